"""Device selection for ONNX Runtime sessions (issue 8): CUDA only where the session can really run
on it; otherwise a clear reason -- a warning and the CPU path for a decoder that runs on CPU, an
error naming the reason for one that cannot (PagedAttention has no CPU kernel). Never a crash."""
import json
import os
import shutil
import warnings

import pytest

import oga as og
from oga import executor as executors
from oga.models import build
from oga.models.random_weights import tiny_spec


@pytest.fixture(scope="module")
def cpu_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cpu"))
    build(None, path, random_spec=tiny_spec(vocab_size=97, context_length=64), seed=1, block_size=4)
    return path


def test_a_cuda_decoder_without_cuda_names_the_reason(tmp_path):
    import onnxruntime as ort

    path = str(tmp_path / "cuda")
    build(None, path, target="cuda", random_spec=tiny_spec(vocab_size=97, context_length=64), seed=1)
    reason = executors.cuda_unavailable_reason(ort)
    assert reason  # no GPU on this machine
    with pytest.raises(RuntimeError) as error:
        og.Model(path)
    assert "needs CUDA (com.microsoft.PagedAttention has no CPU kernel in ONNX Runtime)" in str(error.value)
    assert reason in str(error.value)


def test_a_decoder_that_asks_for_cuda_runs_on_cpu_with_a_warning(cpu_model, tmp_path):
    path = str(tmp_path / "asks_cuda")
    shutil.copytree(cpu_model, path)
    config_path = os.path.join(path, "genai_config.json")
    config = json.load(open(config_path))
    config["model"]["decoder"].setdefault("session_options", {})["provider_options"] = [{"cuda": {}}]
    json.dump(config, open(config_path, "w"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = og.Model(path)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("asks for CUDA; running on CPU because" in m for m in messages), messages
    def tokens_of(loaded):
        engine = og.Engine(loaded)
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(3)
        options.set_min_generated_tokens(3)
        request.begin_turn([5, 6, 7], options)
        buffer = engine.create_event_buffer(8)
        tokens = []
        while engine.has_pending_requests():
            tokens += [e.token for e in engine.run(buffer) if e.flags & og.EngineEventFlags.TOKEN]
        return tokens

    # the same CPU run as the directory without the cuda entry gives
    assert tokens_of(model) == tokens_of(og.Model(cpu_model))
    assert len(tokens_of(model)) == 3


def test_a_cpu_decoder_loads_without_warnings(cpu_model):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        og.Model(cpu_model)
