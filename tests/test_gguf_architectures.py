"""`oga build` from llama.cpp's GGUF files of every architecture of the registry that declares a GGUF
side (oga.models.architectures; the loader: oga.models.gguf_loader).

The files are written here from the tiny HF checkpoints of architecture_models.py the way llama.cpp's
converter lays them out (`write_llama_cpp_gguf`): tensor names from the `gguf` package's own
HF -> GGUF table, q/k rows permuted for Llama and Granite, Gemma's norms stored as 1 + w and its
lm_head dropped, Phi-3's q|k|v and gate|up left fused, LongRoPE's factors as rope_factors_* tensors,
the metadata keys each converter writes, and a byte-level BPE vocabulary. Norms and other 1-D
tensors stay F32; the 2-D ones are F32 or quantized (Q8_0, Q4_0, Q4_1) by `gguf.quants.quantize`.

For each architecture:
- the F32 file loads to the spec and the canonical weights the safetensors loader reads from the
  same checkpoint, exactly (a Gemma norm: the value the converter's float32 1 + w leaves);
- its fp32 build (fused CPU graph) gives the greedy tokens of the safetensors build of the checkpoint
  (test_build_architectures checks those against onnxruntime-genai 0.18's build);
- a quantized file keeps its blocks (the build computes with them exactly), and its build's greedy
  tokens equal the numpy reference's on the dequantized weights, up to a near-tie within the noise of
  MatMulNBits' int8 activations.

Gemma and Gemma 2 are checked on tied checkpoints (the converter drops their lm_head: llama.cpp runs
them with the embedding as the head), Gemma 3 on six layers (llama.cpp windows every layer but each
sixth, whatever the checkpoint's layer_types say).
"""
import json
import os

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

import oga as og
from architecture_models import (SMALL, WINDOW, Architecture, _alternating, _gemma3_flat_rope,
                                 _transformers_checkpoint, checkpoint_dir)
from greedy_runs import begin_all, drain, equal_to_the_reference_up_to_a_near_tie
from oga.models import build
from oga.models.gguf_loader import load_gguf
from oga.models.safetensors_loader import load_safetensors
from test_convert_architectures import _prompts
from test_quantized_decoders import FP16_KV_TOL, INT8_ACTIVATION_TOL, _effective

Q = gguf.GGMLQuantizationType
MAX_NEW = 12

# The checkpoints of architecture_models.py serve as they are, but for these variants (the module
# docstring says why).
_VARIANTS = {
    "gemma-tied": Architecture("gemma-tied", "GemmaForCausalLM", _transformers_checkpoint(
        "GemmaConfig", "GemmaForCausalLM", dict(SMALL, hidden_activation="gelu_pytorch_tanh",
                                                tie_word_embeddings=True))),
    "gemma2-tied": Architecture("gemma2-tied", "Gemma2ForCausalLM", _transformers_checkpoint(
        "Gemma2Config", "Gemma2ForCausalLM",
        dict(SMALL, sliding_window=WINDOW, attn_logit_softcapping=20.0, final_logit_softcapping=10.0,
             query_pre_attn_scalar=16, layer_types=_alternating(2), tie_word_embeddings=True))),
    "gemma3-6-layers": Architecture("gemma3-6-layers", "Gemma3ForCausalLM", _transformers_checkpoint(
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        dict(SMALL, num_hidden_layers=6, sliding_window=WINDOW, query_pre_attn_scalar=16,
             layer_types=["sliding_attention"] * 5 + ["full_attention"],
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
        edit_config=_gemma3_flat_rope)),
}
# name -> the quantized type its quantized test uses (each type on several layouts)
NAMES = {"llama": Q.Q4_1, "qwen2": Q.Q8_0, "qwen3": Q.Q4_0, "phi3": Q.Q8_0, "phi3.5-longrope": Q.Q4_1,
         "phi4-mini": Q.Q4_0, "gemma-tied": Q.Q4_1, "gemma2-tied": Q.Q8_0, "gemma3-6-layers": Q.Q4_0,
         "granite": Q.Q4_1}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> the HF checkpoint directory (the variants written once per module)."""
    root = tmp_path_factory.mktemp("gguf-checkpoints")
    found = {}

    def get(name):
        if name not in found:
            if name in _VARIANTS:
                directory = str(root / name)
                _VARIANTS[name].write_checkpoint(directory, _VARIANTS[name].seed)
                found[name] = directory
            else:
                found[name] = checkpoint_dir(name)
        return found[name]
    return get


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory, checkpoints):
    """(name, quantized type) -> the GGUF file written from that checkpoint, once per module."""
    root = tmp_path_factory.mktemp("gguf-files")
    written = {}

    def get(name, qtype=Q.F32):
        if (name, qtype) not in written:
            path = root / f"{name}-{qtype.name}.gguf"
            write_llama_cpp_gguf(checkpoints(name), path, qtype)
            written[name, qtype] = str(path)
        return written[name, qtype]
    return get


# ---------------------------------------------------------------------------------------------
# The test-side converter: llama.cpp's layout, written with the gguf package's own tables.

_LLAMA_CPP_ARCH = {"LlamaForCausalLM": "LLAMA", "Qwen2ForCausalLM": "QWEN2", "Qwen3ForCausalLM": "QWEN3",
                   "Phi3ForCausalLM": "PHI3", "GemmaForCausalLM": "GEMMA", "Gemma2ForCausalLM": "GEMMA2",
                   "Gemma3ForCausalLM": "GEMMA3", "GraniteForCausalLM": "GRANITE"}
_PERMUTED_QK = {"LlamaForCausalLM", "GraniteForCausalLM"}         # converted as Llama: interleaved RoPE
_GEMMA = {"GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"}
_HEAD_DROPPED = {"GemmaForCausalLM", "Gemma2ForCausalLM"}         # always run with the embedding as head


def _interleave_halves(w, heads):
    """llama.cpp's q/k row order: within each head, the rotate_half halves' rows alternate (GGUF
    row 2i is HF row i, row 2i + 1 is HF row i + D/2)."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_theta(config):
    parameters = config.get("rope_parameters") or {}
    parameters = parameters.get("full_attention", parameters)
    return float(config.get("rope_theta") or parameters.get("rope_theta", 10000.0))


def _write_metadata(writer, hf_arch, config):
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if hf_arch == "Phi3ForCausalLM":
        # Phi-3's own set: no key_length (head_dim is hidden / heads), the rotary width, the window
        # (0 for none) and, for LongRoPE, the original context and one magnitude for both tables
        scaling = config.get("rope_scaling") or {}
        rotary = int(config.get("partial_rotary_factor", 1.0) * hidden) // heads
        original = config["original_max_position_embeddings"]
        writer.add_rope_dimension_count(rotary)
        writer.add_rope_freq_base(_rope_theta(config))
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_sliding_window(config.get("sliding_window") or 0)
        if scaling.get("long_factor"):
            scale = config["max_position_embeddings"] / original
            writer.add_rope_scaling_attn_factors(
                float(np.sqrt(1 + np.log(scale) / np.log(original))) if scale > 1 else 1.0)
        return
    if hf_arch not in ("GemmaForCausalLM", "Gemma2ForCausalLM"):   # those two write no RoPE base
        writer.add_rope_freq_base(_rope_theta(config))
    if hf_arch != "GraniteForCausalLM" and config.get("head_dim"):  # Granite's converter drops head_dim
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if hf_arch in ("LlamaForCausalLM", "GraniteForCausalLM"):
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(hidden // heads)
    if hf_arch == "Gemma2ForCausalLM":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(config["sliding_window"])
    if hf_arch == "Gemma3ForCausalLM":
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(config["sliding_window"])
    if hf_arch == "GraniteForCausalLM":
        writer.add_attention_scale(config["attention_multiplier"])
        writer.add_embedding_scale(config["embedding_multiplier"])
        writer.add_residual_scale(config["residual_multiplier"])
        writer.add_logit_scale(config["logits_scaling"])


def _write_vocabulary(writer, hf_dir, config):
    """The checkpoint's 500 words as a byte-level BPE vocabulary (no merges: the tests use token ids),
    its three special tokens as control tokens."""
    with open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t.startswith("<") else gguf.TokenType.NORMAL for t in tokens])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])


def write_llama_cpp_gguf(hf_dir, path, qtype=Q.F32):
    """The GGUF file llama.cpp's converter (and, for a quantized qtype, its quantizer) would make of
    the HF checkpoint `hf_dir`."""
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    hf_arch = config["architectures"][0]
    arch = gguf.MODEL_ARCH[_LLAMA_CPP_ARCH[hf_arch]]
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    _write_metadata(writer, hf_arch, config)
    _write_vocabulary(writer, hf_dir, config)
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    rope = config.get("rope_scaling") or {}
    if rope.get("long_factor"):
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))
    for hf_name, w in sorted(load_file(os.path.join(hf_dir, "model.safetensors")).items()):
        w = w.astype(np.float32)
        if hf_name == "lm_head.weight" and hf_arch in _HEAD_DROPPED:
            continue
        if hf_arch in _GEMMA and hf_name.endswith("norm.weight"):
            w = w + np.float32(1.0)                      # Gemma's RMSNorm scales by 1 + w
        if hf_arch in _PERMUTED_QK and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _interleave_halves(w, heads)
        elif hf_arch in _PERMUTED_QK and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            w = _interleave_halves(w, kv_heads)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"no GGUF name for {hf_name}"
        if w.ndim == 1 or name.endswith("_norm.weight") or qtype == Q.F32:
            writer.add_tensor(name, np.ascontiguousarray(w))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------------------------------------

def _build(source, out, **kwargs):
    return build(source, out, context_length=128, max_batch_size=4, **kwargs)


def _engine_tokens(model_dir, prompts):
    engine = og.Engine(og.Model(str(model_dir)))
    return drain(og, engine, begin_all(og, engine, prompts, MAX_NEW))


def _is_norm(name):
    return name.endswith(("layernorm.weight", "_norm.weight", "model.norm.weight"))


@pytest.mark.parametrize("name", NAMES)
def test_f32_file_loads_the_checkpoints_spec_and_weights(checkpoints, gguf_files, name):
    want = load_safetensors(checkpoints(name))
    got = load_gguf(gguf_files(name))
    assert got.spec == want.spec
    assert set(got.weights) == set(want.weights)
    for key, w in want.weights.items():
        if want.spec.norm_offset and _is_norm(key):
            # the converter's float32 1 + w, less 1: what norm_offset + weight gives back
            w = (w + np.float32(1.0)) - np.float32(1.0)
        np.testing.assert_array_equal(got.weights[key], w, err_msg=key)
    assert got.blocks == {}
    assert got.tokenizer_json is not None


@pytest.mark.parametrize("name", NAMES)
def test_fp32_build_gives_the_safetensors_builds_tokens(tmp_path, checkpoints, gguf_files, name):
    prompts = _prompts()
    from_gguf = _engine_tokens(_build(gguf_files(name), tmp_path / "gguf", precision="fp32"), prompts)
    from_safetensors = _engine_tokens(_build(checkpoints(name), tmp_path / "hf", precision="fp32"), prompts)
    assert from_gguf == from_safetensors
    assert all(len(tokens) == MAX_NEW for tokens in from_gguf)


def _noise(qtype, accuracy_level):
    """How far the quantized build's logits may sit from the reference's on the same weights, as a
    fraction of the largest |logit|: float16 KV caches (the default with quantized weights) with
    float activations (accuracy_level 0); with int8 activations (4) MatMulNBits' rounding of every
    activation block too. A Q4_1 block w = d q + m reaches MatMulNBits as d q with zero point 0 (m is
    added in float), so the rounded activations meet weights of one sign, about twice as large as the
    block's own; measured here: Q4_0 / Q8_0 up to 3.6 %, Q4_1 up to 11.5 % of the largest logit."""
    if accuracy_level == 0:
        return FP16_KV_TOL
    return INT8_ACTIVATION_TOL * (3 if qtype == Q.Q4_1 else 1)


@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("name", NAMES)
def test_quantized_file_builds_on_its_blocks_and_matches_the_reference(tmp_path, checkpoints, gguf_files, name,
                                                                        accuracy_level):
    qtype = NAMES[name]
    path = gguf_files(name, qtype)
    loaded = load_gguf(path)
    # every linear weight keeps its blocks, through renames, q/k permutations and fused splits
    linear = {k for k, w in loaded.weights.items() if w.ndim == 2}
    assert set(loaded.blocks) == linear
    for key, blocks in loaded.blocks.items():
        assert blocks.source == qtype.name
        np.testing.assert_array_equal(blocks.dequantize(), loaded.weights[key], err_msg=key)
    # ... which are the checkpoint's weights quantized by gguf (row by row, so moving rows commutes)
    hf = load_safetensors(checkpoints(name)).weights
    for key in linear:
        np.testing.assert_array_equal(
            loaded.weights[key], gguf.quants.dequantize(gguf.quants.quantize(hf[key], qtype), qtype), err_msg=key)

    effective = _effective(loaded, None)      # the build keeps every block: precision None
    prompts = _prompts()
    model_dir = _build(path, tmp_path / "oga", accuracy_level=accuracy_level)
    for prompt, have in zip(prompts, _engine_tokens(model_dir, prompts)):
        equal_to_the_reference_up_to_a_near_tie(effective, prompt, have, MAX_NEW, _noise(qtype, accuracy_level))


def test_gemma3_windows_every_layer_but_each_sixth_as_llama_cpp_does(tmp_path):
    """llama.cpp does not store Gemma 3's window pattern: it windows every layer but layers 5, 11, ...
    A four-layer checkpoint whose last layer is global therefore loads with every layer windowed,
    each with the local RoPE base llama.cpp hard-codes."""
    path = write_llama_cpp_gguf(checkpoint_dir("gemma3"), tmp_path / "gemma3-4.gguf")
    spec = load_gguf(path).spec
    assert (spec.sliding_window, spec.sliding_window_layers, spec.local_rope_theta) == (WINDOW, None, 10000.0)
    assert load_safetensors(checkpoint_dir("gemma3")).spec.sliding_window_layers == [0, 1, 2]


def test_an_architecture_the_registry_lacks_is_refused_by_name(tmp_path):
    path = str(tmp_path / "phi2.gguf")
    writer = gguf.GGUFWriter(path, "phi2")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_tensor("token_embd.weight", np.zeros((8, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    message = ("GGUF architecture 'phi2' is not supported; supported: gemma, gemma2, gemma3, granite, llama, "
               "phi3, qwen2, qwen3")
    with pytest.raises(NotImplementedError, match=message):
        load_gguf(path)
    with pytest.raises(NotImplementedError, match=message):
        build(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


class _Metadata:
    """What a module's gguf_features reads, without a file: `keys` (without the architecture prefix),
    settings tensors by name, and the common fields."""

    def __init__(self, fields, keys=None, tensors=None):
        self.fields, self._keys, self._tensors = fields, keys or {}, tensors or {}

    def get(self, key, default=None):
        return self._keys.get(key, default)

    def require(self, key):
        return self._keys[key]

    def tensor_values(self, name):
        return self._tensors.get(name)


def test_gemma_settings_llama_cpp_hard_codes():
    from oga.models.architectures import gemma2, gemma3

    shape = dict(hidden_size=4608, num_heads=32, head_dim=128)     # Gemma 2 27B: hidden / heads 144
    # keys the converter always writes, left out: llama.cpp's defaults (softcaps 50 / 30, window 4096)
    got = gemma2.gguf_features(_Metadata(dict(shape, num_layers=46)))
    assert (got["attention_softcap"], got["final_softcap"], got["sliding_window"]) == (50.0, 30.0, 4096)
    assert got["sliding_window_layers"] == list(range(0, 46, 2))
    assert got["attention_scale"] == 144.0 ** -0.5                 # the 27B model: hidden / heads
    assert gemma2.gguf_features(_Metadata(dict(shape, num_layers=42)))["attention_scale"] == 128.0 ** -0.5

    got = gemma3.gguf_features(_Metadata(dict(shape, num_layers=62), {"attention.sliding_window": 1024}))
    assert got["sliding_window_layers"] == [i for i in range(62) if i % 6 != 5]
    assert (got["local_rope_theta"], got["attention_scale"]) == (10000.0, 144.0 ** -0.5)
    got = gemma3.gguf_features(_Metadata(dict(shape, num_layers=26), {"attention.sliding_window": 0}))
    assert (got["sliding_window"], got["sliding_window_layers"], got["local_rope_theta"]) == (None, None, None)


def test_phi3_longrope_magnitude_other_than_the_default_is_kept():
    from oga.models.architectures import phi3

    factors = {"rope_factors_long.weight": [2.0] * 8, "rope_factors_short.weight": [1.0] * 8}
    keys = {"rope.dimension_count": 16, "rope.scaling.original_context_length": 32, "rope.scaling.attn_factor": 1.5}
    fields = dict(head_dim=16, context_length=256)
    scaling = phi3.gguf_features(_Metadata(fields, keys, factors))["rope_scaling"]
    assert (scaling["short_mscale"], scaling["long_mscale"]) == (1.5, 1.5)
    assert phi3.long_rope_magnitudes(scaling, 256) == (1.5, 1.5)
    # the converter's own value, sqrt(1 + ln(256 / 32) / ln(32)) as float32, is the default: not stored
    keys["rope.scaling.attn_factor"] = float(np.float32(np.sqrt(1 + np.log(8) / np.log(32))))
    assert "short_mscale" not in phi3.gguf_features(_Metadata(fields, keys, factors))["rope_scaling"]
