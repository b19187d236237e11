"""Build an OGA model directory (ONNX decoder + genai_config.json + tokenizer files).

    oga.models.build("SmolLM2-135M-Instruct.Q4_1.gguf", "out/smollm2")           # GGUF file
    oga.models.build("path/to/hf_dir", "out/qwen", target="cuda")                 # config.json + safetensors
    oga.models.build(None, "out/tiny", random_spec=tiny_spec())                   # random weights
    oga.models.build(None, "out/ring", chunk_size=32,                             # sliding-window ring
                     random_spec=tiny_spec(num_layers=4, sliding_window=64, sliding_window_layers=[0, 2]))
    oga.models.build(None, "out/hybrid",                                          # fixed-state layers
                     random_spec=tiny_spec(num_layers=4, layer_types=["conv", "attention", "recurrent", "attention"]))
"""

from __future__ import annotations

import json
import os
import sys
import time

from . import genai_config as cfg
from .linear_weights import DEFAULT_ACCURACY_LEVEL, check_accuracy_level, check_precision
from .spec import DecoderSpec, LoadedModel

MODEL_FILENAME = "model.onnx"
EXTERNAL_DATA_THRESHOLD = 1_500_000_000        # bytes of initializers above which weights go to model.onnx.data


def _say(progress, message):
    if progress:
        print(f"[oga.models] {message}", file=sys.stderr, flush=True)


def load_source(source, *, random_spec: DecoderSpec | None = None, seed: int = 0) -> LoadedModel:
    """A LoadedModel from a GGUF file, an HF directory (config.json + *.safetensors) or random weights."""
    if source is None:
        if random_spec is None:
            raise ValueError("build needs a source (GGUF file or Hugging Face directory) or random_spec")
        from .random_weights import random_model
        return random_model(random_spec, seed=seed)
    if random_spec is not None:
        raise ValueError("pass either a source or random_spec, not both")
    path = os.fspath(source)
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{path}: a Hugging Face model directory needs config.json")
        from .safetensors_loader import load_safetensors
        return load_safetensors(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (magic {magic!r}) and not a directory")
    from .gguf_loader import load_gguf
    return load_gguf(path)


GRAPHS = ("fused", "standard")


def build_graph(loaded: LoadedModel, *, target: str, block_size: int, context_length: int,
                per_token_logits: bool = False, logits_indices: bool = False, state_capture: bool | None = None,
                graph: str = "fused", precision: str | None = None,
                accuracy_level: int = DEFAULT_ACCURACY_LEVEL, kv_cache: str | None = None):
    """The decoder ModelProto for `target` ("cpu" or "cuda"); on cpu, `graph` "fused" (oga's
    operators, any precision) or "standard" (standard ONNX ops, fp32, also loads in onnxruntime-genai)."""
    if target == "cpu" and graph == "fused":
        from .onnx_cpu_fused import build_cpu_fused_graph
        return build_cpu_fused_graph(loaded.spec, loaded.weights, blocks=loaded.blocks, precision=precision,
                                     accuracy_level=accuracy_level, block_size=block_size,
                                     context_length=context_length, per_token_logits=per_token_logits,
                                     logits_indices=logits_indices, state_capture=state_capture, kv_cache=kv_cache)
    if target == "cpu":
        from .onnx_cpu import build_cpu_graph
        return build_cpu_graph(loaded.spec, loaded.weights, block_size=block_size,
                               per_token_logits=per_token_logits, logits_indices=logits_indices,
                               state_capture=state_capture)
    if target == "cuda":
        if state_capture:
            # the per-token fixed states exist for hybrid decoders, which only the CPU builder emits
            raise NotImplementedError("state_capture (per-token fixed state outputs) is built for the cpu target "
                                      "only")
        from .onnx_cuda import build_cuda_graph
        return build_cuda_graph(loaded.spec, loaded.weights, block_size=block_size,
                                context_length=context_length, per_token_logits=per_token_logits,
                                logits_indices=logits_indices)
    raise ValueError(f"target must be 'cpu' or 'cuda', got {target!r}")


def save_model(model, output_dir: str, filename: str = MODEL_FILENAME) -> str:
    """Write the ModelProto; weights go to `<filename>.data` when they exceed 1.5 GB."""
    import onnx
    path = os.path.join(output_dir, filename)
    data = path + ".data"
    if os.path.exists(data):
        os.remove(data)
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(data), size_threshold=1024)
    else:
        onnx.save_model(model, path)
    return path


def write_tokenizer_files(loaded: LoadedModel, output_dir: str) -> list[str]:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json when the source has them."""
    written = []
    if loaded.tokenizer_json is not None:
        with open(os.path.join(output_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(loaded.tokenizer_json)
        written.append("tokenizer.json")
    if loaded.tokenizer_config is not None:
        with open(os.path.join(output_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(loaded.tokenizer_config, f, indent=2, ensure_ascii=False)
        written.append("tokenizer_config.json")
        from .tokenizer_export import special_tokens_map
        with open(os.path.join(output_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
            json.dump(special_tokens_map(loaded.tokenizer_config), f, indent=2, ensure_ascii=False)
        written.append("special_tokens_map.json")
    return written


def build(source, output_dir, *, target: str = "cpu", block_size: int | None = None,
          num_blocks: int | None = None, max_batch_size: int = cfg.DEFAULT_MAX_BATCH_SIZE,
          max_scheduled_tokens: int = cfg.DEFAULT_MAX_SCHEDULED_TOKENS, context_length: int | None = None,
          per_token_logits: bool = False, logits_indices: bool = False, chunk_size: int | None = None,
          state_capture: bool | None = None, random_spec: DecoderSpec | None = None, seed: int = 0,
          graph: str = "fused", precision: str | None = None, accuracy_level: int = DEFAULT_ACCURACY_LEVEL,
          kv_cache: str | None = None, progress: bool = False) -> str:
    """Build a model directory at `output_dir` and return its path.

    `source`: a GGUF file, a Hugging Face directory (config.json + *.safetensors), or None with
    `random_spec` (random weights drawn from `seed`). `target` "cpu" (fp32, standard ops, block
    size 16 by default) or "cuda" (fp16 PagedAttention, block size 256 by default).
    `context_length` defaults to the model's, capped at 4096 on CPU. On CPU `num_blocks` defaults
    to enough blocks for `max_batch_size` requests of `context_length` tokens.
    `chunk_size` becomes search.chunk_size (the per-step query cap of a request); the engine sizes
    the ring of sliding-window ring layers (`DecoderSpec.sliding_window_layers`, cpu target only)
    from it, and it defaults to `max_scheduled_tokens` for them.
    `state_capture`: hybrid decoders also output every packed token's fixed state
    (`present.*.per_token`, see onnx_cpu), which the engine needs to verify drafts; None turns it on
    for hybrid decoders built with `per_token_logits`; it requires `per_token_logits`.
    `graph` (cpu): "fused" (default: fused ONNX Runtime kernels and oga's paged attention operator,
    onnx_cpu_fused) or "standard" (standard ONNX ops only, fp32: the variant onnxruntime-genai 0.18
    can run too). `precision` (fused cpu graph): None (a GGUF keeps its Q4_0 / Q4_1 / Q8_0 blocks,
    everything else fp32), "int4", "int8" or "fp32" (see linear_weights.py); `accuracy_level` is
    MatMulNBits' (4: int8 activations). `kv_cache` (fused cpu graph): "float16" or "float32" KV
    caches (default: float16 when the linear weights are quantized, float32 otherwise).
    """
    if target not in ("cpu", "cuda"):
        raise ValueError(f"target must be 'cpu' or 'cuda', got {target!r}")
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {', '.join(GRAPHS)}, got {graph!r}")
    check_precision(precision)
    check_accuracy_level(accuracy_level)
    if kv_cache is not None and not (target == "cpu" and graph == "fused"):
        raise ValueError("kv_cache is chosen for the cpu target's fused graph only (the standard cpu graph keeps "
                         "float32 caches, the cuda graph float16)")
    if precision not in (None, "fp32") and not (target == "cpu" and graph == "fused"):
        raise ValueError(f"precision {precision!r} is built for the cpu target's fused graph only (the standard "
                         "cpu graph is fp32, the cuda graph fp16)")
    if per_token_logits and logits_indices:
        raise ValueError("per_token_logits and logits_indices are mutually exclusive")
    if state_capture and not per_token_logits:
        # checked before loading the weights: the graph builder refuses it too, but only after that
        raise ValueError("state_capture (per-token fixed state outputs) needs per_token_logits: the states "
                         "serve draft verification, which reads one logits row per packed token")
    block_size = int(block_size or (cfg.CPU_BLOCK_SIZE if target == "cpu" else cfg.CUDA_BLOCK_SIZE))
    output_dir = os.fspath(output_dir)

    start = time.perf_counter()
    _say(progress, f"loading {'random weights' if source is None else source}")
    loaded = load_source(source, random_spec=random_spec, seed=seed)
    spec = loaded.spec
    context_length = int(context_length or cfg.default_context_length(spec, target))
    if target == "cuda":   # checked before the graph's own, narrower checks
        from .onnx_cpu import refuse_features
        refuse_features(spec, "the CUDA graph")
    if spec.ring_layers() and chunk_size is None:
        # the ring of a sliding-window layer holds chunk_size + window - 1 positions per request
        chunk_size = int(max_scheduled_tokens)
    if spec.ring_layers() and target != "cpu":
        raise NotImplementedError("sliding-window ring layers (sliding_window_layers) are built for the cpu "
                                  "target only")
    if spec.hybrid() and target != "cpu":
        raise NotImplementedError("hybrid decoders (conv / recurrent layer_types) are built for the cpu target only")
    _say(progress, f"{spec.architecture}: {spec.num_layers} layers, hidden {spec.hidden_size}, "
                   f"{spec.num_heads}/{spec.num_kv_heads} heads, vocab {spec.vocab_size}; "
                   f"building the {target} graph (block size {block_size}, context {context_length})")
    config = cfg.make_genai_config(spec, filename=MODEL_FILENAME, target=target,
                                   context_length=context_length, block_size=block_size,
                                   num_blocks=num_blocks, max_batch_size=max_batch_size,
                                   max_scheduled_tokens=max_scheduled_tokens,
                                   logits_indices=logits_indices, chunk_size=chunk_size)
    model = build_graph(loaded, target=target, block_size=block_size, context_length=context_length,
                        per_token_logits=per_token_logits, logits_indices=logits_indices,
                        state_capture=state_capture, graph=graph, precision=precision,
                        accuracy_level=accuracy_level, kv_cache=kv_cache)
    del loaded.weights, loaded.blocks                     # the graph holds its own copies

    os.makedirs(output_dir, exist_ok=True)
    _say(progress, f"writing {os.path.join(output_dir, MODEL_FILENAME)}")
    save_model(model, output_dir)
    del model
    with open(os.path.join(output_dir, "genai_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=4)
    written = write_tokenizer_files(loaded, output_dir)
    _say(progress, f"done in {time.perf_counter() - start:.1f} s: model.onnx, genai_config.json"
                   + "".join(f", {name}" for name in written))
    return output_dir
