"""The public Python surface of `oga`: names, enum values, extension type names, factories only,
capabilities, speculative statistics, library_path."""

import ctypes
import enum
import os

import pytest

import oga as og
import oga.testing as ogt
from helpers import make_engine, turn_options

PUBLIC_NAMES = [
    "Engine", "Request", "RequestOptions", "TurnOptions", "EngineEventBuffer", "EngineEvent", "TurnUsage",
    "EngineCapabilities", "EngineEventFlags", "FinishReason", "EngineErrorCode", "Model", "GeneratorParams",
    "library_path",
]

EXTENSION_TYPE_NAMES = {
    "Model": "OgaModel",
    "GeneratorParams": "OgaGeneratorParams",
    "Engine": "OgaEngine",
    "Request": "OgaRequest",
    "RequestOptions": "OgaRequestOptions",
    "TurnOptions": "OgaTurnOptions",
    "EngineEventBuffer": "OgaEngineEventBuffer",
    "EngineEvent": "OgaEngineEvent",
    "TurnUsage": "OgaTurnUsage",
    "EngineCapabilities": "OgaEngineCapabilities",
}

COUNT_KEYS = (
    "rounds completed_rounds interrupted_rounds active_rounds draft_tokens_proposed draft_tokens_evaluated "
    "draft_tokens_accepted correction_tokens bonus_tokens tokens_queued tokens_emitted tokens_discarded "
    "tokens_buffered draft_forward_passes target_forward_passes effective_k adaptive_k_increases "
    "adaptive_k_decreases adaptive_k_observations adaptive_k_probes cooldown_entries cooldown_steps "
    "cooldown_remaining standard_fallback_steps mtp_failures dflash2_failures dflash2_disables "
    "dflash2_admission_misses full_accept_rounds partial_accept_rounds zero_accept_rounds "
    "target_verify_forward_passes target_reanchor_forward_passes target_reconciliation_forward_passes "
    "ngram_lookup_hits ngram_lookup_misses ngram_lookup_tokens_proposed ngram_chained_tokens_proposed "
    "ngram_grammar_candidate_rejections ngram_history_syncs ngram_history_tokens_synced"
).split()
NUMBER_KEYS = (
    "total_draft_ms total_target_ms total_reconciliation_ms total_target_verify_ms total_target_reanchor_ms "
    "total_ngram_history_sync_ms total_ngram_lookup_ms avg_draft_ms_per_token acceptance_rate "
    "avg_draft_tokens_per_round mean_emitted_tokens_per_round expected_tokens_per_round avg_target_ms_per_round "
    "target_baseline_ms_per_token target_overhead_ratio estimated_speedup observed_speedup adaptive_k_throughput"
).split()


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_names_exist(name):
    assert hasattr(og, name)


@pytest.mark.parametrize("alias,type_name", sorted(EXTENSION_TYPE_NAMES.items()))
def test_extension_types_are_named_after_c_handles(alias, type_name):
    assert getattr(og, alias).__name__ == type_name


def test_enum_values():
    F = og.EngineEventFlags
    assert issubclass(F, enum.IntFlag)
    assert [(m, int(getattr(F, m))) for m in ("NONE", "TOKEN", "TURN_FINISHED", "CAPACITY_BLOCKED", "FAILED", "RETRYABLE")] == [
        ("NONE", 0), ("TOKEN", 1), ("TURN_FINISHED", 2), ("CAPACITY_BLOCKED", 4), ("FAILED", 8), ("RETRYABLE", 16)]
    R = og.FinishReason
    assert issubclass(R, enum.IntEnum)
    assert {m.name: m.value for m in R} == {
        "NONE": 0, "EOS": 1, "STOP_STRING": 2, "MAX_GENERATED_TOKENS": 3, "MAX_SESSION_TOKENS": 4,
        "CANCELLED": 5, "FAILED": 6}
    E = og.EngineErrorCode
    assert issubclass(E, enum.IntEnum)
    assert {m.name: m.value for m in E} == {
        "NONE": 0, "CAPACITY_DEFERRED": 1, "EXECUTION_CAPACITY_EXCEEDED": 2, "RETRYABLE_EXECUTION": 3,
        "REQUEST_UNSERVICEABLE": 4, "ENGINE_CONTRACT_FAILURE": 5, "ENGINE_EXECUTION_FAILURE": 6}
    combined = F.TOKEN | F.TURN_FINISHED
    assert isinstance(combined, F) and int(combined) == 3


@pytest.mark.parametrize("alias", ["Request", "EngineEventBuffer", "EngineEvent", "TurnUsage", "EngineCapabilities"])
def test_no_public_constructor(alias):
    with pytest.raises(TypeError, match="No constructor defined"):
        getattr(og, alias)()


def test_default_capabilities(engine):
    caps = engine.get_capabilities()
    assert isinstance(caps, og.EngineCapabilities)
    assert (caps.configured_max_batch_size, caps.max_scheduled_tokens, caps.max_request_length) == (8, 2048, 128)
    with pytest.raises(AttributeError):
        caps.max_request_length = 3


@pytest.mark.parametrize("cfg,expected", [
    (dict(num_blocks=1, block_size=4), (8, 2048, 5)),
    (dict(max_batch_size=3, max_scheduled_tokens=17), (3, 17, 128)),
    (dict(num_blocks=10, block_size=2, context_length=64), (8, 2048, 21)),
    (dict(context_length=40), (8, 2048, 40)),
])
def test_capabilities_follow_config(cfg, expected):
    _, eng = make_engine(**cfg)
    caps = eng.get_capabilities()
    assert (caps.configured_max_batch_size, caps.max_scheduled_tokens, caps.max_request_length) == expected


def test_speculative_stats_keys_and_zero_values(engine):
    stats = engine.get_speculative_stats()
    assert isinstance(stats, dict)
    expected = set(COUNT_KEYS) | set(NUMBER_KEYS) | {"formula_supported", "acceptance_length_histogram"}
    assert set(stats) == expected
    for k in COUNT_KEYS:
        assert type(stats[k]) is int and stats[k] == 0, k
    for k in NUMBER_KEYS:
        assert type(stats[k]) is float and stats[k] == 0.0, k
    assert type(stats["formula_supported"]) is bool
    hist = stats["acceptance_length_histogram"]
    assert isinstance(hist, list) and len(hist) == 8 and all(type(x) is int and x == 0 for x in hist)


def test_max_draft_tokens_per_proposal_follows_the_executor(engine):
    assert engine.max_draft_tokens_per_proposal() == 0  # one logits row per request: no verification
    _, eng2 = make_engine(per_token_logits=True)
    assert eng2.max_draft_tokens_per_proposal() == 7
    _, eng3 = make_engine(per_token_logits=True, max_scheduled_tokens=4)
    assert eng3.max_draft_tokens_per_proposal() == 3  # room beside the mandatory token
    _, eng4 = make_engine(per_token_logits=True, max_scheduled_tokens=1)
    assert eng4.max_draft_tokens_per_proposal() == 0


def test_library_path_is_loadable_by_ctypes():
    path = og.library_path()
    assert isinstance(path, str) and os.path.isfile(path)
    lib = ctypes.CDLL(path)
    for sym in ("OgaCreateEngine", "OgaEngineRun", "OgaCreateRequestOptions", "OgaDestroyRequest",
                "OgaEngineEventBufferGet", "OgaTurnUsageGetCachedPromptTokens", "OgaExtCreateTestModel"):
        assert hasattr(lib, sym), sym


def test_request_identity_and_hash(engine, buffer):
    r = engine.create_request()
    assert isinstance(r, og.Request)
    hash(r)
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    engine.run(buffer)
    assert len(buffer) == 1
    assert buffer[0].request is r
    assert {r: 1}[buffer[0].request] == 1


def test_event_property_types(engine, buffer):
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    engine.run(buffer)
    ev = buffer[0]
    assert isinstance(ev, og.EngineEvent)
    assert isinstance(ev.flags, og.EngineEventFlags)
    assert ev.flags == og.EngineEventFlags.TOKEN | og.EngineEventFlags.TURN_FINISHED
    assert isinstance(ev.finish_reason, og.FinishReason)
    assert ev.finish_reason is og.FinishReason.MAX_GENERATED_TOKENS
    assert isinstance(ev.error_code, og.EngineErrorCode)
    assert ev.error_code is og.EngineErrorCode.NONE
    assert type(ev.token) is int and type(ev.turn_id) is int
    assert ev.matched_stop_string_index is None
    assert isinstance(ev.usage, og.TurnUsage)
    assert (ev.usage.prompt_tokens, ev.usage.generated_tokens, ev.usage.cached_prompt_tokens) == (3, 1, 0)
    assert repr(ev)  # __repr__ shows the fields
    for attr in ("flags", "token", "request", "turn_id"):
        with pytest.raises(AttributeError):
            setattr(ev, attr, 1)


def test_buffer_capacity_property(engine):
    for cap in (0, 1, 3, 64):
        b = engine.create_event_buffer(cap)
        assert isinstance(b, og.EngineEventBuffer)
        assert b.capacity == cap
        assert len(b) == 0
        assert list(b) == []


def test_request_options_and_turn_options_construct(engine):
    opts = og.RequestOptions()
    assert opts.set_max_session_tokens(10) is None
    r = engine.create_request(options=opts)
    t = og.TurnOptions(r)
    assert t.set_max_generated_tokens(3) is None
    assert t.set_min_generated_tokens(1) is None
    for call in (lambda: t.set_do_sample(False), lambda: t.set_temperature(1.0), lambda: t.set_top_p(1.0),
                 lambda: t.set_top_k(1), lambda: t.set_repetition_penalty(1.0), lambda: t.set_no_repeat_ngram_size(0),
                 lambda: t.set_seed(1), t.clear_seed, lambda: t.set_stop_strings([]), lambda: t.set_guidance("regex", "a+"),
                 t.clear_guidance, t.reset):
        assert call() is None


def test_generator_params_seed_form(model):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=20)
    eng = og.Engine(model)
    r = eng.create_request(params)
    assert isinstance(r, og.Request)
    r2 = eng.create_request(params, og.RequestOptions())
    assert isinstance(r2, og.Request)


def test_generator_params_of_another_model_are_refused(model):
    other = ogt.create_test_model(vocab_size=32)
    params = og.GeneratorParams(other)
    eng = og.Engine(model)
    with pytest.raises(RuntimeError, match="created for another model than the engine's"):
        eng.create_request(params)
    # nothing changed: the engine still takes a request with its own model's params
    request = eng.create_request(og.GeneratorParams(model))
    assert isinstance(request, og.Request)


def test_model_path_constructor_fails_without_onnx(tmp_path):
    with pytest.raises(RuntimeError):
        og.Model(str(tmp_path))
