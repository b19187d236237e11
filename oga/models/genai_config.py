"""`genai_config.json` for a built model directory, in onnxruntime-genai 0.18's format.

The layout follows what OGA 0.18's own model builder writes for a paged (continuous-batching)
decoder: `model` (ids, context length, `decoder` with its input/output name templates and the
`state_groups` manifest), `search` defaults, and `engine.dynamic_batching`. The CPU target gets an
explicit `num_blocks` (there is no device memory to auto-size from); the CUDA target gets
`gpu_utilization_factor` unless the caller fixes `num_blocks`.

A decoder with sliding-window ring layers (spec.sliding_window_layers) also gets
`model.decoder.sliding_window = {"window_size": W, "layers": [...]}`, the
`model.decoder.inputs.block_table_windowed` name and `search.chunk_size` (required: the engine
sizes each request's ring from it; seed "Sliding-window paged layers"). The ring layers' caches use
the same past/present name templates as the other layers.

A hybrid decoder (spec.layer_types) lists its attention layers in the paged_kv group and its
fixed-state layers in `fixed_conv` / `fixed_recurrent` groups (empty groups omitted). Their graph
names are OGA 0.18's default templates (`past_key_values.%d.conv_state`, `present.%d.conv_state`,
`past_key_values.%d.recurrent_state`, `present.%d.recurrent_state`), so decoder.inputs/outputs do
not repeat them.
"""

from __future__ import annotations

from . import onnx_cpu as io
from .spec import DecoderSpec

CPU_BLOCK_SIZE = 16
CUDA_BLOCK_SIZE = 256
CPU_DEFAULT_CONTEXT = 4096
DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_MAX_SCHEDULED_TOKENS = 512
DEFAULT_GPU_UTILIZATION = 0.6


def default_context_length(spec: DecoderSpec, target: str) -> int:
    """CPU builds cap the context at 4096 so the default KV pool stays small; CUDA keeps the model's."""
    return min(spec.context_length, CPU_DEFAULT_CONTEXT) if target == "cpu" else spec.context_length


def default_num_blocks(context_length: int, block_size: int, max_batch_size: int) -> int:
    """Enough blocks for `max_batch_size` requests of `context_length` tokens each."""
    return max_batch_size * -(-context_length // block_size)


def state_groups(spec: DecoderSpec) -> list[dict]:
    """model.decoder.state_groups: the paged_kv group, then fixed_conv and fixed_recurrent if any."""
    groups = [{"kind": "paged_kv", "layer_ids": spec.attention_layers()}]
    for kind, layers in (("fixed_conv", spec.conv_layers()), ("fixed_recurrent", spec.recurrent_layers())):
        if layers:
            groups.append({"kind": kind, "layer_ids": layers})
    return groups


def make_genai_config(spec: DecoderSpec, *, filename: str = "model.onnx", target: str = "cpu",
                      context_length: int, block_size: int, num_blocks: int | None,
                      max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                      max_scheduled_tokens: int = DEFAULT_MAX_SCHEDULED_TOKENS,
                      logits_indices: bool = False,
                      gpu_utilization_factor: float = DEFAULT_GPU_UTILIZATION,
                      chunk_size: int | None = None) -> dict:
    """The genai_config.json contents (a dict) for a graph built with the same arguments."""
    for name, value in (("context_length", context_length), ("block_size", block_size),
                        ("max_batch_size", max_batch_size), ("max_scheduled_tokens", max_scheduled_tokens)):
        if int(value) <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if num_blocks is not None and int(num_blocks) <= 0:
        raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
    if target not in ("cpu", "cuda"):
        raise ValueError(f"target must be 'cpu' or 'cuda', got {target!r}")
    if chunk_size is not None and int(chunk_size) <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    ring = spec.ring_layers()
    if ring and chunk_size is None:
        raise ValueError(f"sliding-window ring layers {ring} need chunk_size (search.chunk_size): the engine "
                         "sizes each request's ring of blocks from it")

    inputs = {
        "input_ids": io.INPUT_IDS,
        "cumulative_sequence_lengths": io.CU_SEQLENS,
        "past_sequence_lengths": io.PAST_SEQLENS,
        "block_table": io.BLOCK_TABLE,
        "attention_metadata": io.ATTENTION_METADATA,
        "past_key_names": io.PAST_KEY,
        "past_value_names": io.PAST_VALUE,
    }
    if logits_indices:
        inputs["logits_indices"] = io.LOGITS_INDICES
    if ring:
        inputs["block_table_windowed"] = io.BLOCK_TABLE_WINDOWED
    outputs = {
        "logits": io.LOGITS,
        "present_key_names": io.PRESENT_KEY,
        "present_value_names": io.PRESENT_VALUE,
    }
    provider_options = [{"cuda": {}}] if target == "cuda" else []
    dynamic_batching = {
        "block_size": int(block_size),
        "max_batch_size": int(max_batch_size),
        "max_scheduled_tokens": int(max_scheduled_tokens),
    }
    if target == "cpu" or num_blocks is not None:
        dynamic_batching["num_blocks"] = int(
            num_blocks if num_blocks is not None
            else default_num_blocks(context_length, block_size, max_batch_size))
    else:
        dynamic_batching["gpu_utilization_factor"] = float(gpu_utilization_factor)

    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": provider_options},
        "filename": filename,
        "head_size": int(spec.head_dim),
        "hidden_size": int(spec.hidden_size),
        "inputs": inputs,
        "outputs": outputs,
        "num_attention_heads": int(spec.num_heads),
        "num_hidden_layers": int(spec.num_layers),
        "num_key_value_heads": int(spec.num_kv_heads),
        "state_groups": state_groups(spec),
    }
    if ring:
        decoder["sliding_window"] = {"window_size": int(spec.sliding_window), "layers": ring}
    search = {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": int(context_length),
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": True,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 1.0,
    }
    if chunk_size is not None:
        search["chunk_size"] = int(chunk_size)

    return {
        "model": {
            "bos_token_id": int(spec.bos_token_id),
            "context_length": int(context_length),
            "decoder": decoder,
            "eos_token_id": [int(t) for t in spec.eos_token_ids],
            "pad_token_id": int(spec.pad_token_id),
            "type": spec.architecture,
            "vocab_size": int(spec.vocab_size),
        },
        "search": search,
        "engine": {"dynamic_batching": dynamic_batching},
    }
