"""python -m oga.models build --input PATH | --random [...] --output DIR [--target cpu|cuda] [...]
python -m oga.models convert SRC_DIR DST_DIR [...]   (an onnxruntime-genai CPU build -> a paged decoder)"""

from __future__ import annotations

import argparse
import sys

from .linear_weights import CHOSEN_PRECISIONS, DEFAULT_ACCURACY_LEVEL


def _positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oga.models",
                                     description="Build OGA model directories for oga and onnxruntime-genai.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a model directory (model.onnx + genai_config.json + tokenizer)")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", "-i", metavar="PATH",
                     help="GGUF file, or Hugging Face directory with config.json and *.safetensors")
    src.add_argument("--random", action="store_true", help="random weights of the shape given below")
    b.add_argument("--output", "-o", required=True, metavar="DIR", help="output directory")
    b.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: paged decoder for ONNX Runtime's CPU provider; cuda: fp16 PagedAttention (default cpu)")
    b.add_argument("--graph", choices=("fused", "standard"), default="fused",
                   help="cpu graph: fused (fused ONNX Runtime kernels and oga's paged attention operator; any "
                        "precision) or standard (standard ONNX ops, fp32; onnxruntime-genai 0.18 runs it too); "
                        "default fused")
    b.add_argument("--precision", choices=CHOSEN_PRECISIONS,
                   help="linear weights of the fused cpu graph: int4 / int8 MatMulNBits (GGUF Q4_0 / Q4_1 / Q8_0 "
                        "blocks repacked exactly, everything else quantized round-to-nearest in blocks of 32; the "
                        "LM head 8-bit) or fp32 (default: a GGUF keeps its own Q4_0 / Q4_1 / Q8_0 blocks, "
                        "everything else fp32)")
    b.add_argument("--kv-cache", choices=("float16", "float32"),
                   help="KV cache type of the fused cpu graph (default: float16 when the linear weights are "
                        "quantized, float32 otherwise)")
    b.add_argument("--accuracy-level", type=int, choices=range(5), default=DEFAULT_ACCURACY_LEVEL, metavar="{0..4}",
                   help="MatMulNBits accuracy_level: 4 = int8 activations (default), 0 = as ONNX Runtime picks")
    b.add_argument("--block-size", type=_positive, help="KV block size (default 16 on cpu, 256 on cuda)")
    b.add_argument("--num-blocks", type=_positive,
                   help="KV blocks per layer (cpu default: max-batch-size full-length requests)")
    b.add_argument("--max-batch-size", type=_positive, default=16)
    b.add_argument("--max-scheduled-tokens", type=_positive, default=512)
    b.add_argument("--context-length", type=_positive,
                   help="max tokens per request (default: the model's, capped at 4096 on cpu)")
    logits = b.add_mutually_exclusive_group()
    logits.add_argument("--per-token-logits", action="store_true",
                        help="emit logits for every packed token (draft verification)")
    logits.add_argument("--logits-indices", action="store_true",
                        help="add a logits_indices input selecting the rows that reach the LM head")
    b.add_argument("--state-capture", action=argparse.BooleanOptionalAction, default=None,
                   help="hybrid decoders: also output every packed token's fixed state (present.*.per_token), "
                        "for draft verification; needs --per-token-logits (default: on with it)")
    b.add_argument("--chunk-size", type=_positive,
                   help="search.chunk_size: max query tokens per request and step; sizes the ring of "
                        "sliding-window layers (default for them: --max-scheduled-tokens)")
    c = sub.add_parser("convert", help="turn a CPU model directory of onnxruntime-genai's builder "
                                       "(GroupQueryAttention, contiguous caches) into a paged decoder for oga's engine")
    c.add_argument("source", metavar="SRC_DIR", help="the builder's output directory (genai_config.json, model.onnx)")
    c.add_argument("output", metavar="DST_DIR", help="the new directory (must not exist)")
    c.add_argument("--block-size", type=_positive, default=16, help="KV block size (default 16)")
    c.add_argument("--num-blocks", type=_positive, help="KV blocks per layer (default: max-batch-size requests of "
                                                        "context-length tokens)")
    c.add_argument("--max-batch-size", type=_positive, default=16)
    c.add_argument("--max-scheduled-tokens", type=_positive, default=512)
    c.add_argument("--context-length", type=_positive,
                   help="max tokens per request (default: search.max_length, capped at 4096)")
    c.add_argument("--chunk-size", type=_positive,
                   help="search.chunk_size: max query tokens per request and step (default: max-scheduled-tokens); "
                        "sliding-window layers in a ring need it")
    c.add_argument("--window-ring", action=argparse.BooleanOptionalAction, default=None,
                   help="keep sliding-window layers' KV in a ring of chunk-size + window - 1 positions per request "
                        "(default: when that is smaller than the context; a ring turns prefix caching off)")
    r = b.add_argument_group("random model shape (with --random)")
    r.add_argument("--architecture", choices=("llama", "qwen2", "mistral"), default="llama")
    r.add_argument("--layers", type=_positive, default=2)
    r.add_argument("--hidden", type=_positive, default=64)
    r.add_argument("--heads", type=_positive, default=4)
    r.add_argument("--kv-heads", type=_positive, default=2)
    r.add_argument("--head-dim", type=_positive, help="default hidden / heads")
    r.add_argument("--vocab", type=_positive, default=256)
    r.add_argument("--intermediate", type=_positive, help="default 4 x hidden")
    r.add_argument("--max-position", type=_positive, default=4096, help="model context length")
    r.add_argument("--sliding-window", type=_positive, metavar="W",
                   help="attention window of the windowed layers (every layer unless --sliding-window-layers)")
    r.add_argument("--sliding-window-layers", metavar="I,J,...",
                   help="only these layers are windowed, kept in a sliding-window ring (cpu target)")
    r.add_argument("--layer-types", metavar="KIND,KIND,...",
                   help="hybrid decoder: one of attention, conv, recurrent per layer (cpu target; at least "
                        "one attention layer)")
    r.add_argument("--conv-kernel", type=_positive, default=4, help="kernel of the conv layers")
    r.add_argument("--seed", type=int, default=0)
    return parser


def _layer_list(text):
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sliding-window-layers takes comma-separated layer ids, got {text!r}") from None


def random_spec_from_args(args):
    from .spec import DecoderSpec
    if args.hidden % args.heads and args.head_dim is None:
        raise ValueError(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}; give --head-dim")
    spec = DecoderSpec(
        architecture=args.architecture, vocab_size=args.vocab, hidden_size=args.hidden,
        intermediate_size=args.intermediate or 4 * args.hidden, num_layers=args.layers,
        num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim or args.hidden // args.heads,
        rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5, context_length=args.max_position,
        tie_word_embeddings=False, qkv_bias=args.architecture == "qwen2", sliding_window=args.sliding_window,
        bos_token_id=min(1, args.vocab - 1), eos_token_ids=[min(2, args.vocab - 1)], pad_token_id=0,
        sliding_window_layers=_layer_list(args.sliding_window_layers),
        layer_types=[part.strip() for part in args.layer_types.split(",")] if args.layer_types else None,
        conv_kernel=args.conv_kernel)
    spec.check()
    return spec


def convert_main(args) -> int:
    from .convert import convert
    try:
        out = convert(args.source, args.output, block_size=args.block_size, num_blocks=args.num_blocks,
                      max_batch_size=args.max_batch_size, max_scheduled_tokens=args.max_scheduled_tokens,
                      context_length=args.context_length, chunk_size=args.chunk_size,
                      window_ring=args.window_ring, progress=True)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"python -m oga.models convert: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command == "convert":
        return convert_main(args)
    from .build import build
    try:
        spec = random_spec_from_args(args) if args.random else None
        out = build(None if args.random else args.input, args.output, target=args.target,
                    block_size=args.block_size, num_blocks=args.num_blocks,
                    max_batch_size=args.max_batch_size, max_scheduled_tokens=args.max_scheduled_tokens,
                    context_length=args.context_length, per_token_logits=args.per_token_logits,
                    logits_indices=args.logits_indices, chunk_size=args.chunk_size,
                    state_capture=args.state_capture, random_spec=spec, graph=args.graph,
                    precision=args.precision, accuracy_level=args.accuracy_level, kv_cache=args.kv_cache,
                    seed=args.seed, progress=True)
    except (ValueError, FileNotFoundError, NotImplementedError, OSError) as exc:
        print(f"python -m oga.models build: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
