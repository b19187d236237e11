"""Tiny random checkpoints of every decoder architecture onnxruntime-genai 0.18's builder emits for
CPU, built by that builder in fp32 and int4: the shared material of the architecture tests.

Each recipe writes an HF checkpoint with transformers' own config and model classes
(`XConfig(...)`, `XForCausalLM(config)` under a fixed torch seed, `save_pretrained`), or, for
InternLM2 and ChatGLM3 whose Hub models are remote code, with a local stand-in module that has the
Hub code's module and weight names (the builder reads only the config and the weights). Beside the
weights goes a 500-token word-level tokenizer (the builder always loads one; the tests use token ids).
Every build runs `python -m onnxruntime_genai.models.builder -e cpu -p fp32|int4` in the one builder
process of static_models (run_oga_builder), cached like static_models' directories: under
$OGA_CACHE_DIR/architecture-models/<name>-<precision>-v<RECIPE_VERSION>/ with a `.complete` marker,
else under the pytest session's base temp.

Why the weights look as they do: transformers zeroes biases and the builder drops all-zero biases,
so biases (and norm weights) are drawn at random to exercise those paths; `initializer_range` 0.1
and untied LM heads keep greedy streams from repeating one token and make near-ties rare; windows of
16 positions make sliding windows matter within short prompts, and LongRoPE's
`original_max_position_embeddings` of 32 lets a test cross the short/long switch. Partial rotary
needs head_dim 64 (ONNX Runtime: "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8").

Use from a test module:

    from architecture_models import ARCHITECTURES, architecture_dir
    def test_x(tmp_path_factory):
        model_dir = architecture_dir(tmp_path_factory, "qwen3", "int4")

or call build_architecture(name, out_dir, precision) directly. `python tests/architecture_models.py
OUT_ROOT [NAME ...]` builds them and prints what each build took.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
import zlib
from typing import Callable, Optional

import pytest

from static_models import MissingBuilderDependencies, cache_root, check_builder_dependencies, run_oga_builder

RECIPE_VERSION = 2
PRECISIONS = ("fp32", "int4")
VOCAB_SIZE = 500
BOS, EOS, PAD = 1, 2, 0
MAX_POSITIONS = 256       # the builder's search.max_length: 0.18 allocates its static cache for it
WINDOW = 16
LONGROPE_ORIGINAL = 32
SEED = 0

# Most recipes: 2 layers, hidden 64, 4 heads over 2 KV heads of 16.
SMALL = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=MAX_POSITIONS,
             initializer_range=0.1, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
             tie_word_embeddings=False)
# Partial rotary: head_dim 64 (2 heads over 1 KV head, hidden 128).
WIDE_HEADS = dict(SMALL, hidden_size=128, intermediate_size=192, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=64)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One recipe and the facts about its build that tests need."""
    name: str
    hf_architecture: str                       # config.json `architectures[0]`, the builder's dispatch
    write_checkpoint: Callable[[str, int], None]   # (directory, seed): the HF checkpoint and tokenizer
    sliding_window: Optional[int] = None       # window of the windowed layers, None when no layer has one
    longrope_original_max: Optional[int] = None   # LongRoPE's original_max_position_embeddings
    has_conv_layers: bool = False              # short-convolution layers with past_conv/present_conv state
    has_position_ids: bool = False             # RoPE outside attention: a position_ids graph input
    has_experts: bool = False                  # MoE (fp32) / QMoE (int4)
    remote_code: bool = False                  # stand-in module loaded with hf_remote=true
    # 0.18 fails a padded batch of prompts of different lengths on `sliding_window_cache=1` layers
    # (ONNX Runtime: "seqlens_k[1] = 9 is too small for sequence_length 20").
    batch_runs_in_0_18: bool = True
    precisions: tuple = PRECISIONS

    @property
    def seed(self):
        """torch seed of the checkpoint: one per architecture (Llama and Mistral share classes and
        shapes, so one seed for all would give them the same weights)."""
        return SEED + zlib.crc32(self.name.encode()) % 100_000


# ---------------------------------------------------------------------------------------------
# Checkpoint writing

def write_tokenizer(directory):
    """A word-level tokenizer of VOCAB_SIZE entries (<unk>, <s>, </s>, w3 ... w499)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": PAD, "<s>": BOS, "</s>": EOS}
    vocab.update({f"w{i}": i for i in range(3, VOCAB_SIZE)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<unk>")
    fast.save_pretrained(directory)


def _randomize(model, seed):
    """Random biases (transformers zeroes them and the builder drops all-zero ones) and norm
    weights off their constant start, so every bias and norm path carries something. The LM head's
    EOS row is zeroed: EOS's logit is then 0, below the top of 499 random logits, so no greedy stream
    ends early and every comparison covers its full length."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "bias" or leaf.endswith("_bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
            elif "norm" in name and leaf == "weight":
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
        model.get_output_embeddings().weight[EOS].zero_()


def _edit_config(directory, edit):
    path = os.path.join(directory, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    edit(config)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


def _transformers_checkpoint(config_class, model_class, fields, edit_config=None, after=None):
    """A write_checkpoint for transformers' own classes."""
    def write(directory, seed):
        import torch
        import transformers

        torch.manual_seed(seed)
        config = getattr(transformers, config_class)(**fields)
        config.architectures = [model_class]
        model = getattr(transformers, model_class)(config).eval()
        _randomize(model, seed)
        if after is not None:
            after(model, seed)
        model.save_pretrained(directory)
        if after is not None and hasattr(after, "extra_tensors"):
            after.extra_tensors(directory)
        write_tokenizer(directory)
        if edit_config is not None:
            _edit_config(directory, edit_config)
    return write


def _longrope_factors(count, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    short = [round(float(x), 4) for x in 1.0 + rng.uniform(0.0, 0.5, count)]
    long = [round(float(x), 4) for x in np.linspace(1.0, 8.0, count) * (1.0 + rng.uniform(0.0, 0.2, count))]
    return short, long


def _hub_longrope(rotary_dim):
    """The Hub's Phi-3.5 / Phi-4-mini config format (`rope_scaling.type` "longrope"): the builder
    reads it; transformers 5 saves `rope_parameters.rope_type`, for which it fails (KeyError 'type')."""
    short, long = _longrope_factors(rotary_dim // 2, SEED)

    def edit(config):
        config.pop("rope_parameters", None)
        config["rope_theta"] = 10000.0
        config["original_max_position_embeddings"] = LONGROPE_ORIGINAL
        config["rope_scaling"] = {"type": "longrope", "short_factor": short, "long_factor": long}
    return edit


def _gemma3_flat_rope(config):
    """transformers 5 nests Gemma3's rope settings per layer type, and 0.18's builder reads one
    `rope_parameters` (it fails with KeyError 'rope_type'): one flat section, the global layers'
    settings plus `rope_local_base_freq`, which the builder lifts onto the config (transformers
    keeps the section and fills in its per-type entries from it when it loads the model)."""
    per_type = config.pop("rope_parameters")
    config["rope_parameters"] = dict(per_type["full_attention"],
                                     rope_local_base_freq=per_type["sliding_attention"]["rope_theta"])


class _GptOssMxfp4Experts:
    """Draws the experts as MXFP4 blocks (4-bit e2m1 codes, a power-of-two scale per 32 inputs),
    stores them under the released checkpoints' names (`*_blocks` [E, N, K/32, 16], `*_scales`
    [E, N, K/32]; 0.18's int4 build reads those), and sets the model's dense expert weights to their
    exact decoding, so the fp32 build (which reads the dense weights) is the same model."""
    MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

    def __init__(self):
        self.blocks = {}

    def _draw(self, generator, experts, outputs, inputs):
        import torch

        codes = torch.randint(0, 16, (experts, outputs, inputs // 32, 32), generator=generator, dtype=torch.uint8)
        scales = torch.randint(120, 124, (experts, outputs, inputs // 32), generator=generator, dtype=torch.uint8)
        packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()   # element 2j low, 2j+1 high
        magnitudes = torch.tensor(self.MAGNITUDES, dtype=torch.float32)[(codes & 7).long()]
        values = torch.where((codes & 8) != 0, -magnitudes, magnitudes)
        dense = values * torch.pow(2.0, scales.float() - 127.0).unsqueeze(-1)
        return packed, scales, dense.reshape(experts, outputs, inputs)

    def __call__(self, model, seed):
        import torch

        generator = torch.Generator().manual_seed(seed + 2)
        with torch.no_grad():
            for i, layer in enumerate(model.model.layers):
                experts = layer.mlp.experts
                count, hidden, double_inter = experts.gate_up_proj.shape
                inter = experts.down_proj.shape[1]
                prefix = f"model.layers.{i}.mlp.experts."
                for name, outputs, inputs in (("gate_up_proj", double_inter, hidden), ("down_proj", hidden, inter)):
                    packed, scales, dense = self._draw(generator, count, outputs, inputs)
                    getattr(experts, name).copy_(dense.transpose(-1, -2))   # HF keeps them input-major
                    self.blocks[prefix + name + "_blocks"] = packed
                    self.blocks[prefix + name + "_scales"] = scales

    def extra_tensors(self, directory):
        from safetensors.torch import load_file, save_file

        path = os.path.join(directory, "model.safetensors")
        tensors = load_file(path)
        tensors.update(self.blocks)
        save_file(tensors, path, metadata={"format": "pt"})


# Stand-ins for the Hub's remote code (InternLM2, ChatGLM3): the module tree and weight names of the
# Hub models, nothing else (the builder never runs them).
_INTERNLM2_CONFIG = '''
from transformers import PretrainedConfig


class InternLM2Config(PretrainedConfig):
    model_type = "internlm2"

    def __init__(self, vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=256,
                 rms_norm_eps=1e-6, bias=False, rope_theta=10000.0, initializer_range=0.1,
                 tie_word_embeddings=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.bias = bias
        self.rope_theta = rope_theta
        self.initializer_range = initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
'''
_INTERNLM2_MODEL = '''
"""Module tree and weight names of InternLM2's Hub code; weights only: the builder never runs it."""
import torch
from torch import nn
from transformers import PreTrainedModel

from .configuration_internlm2 import InternLM2Config


class InternLM2RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps


class InternLM2Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        head_dim = config.hidden_size // config.num_attention_heads
        self.wqkv = nn.Linear(config.hidden_size, (config.num_attention_heads + 2 * config.num_key_value_heads)
                              * head_dim, bias=config.bias)
        self.wo = nn.Linear(config.num_attention_heads * head_dim, config.hidden_size, bias=config.bias)


class InternLM2MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)


class InternLM2DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = InternLM2Attention(config)
        self.feed_forward = InternLM2MLP(config)
        self.attention_norm = InternLM2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn_norm = InternLM2RMSNorm(config.hidden_size, config.rms_norm_eps)


class InternLM2PreTrainedModel(PreTrainedModel):
    config_class = InternLM2Config
    base_model_prefix = "model"

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()


class InternLM2Model(InternLM2PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(InternLM2DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = InternLM2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()


class InternLM2ForCausalLM(InternLM2PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = InternLM2Model(config)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.output
'''
_CHATGLM_CONFIG = '''
from transformers import PretrainedConfig


class ChatGLMConfig(PretrainedConfig):
    model_type = "chatglm"

    def __init__(self, num_layers=2, padded_vocab_size=500, hidden_size=128, ffn_hidden_size=192, kv_channels=64,
                 num_attention_heads=2, seq_length=256, layernorm_epsilon=1e-5, rmsnorm=True,
                 add_qkv_bias=True, multi_query_attention=True, multi_query_group_num=1, initializer_range=0.1,
                 tie_word_embeddings=False, **kwargs):
        self.num_layers = num_layers
        self.num_hidden_layers = num_layers
        self.padded_vocab_size = padded_vocab_size
        self.vocab_size = padded_vocab_size
        self.hidden_size = hidden_size
        self.ffn_hidden_size = ffn_hidden_size
        self.kv_channels = kv_channels
        self.head_dim = kv_channels
        self.num_attention_heads = num_attention_heads
        self.seq_length = seq_length
        self.layernorm_epsilon = layernorm_epsilon
        self.rms_norm_eps = layernorm_epsilon
        self.rmsnorm = rmsnorm
        self.add_qkv_bias = add_qkv_bias
        self.multi_query_attention = multi_query_attention
        self.multi_query_group_num = multi_query_group_num
        self.initializer_range = initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
'''
_CHATGLM_MODEL = '''
"""Module tree and weight names of ChatGLM3's Hub code; weights only: the builder never runs it."""
import torch
from torch import nn
from transformers import PreTrainedModel

from .configuration_chatglm import ChatGLMConfig


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps


class SelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        qkv = (config.num_attention_heads + 2 * config.multi_query_group_num) * config.kv_channels
        self.query_key_value = nn.Linear(config.hidden_size, qkv, bias=config.add_qkv_bias)
        self.dense = nn.Linear(config.num_attention_heads * config.kv_channels, config.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, 2 * config.ffn_hidden_size, bias=False)
        self.dense_4h_to_h = nn.Linear(config.ffn_hidden_size, config.hidden_size, bias=False)


class GLMBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.layernorm_epsilon)
        self.self_attention = SelfAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.layernorm_epsilon)
        self.mlp = MLP(config)


class GLMTransformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(GLMBlock(config) for _ in range(config.num_layers))
        self.final_layernorm = RMSNorm(config.hidden_size, config.layernorm_epsilon)


class Embedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)


class ChatGLMPreTrainedModel(PreTrainedModel):
    config_class = ChatGLMConfig
    base_model_prefix = "transformer"

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()


class ChatGLMModel(ChatGLMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embedding = Embedding(config)
        self.encoder = GLMTransformer(config)
        self.output_layer = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        self.post_init()


class ChatGLMForConditionalGeneration(ChatGLMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.transformer = ChatGLMModel(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.transformer.output_layer
'''


def _remote_code_checkpoint(config_module, config_source, model_module, model_source, config_class, model_class,
                            architecture, auto_map, fields):
    """A write_checkpoint for a Hub remote-code model: the stand-in's two modules beside the
    weights, config.json's auto_map naming them."""
    def write(directory, seed):
        import importlib.util

        import torch

        os.makedirs(directory, exist_ok=True)
        for module, source in ((config_module, config_source), (model_module, model_source)):
            with open(os.path.join(directory, module + ".py"), "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(source).lstrip())
        # Import the two files as a package, as transformers' remote-code loader does.
        package = f"oga_arch_standin_{model_module}"
        spec = importlib.util.spec_from_file_location(package, os.path.join(directory, "__init__.py"),
                                                      submodule_search_locations=[directory])
        open(os.path.join(directory, "__init__.py"), "w").close()
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[package] = pkg
        try:
            modules = {}
            for module in (config_module, model_module):
                sub_spec = importlib.util.spec_from_file_location(f"{package}.{module}",
                                                                  os.path.join(directory, module + ".py"))
                sub = importlib.util.module_from_spec(sub_spec)
                sys.modules[f"{package}.{module}"] = sub
                sub_spec.loader.exec_module(sub)
                modules[module] = sub
            torch.manual_seed(seed)
            config = getattr(modules[config_module], config_class)(**fields)
            config.architectures = [architecture]
            config.auto_map = auto_map
            model = getattr(modules[model_module], model_class)(config).eval()
            _randomize(model, seed)
            model.save_pretrained(directory)
        finally:
            for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
                del sys.modules[name]
            os.remove(os.path.join(directory, "__init__.py"))
        write_tokenizer(directory)
        # save_pretrained copies nothing of a module it did not load through auto_map: keep ours.
        _edit_config(directory, lambda c: c.update(architectures=[architecture], auto_map=auto_map))
    return write


# ---------------------------------------------------------------------------------------------
# The recipes

def _alternating(layers, first="sliding_attention"):
    other = "full_attention" if first == "sliding_attention" else "sliding_attention"
    return [first if i % 2 == 0 else other for i in range(layers)]


_gpt_oss_experts = _GptOssMxfp4Experts()

_RECIPES = [
    Architecture("llama", "LlamaForCausalLM", _transformers_checkpoint(
        "LlamaConfig", "LlamaForCausalLM", dict(SMALL, rms_norm_eps=1e-5))),
    Architecture("mistral", "MistralForCausalLM", _transformers_checkpoint(
        # No sliding_window: 0.18's builder writes a window section for it but keeps the graph's
        # window off (local_window_size -1), and 0.18 then fails past 2 x window positions.
        "MistralConfig", "MistralForCausalLM", dict(SMALL, sliding_window=None))),
    Architecture("qwen2", "Qwen2ForCausalLM", _transformers_checkpoint(
        "Qwen2Config", "Qwen2ForCausalLM", dict(SMALL))),   # q/k/v biases, drawn by _randomize
    Architecture("qwen3", "Qwen3ForCausalLM", _transformers_checkpoint(
        "Qwen3Config", "Qwen3ForCausalLM", dict(SMALL))),
    Architecture("phi3", "Phi3ForCausalLM", _transformers_checkpoint(
        "Phi3Config", "Phi3ForCausalLM", dict(SMALL, original_max_position_embeddings=MAX_POSITIONS))),
    Architecture("phi3.5-longrope", "Phi3ForCausalLM", _transformers_checkpoint(
        "Phi3Config", "Phi3ForCausalLM", dict(SMALL, original_max_position_embeddings=LONGROPE_ORIGINAL),
        edit_config=_hub_longrope(SMALL["head_dim"])), longrope_original_max=LONGROPE_ORIGINAL),
    Architecture("phi4-mini", "Phi3ForCausalLM", _transformers_checkpoint(
        "Phi3Config", "Phi3ForCausalLM",
        dict(WIDE_HEADS, original_max_position_embeddings=LONGROPE_ORIGINAL, partial_rotary_factor=0.75,
             tie_word_embeddings=True),
        edit_config=_hub_longrope(48)), longrope_original_max=LONGROPE_ORIGINAL),
    Architecture("phi2", "PhiForCausalLM", _transformers_checkpoint(
        "PhiConfig", "PhiForCausalLM", dict(WIDE_HEADS, num_key_value_heads=2, partial_rotary_factor=0.5,
                                            hidden_act="gelu_new"))),
    Architecture("gemma", "GemmaForCausalLM", _transformers_checkpoint(
        "GemmaConfig", "GemmaForCausalLM", dict(SMALL, hidden_act="gelu_pytorch_tanh",
                                                hidden_activation="gelu_pytorch_tanh"))),
    Architecture("gemma2", "Gemma2ForCausalLM", _transformers_checkpoint(
        "Gemma2Config", "Gemma2ForCausalLM",
        dict(SMALL, sliding_window=WINDOW, attn_logit_softcapping=20.0, final_logit_softcapping=10.0,
             query_pre_attn_scalar=16, layer_types=_alternating(2))),
        sliding_window=WINDOW, batch_runs_in_0_18=False),
    Architecture("gemma3", "Gemma3ForCausalLM", _transformers_checkpoint(
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        dict(SMALL, num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=16,
             layer_types=["sliding_attention"] * 3 + ["full_attention"],
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
        edit_config=_gemma3_flat_rope), sliding_window=WINDOW, batch_runs_in_0_18=False),
    Architecture("granite", "GraniteForCausalLM", _transformers_checkpoint(
        "GraniteConfig", "GraniteForCausalLM",
        dict(SMALL, embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.2,
             logits_scaling=2.5))),
    Architecture("olmo", "OlmoForCausalLM", _transformers_checkpoint(
        "OlmoConfig", "OlmoForCausalLM", dict(SMALL))),
    Architecture("nemotron", "NemotronForCausalLM", _transformers_checkpoint(
        "NemotronConfig", "NemotronForCausalLM", dict(WIDE_HEADS, partial_rotary_factor=0.5,
                                                      hidden_act="relu2"))),
    Architecture("ernie4_5", "Ernie4_5ForCausalLM", _transformers_checkpoint(
        "Ernie4_5Config", "Ernie4_5ForCausalLM", dict(SMALL, use_bias=False))),
    Architecture("smollm3", "SmolLM3ForCausalLM", _transformers_checkpoint(
        # RoPE on every layer: 0.18's builder fails on SmolLM3's NoPE layers (KeyError 'position_ids').
        "SmolLM3Config", "SmolLM3ForCausalLM", dict(SMALL, no_rope_layers=[1, 1], no_rope_layer_interval=4))),
    Architecture("gpt-oss", "GptOssForCausalLM", _transformers_checkpoint(
        "GptOssConfig", "GptOssForCausalLM",
        dict(SMALL, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
             layer_types=_alternating(2), attention_bias=True),
        after=_gpt_oss_experts), sliding_window=WINDOW, has_experts=True, batch_runs_in_0_18=False),
    Architecture("lfm2", "Lfm2ForCausalLM", _transformers_checkpoint(
        "Lfm2Config", "Lfm2ForCausalLM",
        dict({k: v for k, v in SMALL.items() if k != "head_dim"}, num_hidden_layers=4, norm_eps=1e-5,
             conv_L_cache=3, block_auto_adjust_ff_dim=False,
             layer_types=["conv", "full_attention", "conv", "full_attention"])), has_conv_layers=True),
    Architecture("lfm2-moe", "Lfm2MoeForCausalLM", _transformers_checkpoint(
        "Lfm2MoeConfig", "Lfm2MoeForCausalLM",
        dict({k: v for k, v in SMALL.items() if k != "head_dim"}, num_hidden_layers=4, norm_eps=1e-5,
             conv_L_cache=3, moe_intermediate_size=64, num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
             use_expert_bias=True, layer_types=["conv", "full_attention", "conv", "full_attention"])),
        has_conv_layers=True, has_experts=True),
    Architecture("hunyuan", "HunYuanDenseV1ForCausalLM", _transformers_checkpoint(
        "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", dict(SMALL)), has_position_ids=True),
    Architecture("internlm2", "InternLM2ForCausalLM", _remote_code_checkpoint(
        "configuration_internlm2", _INTERNLM2_CONFIG, "modeling_internlm2", _INTERNLM2_MODEL,
        "InternLM2Config", "InternLM2ForCausalLM", "InternLM2ForCausalLM",
        {"AutoConfig": "configuration_internlm2.InternLM2Config",
         "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"},
        dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
             bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)), remote_code=True),
    Architecture("chatglm3", "ChatGLMModel", _remote_code_checkpoint(
        "configuration_chatglm", _CHATGLM_CONFIG, "modeling_chatglm", _CHATGLM_MODEL,
        "ChatGLMConfig", "ChatGLMForConditionalGeneration", "ChatGLMModel",
        {"AutoConfig": "configuration_chatglm.ChatGLMConfig",
         "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration",
         "AutoModelForCausalLM": "modeling_chatglm.ChatGLMForConditionalGeneration"},
        dict(padded_vocab_size=VOCAB_SIZE, seq_length=MAX_POSITIONS, bos_token_id=BOS, eos_token_id=EOS,
             pad_token_id=PAD)), remote_code=True),
]

ARCHITECTURES = {recipe.name: recipe for recipe in _RECIPES}


# ---------------------------------------------------------------------------------------------
# Building

_scratch = []        # this process's temporary directory for checkpoints, removed at exit
_checkpoints = {}    # architecture name -> its checkpoint directory, written once per process
BUILD_SECONDS = {}   # (name, precision) -> seconds the builder took in this process (checkpoint included)


def checkpoint_dir(name):
    """The HF checkpoint of architecture `name`, written once per process."""
    recipe = ARCHITECTURES[name]
    if name not in _checkpoints:
        if not _scratch:
            _scratch.append(tempfile.mkdtemp(prefix="oga-arch-checkpoints-"))
            atexit.register(shutil.rmtree, _scratch[0], True)
        directory = os.path.join(_scratch[0], name)
        shutil.rmtree(directory, ignore_errors=True)   # a write that failed earlier in this process
        recipe.write_checkpoint(directory, recipe.seed)
        _checkpoints[name] = directory
    return _checkpoints[name]


def build_architecture(name, out_dir, precision="fp32"):
    """0.18's builder (`-e cpu -p precision`) on architecture `name`'s checkpoint into out_dir;
    reuses a finished build (its `.complete` marker). Returns out_dir."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    recipe = ARCHITECTURES[name]
    if precision not in recipe.precisions:
        raise ValueError(f"{name} is built in {', '.join(recipe.precisions)}, not {precision!r}")
    out_dir = os.fspath(out_dir)
    if os.path.isfile(os.path.join(out_dir, ".complete")):
        return out_dir
    check_builder_dependencies()
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    start = time.perf_counter()
    hf_dir = checkpoint_dir(name)
    # Remote code is copied into transformers' module cache: keep it in this process's scratch.
    extra = ("hf_remote=true",) if recipe.remote_code else ()
    run_oga_builder(hf_dir, out_dir, precision=precision, extra=extra,
                    environment={"HF_MODULES_CACHE": os.path.join(_scratch[0], "hf-modules")})
    BUILD_SECONDS[name, precision] = time.perf_counter() - start
    open(os.path.join(out_dir, ".complete"), "w").close()
    return out_dir


def architecture_dir(tmp_path_factory, name, precision):
    """The built directory of architecture `name` in `precision`, built once per run (or found in
    $OGA_CACHE_DIR); a missing builder dependency fails the test naming the install command."""
    out_dir = os.path.join(cache_root(tmp_path_factory, "architecture-models"), f"{name}-{precision}-v{RECIPE_VERSION}")
    try:
        return build_architecture(name, out_dir, precision)
    except MissingBuilderDependencies as e:
        pytest.fail(str(e), pytrace=False)


if __name__ == "__main__":   # python tests/architecture_models.py OUT_ROOT [NAME ...]: build, print timings
    root = sys.argv[1] if len(sys.argv) > 1 else "architecture-models"
    names = sys.argv[2:] or list(ARCHITECTURES)
    print(f"{'architecture':<18} {'precision':<9} {'seconds':>8}", flush=True)
    for name in names:
        for precision in ARCHITECTURES[name].precisions:
            started = time.perf_counter()
            try:
                build_architecture(name, os.path.join(root, f"{name}-{precision}"), precision)
                print(f"{name:<18} {precision:<9} {time.perf_counter() - started:8.2f}", flush=True)
            except Exception as e:   # report every architecture, then the failures in full
                print(f"{name:<18} {precision:<9} FAILED: {str(e)[-1500:]}", flush=True)
