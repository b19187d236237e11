"""oga.models: build Llama-family decoders (Llama, SmolLM, Qwen2, Mistral) as OGA model directories.

Sources: GGUF files, Hugging Face directories (config.json + safetensors), random weights.
Targets: "cpu" (fused graph with oga's operators, int4 / int8 / fp32; or standard ONNX ops, fp32)
and "cuda" (fp16, PagedAttention).
Also ``convert``: an onnxruntime-genai builder CPU directory -> a paged decoder directory.
CLI: ``python -m oga.models build --input PATH|--random --output DIR [--target cpu|cuda]``,
``python -m oga.models convert SRC DST`` (also ``oga build`` / ``oga convert``).

Nothing here needs the compiled engine (``oga._core``); heavy imports (onnx, gguf) happen on use.
"""

from .build import build, load_source
from .convert import ConversionError, convert
from .spec import DecoderSpec, LoadedModel

__all__ = ["build", "convert", "ConversionError", "load_source", "DecoderSpec", "LoadedModel"]
