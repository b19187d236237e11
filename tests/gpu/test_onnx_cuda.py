"""The ONNX Runtime executor's device path on CUDA: a tiny fp16 PagedAttention decoder from oga's
builder on CUDAExecutionProvider (device KV caches, staged inputs, CUDA graphs) through the whole
engine, against the float64 reference of the same weights: every token of every greedy stream must
be the reference's choice given the stream's own history, or within a near-tie of it (fp16 and fp32
may disagree where two logits nearly tie). Token selection must happen on the device (the engine's
device_sampled_rows / host_read_logits_rows counters), for greedy and sampled turns; a policy the
device sampler lacks reads its rows back. A hybrid decoder (standard-op graph, fixed-state pool in
device memory) runs the same way. Skipped, with the reason, unless ONNX Runtime has
CUDAExecutionProvider, oga.cuda_kernels finds a device, oga.device has CudaDevice and the `onnx`
package (the builder) is installed; tests/gpu/device_check.sh runs this on a GPU machine."""
import json
import os
import shutil

import numpy as np
import pytest

import oga.cuda_kernels as ck
from oga import device as devices
from oga import executor as executors


def _unavailable():
    try:
        import onnxruntime as ort
    except ImportError as error:
        return f"onnxruntime cannot be imported: {error}"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "this onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed)"
    available, reason = ck.cuda_status()
    if not available:
        return reason
    if not hasattr(devices, "CudaDevice"):
        return "oga.device has no CudaDevice yet"
    try:
        import onnx  # noqa: F401  (the model builder)
    except ImportError:
        return "the onnx package (the model builder) is not installed"
    return ""


REASON = _unavailable()
pytestmark = pytest.mark.skipif(bool(REASON), reason=f"no ONNX Runtime CUDA path here: {REASON}")

PROMPTS = [list(range(3, 40)), [5, 9, 13], [7] * 20, [11, 4], list(range(60, 20, -3))]
MAX_GEN = 12


def _spec():
    from oga.models.random_weights import tiny_spec

    # head_dim 64: a size every PagedAttention backend takes
    return tiny_spec(vocab_size=256, hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2,
                     head_dim=64, context_length=512)


def _hybrid_spec():
    from oga.models.random_weights import tiny_spec

    return tiny_spec(vocab_size=256, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16,
                     context_length=256, layer_types=["conv", "attention", "recurrent", "attention"], conv_kernel=4)


def _on_cuda(model_dir, options=None):
    """A copy of a CPU-built directory whose session options ask for CUDA."""
    copy = f"{model_dir}_on_cuda"
    shutil.copytree(model_dir, copy)
    config_path = os.path.join(copy, "genai_config.json")
    config = json.load(open(config_path))
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": dict(options or {})}]
    json.dump(config, open(config_path, "w"))
    return copy


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from oga.models import build

    cpu = str(tmp_path_factory.mktemp("cpu"))
    cuda = str(tmp_path_factory.mktemp("cuda"))
    build(None, cpu, random_spec=_spec(), graph="standard", block_size=16, max_batch_size=4, max_scheduled_tokens=64,
          seed=3)
    # a small fixed pool (test_the_device_samples_and_sizes_the_cache covers automatic sizing)
    build(None, cuda, target="cuda", random_spec=_spec(), num_blocks=8, max_batch_size=4,
          max_scheduled_tokens=64, seed=3)
    graph = str(tmp_path_factory.mktemp("graph") / "model")
    shutil.copytree(cuda, graph)
    config_path = os.path.join(graph, "genai_config.json")
    config = json.load(open(config_path))
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": "1"}}]
    json.dump(config, open(config_path, "w"))
    # a hybrid decoder: the standard-op CPU graph (every op has a CUDA kernel) asked to run on CUDA,
    # so its fixed-state banks live in device memory
    hybrid_cpu = str(tmp_path_factory.mktemp("hybrid"))
    build(None, hybrid_cpu, random_spec=_hybrid_spec(), graph="standard", block_size=16, max_batch_size=4,
          max_scheduled_tokens=64, seed=3)
    return {"cpu": cpu, "cuda": cuda, "graph": graph, "hybrid_cpu": hybrid_cpu, "hybrid": _on_cuda(hybrid_cpu)}


def run(model_dir, record=None, policy=None):
    """Streams of PROMPTS, submitted together (four slots, so the fifth waits for one), greedy or
    with `policy` (TurnOptions setters, seeded per request); returns (streams, executor, counters)."""
    import oga as og
    from oga import testing

    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = og.Engine(og.Model(model_dir))
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    if record is not None:
        executor.session = record(executor.session)
    requests = []
    for i, prompt in enumerate(PROMPTS):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(MAX_GEN)
        for name, value in (policy or {}).items():
            getattr(options, f"set_{name}")(value)
        if policy:
            options.set_seed(100 + i)
        request.begin_turn(np.asarray(prompt, np.int32), options)
        requests.append(request)
    tokens = {id(r): [] for r in requests}
    buffer = engine.create_event_buffer(16)
    for _ in range(1000):
        if not engine.has_pending_requests():
            break
        for event in engine.run(buffer):
            if event.request is None:
                continue
            assert not event.flags & og.EngineEventFlags.FAILED, event.error_code
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens[id(event.request)].append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                event.request.close()
    return [tokens[id(r)] for r in requests], executor, testing.engine_counters(engine)


def assert_agrees(device_streams, spec=None, seed=3):
    """Every token of every stream is the float64 reference's greedy choice after the stream's own
    history, or within a near-tie of it (fp16 against float64)."""
    from oga.models.random_weights import random_model
    from oga.models.reference import Reference

    loaded = random_model(spec or _spec(), seed=seed)
    checked = 0
    for prompt, got in zip(PROMPTS, device_streams):
        reference = Reference(loaded)
        logits = reference.step(list(prompt))[-1]
        for token in got:
            best = int(np.argmax(logits))
            if token != best:
                margin = float(logits[best] - logits[token])
                assert margin <= 2e-2 * max(1.0, float(np.abs(logits).max())), (prompt, got, token, best, margin)
            checked += 1
            logits = reference.step([token])[-1]
    assert checked > 2 * MAX_GEN


def assert_selected_on_the_device(streams, counters):
    """Every token selected by the sampling kernels (each token, plus an EOS that ended a turn early),
    no logits row read back to the host."""
    tokens = sum(map(len, streams))
    assert tokens <= counters["device_sampled_rows"] <= tokens + len(PROMPTS), counters
    assert counters["host_read_logits_rows"] == 0, counters


def test_paged_attention_decoder_on_cuda_agrees_with_the_reference(models):
    got, executor, counters = run(models["cuda"])
    assert type(executor) is executors.DeviceOnnxEngineExecutor
    assert executor.ort_device[0] == "cuda" and executor.decoder.providers[0] == "CUDAExecutionProvider"
    assert not executor.cuda_graph
    assert executor.logits_on_device == 1
    assert_agrees(got)
    assert_selected_on_the_device(got, counters)


SAMPLED = {"do_sample": True, "temperature": 0.8, "top_k": 20, "top_p": 0.9}


def test_sampled_turns_are_selected_on_the_device_and_reproducible(models):
    """Seeded sampling on the device: the kernels draw from each request's Philox stream, so the
    same seeds give the same streams run after run, nothing is read back, and other seeds differ."""
    first, _, counters = run(models["cuda"], policy=SAMPLED)
    again, _, _ = run(models["cuda"], policy=SAMPLED)
    assert first == again
    assert_selected_on_the_device(first, counters)
    greedy, _, _ = run(models["cuda"])
    assert first != greedy


def test_a_policy_the_device_sampler_lacks_reads_its_rows_back(models):
    """no_repeat_ngram_size is applied on the host: those rows' logits are read back, and the greedy
    stream still follows the reference wherever it does not repeat a 2-gram."""
    got, _, counters = run(models["cuda"], policy={"no_repeat_ngram_size": 2})
    assert counters["host_read_logits_rows"] >= sum(map(len, got)) - len(PROMPTS)
    for stream in got:
        grams = list(zip(stream, stream[1:]))
        assert len(grams) == len(set(grams))


def test_a_hybrid_decoder_runs_on_the_device_path(models):
    """The fixed-state pool in device memory (banks, gathers through the kernels) under a hybrid
    decoder on CUDA: greedy streams follow the reference, selected on the device."""
    got, executor, counters = run(models["hybrid"])
    assert type(executor) is executors.DeviceOnnxEngineExecutor
    assert executor.decoder.providers[0] == "CUDAExecutionProvider"
    assert counters["fixed_state_direct_steps"] + counters["fixed_state_fallback_steps"] > 0
    assert_agrees(got, spec=_hybrid_spec())
    assert_selected_on_the_device(got, counters)
    cpu, _, _ = run(models["hybrid_cpu"])
    assert sum(a == b for a, b in zip(got, cpu)) >= len(PROMPTS) - 1   # fp32 on both: at most a near-tie apart


class RecordingSession:
    def __init__(self, session):
        self._session = session
        self.graph_ids = []

    def run_with_iobinding(self, binding, run_options=None):
        self.graph_ids.append(None if run_options is None else int(run_options.get_run_config_entry("gpu_graph_id")))
        return self._session.run_with_iobinding(binding, run_options)


def test_cuda_graphs_capture_and_replay_decode_steps(models):
    got, executor, counters = run(models["graph"], record=RecordingSession)
    assert executor.cuda_graph
    graph_ids = executor.session.graph_ids
    assert -1 in graph_ids
    # a graph id's first step runs eagerly (oga's warm-up); later steps capture and replay it
    assert any(graph_ids.count(g) >= 3 for g in set(graph_ids) if g >= 0), graph_ids
    assert_agrees(got)
    assert_selected_on_the_device(got, counters)


def test_the_device_sizes_the_cache(models):
    """A model without num_blocks sizes its cache from the device's free memory."""
    import oga as og
    from oga import testing

    auto = str(models["cuda"]) + "_auto"
    shutil.copytree(models["cuda"], auto)
    config_path = os.path.join(auto, "genai_config.json")
    config = json.load(open(config_path))
    batching = config["engine"]["dynamic_batching"]
    batching.pop("num_blocks", None)
    batching["gpu_utilization_factor"] = 0.05
    json.dump(config, open(config_path, "w"))
    model = og.Model(auto)
    engine = og.Engine(model)
    probe = devices.CudaDevice(0, with_kernels=False)
    free, _ = probe.memory_info()
    probe.close()
    blocks = testing.engine_counters(engine)["total_blocks"]
    print(f"\nauto-sized KV cache: {blocks} blocks with {free / 2**30:.1f} GiB free on the device")
    assert blocks > 8


def _with_blocks(model_dir, num_blocks):
    """A copy of the model directory whose engine has `num_blocks` KV blocks."""
    copy = f"{model_dir}_{num_blocks}_blocks"
    if not os.path.isdir(copy):
        shutil.copytree(model_dir, copy)
        config_path = os.path.join(copy, "genai_config.json")
        config = json.load(open(config_path))
        config["engine"]["dynamic_batching"]["num_blocks"] = num_blocks
        json.dump(config, open(config_path, "w"))
    return copy


def _throughput(model_dir, requests=32, max_gen=64):
    import time

    import oga as og

    # Room for every resident's whole turn (4 x 80 tokens of 16-token blocks): without preemption,
    # residents that all need a block at once with none free would wait for ever.
    engine = og.Engine(og.Model(_with_blocks(model_dir, 4 * 6)))
    buffer = engine.create_event_buffer(256)
    handles = []
    for i in range(requests):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(max_gen)
        options.set_min_generated_tokens(max_gen)
        request.begin_turn(np.asarray([(3 + i + k) % 250 + 2 for k in range(16)], np.int32), options)
        handles.append(request)
    tokens = 0
    start = time.perf_counter()
    for _ in range(20 * requests * max_gen):
        if not engine.has_pending_requests():
            break
        tokens += sum(1 for e in engine.run(buffer) if e.flags & og.EngineEventFlags.TOKEN)
    assert tokens == requests * max_gen, (tokens, "the workload did not finish")
    return tokens / (time.perf_counter() - start)


def test_report_throughput(models):
    """Prints generated tokens per second, 32 requests of 64 tokens (a figure, not a target)."""
    figures = {name: _throughput(models[name]) for name in ("cpu", "cuda", "graph")}
    print("\nthroughput, tiny decoder, 32 requests x 64 tokens: " +
          ", ".join(f"{name} {value:.0f} tokens/s" for name, value in figures.items()))
    assert all(value > 0 for value in figures.values())
