"""oga.models: build Llama-family decoders (Llama, SmolLM, Qwen2, Mistral) as OGA model directories.

Sources: GGUF files, Hugging Face directories (config.json + safetensors), random weights.
Targets: "cpu" (fp32, paged attention in standard ONNX ops) and "cuda" (fp16, PagedAttention).
Also a CLI: ``python -m oga.models build --input PATH|--random --output DIR [--target cpu|cuda]``.

Nothing here needs the compiled engine (``oga._core``); heavy imports (onnx, gguf) happen on use.
"""

from .build import build, load_source
from .spec import DecoderSpec, LoadedModel

__all__ = ["build", "load_source", "DecoderSpec", "LoadedModel"]
