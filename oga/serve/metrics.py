"""Prometheus metrics of one `oga serve` replica (GET /metrics, Prometheus text format).

Request and token figures are counted by the handlers as turns end; latency histograms are fed
from the owner thread's event timestamps (time to first token from the request's arrival,
inter-token latency between consecutive tokens of a turn); engine figures (KV blocks, preemptions,
engine-side waiting and resident requests) are read at scrape time from the owner's latest
EngineStats snapshot, so a scrape never calls into the engine.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

# Outcomes of oga_requests_total.
OUTCOMES = ("stop", "length", "cancelled", "failed", "rejected", "unavailable")

_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5.0)


class _EngineCollector:
    """Yields the engine's figures from the owner's current EngineStats at each scrape."""

    def __init__(self, stats_source):
        self._stats_source = stats_source

    def collect(self):
        stats = self._stats_source()
        figures = (
            (GaugeMetricFamily, "oga_kv_blocks_in_use", "KV cache blocks held by requests.",
             stats.total_blocks - stats.free_blocks),
            (GaugeMetricFamily, "oga_kv_blocks_total", "KV cache blocks of the engine's pool.", stats.total_blocks),
            (GaugeMetricFamily, "oga_engine_resident_requests",
             "Requests the engine holds a batch row (and cache) for.", stats.resident_requests),
            (GaugeMetricFamily, "oga_engine_waiting_requests", "Requests the engine has not admitted yet.",
             stats.waiting_requests),
            (CounterMetricFamily, "oga_preemptions",
             "Requests whose cache the engine released to make room (recomputed later).", stats.preemptions),
            (CounterMetricFamily, "oga_engine_steps", "Engine steps run.", stats.steps),
        )
        for family_type, name, documentation, value in figures:
            family = family_type(name, documentation)
            family.add_metric([], value)
            yield family


class ServeMetrics:
    """The replica's registry (its own, so several servers can live in one process)."""

    def __init__(self, stats_source):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("oga_requests", "Requests answered, by route and outcome (stop, length: finished; "
                                "cancelled: client gone or shutdown; failed: the engine failed the turn; rejected: "
                                "4xx; unavailable: 503).", ["route", "outcome"], registry=r)
        self.prompt_tokens = Counter("oga_prompt_tokens", "Prompt tokens of turns that ran.", registry=r)
        self.generation_tokens = Counter("oga_generation_tokens", "Tokens generated.", registry=r)
        self.time_to_first_token = Histogram("oga_time_to_first_token_seconds",
                                             "From the request's arrival to its first generated token.",
                                             buckets=_TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("oga_inter_token_latency_seconds",
                                             "Between consecutive generated tokens of a turn.",
                                             buckets=_ITL_BUCKETS, registry=r)
        self.running = Gauge("oga_requests_running", "Requests generating (first token sent, not finished).",
                             registry=r)
        self.waiting = Gauge("oga_requests_waiting", "Requests accepted without a first token yet (queued, waiting "
                             "for admission or prefilling); the 503 limit applies to these.", registry=r)
        r.register(_EngineCollector(stats_source))
        for route in ("chat", "completion"):
            for outcome in OUTCOMES:
                self.requests.labels(route, outcome)  # every series exists from the start, at 0

    def render(self) -> bytes:
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_LATEST
