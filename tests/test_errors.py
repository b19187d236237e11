"""Typed errors: every failed core call raises oga.OgaError (a RuntimeError, as onnxruntime-genai's
errors are, with the C API's exact message) whose `kind` names the core's error type
(OgaExtResultGetErrorKind); an allocation failure returns one static result that OgaDestroyResult
leaves alone."""
import ctypes
import threading
from ctypes import byref, c_size_t

import pytest

import oga as og
import oga.testing as ogt
from capi import Handles, P, config, lib, ok  # noqa: F401 (lib is a fixture)


def test_a_caller_mistake_is_an_api_error_with_the_c_message():
    engine = og.Engine(ogt.create_test_model())
    request = engine.create_request()
    request.close()
    with pytest.raises(og.OgaError) as info:
        request.begin_turn([5, 9, 13])
    assert isinstance(info.value, RuntimeError)
    assert str(info.value) == "Cannot use a closed request."
    assert info.value.kind is og.ErrorKind.API


def test_a_call_from_another_thread_is_an_api_error():
    engine = og.Engine(ogt.create_test_model())
    errors = []

    def call():
        try:
            engine.create_request()
        except og.OgaError as error:
            errors.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    [error] = errors
    assert error.kind is og.ErrorKind.API
    assert str(error) == "Engine operations must be called from the Engine owner thread."


def test_an_allocation_failure_is_an_out_of_memory_error():
    """An allocation failure while planning a step escapes Run (the engine stays healthy)."""
    model = ogt.create_test_model()
    engine = og.Engine(model)
    request = engine.create_request()
    request.begin_turn([5, 9, 13])
    buffer = engine.create_event_buffer(4)
    ogt.inject_fault(model, "plan", kind="retryable")  # the planner's std::bad_alloc
    with pytest.raises(og.OgaError) as info:
        engine.run(buffer)
    assert info.value.kind is og.ErrorKind.OUT_OF_MEMORY
    assert str(info.value) == "std::bad_alloc"
    assert len(engine.run(buffer)) == 1  # nothing changed: the next run delivers the first token


def test_the_out_of_memory_result_is_static_and_never_freed(lib):
    lib.OgaExtResultGetErrorKind.restype = ctypes.c_uint32
    lib.OgaExtResultGetErrorKind.argtypes = [ctypes.c_void_p]
    model = P()
    ok(lib, lib.OgaExtCreateTestModel(config(), byref(model)))
    handles = Handles(lib, model)
    request = handles.request()
    handles.begin(request, [5, 9, 13])
    buffer = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(handles.engine, 4, byref(buffer)))
    results = []
    for _ in range(2):
        ok(lib, lib.OgaExtTestModelInjectFault(model, 0, 1, 0, 1))  # phase Plan, an allocation failure
        results.append(lib.OgaEngineRun(handles.engine, buffer))
    assert results[0] is not None and results[0] == results[1]  # the one static result
    assert [lib.OgaExtResultGetErrorKind(r) for r in results] == [int(og.ErrorKind.OUT_OF_MEMORY)] * 2
    for result in results:
        lib.OgaDestroyResult(result)  # a no-op for the static result: destroying it twice is safe
    assert lib.OgaResultGetError(results[0]) == b"std::bad_alloc"
    assert lib.OgaExtResultGetErrorKind(None) == int(og.ErrorKind.NONE)
    # an ordinary failure is a fresh result of kind Api
    bad = lib.OgaCreateEngineEventBuffer(handles.engine, c_size_t(4), None)
    assert bad is not None and bad != results[0]
    assert lib.OgaExtResultGetErrorKind(bad) == int(og.ErrorKind.API)
    lib.OgaDestroyResult(bad)
    lib.OgaDestroyEngineEventBuffer(buffer)
    lib.OgaDestroyRequest(request)
    handles.destroy()
    lib.OgaDestroyModel(model)


def test_error_kinds_are_the_c_constants():
    assert [int(k) for k in og.ErrorKind] == list(range(8))
    assert [k.name for k in og.ErrorKind] == ["NONE", "API", "CONTRACT", "RETRYABLE", "DEVICE", "INTERRUPTED",
                                             "OUT_OF_MEMORY", "INTERNAL"]
