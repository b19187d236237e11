"""N engine replicas behind Ray Serve.

Each replica is a Ray actor running the same FastAPI application `oga serve` runs (oga.serve.app),
with its own EngineOwner: one engine on its own owner thread per replica. Ray Serve's HTTP proxy and
router spread requests over the replicas, its controller calls `check_health` (a replica whose
engine failed or whose owner thread died is replaced) and starts a new replica when one dies. On a
GPU node give each replica a GPU through its resources (`num_gpus=1`: Ray sets CUDA_VISIBLE_DEVICES
so each replica's engine sees its own device).

Three ways to run it:

- `oga serve --replicas N` starts a local Ray instance (or joins `--ray-address`), deploys N replicas
  and serves until SIGTERM / Ctrl-C, then shuts Serve and Ray down and exits 0;
- `serve run oga.serve:ray_app model_dir=DIR replicas=2` with Ray's own CLI (arguments below);
- `build_application(settings, replicas=2)` from Python, for `ray.serve.run`.
"""
import dataclasses
import signal
import sys
import threading

from ray import serve

from .app import create_app
from .settings import ServeSettings

# A replica holds a whole engine: Ray's default of 5 concurrent requests per replica would queue
# requests in front of a continuous-batching engine that takes hundreds; the server's own waiting
# limit (503) is the back-pressure.
_ONGOING_PER_REPLICA = 4096


@serve.deployment(name="oga", max_ongoing_requests=_ONGOING_PER_REPLICA, health_check_period_s=2.0,
                  health_check_timeout_s=30.0)
@serve.ingress()
class OgaReplica:
    """One replica: the OpenAI-compatible application over its own engine owner thread."""

    def __init__(self, settings: dict):
        self._settings = ServeSettings(**settings)
        self._app = None

    def __serve_build_asgi_app__(self):
        replica = serve.get_replica_context().replica_id.unique_id
        self._app = create_app(self._settings, replica_id=replica)
        return self._app

    def check_health(self):
        server = self._app.state.server if self._app is not None else None
        if server is not None and server.owner is not None and not server.owner.healthy:
            raise RuntimeError(f"the engine is not available: {server.owner.failure or 'owner thread stopped'}")


def build_application(settings: ServeSettings, replicas: int = 1, *, num_cpus: float = 1.0, num_gpus: float = 0.0):
    """The Ray Serve application: `replicas` OgaReplica actors, each with these resources."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    actor_options = {"num_cpus": num_cpus}
    if num_gpus:
        actor_options["num_gpus"] = num_gpus
    # Ray waits this long for a replica's own drain (settings.shutdown_timeout_s) before killing it.
    return OgaReplica.options(num_replicas=replicas, ray_actor_options=actor_options,
                              graceful_shutdown_timeout_s=settings.shutdown_timeout_s + 15.0,
                              graceful_shutdown_wait_loop_s=1.0).bind(dataclasses.asdict(settings))


def application_from_arguments(args: dict):
    """The builder behind `serve run oga.serve:ray_app key=value ...`. Keys: model_dir (default: the
    SmolLM2 build of `oga serve`, built here on first use), model_name, max_batch_size, max_waiting,
    shutdown_timeout_s, replicas (default 1), num_cpus (default 1), num_gpus (default 0)."""
    known = {"model_dir", "model_name", "max_batch_size", "max_waiting", "shutdown_timeout_s", "replicas",
             "num_cpus", "num_gpus"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown oga.serve:ray_app arguments {sorted(unknown)}; known: {sorted(known)}")
    from .settings import default_model_settings

    values = dict(args)
    replicas = int(values.pop("replicas", 1))
    num_cpus = float(values.pop("num_cpus", 1.0))
    num_gpus = float(values.pop("num_gpus", 0.0))
    for name in ("max_batch_size", "max_waiting"):
        if name in values:
            values[name] = int(values[name])
    if "shutdown_timeout_s" in values:
        values["shutdown_timeout_s"] = float(values["shutdown_timeout_s"])
    if "model_dir" not in values:
        values.update(default_model_settings(values.get("model_name")))
    return build_application(ServeSettings(**values), replicas, num_cpus=num_cpus, num_gpus=num_gpus)


def serve_replicas(settings: ServeSettings, replicas: int, host: str, port: int, *, num_cpus: float = 1.0,
                   num_gpus: float = 0.0, ray_address: str | None = None) -> int:
    """`oga serve --replicas N`: deploys the replicas and serves until SIGTERM / Ctrl-C. Then each
    replica drains (finishes or cancels its turns within the shutdown timeout) and stops; a local
    Ray instance is shut down, on a joined cluster (`ray_address`) only this application is deleted.
    Returns the exit code, 0."""
    import ray

    local = ray_address is None
    if local:
        # Only small HTTP messages pass through Ray's object store.
        ray.init(address="local", include_dashboard=False, object_store_memory=256 << 20)
    else:
        ray.init(address=ray_address)
    stop = threading.Event()
    # Installed after ray.init: the Ray driver installs a SIGTERM handler of its own, which aborts.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_application(settings, replicas, num_cpus=num_cpus, num_gpus=num_gpus), name="oga",
                  route_prefix="/", blocking=False)
        print(f"oga serve: {replicas} replicas of {settings.model_name} on http://{host}:{port}", file=sys.stderr,
              flush=True)
        while not stop.wait(0.5):
            pass
        print("oga serve: shutting down the replicas", file=sys.stderr, flush=True)
        if local:
            serve.shutdown()
        else:
            serve.delete("oga")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
    return 0
