"""Ctrl-C never poisons: a BaseException that is not an Exception (KeyboardInterrupt from a signal
handler, SystemExit, GeneratorExit) raised by Python code inside a callback the core runs -- the
ONNX Runtime executor, its device operations, the model and token-table loaders, the tokenizer --
rolls the step back as Retryable (OgaExtExecutionStatus_Interrupted), leaves the engine healthy and
is raised from the Python method whose core call ran the callback once that call returns. The
interrupted Run delivers nothing; the next one delivers the retained Retryable event. Exceptions
keep their classification (capacity for out-of-memory, fatal otherwise).

The core side runs on the test model (fault kind "interrupted" at the executor, the simulated
device and the fixed-state pool); the Python side on a real paged decoder built by oga.models."""
import signal
import time
import warnings

import pytest

import oga as og
import oga.testing as ogt
from helpers import (E_RETRYABLE, R_NONE, RETRYABLE, TOKEN, Job, OracleSequence, Turn, counters, drive,
                     expected_workload, make_engine, prompt_without_eos, run_once, run_workload, turn_options)
from oga import executor as executors
from greedy_runs import begin_all
from model_dirs import EXECUTOR_SPEC, executor_model_dir
from static_models import tiny_llama_static_dir  # noqa: F401  (fixture)
from test_hybrid_engine import TENSORS, hybrid_cfg

RETRY_EVENT = (RETRYABLE, 0, None, R_NONE, E_RETRYABLE, (0, 0, 0))


@pytest.fixture(scope="module", autouse=True)
def python_executor():
    """The ONNX Runtime side of these tests interrupts the Python executor's callbacks
    (OGA_EXECUTOR=python); a native step runs no Python (tests/test_native_executor.py covers
    Ctrl-C there)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OGA_EXECUTOR", "python")
        yield
INTERRUPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit]


# ---------------------------------------------------------------------------------------------
# The core: OgaExtExecutionStatus_Interrupted
# ---------------------------------------------------------------------------------------------

CFG = dict(max_scheduled_tokens=8, chunk_size=3, max_batch_size=4)
JOBS = [
    Job([Turn([5, 9, 13, 2, 3, 4, 5], max_gen=8), Turn([7, 8], max_gen=5)]),
    Job([Turn([7, 7], max_gen=10)]),
    Job([Turn(list(range(20, 30)), max_gen=6), Turn([3], max_gen=4)]),
    Job([Turn(list(range(30, 43)), max_gen=5)], start_run=4),
]


def _interrupted_once(cfg, jobs, fault):
    """The workload with `fault` (kind "interrupted") equals the clean one but for one Retryable
    event and one rolled-back step, and nothing is left allocated."""
    clean = run_workload(cfg, jobs)
    assert clean.per_job == expected_workload(jobs, cfg) and clean.engine_events == []
    result = run_workload(cfg, jobs, fault=dict(kind="interrupted", **fault))
    assert result.engine_events == [RETRY_EVENT]
    assert result.per_job == clean.per_job
    assert result.counters["rolled_back_steps"] == 1
    assert result.counters["committed_steps"] == clean.counters["committed_steps"]
    assert result.counters["free_blocks"] == result.counters["total_blocks"]
    return clean, result


@pytest.mark.parametrize("skip", [0, 1, 5, 9, 13])
def test_an_interrupted_execution_is_rolled_back_and_retried(skip):
    clean, result = _interrupted_once(CFG, JOBS, dict(phase="execute", skip=skip))
    assert result.counters["model_runs"] == clean.counters["model_runs"] + 1
    assert result.runs == clean.runs + 2  # the interrupted Run and the one delivering its event


def test_an_interrupted_run_delivers_nothing_and_changes_nothing_committed():
    model, engine = make_engine()
    requests = [engine.create_request() for _ in range(2)]
    prompts = [prompt_without_eos(8, length=5), prompt_without_eos(8, length=2, offset=1)]
    for request, prompt in zip(requests, prompts):
        request.begin_turn(prompt, turn_options(request, max_gen=8))
    buffer = engine.create_event_buffer(16)
    first = run_once(engine, buffer)
    assert [e.request for e in first] == requests
    view = buffer[0]
    before = counters(engine)
    ogt.inject_fault(model, "execute", "interrupted")
    assert run_once(engine, buffer) == []  # returned at once, nothing delivered
    with pytest.raises(RuntimeError, match="stale"):
        view.flags  # the buffer was run again all the same
    after = counters(engine)
    assert after["rolled_back_steps"] == before["rolled_back_steps"] + 1
    assert after["model_runs"] == before["model_runs"] + 1
    for name in ("committed_steps", "free_blocks", "resident_requests", "waiting_requests"):
        assert after[name] == before[name], name
    assert after["retained_events"] == 1
    assert engine.has_pending_requests()
    [event] = run_once(engine, buffer)
    assert (event.request, event.flags, event.error_code) == (None, RETRYABLE, E_RETRYABLE)
    rest = drive(engine, buffer)
    tokens = {id(r): [e.token for e in first + rest if e.request is r and e.flags & TOKEN] for r in requests}
    for request, prompt in zip(requests, prompts):
        assert tokens[id(request)] == OracleSequence().turn(prompt, max_gen=8)[0]


@pytest.mark.parametrize("device_sampling, phase", [(True, "device_sample"), (False, "device_copy")])
@pytest.mark.parametrize("skip", [0, 4])
def test_an_interrupted_device_selection_is_rolled_back(device_sampling, phase, skip):
    cfg = dict(CFG, num_blocks=64, device_ops=True, device_logits=True, device_sampling=device_sampling)
    _interrupted_once(cfg, JOBS, dict(phase=phase, skip=skip))


@pytest.mark.parametrize("skip", [0, TENSORS])  # the reservation's gather; commit preparation's copies
def test_an_interrupted_fixed_state_copy_is_rolled_back(skip):
    cfg = hybrid_cfg(max_batch_size=4, max_scheduled_tokens=8, num_blocks=64, device_ops=True)

    def fallback_only(engine):
        ogt.set_fixed_state_fallback_only(engine, True)  # every step gathers, then stages

    clean = run_workload(cfg, JOBS, setup=fallback_only)
    result = run_workload(cfg, JOBS, setup=fallback_only,
                          fault=dict(phase="device_copy", kind="interrupted", skip=skip + 2 * TENSORS))
    assert result.engine_events == [RETRY_EVENT]
    assert result.per_job == clean.per_job == expected_workload(JOBS, cfg)
    assert result.counters["rolled_back_steps"] == 1


@pytest.mark.parametrize("skip", [0, 3])
def test_an_interrupted_fixed_state_preparation_leaves_the_pool_healthy(skip):
    _interrupted_once(hybrid_cfg(max_batch_size=4, max_scheduled_tokens=8, num_blocks=64), JOBS,
                      dict(phase="fixed_state_prepare", skip=skip))


# ---------------------------------------------------------------------------------------------
# The Python callbacks
# ---------------------------------------------------------------------------------------------

SPEC = EXECUTOR_SPEC
PROMPTS = [[5, 9, 13], [7] * 20, [11, 12, 13, 14, 15, 16, 17, 18, 19], list(range(3, 50)), [3, 4]]
MAX_NEW = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return executor_model_dir(tmp_path_factory, "tiny-llama")


@pytest.fixture(scope="module")
def model(model_dir):
    return og.Model(model_dir)


def _open(model):
    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = og.Engine(model)
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    return engine, executor


def _begin(engine, prompts=PROMPTS, max_new=MAX_NEW):
    return begin_all(og, engine, prompts, max_new)


def _collect(buffer, tokens, engine_events):
    for event in buffer:
        assert not event.flags & og.EngineEventFlags.FAILED, event.error_code
        if event.request is None:
            engine_events.append((event.flags, event.error_code))
        elif event.flags & og.EngineEventFlags.TOKEN:
            tokens.setdefault(id(event.request), []).append(event.token)


def _drain(engine, requests, buffer, tokens=None, engine_events=None, limit=5000):
    tokens = {} if tokens is None else tokens
    engine_events = [] if engine_events is None else engine_events
    for _ in range(limit):
        if not engine.has_pending_requests():
            return [tokens.get(id(r), []) for r in requests], engine_events
        _collect(engine.run(buffer), tokens, engine_events)
        ogt.check_invariants(engine)
    raise AssertionError("the engine did not finish")


@pytest.fixture(scope="module")
def uninterrupted(model):
    engine, _ = _open(model)
    requests = _begin(engine)
    tokens, events = _drain(engine, requests, engine.create_event_buffer(64))
    assert events == [] and all(tokens)
    return tokens


class Once:
    """Wraps `function`: call number `at` raises `error` (before or after calling through)."""

    def __init__(self, function, error, at=0, after=False):
        self.function, self.error, self.at, self.after, self.calls = function, error, at, after, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls - 1 == self.at and not self.after:
            raise self.error()
        result = self.function(*args, **kwargs)
        if self.calls - 1 == self.at:
            raise self.error()
        return result


class Session:
    """A session whose run_with_iobinding is `run` (the executor looks it up on every step)."""

    def __init__(self, session, run):
        self._session, self.run_with_iobinding = session, run

    def __getattr__(self, name):
        return getattr(self._session, name)


@pytest.mark.parametrize("error", INTERRUPTIONS)
@pytest.mark.parametrize("after", [False, True], ids=["before-the-session-run", "after-the-session-run"])
@pytest.mark.parametrize("at", [0, 3])  # the first prefill; a decode step
def test_an_interruption_inside_the_executor_reaches_the_caller_and_the_engine_carries_on(
        model, uninterrupted, error, after, at):
    engine, executor = _open(model)
    requests = _begin(engine)
    buffer = engine.create_event_buffer(64)
    tokens, engine_events = {}, []
    for _ in range(at):
        _collect(engine.run(buffer), tokens, engine_events)
    before = ogt.engine_counters(engine)
    # after=True: the caches were already written in place by the session run the step then drops
    executor.session = Session(executor.session, Once(executor.session.run_with_iobinding, error, after=after))
    with pytest.raises(error):
        engine.run(buffer)
    ogt.check_invariants(engine)
    counts = ogt.engine_counters(engine)
    for name in ("committed_steps", "free_blocks", "resident_requests", "waiting_requests"):
        assert counts[name] == before[name], name
    assert counts["rolled_back_steps"] == before["rolled_back_steps"] + 1
    assert engine.has_pending_requests()  # healthy: the next Run delivers the step's Retryable event
    [event] = list(engine.run(buffer))
    assert (event.request, event.flags, event.error_code) == (
        None, og.EngineEventFlags.RETRYABLE, og.EngineErrorCode.RETRYABLE_EXECUTION)
    got, engine_events = _drain(engine, requests, buffer, tokens, engine_events)
    assert engine_events == [] and got == uninterrupted


@pytest.mark.parametrize("error, code", [
    (lambda: ValueError("bad binding"), og.EngineErrorCode.ENGINE_EXECUTION_FAILURE),
    (lambda: RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code"),
     og.EngineErrorCode.ENGINE_EXECUTION_FAILURE),
    (lambda: MemoryError(), og.EngineErrorCode.EXECUTION_CAPACITY_EXCEEDED),
])
def test_exceptions_from_the_executor_keep_their_classification(model, error, code):
    engine, executor = _open(model)
    [request] = _begin(engine, PROMPTS[:1])
    buffer = engine.create_event_buffer(8)
    executor.session = Session(executor.session, Once(executor.session.run_with_iobinding, error))
    [event] = list(engine.run(buffer))
    assert event.error_code == code
    if code == og.EngineErrorCode.EXECUTION_CAPACITY_EXCEEDED:
        assert event.flags == og.EngineEventFlags.CAPACITY_BLOCKED
        assert list(engine.run(buffer))  # rolled back, runs again
        return
    assert event.flags & og.EngineEventFlags.FAILED and event.request is request
    with pytest.raises(RuntimeError, match="no longer healthy. Cause: "):
        engine.run(buffer)


class AlarmTimeout(RuntimeError):
    """What the caller's SIGALRM handler raises (an ordinary exception, as timeout handlers raise)."""


def _alarm_timeout(signum, frame):
    raise AlarmTimeout("the step took too long")


class SignalOnce:
    """A session's run_with_iobinding that raises SIGALRM once (call number `at`, before or after
    calling through): the caller's handler then runs inside the executor, as it does when the
    signal arrives while ONNX Runtime runs the step."""

    def __init__(self, function, at=0, after=False):
        self.function, self.at, self.after, self.calls = function, at, after, 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls - 1 == self.at and not self.after:
            signal.raise_signal(signal.SIGALRM)
        result = self.function(*args)
        if self.calls - 1 == self.at:
            signal.raise_signal(signal.SIGALRM)
        return result


@pytest.fixture
def alarm_handler():
    previous = signal.signal(signal.SIGALRM, _alarm_timeout)
    yield
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("after", [False, True], ids=["before-the-session-run", "after-the-session-run"])
@pytest.mark.parametrize("at", [0, 3])  # the first prefill; a decode step
def test_an_exception_from_the_callers_signal_handler_is_an_interruption(
        model, device_model, uninterrupted, alarm_handler, path, after, at):
    """An ordinary exception that the caller's own signal handler raises while engine.run executes
    the model (a RuntimeError from a SIGALRM timeout) is the caller's, as a KeyboardInterrupt is: the
    step rolls back, run raises it, the engine and every request carry on."""
    engine, executor = _open(model if path == "host" else device_model)
    assert isinstance(executor, executors.DeviceOnnxEngineExecutor) == (path == "device")
    requests = _begin(engine)
    buffer = engine.create_event_buffer(64)
    tokens, engine_events = {}, []
    for _ in range(at):
        _collect(engine.run(buffer), tokens, engine_events)
    before = ogt.engine_counters(engine)
    executor.session = Session(executor.session, SignalOnce(executor.session.run_with_iobinding, after=after))
    with pytest.raises(AlarmTimeout, match="the step took too long"):
        engine.run(buffer)
    assert len(buffer) == 0
    ogt.check_invariants(engine)
    counts = ogt.engine_counters(engine)
    for name in ("committed_steps", "free_blocks", "resident_requests", "waiting_requests"):
        assert counts[name] == before[name], name
    assert counts["rolled_back_steps"] == before["rolled_back_steps"] + 1
    got, engine_events = _drain(engine, requests, buffer, tokens, engine_events)
    assert engine_events == [(og.EngineEventFlags.RETRYABLE, og.EngineErrorCode.RETRYABLE_EXECUTION)]
    assert got == uninterrupted


def test_the_same_exception_raised_by_the_executor_itself_stays_fatal(model, alarm_handler):
    """Only the signal handler's exceptions are the caller's: the executor's own are failures."""
    engine, executor = _open(model)
    [request] = _begin(engine, PROMPTS[:1])
    buffer = engine.create_event_buffer(8)
    executor.session = Session(executor.session,
                               Once(executor.session.run_with_iobinding, lambda: AlarmTimeout("not a signal")))
    [event] = list(engine.run(buffer))
    assert event.flags & og.EngineEventFlags.FAILED and event.request is request
    with pytest.raises(RuntimeError, match="no longer healthy. Cause: AlarmTimeout: not a signal"):
        engine.run(buffer)


def test_an_interruption_in_the_executor_outside_the_session_run(model, uninterrupted, monkeypatch):
    """Raised from the executor's own Python code (binding a step), not from ONNX Runtime's."""
    engine, executor = _open(model)
    requests = _begin(engine)
    buffer = engine.create_event_buffer(64)
    monkeypatch.setattr(executor, "_bind_output", Once(executor._bind_output, KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        engine.run(buffer)
    monkeypatch.undo()
    got, engine_events = _drain(engine, requests, buffer)
    assert engine_events == [(og.EngineEventFlags.RETRYABLE, og.EngineErrorCode.RETRYABLE_EXECUTION)]
    assert got == uninterrupted


def test_a_log_callback_interrupted_inside_the_executor(model, uninterrupted, monkeypatch):
    """The log callback is Python called by Python (the core never logs): a KeyboardInterrupt it
    raises while the executor logs is the executor's interruption."""
    engine, executor = _open(model)
    requests = _begin(engine)
    buffer = engine.create_event_buffer(64)
    real_run = executor.session.run_with_iobinding

    def logging_run(binding, *args):
        og.runtime.log("model_output_shapes", "step")
        return real_run(binding, *args)

    def callback(line):
        raise KeyboardInterrupt

    monkeypatch.setattr(executor, "session", Session(executor.session, logging_run))
    og.set_log_options(enabled=True, model_output_shapes=True)
    og.set_log_callback(callback)
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.run(buffer)
    finally:
        og.set_log_callback(None)
        og.set_log_options(enabled=False, model_output_shapes=False)
    got, engine_events = _drain(engine, requests, buffer)
    assert engine_events == [(og.EngineEventFlags.RETRYABLE, og.EngineErrorCode.RETRYABLE_EXECUTION)]
    assert got == uninterrupted


# Modules whose Python code runs only inside core calls here (through the _core.pyx trampolines).
CALLBACK_MODULES = ("oga.executor.decoder", "oga.executor.host", "oga.executor.device_path", "oga.executor.static",
                    "oga.device_ops", "oga.device")


def _inside_core_calls(frame):
    """Whether the interrupted Python frame runs inside a core call -- the executor or what it calls
    (ONNX Runtime's Python wrapper, numpy)."""
    f = frame
    while f is not None:
        if f.f_globals.get("__name__") in CALLBACK_MODULES:
            return True
        f = f.f_back
    return False


def _interrupt_inside_core_calls(signum, frame):
    """A SIGALRM handler: signal.default_int_handler (KeyboardInterrupt) whenever the interrupted
    Python frame runs inside a core call. One that lands in the driving loop's own code is dropped,
    so the loop's bookkeeping stays exact (keeping a caller's own code safe from a signal storm is
    the caller's business)."""
    if _inside_core_calls(frame):
        signal.default_int_handler(signum, frame)


def _timeout_inside_core_calls(signum, frame):
    """The same storm with an ordinary exception, as a timeout handler raises."""
    if _inside_core_calls(frame):
        raise AlarmTimeout("the step took too long")


@pytest.mark.parametrize("handler, error", [(_interrupt_inside_core_calls, KeyboardInterrupt),
                                            (_timeout_inside_core_calls, AlarmTimeout)])
def test_a_sigalrm_storm_over_whole_generations(model, uninterrupted, handler, error):
    """setitimer(1 ms) -> KeyboardInterrupt (or the handler's own exception) during several whole
    generations of five requests: the caller catches them and keeps calling run; every request
    finishes with exactly the uninterrupted greedy tokens, no event fails, the engine stays healthy."""
    previous = signal.signal(signal.SIGALRM, handler)
    interrupts = generations = retries = runs = 0
    deadline = time.monotonic() + 8.0
    try:
        while generations < 3 or (interrupts < 10 and time.monotonic() < deadline):
            engine, _ = _open(model)
            requests = _begin(engine)
            buffer = engine.create_event_buffer(64)
            tokens, engine_events = {}, []
            signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
            try:
                for _ in range(20000):
                    if not engine.has_pending_requests():
                        break
                    runs += 1
                    try:
                        engine.run(buffer)
                    except error:
                        interrupts += 1
                        assert len(buffer) == 0  # an interrupted Run delivers nothing
                        continue
                    _collect(buffer, tokens, engine_events)
                else:
                    raise AssertionError("the engine did not finish")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0, 0)
            assert [tokens.get(id(r), []) for r in requests] == uninterrupted
            assert set(engine_events) <= {(og.EngineEventFlags.RETRYABLE, og.EngineErrorCode.RETRYABLE_EXECUTION)}
            retries += len(engine_events)
            ogt.check_invariants(engine)
            generations += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
    print(f"{generations} generations, {runs} runs, {interrupts} interrupts")
    assert interrupts > 0
    assert retries == interrupts  # each interrupt rolled one step back, retried by a later run


@pytest.mark.parametrize("after", [False, True], ids=["before-the-session-run", "after-the-session-run"])
def test_an_interruption_inside_the_static_executor(tiny_llama_static_dir, after):
    """The static batching path (execute_static, contiguous caches updated in place)."""
    prompts, max_new = [[5, 9, 13, 17], [7, 8]], 6
    model = og.Model(tiny_llama_static_dir)
    engine, _ = _open(model)
    expected, events = _drain(engine, _begin(engine, prompts, max_new), engine.create_event_buffer(16))
    assert events == [] and all(expected)
    engine, executor = _open(model)
    requests = _begin(engine, prompts, max_new)
    buffer = engine.create_event_buffer(16)
    tokens, events = {}, []
    _collect(engine.run(buffer), tokens, events)  # the prefill
    executor.session = Session(executor.session,
                               Once(executor.session.run_with_iobinding, KeyboardInterrupt, after=after))
    with pytest.raises(KeyboardInterrupt):
        engine.run(buffer)
    got, events = _drain(engine, requests, buffer, tokens, events)
    assert events == [(og.EngineEventFlags.RETRYABLE, og.EngineErrorCode.RETRYABLE_EXECUTION)]
    assert got == expected


# ---------------------------------------------------------------------------------------------
# Loaders, engine creation, device operations, token text
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("error", INTERRUPTIONS)
def test_an_interrupted_model_load_raises_the_interruption(model_dir, monkeypatch, error):
    monkeypatch.setattr(executors, "load_decoder", Once(executors.load_decoder, error))
    with pytest.raises(error):
        og.Model(model_dir)
    og.Engine(og.Model(model_dir))  # nothing left behind


def test_an_exception_in_the_model_loader_stays_a_runtime_error(model_dir, monkeypatch):
    monkeypatch.setattr(executors, "load_decoder", Once(executors.load_decoder, lambda: OSError("disk")))
    with pytest.raises(RuntimeError):
        og.Model(model_dir)


@pytest.mark.parametrize("error", INTERRUPTIONS)
def test_an_interrupted_engine_creation_raises_the_interruption(model, monkeypatch, error):
    real = executors.OnnxEngineExecutor.__init__
    raising = Once(real, error)
    monkeypatch.setattr(executors.OnnxEngineExecutor, "__init__", lambda self, *args: raising(self, *args))
    with pytest.raises(error):
        og.Engine(model)
    monkeypatch.undo()
    engine, _ = _open(model)
    requests = _begin(engine, PROMPTS[:1], 2)
    tokens, events = _drain(engine, requests, engine.create_event_buffer(4))
    assert events == [] and len(tokens[0]) == 2


@pytest.fixture(scope="module")
def device_model(model_dir):
    with warnings.catch_warnings(), ogt.device_path():
        warnings.simplefilter("ignore", RuntimeWarning)
        return og.Model(model_dir)


@pytest.mark.parametrize("after", [False, True], ids=["before-the-read", "after-the-read"])
def test_an_interrupted_device_operation_is_rolled_back(device_model, uninterrupted, monkeypatch, after):
    """The device path (oga.device.HostDevice on the CPU): the core reads logits rows back through
    DeviceOps.read, a Python callback of the core's own."""
    engine, executor = _open(device_model)
    assert isinstance(executor, executors.DeviceOnnxEngineExecutor) and executor.logits_on_device
    requests = _begin(engine)
    buffer = engine.create_event_buffer(64)
    ops = executor.decoder.device_ops
    tokens, events = {}, []
    _collect(engine.run(buffer), tokens, events)
    monkeypatch.setattr(ops, "read", Once(ops.read, KeyboardInterrupt, after=after))
    with pytest.raises(KeyboardInterrupt):
        engine.run(buffer)
    monkeypatch.undo()
    ogt.check_invariants(engine)
    got, events = _drain(engine, requests, buffer, tokens, events)
    assert events == [(og.EngineEventFlags.RETRYABLE, og.EngineErrorCode.RETRYABLE_EXECUTION)]
    assert got == uninterrupted


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory):
    from model_dirs import tiny_model_dir
    return tiny_model_dir(tmp_path_factory)


@pytest.mark.parametrize("error", INTERRUPTIONS)
def test_an_interrupted_token_table_load_fails_the_turn_without_effect(text_model_dir, monkeypatch, error):
    from oga import tokenizer
    engine = og.Engine(og.Model(text_model_dir))
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(4)
    options.set_stop_strings(["never-generated"])
    monkeypatch.setattr(tokenizer, "_engine_token_table", Once(tokenizer._engine_token_table, error))
    with pytest.raises(error):
        request.begin_turn([5, 6, 7], options)
    assert not engine.has_pending_requests()  # the turn did not begin
    assert request.begin_turn([5, 6, 7], options) == 1  # the table loads this time
    tokens, events = _drain(engine, [request], engine.create_event_buffer(8))
    assert events == [] and 0 < len(tokens[0]) <= 4


def test_an_exception_in_the_token_table_loader_stays_a_runtime_error(text_model_dir, monkeypatch):
    from oga import tokenizer
    engine = og.Engine(og.Model(text_model_dir))
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_stop_strings(["x"])
    monkeypatch.setattr(tokenizer, "_engine_token_table", Once(tokenizer._engine_token_table, lambda: OSError("io")))
    with pytest.raises(RuntimeError, match="failed to load: OSError: io"):
        request.begin_turn([5, 6, 7], options)


def test_an_interrupted_tokenizer_fails_a_guided_turn_without_effect(text_model_dir, monkeypatch):
    """Guidance asks the model's tokenizer for the tokens of text a grammar forces (at the turn's
    first mask, computed by begin_turn)."""
    pytest.importorskip("llguidance")
    from oga import tokenizer
    engine = og.Engine(og.Model(text_model_dir))
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(6)
    options.set_guidance("regex", "The capital")
    calls = Once(tokenizer._engine_tokenize, KeyboardInterrupt)
    monkeypatch.setattr(tokenizer, "_engine_tokenize", calls)
    with pytest.raises(KeyboardInterrupt):
        request.begin_turn([5, 6, 7], options)
    assert calls.calls == 1
    assert not engine.has_pending_requests()
    assert request.begin_turn([5, 6, 7], options) == 1
    tokens, events = _drain(engine, [request], engine.create_event_buffer(8))
    assert events == [] and tokens[0]


# ---------------------------------------------------------------------------------------------
# Ctrl-C during a process's first og.Model (onnxruntime's first import happens inside it)
# ---------------------------------------------------------------------------------------------

# The child: reports "loading", loads the model (its first og.Model: onnxruntime is imported inside
# it), then waits for an interrupt that came after the load; then loads it again and runs an engine
# on it. One JSON line: where the interrupt landed, and what the retry did (and the seconds of an
# uninterrupted load).
_FIRST_LOAD = r"""
import json, sys, time
import oga as og

path, interrupted = sys.argv[1], sys.argv[2] == "interrupted"
print("loading", flush=True)
start = time.perf_counter()
outcome = "in og.Model"
try:
    og.Model(path)
    outcome, seconds = "after the load", time.perf_counter() - start
    time.sleep(30 if interrupted else 0)  # where an interrupt later than the load lands
except KeyboardInterrupt:
    pass
except BaseException as error:
    outcome = f"{type(error).__name__}: {error}"
try:
    engine = og.Engine(og.Model(path))
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(2)
    request.begin_turn([5, 9, 13], options)
    buffer = engine.create_event_buffer(4)
    tokens = 0
    while engine.has_pending_requests():
        tokens += sum(1 for e in engine.run(buffer) if e.flags & og.EngineEventFlags.TOKEN)
    retry = f"{tokens} tokens"
except BaseException as error:
    retry = f"{type(error).__name__}: {error}"
print(json.dumps({"outcome": outcome, "seconds": None if interrupted else seconds, "retry": retry}), flush=True)
"""


def _first_load(model_dir, delay):
    """A fresh process whose first og.Model gets SIGINT (Ctrl-C) `delay` seconds after it starts
    (None: no signal); its JSON report."""
    import json
    import os
    import subprocess
    import sys

    from helpers import subprocess_env

    env = subprocess_env()
    env.pop("OGA_EXECUTOR", None)  # the default (native) executor, as a user runs it
    child = subprocess.Popen([sys.executable, "-c", _FIRST_LOAD, model_dir,
                              "calm" if delay is None else "interrupted"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline() == "loading\n", child.stderr.read()
        if delay is not None:
            time.sleep(delay)
            child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_ctrl_c_during_the_first_model_load_raises_keyboardinterrupt_and_the_next_load_works(model_dir):
    """onnxruntime's first import runs inside the first og.Model; a Ctrl-C that cut it half-way
    made og.Model raise "initialization failed" and left its types half-registered, so no later
    load could work ("generic_type: type ... is already registered!"). Over delays that spread
    across the whole first load, every trial ends with KeyboardInterrupt (in og.Model, or after it
    when the load was quicker than the delay) and a retry that loads and runs the model."""
    calm = _first_load(model_dir, None)
    assert calm["retry"] == "2 tokens", calm
    duration = calm["seconds"]
    delays = [duration * i / 12 for i in range(12)]
    trials = [(delay, _first_load(model_dir, delay)) for delay in delays]
    for delay, trial in trials:
        assert trial["outcome"] in ("in og.Model", "after the load"), (delay, trial)
        assert trial["retry"] == "2 tokens", (delay, trial)
    interrupted = sum(trial["outcome"] == "in og.Model" for _, trial in trials)
    print(f"first load {duration * 1e3:.0f} ms; {interrupted} of {len(trials)} interrupts landed in og.Model")
    assert interrupted >= len(trials) // 3, trials  # the delays reach into the load, however loaded the machine
