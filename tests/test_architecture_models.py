"""tests/architecture_models.py's builds carry what its ARCHITECTURES table says they carry, so the
tests that rely on a fact (a window, LongRoPE's switch, conv state, position_ids, experts, random
biases) exercise it. Reads the graphs only (no weights)."""
import json
import os

import pytest

from architecture_models import ARCHITECTURES, LONGROPE_ORIGINAL, VOCAB_SIZE, architecture_dir, build_architecture

onnx = pytest.importorskip("onnx")
CASES = [(name, precision) for name in ARCHITECTURES for precision in ARCHITECTURES[name].precisions]


def graph(directory):
    return onnx.load(os.path.join(directory, "model.onnx"), load_external_data=False).graph


def attribute(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


@pytest.mark.parametrize("name,precision", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_the_build_has_the_recipes_features(name, precision, tmp_path_factory):
    recipe = ARCHITECTURES[name]
    directory = architecture_dir(tmp_path_factory, name, precision)
    g = graph(directory)
    ops = {node.op_type for node in g.node}
    inputs = {i.name for i in g.input}
    with open(os.path.join(directory, "genai_config.json")) as f:
        config = json.load(f)
    assert config["model"]["vocab_size"] == VOCAB_SIZE
    assert "engine" not in config   # static batching: OGA's CPU build

    attention = [node for node in g.node if node.op_type == "GroupQueryAttention"]
    windows = {attribute(node, "local_window_size", -1) for node in attention}
    if recipe.sliding_window:
        assert windows == {-1, recipe.sliding_window}
    else:
        assert windows == {-1}
    assert ("If" in ops) == (recipe.longrope_original_max is not None)
    if recipe.longrope_original_max:
        assert recipe.longrope_original_max == LONGROPE_ORIGINAL
    assert any(".conv" in i for i in inputs) == recipe.has_conv_layers
    assert ("position_ids" in inputs) == recipe.has_position_ids
    assert bool(ops & {"MoE", "QMoE"}) == recipe.has_experts
    if recipe.has_experts:
        assert ("QMoE" if precision == "int4" else "MoE") in ops
    assert ("MatMulNBits" in ops) == (precision == "int4")


def test_random_biases_survive_the_build(tmp_path_factory):
    """Qwen2's q/k/v biases (transformers zeroes them; the builder drops all-zero ones): an Add after
    the fused q|k|v projection, which Llama (no biases) has not."""
    def qkv_bias(name):
        g = graph(architecture_dir(tmp_path_factory, name, "fp32"))
        return any(node.op_type == "Add" and "/attn/qkv_proj/" in node.name for node in g.node)

    assert qkv_bias("qwen2") and not qkv_bias("llama")


def test_unknown_names_and_precisions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown architecture 'falcon'"):
        build_architecture("falcon", tmp_path / "x", "fp32")
    with pytest.raises(ValueError, match=r"llama is built in fp32, int4, not 'fp16'"):
        build_architecture("llama", tmp_path / "x", "fp16")
    assert not (tmp_path / "x").exists()
