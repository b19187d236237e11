"""oga's static batching path on every decoder architecture onnxruntime-genai 0.18's builder emits
for CPU (tests/architecture_models.py), fp32 and int4, side by side with 0.18 on the same directory.

og.Model + og.Generator, greedy, on each of oga's executors (native and OGA_EXECUTOR=python): two
prompts of different lengths alone (7 and 23 tokens, 24 new tokens each: past Gemma2/Gemma3/GPT-OSS's
16-position windows and LongRoPE's switch at 32 positions), then both in one batch of two. Each
stream must be 0.18's Generator's stream for that prompt alone; int4 streams may part at a near-tie
(greedy_runs.equal_up_to_a_near_tie: MatMulNBits quantizes activations to int8, and a different
batch moves them). Where 0.18 runs the padded batch (not on the sliding-window layers of Gemma2,
Gemma3 and GPT-OSS, where ONNX Runtime fails it), its batch rows are its solo streams too, except
LFM2's: 0.18 runs the padding through the short convolution of a shorter row and leaves it in that
row's state; oga does not (README). LongRoPE graphs (Phi-3.5, Phi-4-mini) choose one rotary table
for the whole batch by its longest row, so there the batch is compared with 0.18's batch.

Also: a Generator's second turn on LFM2 (conv state) and HunYuan (positions) gives the stream of
one turn over the same tokens, the errors
for what the static path still refuses, and og.Engine on HunYuan (position_ids) against 0.18's.
"""
import os

import numpy as np
import pytest

import oga as og
from oga.executor import native as native_executor
from architecture_models import ARCHITECTURES, PAD, architecture_dir
from greedy_runs import INT8_ACTIVATION_NOISE, equal_up_to_a_near_tie, greedy

ref = pytest.importorskip("onnxruntime_genai")

SHORT = [1, 17, 245, 33, 401, 96, 7]
LONG = [1, 412, 88, 9, 250, 301, 77, 140, 5, 499, 23, 61, 318, 205, 44, 190, 72, 366, 11, 283, 154, 37, 420]
NEW_TOKENS = 24
CASES = [(name, precision) for name in ARCHITECTURES for precision in ARCHITECTURES[name].precisions]

_models = {}        # (module name, directory) -> Model, shared by the tests of a run
_references = {}    # (directory, prompt) -> 0.18's solo stream


def model(module, directory):
    key = (module.__name__, directory)
    if key not in _models:
        _models[key] = module.Model(directory)
    return _models[key]


def generate(module, m, rows, max_new=NEW_TOKENS):
    """Greedy Generator run over `rows` (right-padded with PAD into one batch when there are
    several); returns each row's new tokens."""
    width = max(map(len, rows))
    params = module.GeneratorParams(m)
    params.set_search_options(max_length=width + max_new, batch_size=len(rows))
    generator = module.Generator(m, params)
    generator.append_tokens(np.array([row + [PAD] * (width - len(row)) for row in rows], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [generator.get_sequence(r).tolist()[width:] for r in range(len(rows))]


def reference(directory, prompt):
    key = (directory, tuple(prompt))
    if key not in _references:
        _references[key] = generate(ref, model(ref, directory), [prompt])[0]
    return _references[key]


def reference_logits(directory, history):
    """0.18's next-token logits after `history` (a third computation for the near-tie rule)."""
    m = model(ref, directory)
    params = ref.GeneratorParams(m)
    params.set_search_options(max_length=len(history) + 1)
    generator = ref.Generator(m, params)
    generator.append_tokens(np.array(history, np.int32))
    return generator.get_logits()[0, -1].astype(np.float64)


def assert_stream(directory, precision, prompt, have):
    want = reference(directory, prompt)
    if precision == "fp32":
        assert have == want
    else:
        equal_up_to_a_near_tie(want, have, lambda generated: reference_logits(directory, prompt + generated),
                               INT8_ACTIVATION_NOISE)


@pytest.fixture(scope="module", params=CASES, ids=[f"{name}-{precision}" for name, precision in CASES])
def case(request, tmp_path_factory):
    name, precision = request.param
    return name, precision, architecture_dir(tmp_path_factory, name, precision)


@pytest.fixture(params=["native", "python"])
def executor(request, monkeypatch):
    monkeypatch.setenv("OGA_EXECUTOR", request.param)
    return request.param


def oga_model(directory, executor):
    """oga's Model of `directory` on `executor` (loaded once per run and executor)."""
    key = (og.__name__, directory, executor)
    if key not in _models:
        _models[key] = og.Model(directory)
        assert_selected(directory, executor)
    return _models[key]


def assert_selected(directory, executor):
    selection = native_executor.selections[os.path.join(directory, "model.onnx")]
    assert selection.executor == executor, selection


def test_prompts_alone_give_0_18s_streams(case, executor):
    name, precision, directory = case
    m = oga_model(directory, executor)
    for prompt in (SHORT, LONG):
        have = generate(og, m, [prompt])[0]
        assert len(have) == NEW_TOKENS
        assert_stream(directory, precision, prompt, have)


def test_a_batch_of_both_gives_each_prompts_stream(case, executor):
    name, precision, directory = case
    recipe = ARCHITECTURES[name]
    m = oga_model(directory, executor)
    batch = generate(og, m, [SHORT, LONG])
    if recipe.longrope_original_max:
        # The graph chooses LongRoPE's short or long tables for the whole batch, by the total length
        # (an If on the mask's width): the static path runs the graph unchanged, so the short row
        # switches when the long one does, as in 0.18's batch (the same graph on the same inputs).
        assert batch == generate(ref, model(ref, directory), [SHORT, LONG])
        return
    for prompt, have in zip((SHORT, LONG), batch):
        assert_stream(directory, precision, prompt, have)
    if executor == "native" and precision == "fp32" and recipe.batch_runs_in_0_18 and not recipe.has_conv_layers:
        assert generate(ref, model(ref, directory), [SHORT, LONG]) == [reference(directory, SHORT),
                                                                       reference(directory, LONG)]


def test_0_18_batch_carries_padding_into_lfm2s_conv_state(tmp_path_factory):
    """The difference the README lists: 0.18's padded batch leaves the shorter row's padding in its
    convolution state, so that row's stream is not its solo stream (oga's is: the test above)."""
    directory = architecture_dir(tmp_path_factory, "lfm2", "fp32")
    short_in_batch, long_in_batch = generate(ref, model(ref, directory), [SHORT, LONG])
    assert long_in_batch == reference(directory, LONG)
    assert short_in_batch != reference(directory, SHORT)


@pytest.mark.parametrize("name", [n for n in ARCHITECTURES
                                  if ARCHITECTURES[n].has_conv_layers or ARCHITECTURES[n].has_position_ids])
def test_a_second_turn_continues_the_row(name, executor, tmp_path_factory):
    """A Generator row continued with appended tokens gives the stream of one turn over the same
    tokens: the static executor keeps each row's conv state across steps and turns, and a second
    turn's positions continue the row's (HunYuan's position_ids)."""
    directory = architecture_dir(tmp_path_factory, name, "fp32")
    m = oga_model(directory, executor)
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=64)
    turns = og.Generator(m, params)
    turns.append_tokens(np.array(SHORT, np.int32))
    for _ in range(3):
        turns.generate_next_token()
    turns.append_tokens(np.array([5, 6, 7], np.int32))
    for _ in range(4):
        turns.generate_next_token()
    sequence = turns.get_sequence(0).tolist()
    one_turn = generate(og, m, [sequence[:len(SHORT) + 6]], max_new=4)[0]
    assert sequence[len(SHORT) + 6:] == one_turn


def test_a_static_conv_model_refuses_what_it_cannot_do(tmp_path_factory, executor):
    """og.Engine refuses it as 0.18's Engine does (og.Generator runs it), and a Generator cannot
    rewind a row's conv state (0.18's text); a refused rewind changes nothing."""
    directory = architecture_dir(tmp_path_factory, "lfm2", "fp32")
    m = oga_model(directory, executor)
    with pytest.raises(RuntimeError, match="Fixed decoder state groups require engine.dynamic_batching"):
        og.Engine(m)
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=64)
    generator = og.Generator(m, params)
    generator.append_tokens(np.array(SHORT, np.int32))
    for _ in range(3):
        generator.generate_next_token()
    before = generator.get_sequence(0).tolist()
    with pytest.raises(RuntimeError, match=r"^RewindTo is currently not supported for lfm2\.$"):
        generator.rewind_to(len(SHORT) + 1)
    assert generator.get_sequence(0).tolist() == before
    generator.generate_next_token()
    assert generator.get_sequence(0).tolist()[:len(before)] == before
    generator.rewind_to(0)   # to nothing: the row starts again from zeros
    generator.append_tokens(np.array(SHORT, np.int32))
    for _ in range(3):
        generator.generate_next_token()
    assert generator.get_sequence(0).tolist() == before


def test_layer_types_oga_cannot_bind_are_refused_at_load(tmp_path_factory, tmp_path):
    """A layer kind without a binding oga knows (e.g. a linear-attention layer) fails the load,
    naming the layer."""
    import json
    import shutil

    directory = architecture_dir(tmp_path_factory, "lfm2", "fp32")
    copy = tmp_path / "lfm2-other-layer"
    shutil.copytree(directory, copy)
    with open(copy / "genai_config.json") as f:
        config = json.load(f)
    config["model"]["decoder"]["layer_types"][2] = "linear_attention"
    with open(copy / "genai_config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(RuntimeError, match=r"model.decoder.layer_types\[2\] is 'linear_attention'; oga runs "
                                           "full_attention, sliding_attention and conv layers"):
        og.Model(str(copy))
    config["model"]["decoder"]["layer_types"] = config["model"]["decoder"]["layer_types"][:3]
    with open(copy / "genai_config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(RuntimeError, match="model.decoder.layer_types lists 3 layers, but num_hidden_layers is 4"):
        og.Model(str(copy))


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_hunyuan_on_og_engine_gives_0_18_engines_streams(precision, executor, tmp_path_factory):
    """og.Engine's static path feeds HunYuan's position_ids (RoPE outside attention) as 0.18's
    Engine does: both prompts concurrently."""
    directory = architecture_dir(tmp_path_factory, "hunyuan", precision)
    want = greedy(ref, directory, [SHORT, LONG], NEW_TOKENS)
    have = greedy(og, directory, [SHORT, LONG], NEW_TOKENS)
    assert_selected(directory, executor)
    for prompt, w, h in zip((SHORT, LONG), want, have):
        if precision == "fp32":
            assert h == w
        else:
            equal_up_to_a_near_tie(w, h, lambda generated: reference_logits(directory, prompt + generated),
                                   INT8_ACTIVATION_NOISE)
