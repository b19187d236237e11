"""The static batching path on the CPU models OGA's own builder writes (GroupQueryAttention over
contiguous caches shared by past and present). Behaviour against onnxruntime-genai 0.18 is compared
scenario by scenario in tests/conformance (model "static"); this file covers the real model and the
cache binding."""
import numpy as np

import oga as og
from oga import executor as executors
from oga import testing
from static_models import smollm2_static_dir, tiny_llama_static_dir  # noqa: F401  (fixtures)

CHAT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2,
        198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


def _run(engine, prompts, max_new, module=og):
    """Greedy turns of every prompt at once on `engine` (an oga engine, or onnxruntime-genai's with
    module=onnxruntime_genai); returns (tokens, finish reasons) per prompt."""
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        options = module.TurnOptions(request)
        options.set_max_generated_tokens(max_new)
        request.begin_turn(np.asarray(prompt, dtype=np.int32), options)
        requests.append(request)
    buffer = engine.create_event_buffer(16)
    tokens, reasons = {id(r): [] for r in requests}, {}
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.token is not None:
                tokens[id(event.request)].append(event.token)
            if event.flags & module.EngineEventFlags.TURN_FINISHED:
                reasons[id(event.request)] = event.finish_reason
        if module is og:
            testing.check_invariants(engine)
    return [tokens[id(r)] for r in requests], [reasons[id(r)] for r in requests]


def test_smollm2_static_build_answers_the_chat_prompt(smollm2_static_dir):
    engine = og.Engine(og.Model(smollm2_static_dir))
    capabilities = engine.get_capabilities()
    assert (capabilities.configured_max_batch_size, capabilities.max_scheduled_tokens,
            capabilities.max_request_length) == (4, 0, 0)
    tokens, reasons = _run(engine, [CHAT, [504, 3575, 282, 4649, 314]], 24)
    # onnxruntime-genai 0.18's static engine on the same directory, in this run
    import onnxruntime_genai as og18
    expected, expected_reasons = _run(og18.Engine(og18.Model(smollm2_static_dir)),
                                      [CHAT, [504, 3575, 282, 4649, 314]], 24, module=og18)
    assert tokens == expected and reasons == [int(r) for r in expected_reasons]
    # "The capital of France is Paris." then EOS
    assert tokens[0] == [504, 3575, 282, 4649, 314, 7042, 30]
    assert reasons[0] == og.FinishReason.EOS
    tokenizer = og.Tokenizer(og.Model(smollm2_static_dir))
    assert tokenizer.decode(tokens[0]) == "The capital of France is Paris."
    assert tokens[1][:2] == [7042, 30]  # " Paris."


def test_static_caches_are_bound_in_place(tiny_llama_static_dir, monkeypatch):
    monkeypatch.setenv("OGA_EXECUTOR", "python")  # inspects the Python executor
    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = og.Engine(og.Model(tiny_llama_static_dir))
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    addresses = [cache.ctypes.data for _, _, cache in executor.caches]
    assert not any(cache.any() for _, _, cache in executor.caches)
    _run(engine, [[504, 3575, 282], [42]], 4)
    # GroupQueryAttention wrote keys and values straight into the buffers oga bound as past and present.
    assert all(cache.any() for _, _, cache in executor.caches)
    assert [cache.ctypes.data for _, _, cache in executor.caches] == addresses


def test_batched_rows_equal_each_alone(tiny_llama_static_dir):
    model = og.Model(tiny_llama_static_dir)
    prompts = [[504, 3575, 282, 4649, 314], [2705, 28, 827, 28], [42], [10, 11, 12, 13, 14, 15]]
    alone = [_run(og.Engine(model), [p], 6)[0][0] for p in prompts]
    together, _ = _run(og.Engine(model), prompts, 6)
    assert together == alone


def test_failed_prefill_and_decode_steps_are_retried(tiny_llama_static_dir, monkeypatch):
    """A static step mutates nothing before it succeeds: an out-of-memory failure reports
    CAPACITY_BLOCKED and the next run repeats the same step (prefill of a fresh batch included)."""
    monkeypatch.setenv("OGA_EXECUTOR", "python")  # inspects the Python executor
    model = og.Model(tiny_llama_static_dir)
    prompts = [[504, 3575, 282], [42, 43]]
    expected, _ = _run(og.Engine(model), prompts, 5)
    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = og.Engine(model)
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    session = executor.session
    failures = {1, 3}  # the prefill, then the second decode
    calls = []

    class FlakySession:
        def run_with_iobinding(self, binding):
            calls.append(1)
            if len(calls) in failures:
                raise RuntimeError("Failed to allocate memory for requested buffer of size 1")
            session.run_with_iobinding(binding)

    executor.session = FlakySession()
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(5)
        request.begin_turn(np.asarray(prompt, dtype=np.int32), options)
        requests.append(request)
    buffer = engine.create_event_buffer(16)
    tokens, blocked = {r: [] for r in requests}, 0
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.request is None:
                assert event.error_code == og.EngineErrorCode.EXECUTION_CAPACITY_EXCEEDED
                blocked += 1
            elif event.token is not None:
                tokens[event.request].append(event.token)
        testing.check_invariants(engine)
    assert blocked == 2
    assert [tokens[r] for r in requests] == expected
