"""The ONNX Runtime executor's device path (oga/executors.py, DeviceOnnxEngineExecutor), run on
the CPU with oga.device.HostDevice through oga.testing.device_path: the code a session on
CUDAExecutionProvider runs -- caches, staged inputs and logits in device memory allocated at
open_engine, one upload per input per step at fixed addresses, gpu_graph_id run options for graph
steps -- against the host path on the same builder models through the whole engine. The same CPU
kernels see the same inputs either way, so token streams must be identical."""
import ctypes
import gc
import json
import shutil
import warnings

import numpy as np
import pytest

import oga as og
from oga import device as devices
from oga import executor as executors
from oga import testing
from oga.models import build
from oga.models.random_weights import tiny_spec

MAX_GEN = 10
# (prompt, Run at which it begins, sampling: None = greedy, else (seed, temperature, top_k, top_p))
JOBS = [
    (list(range(3, 40)), 0, None),          # longer than a step's token budget: chunked prefill
    ([5, 9, 13], 0, (7, 0.9, 20, 1.0)),
    ([7] * 20, 1, None),
    ([11, 4], 3, (11, 1.2, 0, 0.9)),
    (list(range(60, 20, -3)), 6, None),     # admitted while the others decode
    ([8, 8, 9], 9, (5, 0.7, 8, 0.95)),
]


def _spec(**overrides):
    fields = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8,
                  context_length=256)
    fields.update(overrides)
    return tiny_spec(**fields)


# name -> (spec, extra build arguments)
MODELS = {
    "plain": (_spec(), {}),
    "logits_indices": (_spec(), {"logits_indices": True}),
    "per_token": (_spec(), {"per_token_logits": True}),
    "sliding_window": (_spec(num_layers=3, sliding_window=6, sliding_window_layers=[0, 2]), {"chunk_size": 8}),
    "hybrid": (_spec(num_layers=3, layer_types=["conv", "attention", "recurrent"], conv_kernel=3), {}),
}


@pytest.fixture(scope="module", autouse=True)
def python_executor():
    """The device path is the Python executor's (decoders on a device always run there); its host
    path, the reference here, is selected with OGA_EXECUTOR=python too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OGA_EXECUTOR", "python")
        yield


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for name, (spec, extra) in MODELS.items():
        path = str(tmp_path_factory.mktemp(name))
        # block size 4 and 16 tokens per step: several blocks per request, prefills in chunks
        build(None, path, random_spec=spec, block_size=4, max_batch_size=4, max_scheduled_tokens=16, seed=3,
              **extra)
        dirs[name] = path
    return dirs


def add_position_ids(path):
    """The builder's graphs take no position_ids: this one gets an input position_ids [num_tokens];
    each row's logits get its last token's position times a fixed vector over the vocabulary added,
    so a position staged wrong changes tokens."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(f"{path}/model.onnx")
    graph = model.graph
    [producer] = [node for node in graph.node if "logits" in node.output]
    producer.output[list(producer.output).index("logits")] = "logits_before_positions"
    graph.input.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["num_tokens"]))
    graph.initializer.extend([onnx.numpy_helper.from_array(np.array([1], np.int64), "pos_one"),
                              onnx.numpy_helper.from_array(np.array([1 << 30], np.int64), "pos_end"),
                              onnx.numpy_helper.from_array(np.array(1, np.int32), "pos_one32"),
                              onnx.numpy_helper.from_array(
                                  np.random.default_rng(0).normal(0, 0.1, 97).astype(np.float32), "pos_scale")])
    graph.node.extend([
        helper.make_node("Slice", ["cumulative_sequence_lengths", "pos_one", "pos_end"], ["pos_ends"]),
        helper.make_node("Sub", ["pos_ends", "pos_one32"], ["pos_last"]),
        helper.make_node("Gather", ["position_ids", "pos_last"], ["pos_rows"], axis=0),
        helper.make_node("Cast", ["pos_rows"], ["pos_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pos_float", "pos_one"], ["pos_column"]),
        helper.make_node("Mul", ["pos_column", "pos_scale"], ["pos_bias"]),
        helper.make_node("Add", ["logits_before_positions", "pos_bias"], ["logits"]),
    ])
    onnx.save(model, f"{path}/model.onnx")


@pytest.fixture(scope="module")
def positions_dir(model_dirs, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("positions") / "model")
    shutil.copytree(model_dirs["plain"], path)
    add_position_ids(path)
    return path


@pytest.fixture(scope="module")
def graph_dir(model_dirs, tmp_path_factory):
    """The plain model with a cuda provider entry asking for CUDA graphs (dropped on this CPU
    machine, with a warning; the device path still declares the capability)."""
    path = str(tmp_path_factory.mktemp("graph") / "model")
    shutil.copytree(model_dirs["plain"], path)
    config_path = f"{path}/genai_config.json"
    config = json.load(open(config_path))
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": "1"}}]
    json.dump(config, open(config_path, "w"))
    return path


class CountingDevice(devices.HostDevice):
    """HostDevice that records every allocation, release and upload."""

    def __init__(self):
        super().__init__()
        self.allocated, self.released, self.uploads = [], [], []

    def allocate(self, nbytes):
        address = super().allocate(nbytes)
        self.allocated.append((address, int(nbytes)))
        return address

    def release(self, address):
        self.released.append(int(address))
        super().release(address)

    def upload(self, destination, source, nbytes):
        self.uploads.append((int(destination), int(source), int(nbytes)))
        super().upload(destination, source, nbytes)


class RecordingBinding:
    """An IOBinding that records (name, device type, address, shape) of every bind call."""

    def __init__(self, binding):
        self._binding = binding
        self.calls = []

    def bind_input(self, name, device_type, device_id, dtype, shape, address):
        self.calls.append((name, device_type, int(address), tuple(shape)))
        self._binding.bind_input(name, device_type, device_id, dtype, shape, address)

    def bind_output(self, name, device_type, device_id, dtype, shape, address):
        self.calls.append((name, device_type, int(address), tuple(shape)))
        self._binding.bind_output(name, device_type, device_id, dtype, shape, address)

    def __getattr__(self, name):  # _iobinding and the rest, for InferenceSession.run_with_iobinding
        return getattr(self._binding, name)


class RecordingSession:
    """Forwards run_with_iobinding and records each run's gpu_graph_id run option (None: no options)."""

    def __init__(self, session):
        self._session = session
        self.graph_ids = []

    def run_with_iobinding(self, binding, run_options=None):
        self.graph_ids.append(None if run_options is None else run_options.get_run_config_entry("gpu_graph_id"))
        return self._session.run_with_iobinding(binding, run_options)


def load(model_dir, device=None):
    """og.Model on the host path, or on the device path with `device` (a factory) when given."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the graph model's dropped cuda entry
        if device is None:
            return og.Model(model_dir)
        with testing.device_path(device):
            return og.Model(model_dir)


def open_engine(model):
    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = og.Engine(model)
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    return engine, executor


def run_jobs(engine, jobs=JOBS, propose=None, after_run=None, max_runs=2000):
    """Runs `jobs` (see JOBS) to completion; `propose(index, emitted)` gives drafts before each Run
    to requests that already emitted a token. Returns the tokens of each job."""
    requests = [None] * len(jobs)
    tokens = [[] for _ in jobs]
    buffer = engine.create_event_buffer(16)
    for runs in range(max_runs):
        for i, (prompt, start, sampling) in enumerate(jobs):
            if requests[i] is None and start <= runs:
                requests[i] = engine.create_request()
                options = og.TurnOptions(requests[i])
                options.set_max_generated_tokens(MAX_GEN)
                if sampling is not None:
                    seed, temperature, top_k, top_p = sampling
                    options.set_do_sample(True)
                    options.set_seed(seed)
                    options.set_temperature(temperature)
                    options.set_top_k(top_k)
                    options.set_top_p(top_p)
                requests[i].begin_turn(np.asarray(prompt, np.int32), options)
            elif propose is not None and requests[i] is not None and 0 < len(tokens[i]) < MAX_GEN:
                drafts = propose(i, tokens[i])
                if drafts:
                    requests[i].set_draft_tokens(drafts)
        if all(r is not None for r in requests) and not engine.has_pending_requests():
            return tokens
        for event in engine.run(buffer):
            if event.request is None:  # six requests through four slots
                assert event.flags == og.EngineEventFlags.CAPACITY_BLOCKED, event.error_code
                continue
            assert not event.flags & og.EngineEventFlags.FAILED, event.error_code
            i = requests.index(event.request)
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens[i].append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                requests[i].close()  # frees its slot for a later admission
        testing.check_invariants(engine)
        if after_run is not None:
            after_run(engine)
    raise AssertionError("the engine did not become idle")


def streams(model_dir, device=None, **kwargs):
    engine, executor = open_engine(load(model_dir, device))
    expected = executors.DeviceOnnxEngineExecutor if device else executors.OnnxEngineExecutor
    assert type(executor) is expected
    return run_jobs(engine, **kwargs)


@pytest.mark.parametrize("name", ["plain", "logits_indices", "per_token", "sliding_window", "hybrid", "positions"])
def test_device_path_streams_equal_the_host_path(model_dirs, positions_dir, name):
    path = positions_dir if name == "positions" else model_dirs[name]
    host = streams(path)
    assert sum(map(len, host)) > 3 * MAX_GEN
    assert streams(path, devices.HostDevice) == host


def test_position_ids_reach_the_graph(model_dirs, positions_dir):
    """The position model is not the plain one in disguise: its positions change tokens."""
    assert streams(positions_dir, devices.HostDevice) != streams(model_dirs["plain"])


def test_drafts_on_the_device_path(model_dirs):
    """Per-token logits: drafts verified on the device path as on the host path (the proposals are
    the plain greedy continuation with every third one wrong, so some are accepted, some not)."""
    path = model_dirs["per_token"]
    greedy_jobs = [(prompt, start, None) for prompt, start, _ in JOBS]
    plain = streams(path, jobs=greedy_jobs)

    def propose(i, emitted):
        drafts = plain[i][len(emitted):len(emitted) + 3]
        return [t if (len(emitted) + k) % 3 else (t + 1) % 97 for k, t in enumerate(drafts)]

    engine, _ = open_engine(load(path, devices.HostDevice))
    with_drafts = run_jobs(engine, greedy_jobs, propose=propose)
    assert with_drafts == streams(path, jobs=greedy_jobs, propose=propose)
    assert with_drafts == plain  # greedy verification never changes a greedy stream
    stats = engine.get_speculative_stats()
    assert 0 < stats["draft_tokens_accepted"] < stats["draft_tokens_evaluated"]


@pytest.mark.parametrize("name", ["sliding_window", "positions"])
def test_one_upload_per_input_fixed_addresses_and_no_allocation_after_open(model_dirs, positions_dir, name):
    path = positions_dir if name == "positions" else model_dirs[name]
    created = []

    def factory():
        created.append(CountingDevice())
        return created[-1]

    engine, executor = open_engine(load(path, factory))
    [device] = created
    allocations_at_open = len(device.allocated)
    # every cache, the input buffer and the logits buffer; nothing else
    assert allocations_at_open == len(executor.caches) + 2
    assert device.live_allocations() == allocations_at_open
    binding = executor.binding = RecordingBinding(executor.binding)
    per_step = []

    def after_run(engine):
        per_step.append(len(device.uploads))

    run_jobs(engine, after_run=after_run)
    staged = len(executor.input_slots)
    # input_ids, cumulative and past lengths, block_table, and block_table_windowed or position_ids
    assert staged == 5
    steps = np.diff([0] + per_step)
    assert steps.max() <= staged and steps.sum() > 0
    # At these small limits the capacity between inputs is far below UPLOAD_MERGE_GAP: one copy a step.
    assert executor.device_inputs_bytes < executors.UPLOAD_MERGE_GAP and steps.max() == 1
    region = (executor.device_inputs, executor.device_inputs + executor.device_inputs_bytes)
    staging = executor.staging.ctypes.data
    for destination, source, nbytes in device.uploads:
        assert region[0] <= destination and destination + nbytes <= region[1]
        assert source - staging == destination - region[0]  # the staging buffer mirrors the device buffer
    # Packed inputs were bound at one address each (the persistent buffers), only when a shape changed.
    addresses = {}
    for name, device_type, address, shape in binding.calls:
        addresses.setdefault(name, set()).add(address)
        assert device_type == "cpu"  # HostDevice's ONNX Runtime device type
    names = executor.names
    for name in list(executor.input_slots) + [names["attention_metadata"], names["logits"]]:
        assert len(addresses[name]) == 1, (name, addresses[name])
    assert addresses[names["logits"]] == {executor.device_logits}
    bound = {}
    for name, _, address, shape in binding.calls:
        assert bound.get(name) != (address, shape), f"{name} rebound without a change"
        bound[name] = (address, shape)
    assert len(device.allocated) == allocations_at_open
    # ONNX Runtime wrote keys and values into the device caches in place.
    for address, nbytes in device.allocated[:len(executor.caches)]:
        assert any(ctypes.string_at(address, nbytes))
    del engine, executor, binding
    gc.collect()
    assert device.live_allocations() == 0
    assert sorted(device.released) == sorted(a for a, _ in device.allocated)


class ClosingDevice(CountingDevice):
    """CountingDevice that records close() and has a (never launched) kernel table, so the decoder's
    DeviceOps allocates its sampling staging and scratch at open_engine."""

    def __init__(self):
        super().__init__()
        self.kernels = object()
        self.closes = 0

    def close(self):
        self.closes += 1
        super().close()


def test_model_release_frees_the_device(model_dirs):
    """The decoder's device outlives every engine but not the model: at release_model the DeviceOps
    staging and scratch are released and the device closed (a CudaDevice frees nothing, not even its
    stream, when it is collected)."""
    created = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with testing.device_path(lambda: created.append(ClosingDevice()) or created[-1]):
            model = og.Model(model_dirs["plain"])
    engine, executor = open_engine(model)
    [device] = created
    executor_allocations = len(executor.caches) + 2
    assert len(device.allocated) > executor_allocations  # the DeviceOps' staging and scratch
    del engine, executor
    gc.collect()
    assert device.closes == 0  # the model is alive: its device stays open
    del model
    gc.collect()
    assert device.closes == 1
    assert sorted(device.released) == sorted(a for a, _ in device.allocated)


class HostBufferRecordingDevice(devices.HostDevice):
    def __init__(self):
        super().__init__()
        self.host_buffers = []

    def host_buffer(self, nbytes):
        self.host_buffers.append(int(nbytes))
        return super().host_buffer(nbytes)


@pytest.mark.parametrize("name", ["plain", "per_token"])
def test_device_logits_take_no_pinned_host_copy(model_dirs, name):
    """With the DeviceOps in place the logits never come back whole, so open_engine stages only the
    packed inputs in pinned memory, not a rows x vocab logits buffer."""
    created = []
    engine, executor = open_engine(load(model_dirs[name], lambda: created.append(HostBufferRecordingDevice())
                                        or created[-1]))
    [device] = created
    assert executor.logits_on_device == 1
    assert device.host_buffers == [executor.staging.nbytes]
    assert run_jobs(engine) == streams(model_dirs[name])


def test_cuda_graph_steps_run_with_their_graph_id(model_dirs, graph_dir):
    model = load(graph_dir, devices.HostDevice)
    engine, executor = open_engine(model)
    assert executor.cuda_graph
    session = executor.session = RecordingSession(executor.session)
    expected = []

    seen = set()

    def after_run(engine):
        while len(expected) < len(session.graph_ids):
            graph_id = testing.last_step_inputs(engine)["graph_id"]
            # a graph id's first step runs eagerly (the memory arena's warm-up), later ones with it
            expected.append(str(graph_id if graph_id < 0 or graph_id in seen else -1))
            seen.add(graph_id)

    tokens = run_jobs(engine, after_run=after_run)
    assert session.graph_ids == expected
    assert "-1" in expected and any(g != "-1" for g in expected)  # eager and graph steps both ran
    # bucketed graph steps compute the same tokens as the host path's exact ones
    assert tokens == streams(model_dirs["plain"])


def test_without_cuda_graph_no_run_options(model_dirs):
    engine, executor = open_engine(load(model_dirs["plain"], devices.HostDevice))
    assert not executor.cuda_graph
    session = executor.session = RecordingSession(executor.session)
    run_jobs(engine, JOBS[:2])
    assert session.graph_ids and set(session.graph_ids) == {None}


class FailingDevice(devices.HostDevice):
    def __init__(self, fail_after):
        super().__init__()
        self.fail_after = fail_after

    def allocate(self, nbytes):
        if len(self._allocations) >= self.fail_after:
            raise devices.DeviceOutOfMemory(f"host device: cannot allocate {nbytes} bytes (test)")
        return super().allocate(nbytes)


def test_device_out_of_memory_at_open_is_a_capacity_failure(model_dirs):
    created = []
    model = load(model_dirs["plain"], lambda: created.append(FailingDevice(fail_after=3)) or created[-1])
    with pytest.raises(RuntimeError, match="could not prepare the engine: cannot allocate the KV cache: host device: "
                                           "cannot allocate"):
        og.Engine(model)
    assert created[0].live_allocations() == 0  # what open had allocated was released


def test_run_failures_on_the_device_path(model_dirs):
    engine, executor = open_engine(load(model_dirs["plain"], devices.HostDevice))
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(4)
    request.begin_turn([5, 9, 13], options)
    buffer = engine.create_event_buffer(4)
    real = executor.session

    def failing(text):
        def run(binding, run_options=None):
            raise RuntimeError(text)
        return type("S", (), {"run_with_iobinding": staticmethod(run)})()

    executor.session = failing("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory ; "
                               "GPU=0 ; hostname=h ; expr=cudaMalloc((void**)&p, size);")
    [event] = list(engine.run(buffer))
    assert event.error_code == og.EngineErrorCode.EXECUTION_CAPACITY_EXCEEDED
    executor.session = real
    assert list(engine.run(buffer))  # the rolled-back step runs again
    executor.session = failing("[ONNXRuntimeError] : 1 : FAIL : CUDA error cudaErrorIllegalAddress")
    events = list(engine.run(buffer))
    assert events[0].flags & og.EngineEventFlags.FAILED
    with pytest.raises(RuntimeError, match="cudaErrorIllegalAddress"):
        engine.run(buffer)


@pytest.mark.parametrize("text", [
    "CUDA failure 2: out of memory ; GPU=0",
    "onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 4294967296",
    "CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0",
    "CUDNN failure 4: CUDNN_STATUS_ALLOC_FAILED",
    "CUDA_ERROR_OUT_OF_MEMORY",
])
def test_cuda_out_of_memory_texts_are_capacity_failures(text):
    assert executors.classify_failure(RuntimeError(text)) == executors.STATUS_CAPACITY_EXCEEDED


def test_a_cuda_device_that_cannot_be_opened_is_a_load_error(monkeypatch):
    monkeypatch.delattr(devices, "CudaDevice", raising=False)
    with pytest.raises(executors.ModelLoadError, match=r"model\.onnx: the session would run on "
                                                           r"CUDAExecutionProvider \(device 1\), but oga cannot open"):
        executors.decoder._open_cuda_device("model.onnx", 1)


@pytest.mark.parametrize("lands_on_cuda", [True, False])
def test_a_cuda_session_opens_its_device_and_shares_its_stream(graph_dir, model_dirs, monkeypatch, lands_on_cuda):
    """The CUDA branch of OnnxDecoder, with ONNX Runtime's CPU provider dressed up as CUDA and a
    HostDevice standing in for CudaDevice: the device opened for the provider's device_id, its
    stream passed as user_compute_stream, enable_cuda_graph declared; a session that ONNX Runtime
    left on the CPU provider after all takes the host path."""
    import onnxruntime as ort

    opened, sessions = [], []

    class StandInCudaDevice(devices.HostDevice):
        stream = 0x5150

        def __init__(self, device_id):
            super().__init__()
            self.device_id = device_id
            opened.append(self)

    class CudaLookingSession(ort.InferenceSession):
        def __init__(self, path, options, providers, provider_options):
            sessions.append((providers, provider_options))
            super().__init__(path, options, providers=["CPUExecutionProvider"])

        def get_providers(self):
            return ["CUDAExecutionProvider", "CPUExecutionProvider"] if lands_on_cuda else ["CPUExecutionProvider"]

    monkeypatch.setattr(devices, "CudaDevice", StandInCudaDevice, raising=False)
    monkeypatch.setattr(ort, "InferenceSession", CudaLookingSession)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(executors.decoder, "cuda_unavailable_reason", lambda ort: "")
    config = og.Config(graph_dir)
    config.set_provider_option("cuda", "device_id", "0")
    engine, executor = open_engine(og.Model(config))
    [(providers, options)] = sessions
    assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert options[0] == {"enable_cuda_graph": "1", "device_id": "0", "user_compute_stream": str(0x5150)}
    [device] = opened
    if not lands_on_cuda:
        assert type(executor) is executors.OnnxEngineExecutor
        return
    assert executor.device is device and executor.cuda_graph
    session = executor.session = RecordingSession(executor.session)
    assert run_jobs(engine) == streams(model_dirs["plain"])
    assert any(g != "-1" for g in session.graph_ids)


@pytest.fixture(scope="module")
def emulated_kernels(tmp_path_factory):
    from kernel_emulation import EmulatedKernels, build_emulated_kernels

    return EmulatedKernels(build_emulated_kernels(str(tmp_path_factory.mktemp("emulated_kernels"))))


@pytest.mark.parametrize("name", ["plain", "hybrid"])
def test_device_sampling_and_state_copies_through_the_kernels(model_dirs, emulated_kernels, name):
    """The whole GPU pipeline short of CUDA itself: the engine selects every row through
    OgaExtDeviceOps.sample (oga.device_ops.DeviceOps launching the kernels of cuda/, run here by the
    CPU emulator), the hybrid model's fixed state moves through the gather kernel, and every stream
    (greedy and seeded sampling) equals the host path's."""
    path = model_dirs[name]
    host = streams(path)
    engine, executor = open_engine(load(path, lambda: devices.HostDevice(kernels=emulated_kernels)))
    assert executor.logits_on_device == 1
    launches = len(emulated_kernels.launches)
    assert run_jobs(engine) == host
    counters = testing.engine_counters(engine)
    # every selection: each token, plus the EOS that ended a turn early
    assert sum(map(len, host)) <= counters["device_sampled_rows"] <= sum(map(len, host)) + len(JOBS)
    assert counters["host_read_logits_rows"] == 0
    names = {launch[0] for launch in emulated_kernels.launches[launches:]}
    assert {"oga_sample_f32"} <= names
    if name == "hybrid":
        assert "oga_gather_rows" in names
