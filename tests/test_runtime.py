"""Module-level functions of onnxruntime-genai 0.18 (oga/runtime.py) and og.Tensor."""
import inspect

import numpy as np
import pytest

import oga as og

import onnxruntime as ort  # noqa: E402  (test dependencies: a missing one fails, never skips)
import onnxruntime_genai as ref  # noqa: E402


def test_every_0_18_module_function_exists():
    functions = [name for name in dir(ref) if not name.startswith("_") and inspect.isbuiltin(getattr(ref, name))]
    assert "is_cuda_available" in functions and "set_log_options" in functions
    missing = [name for name in functions if not callable(getattr(og, name, None))]
    assert missing == []


def test_tokenizer_classes_exist():
    for name in ("Tokenizer", "TokenizerStream", "Tensor", "Config", "Model"):
        assert hasattr(og, name), name


@pytest.mark.parametrize("function, provider", [
    ("is_cuda_available", "CUDAExecutionProvider"),
    ("is_dml_available", "DmlExecutionProvider"),
    ("is_rocm_available", "ROCMExecutionProvider"),
    ("is_openvino_available", "OpenVINOExecutionProvider"),
    ("is_qnn_available", "QNNExecutionProvider"),
    ("is_webgpu_available", "WebGpuExecutionProvider"),
])
def test_availability_follows_onnxruntime(function, provider):
    result = getattr(og, function)()
    assert result is (provider in ort.get_available_providers())


def test_availability_without_onnxruntime(monkeypatch):
    import oga.runtime

    monkeypatch.setattr(oga.runtime, "_onnxruntime", lambda: None)
    assert og.is_cuda_available() is False


def test_telemetry_switches_return_none():
    assert og.disable_telemetry_events() is None
    assert og.enable_telemetry_events() is None
    assert og.disable_telemetry_events() is None


def test_gpu_device_id():
    try:
        assert og.get_current_gpu_device_id() == 0
        assert og.set_current_gpu_device_id(1) is None
        assert og.get_current_gpu_device_id() == 1
        with pytest.raises(ValueError):
            og.set_current_gpu_device_id(-1)
        with pytest.raises(TypeError):
            og.set_current_gpu_device_id("0")
    finally:
        og.set_current_gpu_device_id(0)


def test_log_options_like_0_18(tmp_path):
    import oga.runtime

    saved = oga.runtime.log_options()
    try:
        # Accepted by both: 0.18's bool options and the filename string.
        options = dict(enabled=False, ansi_tags=False, warning=True, generate_next_token=True,
                       append_next_tokens=False, hit_eos=True, hit_max_length=False, model_input_values=False,
                       model_output_shapes=False, model_output_values=False, model_logits=False,
                       ort_lib=False, value_stats=False)
        assert ref.set_log_options(**options) is None
        assert og.set_log_options(**options) is None
        assert og.set_log_options() is None
        # Rejected by both with RuntimeError: unknown names, wrong value types.
        for bad in ({"foo": True}, {"enabled": 1}, {"enabled": "yes"}, {"filename": True}):
            with pytest.raises(RuntimeError):
                ref.set_log_options(**bad)
            with pytest.raises(RuntimeError):
                og.set_log_options(**bad)
        with pytest.raises(RuntimeError, match="Unknown log option type, can be bool/string:enabled"):
            og.set_log_options(enabled=1.5)
        # A rejected call changes nothing, even the options before the bad one.
        og.set_log_options(hit_eos=False)
        with pytest.raises(RuntimeError):
            og.set_log_options(hit_eos=True, foo=True)
        assert oga.runtime.log_options()["hit_eos"] is False
    finally:
        ref.set_log_options(enabled=False)
        oga.runtime._log_options.update(saved)


def test_log_callback_and_file(tmp_path):
    import oga.runtime

    saved = oga.runtime.log_options()
    lines = []
    try:
        og.set_log_callback(lines.append)
        oga.runtime.log("warning", "not enabled")
        og.set_log_options(enabled=True, warning=True)
        oga.runtime.log("warning", "hello")
        oga.runtime.log("hit_eos", "option off")
        assert lines == ["warning: hello"]
        og.set_log_callback(None)
        path = tmp_path / "log.txt"
        og.set_log_options(filename=str(path))
        oga.runtime.log("warning", "to file")
        assert path.read_text() == "warning: to file\n"
        with pytest.raises(TypeError):
            og.set_log_callback(5)
    finally:
        og.set_log_callback(None)
        oga.runtime._log_options.update(saved)


def test_execution_provider_libraries():
    with pytest.raises(RuntimeError, match="Failed to register execution provider library 'foo'"):
        og.register_execution_provider_library("foo", "/nonexistent/libfoo.so")
    with pytest.raises(RuntimeError, match="foo was not registered"):
        og.unregister_execution_provider_library("foo")


def test_tensor():
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    tensor = og.Tensor(array)
    assert tensor.shape() == [2, 3]
    assert tensor.type() == og.ElementType.int32 == 6
    np.testing.assert_array_equal(tensor.as_numpy(), array)
    assert og.Tensor(np.zeros(4, np.float32)).type() == og.ElementType.float32
    reference = ref.Tensor(array)
    assert reference.shape() == tensor.shape()
    with pytest.raises(TypeError):
        og.Tensor([1, 2])
