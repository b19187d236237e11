"""oga.models graph builders: the CPU paged decoder against the numpy reference, in-place caches,
logits variants, genai_config.json, the CLI, onnxruntime-genai 0.18's Engine on the built
directories, and the CUDA (PagedAttention) graph's validity."""
import copy
import json
import os
import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from oga.models import build
from oga.models import genai_config
from oga.models.__main__ import main as cli_main
from oga.models.onnx_cpu import build_cpu_graph, rope_inv_freq
from oga.models.onnx_cpu_fused import build_cpu_fused_graph
from oga.models.onnx_cuda import build_cuda_graph
from oga.models.random_weights import random_model
from oga.models.reference import Reference, greedy
from oga.models.reference import rope_inv_freq as reference_inv_freq
from oga.models.spec import DecoderSpec

from conftest import smollm2_gguf_path
from greedy_runs import greedy as engine_greedy
from paged_runner import PagedRunner, ReferenceRows
from static_models import load_gguf_weights

BLOCK = 4
NUM_BLOCKS = 40
TOL = 1e-4

SPEC = DecoderSpec(
    architecture="llama", vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5, context_length=256,
    tie_word_embeddings=False, qkv_bias=False, sliding_window=None, bos_token_id=1, eos_token_ids=[2],
    pad_token_id=0)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
def _variant(name):
    from dataclasses import replace
    return {
        "llama": SPEC,
        "qwen2-bias-tied": replace(SPEC, architecture="qwen2", qkv_bias=True, tie_word_embeddings=True,
                                   rope_theta=1e6),
        "llama3-rope-mha": replace(SPEC, num_kv_heads=4, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0),
        "mistral-window": replace(SPEC, architecture="mistral", sliding_window=5, num_kv_heads=1),
    }[name]


def _prompts(rng, *lengths):
    return [list(map(int, rng.integers(0, SPEC.vocab_size, n))) for n in lengths]


# Each step: rows of (sequence, number of new tokens); a sequence's first row is its prefill
# (maybe a chunk of it). Step 1: pure prefill; 2 and 3: mixed decodes, chunks and new prompts;
# 4: pure decode.
SCHEDULE = [
    [("a", 10), ("b", 7)],
    [("a", 1), ("b", 3), ("c", 3), ("d", 6)],
    [("d", 9), ("a", 1), ("c", 1), ("b", 1), ("e", 1)],
    [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)],
]


def _fused_fp32(spec, weights, **kwargs):
    return build_cpu_fused_graph(spec, weights, precision="fp32", context_length=spec.context_length, **kwargs)


# Both CPU graphs, at fp32: the standard-op one and the fused one (oga's operators).
GRAPH_BUILDERS = {"standard": build_cpu_graph, "fused": _fused_fp32}


def _run_schedule(runner, refs, rng, check):
    for rows in SCHEDULE:
        step = [(name, _prompts(rng, n)[0]) for name, n in rows]
        check(runner.step(step), refs.step(step), step)


@pytest.mark.parametrize("graph", list(GRAPH_BUILDERS))
@pytest.mark.parametrize("variant, block_size", [("llama", BLOCK), ("llama", 1), ("llama", 16),
                                                 ("qwen2-bias-tied", BLOCK), ("llama3-rope-mha", BLOCK),
                                                 ("mistral-window", BLOCK)])
def test_prefill_decode_and_mixed_steps_match_the_numpy_reference(variant, block_size, graph):
    spec = _variant(variant)
    loaded = random_model(spec, seed=7)
    runner = PagedRunner(GRAPH_BUILDERS[graph](spec, loaded.weights, block_size=block_size), spec,
                         block_size=block_size, num_blocks=NUM_BLOCKS * BLOCK // block_size + 4)
    refs = ReferenceRows(loaded)
    worst = []

    def check(logits, expected, step):
        assert logits.shape == (len(step), spec.vocab_size)
        for row, exp in zip(logits, expected):
            worst.append(float(np.abs(row - exp[-1]).max()))

    _run_schedule(runner, refs, np.random.default_rng(1), check)
    print(f"{variant} {graph} (block size {block_size}): max abs diff {max(worst):.2e}")
    assert max(worst) < TOL


def test_caches_are_updated_in_place_and_only_at_the_rows_slots():
    loaded = random_model(SPEC, seed=2)
    runner = PagedRunner(build_cpu_graph(SPEC, loaded.weights, block_size=BLOCK), SPEC)
    before = {k: v.copy() for k, v in runner.caches.items()}
    runner.step([("a", [5, 6, 7, 8, 9]), ("b", [1, 2])])
    runner.step([("a", [3]), ("b", [4, 4, 4])])
    # the rows' tokens, plus the rest of each row's last block (zeroed so a read of the whole
    # block is finite), and nothing else
    tokens = {runner.slot("a", p) for p in range(6)} | {runner.slot("b", p) for p in range(5)}
    tails = {runner.slot("a", p) for p in range(6, 8)} | {runner.slot("b", p) for p in range(5, 8)}
    for key, arr in runner.caches.items():
        for block in range(arr.shape[0]):
            for slot in range(arr.shape[1]):
                if (block, slot) in tokens:
                    assert np.isfinite(arr[block, slot]).all() and arr[block, slot].any(), (key, block, slot)
                elif (block, slot) in tails:
                    assert not arr[block, slot].any(), (key, block, slot)
                else:
                    assert np.isnan(arr[block, slot]).all() and np.isnan(before[key][block, slot]).all()
    # the key of token 0 of "a" in layer 0 is RoPE(position 0) = the raw k projection of its input
    ref = Reference(loaded)
    ref.step([5, 6, 7, 8, 9, 3])
    block, slot = runner.slot("a", 0)
    assert np.abs(runner.caches[(0, "key")][block, slot] - ref.keys[0][0]).max() < TOL
    block, slot = runner.slot("a", 5)
    assert np.abs(runner.caches[(1, "value")][block, slot] - ref.values[1][5]).max() < TOL


def test_the_fused_graph_writes_only_the_rows_slots_and_reads_no_other():
    """oga.PagedGroupQueryAttention writes each token's slot and nothing else (no tail zeroing: it
    never reads a slot no token wrote, so the NaN every other slot starts with never reaches the
    logits)."""
    loaded = random_model(SPEC, seed=2)
    runner = PagedRunner(_fused_fp32(SPEC, loaded.weights, block_size=BLOCK), SPEC)
    refs = ReferenceRows(loaded)
    for rows in ([("a", [5, 6, 7, 8, 9]), ("b", [1, 2])], [("a", [3]), ("b", [4, 4, 4])]):
        logits = runner.step(rows)
        assert np.isfinite(logits).all()
        assert np.abs(logits - np.stack([r[-1] for r in refs.step(rows)])).max() < TOL
    tokens = {runner.slot("a", p) for p in range(6)} | {runner.slot("b", p) for p in range(5)}
    for key, arr in runner.caches.items():
        for block in range(arr.shape[0]):
            for slot in range(arr.shape[1]):
                assert np.isfinite(arr[block, slot]).all() == ((block, slot) in tokens), (key, block, slot)
    ref = Reference(loaded)
    ref.step([5, 6, 7, 8, 9, 3])
    block, slot = runner.slot("a", 5)
    assert np.abs(runner.caches[(0, "key")][block, slot] - ref.keys[0][5]).max() < TOL
    assert np.abs(runner.caches[(1, "value")][block, slot] - ref.values[1][5]).max() < TOL


def test_present_outputs_come_straight_out_of_scatternd_on_the_inputs():
    model = build_cpu_graph(SPEC, random_model(SPEC).weights, block_size=BLOCK)
    producers = {out: node for node in model.graph.node for out in node.output}
    graph_inputs = {i.name for i in model.graph.input}
    for i in range(SPEC.num_layers):
        for kind in ("key", "value"):
            node = producers[f"present.{i}.{kind}"]
            assert node.op_type == "ScatterND"
            assert node.input[0] == f"past_key_values.{i}.{kind}" and node.input[0] in graph_inputs
            # nobody else rewrites the cache input
            users = [n for n in model.graph.node if node.input[0] in n.input]
            assert users == [node]
    onnx.checker.check_model(model, full_check=True)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output)}
    assert dims["input_ids"] == ["num_tokens"]
    assert dims["block_table"] == ["batch_size", "max_blocks"]
    assert dims["past_key_values.0.key"] == ["num_blocks", BLOCK, 2, 16]
    assert dims["logits"] == ["batch_size", 97]
    assert dims["attention_metadata"] == [3]


def test_fused_present_outputs_come_straight_out_of_the_attention_operator_on_the_inputs():
    model = _fused_fp32(SPEC, random_model(SPEC).weights, block_size=BLOCK)
    producers = {out: node for node in model.graph.node for out in node.output}
    for i in range(SPEC.num_layers):
        node = producers[f"present.{i}.key"]
        assert (node.op_type, node.domain) == ("PagedGroupQueryAttention", "oga")
        assert producers[f"present.{i}.value"] is node
        assert list(node.input[3:8]) == [f"past_key_values.{i}.key", f"past_key_values.{i}.value", "block_table",
                                         "cumulative_sequence_lengths", "past_sequence_lengths"]
        for kind in ("key", "value"):
            assert [n for n in model.graph.node if f"past_key_values.{i}.{kind}" in n.input] == [node]
    onnx.checker.check_model(model, full_check=True)
    # the same graph inputs and outputs as the standard graph: one contract, plus the fused LM head's
    # block maxima (oga.LogitsHead), an output the standard graph's Gemm has no equivalent of
    standard = build_cpu_graph(SPEC, random_model(SPEC).weights, block_size=BLOCK)
    signature = (lambda m: [(v.name, str(v.type)) for v in list(m.graph.input) + list(m.graph.output)
                            if v.name != "logits_block_maxima"])
    assert signature(model) == signature(standard)
    maxima = next(v for v in model.graph.output if v.name == "logits_block_maxima")
    assert [d.dim_param or d.dim_value for d in maxima.type.tensor_type.shape.dim] == [
        "batch_size", -(-SPEC.vocab_size // 1024)]
    assert producers["logits_block_maxima"] is producers["logits"]
    assert (producers["logits"].op_type, producers["logits"].domain) == ("LogitsHead", "oga")
    assert len(model.graph.node) < len(standard.graph.node) / 4


@pytest.mark.parametrize("graph", list(GRAPH_BUILDERS))
def test_per_token_logits_and_logits_indices(graph):
    builder = GRAPH_BUILDERS[graph]
    loaded = random_model(SPEC, seed=4)
    per_token = PagedRunner(builder(SPEC, loaded.weights, block_size=BLOCK, per_token_logits=True), SPEC)
    selected = PagedRunner(builder(SPEC, loaded.weights, block_size=BLOCK, logits_indices=True), SPEC)
    refs = ReferenceRows(loaded)
    rng = np.random.default_rng(5)
    worst = 0.0
    for rows in SCHEDULE[:3]:
        step = [(name, _prompts(rng, n)[0]) for name, n in rows]
        expected = np.concatenate(refs.step(step))
        got = per_token.step(step)
        assert got.shape == (sum(len(t) for _, t in step), SPEC.vocab_size)
        worst = max(worst, float(np.abs(got - expected).max()))
        picks = [len(expected) - 1, 0, 2, 2]                 # any rows, any order, repeats allowed
        got = selected.step(step, logits_indices=picks)
        assert got.shape == (len(picks), SPEC.vocab_size)
        worst = max(worst, float(np.abs(got - expected[picks]).max()))
    print(f"per-token / selected logits: max abs diff {worst:.2e}")
    assert worst < TOL
    with pytest.raises(ValueError, match="mutually exclusive"):
        builder(SPEC, loaded.weights, per_token_logits=True, logits_indices=True)
    assert selected.session.get_outputs()[0].shape[0] == "num_logits"
    assert per_token.session.get_outputs()[0].shape[0] == "num_tokens"


def test_rope_frequencies_follow_hugging_face():
    from dataclasses import replace
    for scaling in (None, {"rope_type": "linear", "factor": 4.0}, LLAMA3_SCALING):
        spec = replace(SPEC, rope_scaling=scaling)
        assert np.allclose(rope_inv_freq(spec), reference_inv_freq(spec), rtol=1e-12, atol=0)
    with pytest.raises(NotImplementedError, match="yarn"):
        rope_inv_freq(replace(SPEC, rope_scaling={"rope_type": "yarn", "factor": 2.0}))


# --------------------------------------------------------------------------------------------
# model directories

def test_build_writes_an_oga_018_directory(tmp_path):
    out = build(None, tmp_path / "m", random_spec=SPEC, max_batch_size=4, max_scheduled_tokens=64)
    assert sorted(os.listdir(out)) == ["genai_config.json", "model.onnx"]     # no tokenizer for random
    config = json.load(open(os.path.join(out, "genai_config.json")))
    decoder = config["model"]["decoder"]
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert "logits_indices" not in decoder["inputs"]
    assert decoder["state_groups"] == [{"kind": "paged_kv", "layer_ids": [0, 1]}]
    assert (decoder["head_size"], decoder["num_key_value_heads"], decoder["num_hidden_layers"]) == (16, 2, 2)
    assert config["model"]["context_length"] == config["search"]["max_length"] == 256
    assert config["model"]["eos_token_id"] == [2]
    assert config["engine"]["dynamic_batching"] == {
        "block_size": 16, "max_batch_size": 4, "max_scheduled_tokens": 64, "num_blocks": 4 * 256 // 16}
    assert genai_config.default_context_length(SPEC, "cpu") == 256
    from dataclasses import replace
    assert genai_config.default_context_length(replace(SPEC, context_length=8192), "cpu") == 4096
    assert genai_config.default_context_length(replace(SPEC, context_length=8192), "cuda") == 8192


def test_cli_builds_random_models_and_reports_errors(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli_main(["build", "--random", "--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "2",
                   "--vocab", "50", "--intermediate", "48", "--output", str(out), "--block-size", "8",
                   "--num-blocks", "20", "--logits-indices"])
    captured = capsys.readouterr()
    assert rc == 0 and "[oga.models]" in captured.err
    config = json.load(open(out / "genai_config.json"))
    assert config["engine"]["dynamic_batching"]["num_blocks"] == 20
    assert config["model"]["decoder"]["inputs"]["logits_indices"] == "logits_indices"
    model = onnx.load(str(out / "model.onnx"))
    assert [i.name for i in model.graph.input if i.name == "logits_indices"]
    assert model.graph.input[-1].type.tensor_type.shape.dim[1].dim_value == 8

    assert cli_main(["build", "--input", str(tmp_path / "missing.gguf"), "--output", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["build", "--random", "--output", str(out), "--per-token-logits", "--logits-indices"])
    with pytest.raises(SystemExit):
        cli_main(["build", "--output", str(out)])                       # neither --input nor --random


def _write_hf_dir(path, loaded):
    header, blobs, offset = {}, [], 0
    for name, w in loaded.weights.items():
        raw = np.ascontiguousarray(w, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(w.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    s = loaded.spec
    config = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": s.vocab_size, "hidden_size": s.hidden_size,
              "intermediate_size": s.intermediate_size, "num_hidden_layers": s.num_layers,
              "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads,
              "rope_theta": s.rope_theta, "rms_norm_eps": s.rms_norm_eps, "max_position_embeddings": s.context_length,
              "tie_word_embeddings": s.tie_word_embeddings, "bos_token_id": s.bos_token_id,
              "eos_token_id": s.eos_token_ids, "pad_token_id": s.pad_token_id}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{{ messages }}", "eos_token": "</s>", "bos_token": "<s>"}, f)


def test_build_from_a_hugging_face_directory_with_external_data(tmp_path, monkeypatch):
    from dataclasses import replace
    import importlib
    build_module = importlib.import_module("oga.models.build")    # the package attribute is the function
    spec = replace(SPEC, architecture="qwen2", qkv_bias=True, tie_word_embeddings=True)
    loaded = random_model(spec, seed=11)
    _write_hf_dir(tmp_path / "hf", loaded)
    monkeypatch.setattr(build_module, "EXTERNAL_DATA_THRESHOLD", 0)      # force model.onnx.data
    out = build(str(tmp_path / "hf"), tmp_path / "out", block_size=BLOCK)
    files = set(os.listdir(out))
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer_config.json",
            "special_tokens_map.json"} <= files and "tokenizer.json" not in files
    assert json.load(open(os.path.join(out, "special_tokens_map.json"))) == {"bos_token": "<s>", "eos_token": "</s>"}
    assert json.load(open(os.path.join(out, "genai_config.json")))["model"]["type"] == "qwen2"
    runner = PagedRunner(onnx.load(os.path.join(out, "model.onnx")), spec)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert np.abs(runner.step([("p", prompt)])[0] - Reference(loaded).step(prompt)[-1]).max() < TOL


def _run_018(model_dir, prompts, n):
    import onnxruntime_genai as og
    return engine_greedy(og, model_dir, prompts, n)


PROMPTS_018 = [[5, 9, 13], [7] * 20, [11, 12, 13, 14, 15, 16, 17, 18, 19], list(range(3, 50)), [3, 4]]


@pytest.mark.parametrize("logits", ["last", "per_token", "indices"])
def test_onnxruntime_genai_018_engine_runs_the_directory(tmp_path, logits):
    """Chunked prefills (47-token prompt, 32-token steps), mixed steps, greedy == the reference."""
    out = build(None, tmp_path / logits, random_spec=SPEC, seed=3, max_batch_size=8, max_scheduled_tokens=32,
                per_token_logits=logits == "per_token", logits_indices=logits == "indices", graph="standard")
    got = _run_018(out, PROMPTS_018, 10)
    loaded = random_model(SPEC, seed=3)
    for prompt, tokens in zip(PROMPTS_018, got):
        assert tokens == [t for t in greedy(loaded, prompt, 10) if t not in SPEC.eos_token_ids]


# --------------------------------------------------------------------------------------------
# CUDA graph (cannot run here: no CPU kernel for PagedAttention)

def test_cuda_graph_is_valid_onnx_and_loads_up_to_paged_attention(tmp_path):
    from dataclasses import replace
    spec = replace(SPEC, qkv_bias=True)
    model = build_cuda_graph(spec, random_model(spec).weights, context_length=256)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    outputs = {o.name: o.type.tensor_type for o in inferred.graph.output}
    assert outputs["logits"].elem_type == onnx.TensorProto.FLOAT
    assert outputs["present.1.value"].elem_type == onnx.TensorProto.FLOAT16
    assert [d.dim_param or d.dim_value for d in outputs["present.1.value"].shape.dim] == ["num_blocks", 256, 2, 16]

    nodes = [n for n in model.graph.node if n.op_type == "PagedAttention"]
    assert len(nodes) == spec.num_layers
    for i, node in enumerate(nodes):
        assert node.domain == "com.microsoft"
        assert list(node.input[3:8]) == [f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                                         "cumulative_sequence_lengths", "past_sequence_lengths", "block_table"]
        assert list(node.input[8:10]) == ["cos_cache", "sin_cache"] and node.input[16] == "attention_metadata"
        assert list(node.output[1:]) == [f"present.{i}.key", f"present.{i}.value"]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["num_heads"] == 4 and attrs["kv_num_heads"] == 2 and attrs["do_rotary"] == 1
    cos = next(t for t in model.graph.initializer if t.name == "cos_cache")
    assert list(cos.dims) == [256, 8] and cos.data_type == onnx.TensorProto.FLOAT16

    # ORT resolves the graph against its contrib schemas (input count, types, attributes), so
    # session creation on CPU fails only at kernel lookup, and only for PagedAttention.
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED.*PagedAttention"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    broken = copy.deepcopy(model)
    next(n for n in broken.graph.node if n.op_type == "PagedAttention").input[5] = "input_ids"
    with pytest.raises(Exception, match="INVALID_GRAPH"):
        ort.InferenceSession(broken.SerializeToString(), providers=["CPUExecutionProvider"])

    with pytest.raises(ValueError, match="power-of-two"):
        build_cuda_graph(spec, random_model(spec).weights, block_size=24)

    out = build(None, tmp_path / "cuda", random_spec=spec, target="cuda")
    config = json.load(open(os.path.join(out, "genai_config.json")))
    assert config["engine"]["dynamic_batching"]["block_size"] == 256
    assert "gpu_utilization_factor" in config["engine"]["dynamic_batching"]
    assert config["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {}}]
    assert config["model"]["decoder"]["state_groups"][0]["kind"] == "paged_kv"


# --------------------------------------------------------------------------------------------
# the real model of record

@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return smollm2_dir


def test_smollm2_directory_matches_the_reference_and_runs_under_018(smollm2):
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(os.listdir(smollm2))
    assert "chat_template" in json.load(open(os.path.join(smollm2, "tokenizer_config.json")))
    prompt = [504, 3575, 282, 4649, 314]                     # "The capital of France is"
    loaded = load_gguf_weights(smollm2_gguf_path())         # load_gguf(..., with_tokenizer=False), once a run
    expected = Reference(loaded).step(prompt)[-1]
    model = onnx.load(os.path.join(smollm2, "model.onnx"))
    runner = PagedRunner(model, loaded.spec, block_size=16, num_blocks=4, reserve_ahead=0)
    diff = float(np.abs(runner.step([("p", prompt)])[0] - expected).max())
    print(f"SmolLM2 last-token logits: max abs diff {diff:.2e}")
    assert diff < 1e-3
    tokens = _run_018(smollm2, [prompt], 3)[0]
    assert tokens[0] == 7042                                  # " Paris"
