"""Quantized fused CPU decoders (oga.models, precision None / int4 / int8): their logits against the
numpy reference run on exactly the weights the graph computes with (the GGUF blocks dequantized, or
the round-to-nearest codes dequantized), step by step through prefill, decode and mixed steps.

Tolerances: with accuracy_level 0 MatMulNBits computes in float32, so the graph must match to
float32 accuracy (QUANT_TOL, as the fp32 graphs do). With accuracy_level 4 (the default: int8
activations) every activation block of 32 is rounded to 8 bits, one step being 1/127 of the block's
largest value; that error is the graph's own, not a defect, so the bound is relative to the logits'
scale (INT8_ACTIVATION_TOL), and the greedy choice must still be the reference's where the
reference's margin exceeds twice the measured difference."""
from dataclasses import replace

import gguf
import numpy as np
import pytest

import oga as og
from oga import ortops, testing
from oga.models import build
from oga.models import linear_weights as lw
from oga.models import quantize as qz
from oga.models.onnx_cpu_fused import build_cpu_fused_graph
from oga.models.random_weights import random_model, tiny_spec
from oga.models.reference import Reference
from oga.models.spec import LoadedModel
from greedy_runs import begin_all, drain
from paged_runner import BLOCK, NUM_BLOCKS, PagedRunner, ReferenceRows

QUANT_TOL = 2e-4
INT8_ACTIVATION_TOL = 0.05          # of the largest |logit|
FP16_KV_TOL = 0.01                  # of the largest |logit|

SCHEDULE = [[("a", 10), ("b", 7)], [("a", 1), ("b", 3), ("c", 5)], [("c", 1), ("a", 1), ("b", 1), ("d", 9)],
            [("a", 1), ("b", 1), ("c", 1), ("d", 1)]]

SPECS = {
    "llama": tiny_spec(vocab_size=97, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                       head_dim=16),
    "qwen2-bias-tied": tiny_spec(vocab_size=97, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=1,
                                 head_dim=16, architecture="qwen2", qkv_bias=True, tie_word_embeddings=True),
}


def _gguf_source(spec, seed, types):
    """A random model as if read from a GGUF file whose linear weights are stored as types[name kind]
    (Q4_0 / Q4_1 / Q8_0) and embedding as Q8_0: blocks from gguf's own quantizer, float weights its
    dequantization."""
    loaded = random_model(spec, seed=seed)
    weights, blocks = dict(loaded.weights), {}
    for name, w in loaded.weights.items():
        if w.ndim != 2:
            continue
        kind = "embedding" if name == "model.embed_tokens.weight" else name.rsplit(".", 2)[-2]
        type_name = types.get(kind, types.get("default"))
        if type_name is None:
            continue
        qtype = getattr(gguf.GGMLQuantizationType, type_name)
        raw = gguf.quants.quantize(w, qtype)
        blocks[name] = qz.from_gguf(type_name, raw, *w.shape)
        weights[name] = gguf.quants.dequantize(raw, qtype).reshape(w.shape).astype(np.float32)
    return LoadedModel(spec=spec, weights=weights, blocks=blocks)


def _effective(loaded, precision):
    """The model the fused graph computes at `precision`: linear_weights' choices dequantized, the
    LM head apart from the embedding (a tied head may be quantized while the table is not)."""
    spec = loaded.spec
    weights = dict(loaded.weights)
    for name, w in loaded.weights.items():
        if w.ndim == 2 and name not in ("model.embed_tokens.weight", "lm_head.weight"):
            weights[name] = lw.choose(name, w, loaded.blocks, precision).effective()
    head = "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
    weights["lm_head.weight"] = lw.choose(head, loaded.weights[head], loaded.blocks, precision,
                                          None if precision is None else 8).effective()
    return LoadedModel(spec=replace(spec, tie_word_embeddings=False), weights=weights)


def _run(loaded, precision, accuracy_level, kv_cache="float32"):
    spec = loaded.spec
    model = build_cpu_fused_graph(spec, loaded.weights, blocks=loaded.blocks, precision=precision,
                                  accuracy_level=accuracy_level, block_size=BLOCK, context_length=spec.context_length,
                                  kv_cache=kv_cache)
    runner = PagedRunner(model, spec, block_size=BLOCK, num_blocks=NUM_BLOCKS,
                         cache_dtype=np.float16 if kv_cache == "float16" else np.float32)
    refs = ReferenceRows(_effective(loaded, precision))
    rng = np.random.default_rng(9)
    worst, scale, flips_allowed = 0.0, 0.0, []
    for rows in SCHEDULE:
        step = [(name, list(map(int, rng.integers(0, spec.vocab_size, n)))) for name, n in rows]
        got = runner.step(step)
        expected = [e[-1] for e in refs.step(step)]
        for row, want in zip(got, expected):
            difference = float(np.abs(row - want).max())
            worst, scale = max(worst, difference), max(scale, float(np.abs(want).max()))
            top2 = np.sort(want)[-2:]
            if top2[1] - top2[0] > 2 * difference:
                flips_allowed.append(int(np.argmax(row)) == int(np.argmax(want)))
    return worst, scale, flips_allowed, model


def _quantized_op(accuracy_level):
    """The node of a quantized linear: oga's own at int8 activations, MatMulNBits at float ones."""
    return "QuantizedLinear" if accuracy_level == 4 else "MatMulNBits"


def _other_quantized_op(accuracy_level):
    return "MatMulNBits" if accuracy_level == 4 else "QuantizedLinear"


@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("types", [{"default": "Q4_1", "embedding": "Q8_0"},
                                   {"default": "Q4_0", "v_proj": "Q8_0", "down_proj": "Q8_0", "embedding": "Q8_0"},
                                   {"default": "Q8_0"}], ids=["q4_1", "q4_0-mixed-q8_0", "q8_0"])
def test_gguf_blocks_as_they_are_match_the_reference(spec_name, types, accuracy_level):
    loaded = _gguf_source(SPECS[spec_name], 3, types)
    worst, scale, argmax_equal, model = _run(loaded, None, accuracy_level)
    print(f"{spec_name} {types} accuracy_level {accuracy_level}: max abs diff {worst:.2e} (logits up to {scale:.2f})")
    assert worst < (QUANT_TOL if accuracy_level == 0 else INT8_ACTIVATION_TOL * scale)
    assert all(argmax_equal) and argmax_equal
    kinds = {n.op_type for n in model.graph.node}
    assert _quantized_op(accuracy_level) in kinds and "Gemm" not in kinds   # every linear stays quantized
    assert _other_quantized_op(accuracy_level) not in kinds
    assert "GatherBlockQuantized" in kinds                          # the Q8_0 embedding as is


@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_round_to_nearest_builds_match_the_reference(precision, accuracy_level):
    loaded = random_model(SPECS["llama"], seed=4)
    worst, scale, argmax_equal, model = _run(loaded, precision, accuracy_level)
    print(f"{precision} accuracy_level {accuracy_level}: max abs diff {worst:.2e} (logits up to {scale:.2f})")
    assert worst < (QUANT_TOL if accuracy_level == 0 else INT8_ACTIVATION_TOL * scale)
    assert all(argmax_equal) and argmax_equal
    assert _other_quantized_op(accuracy_level) not in {n.op_type for n in model.graph.node}
    bits = {int(next(a.i for a in n.attribute if a.name == "bits")) for n in model.graph.node
            if n.op_type == _quantized_op(accuracy_level)}
    assert bits == ({4, 8} if precision == "int4" else {8})        # the LM head is 8-bit either way


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_float16_kv_caches_match_the_reference(accuracy_level):
    """The default for quantized builds: keys and values stored as float16 (rounding each to 11
    significant bits, a relative 2^-11 ~ 5e-4), within FP16_KV_TOL of the reference more than the
    float32-cache build."""
    loaded = _gguf_source(SPECS["llama"], 3, {"default": "Q4_1", "embedding": "Q8_0"})
    worst, scale, argmax_equal, model = _run(loaded, None, accuracy_level, kv_cache="float16")
    print(f"float16 KV, accuracy_level {accuracy_level}: max abs diff {worst:.2e} (logits up to {scale:.2f})")
    bound = (QUANT_TOL if accuracy_level == 0 else INT8_ACTIVATION_TOL * scale) + FP16_KV_TOL * scale
    assert worst < bound and all(argmax_equal) and argmax_equal
    assert model.graph.input[-1].type.tensor_type.elem_type == 10               # float16 caches
    assert build_cpu_fused_graph(loaded.spec, loaded.weights, blocks=loaded.blocks, block_size=BLOCK,
                                 context_length=64).graph.input[-1].type.tensor_type.elem_type == 10  # the default


def test_smollm2_int4_matches_the_reference_on_the_gguf_weights(smollm2_int4_dir, tmp_path):
    """The default SmolLM2 build (its Q4_1 / Q8_0 blocks as they are) against the reference on the
    GGUF's dequantized weights: to float32 accuracy with float activations and caches
    (accuracy_level 0, float32 KV), and as built by default (int8 activations, float16 KV) within
    their rounding, with the same next token. Float16 caches alone move SmolLM2's logits by 0.005-0.011;
    30 layers of int8 activation rounding move them by 0.7-2.9 (logits up to ~20) however the inputs
    are perturbed, so the bound is 20% of the largest logit."""
    import onnx

    from conftest import smollm2_gguf_path
    from static_models import load_gguf_weights

    loaded = load_gguf_weights(smollm2_gguf_path())         # load_gguf(..., with_tokenizer=False), once a run
    prompt = [504, 3575, 282, 4649, 314]                     # "The capital of France is"
    expected = Reference(loaded).step(prompt)[-1]
    exact = build(smollm2_gguf_path(), str(tmp_path / "acc0"), context_length=256, num_blocks=32, accuracy_level=0,
                  kv_cache="float32")
    for model_dir, bound, cache in ((exact, 1e-3, np.float32),
                                    (smollm2_int4_dir, 0.2 * float(np.abs(expected).max()), np.float16)):
        runner = PagedRunner(onnx.load(f"{model_dir}/model.onnx"), loaded.spec, block_size=16, num_blocks=4,
                             reserve_ahead=0, cache_dtype=cache)
        got = runner.step([("p", prompt)])[0]
        difference = float(np.abs(got - expected).max())
        print(f"SmolLM2 {model_dir}: last-token logits max abs diff {difference:.2e}")
        assert difference < bound
        assert int(np.argmax(got)) == int(np.argmax(expected)) == 7042          # " Paris"


def test_the_engine_updates_the_fused_caches_in_place(tmp_path):
    """No whole-cache copy in any step: the executor binds present_* to past_*'s memory, so
    oga.PagedGroupQueryAttention never has to copy (it counts each time it must)."""
    out = build(None, str(tmp_path / "m"), random_spec=replace(SPECS["llama"], num_layers=3), precision="int4",
                block_size=4, max_batch_size=4, max_scheduled_tokens=16, num_blocks=64)
    engine = og.Engine(og.Model(out))
    copies = ortops.cache_copies()
    requests = begin_all(og, engine, ([5, 9, 13], list(range(3, 40)), [7] * 20), 20)
    drain(og, engine, requests)                     # checks the engine's invariants after every step
    assert testing.engine_counters(engine)["committed_steps"] > 20
    assert ortops.cache_copies() == copies
