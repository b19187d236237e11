"""Arguments a caller can get subtly wrong are refused before anything changes: floats where an
integer is meant (Cython alone would truncate 3.9 to 3), strings and None where a bool or a string
is meant, a 2-D Generator block with another row count than batch_size, search options of which one
is bad (none is applied), GeneratorParams the step API cannot honour, a request of a destroyed
engine, and held logits that leave nothing to select (the Generator keeps working afterwards)."""
import numpy as np
import pytest

import oga as og
import oga.testing as ogt
from helpers import drive


@pytest.fixture
def model():
    return ogt.create_test_model()


def _generator(model, max_length=40, **options):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, **options)
    return og.Generator(model, params)


def _tokens(model, prompt, steps, **options):
    """The sequences a fresh Generator gives for `prompt` after `steps` tokens."""
    generator = _generator(model, **options)
    generator.append_tokens(prompt)
    for _ in range(steps):
        generator.generate_next_token()
    return [generator.get_sequence(i).tolist() for i in range(options.get("batch_size", 1))]


@pytest.mark.parametrize("value", [3.0, 3.9, "3", None, np.float32(2.0)])
def test_generator_integer_arguments_refuse_non_integers(model, value):
    generator = _generator(model)
    generator.append_tokens(np.array([5, 6, 7, 8, 9], np.int32))
    with pytest.raises(TypeError, match="new_length must be an integer"):
        generator.rewind_to(value)
    with pytest.raises(TypeError, match="index must be an integer"):
        generator.get_sequence(value)
    assert generator.get_sequence(np.int64(0)).tolist() == [5, 6, 7, 8, 9]  # numpy integers are integers
    generator.rewind_to(np.int32(3))
    assert generator.get_sequence(0).tolist() == [5, 6, 7]


@pytest.mark.parametrize("setter", ["set_max_generated_tokens", "set_min_generated_tokens", "set_top_k",
                                    "set_no_repeat_ngram_size", "set_seed"])
def test_turn_option_integers_refuse_floats(model, setter):
    engine = og.Engine(model)
    request = engine.create_request()
    options = og.TurnOptions(request)
    with pytest.raises(TypeError, match="must be an integer, not float"):
        getattr(options, setter)(2.5)
    with pytest.raises(TypeError, match="must be an integer, not str"):
        getattr(options, setter)("2")
    getattr(options, setter)(True if setter == "set_seed" else 2)  # bools and ints are taken
    with pytest.raises(OverflowError):
        og.RequestOptions().set_max_session_tokens(-1)
    with pytest.raises(TypeError, match="max_session_tokens must be an integer"):
        og.RequestOptions().set_max_session_tokens(8.0)


def test_engine_integer_arguments_refuse_floats(model):
    engine = og.Engine(model)
    with pytest.raises(TypeError, match="capacity must be an integer, not float"):
        engine.create_event_buffer(2.5)
    with pytest.raises(TypeError, match="max_events must be an integer, not float"):
        engine.run(max_events=2.5)
    request = engine.create_request()
    with pytest.raises(TypeError, match="turn_id must be an integer, not float"):
        request.cancel_turn(1.0)
    with pytest.raises(TypeError, match="turn_id must be an integer, not float"):
        request.rewind_to_start_of_turn(1.0)
    assert engine.create_event_buffer(np.int64(2)).capacity == 2


def test_max_generated_tokens_is_not_truncated(model):
    """3.7 used to become 3: the turn generated 3 tokens instead of failing."""
    engine = og.Engine(model)
    request = engine.create_request()
    options = og.TurnOptions(request)
    with pytest.raises(TypeError):
        options.set_max_generated_tokens(3.7)
    options.set_max_generated_tokens(2)
    options.set_min_generated_tokens(2)
    request.begin_turn(np.array([5, 9, 13], np.int32), options)
    tokens = [e.token for e in drive(engine) if e.flags & og.EngineEventFlags.TOKEN]
    assert len(tokens) == 2


@pytest.mark.parametrize("value", ["no", "", None, 1.0, object()])
def test_booleans_refuse_strings_none_and_floats(model, value):
    engine = og.Engine(model)
    options = og.TurnOptions(engine.create_request())
    with pytest.raises(TypeError, match="do_sample must be a bool"):
        options.set_do_sample(value)
    params = og.GeneratorParams(model)
    with pytest.raises(TypeError, match="enable_ff_tokens must be a bool"):
        params.set_guidance("regex", "a+", value)
    for good in (True, False, np.bool_(True), 0, 1):
        options.set_do_sample(good)


def test_strings_refuse_none(model):
    generator = _generator(model)
    with pytest.raises(TypeError):
        generator.set_runtime_option("terminate_session", None)
    with pytest.raises(TypeError):
        generator.set_runtime_option(None, "0")
    engine = og.Engine(model)
    options = og.TurnOptions(engine.create_request())
    with pytest.raises(TypeError):
        options.set_guidance(None, "a+")
    with pytest.raises(TypeError):
        options.set_guidance("regex", None)


def test_a_2d_block_must_have_batch_size_rows(model):
    generator = _generator(model, max_length=20, batch_size=2)
    for block in ([[5, 6], [7, 8], [9, 10]], [[5, 6, 7, 8]], [[5], [6], [7], [8]]):
        with pytest.raises(ValueError, match=r"batch_size is 2: a 2-D block must be \[batch_size, sequence_length\]"):
            generator.append_tokens(np.array(block, np.int32))
    assert generator.token_count() == 0
    single = _generator(model, max_length=20)
    with pytest.raises(ValueError, match="batch_size is 1"):
        single.append_tokens(np.array([[5, 6], [7, 8]], np.int32))
    generator.append_tokens(np.array([[5, 6], [7, 8]], np.int32))
    generator.generate_next_token()
    assert [generator.get_sequence(i).tolist() for i in range(2)] == _tokens(
        model, np.array([[5, 6], [7, 8]], np.int32), 1, max_length=20, batch_size=2)


def test_search_options_are_applied_all_or_none(model):
    params = og.GeneratorParams(model)
    before = params.get_search_options()
    with pytest.raises(RuntimeError, match='Unknown value "bogus"'):
        params.set_search_options(max_length=50, bogus=1)
    with pytest.raises(TypeError, match="temperature must be a number or a bool"):
        params.set_search_options(top_k=3, temperature="x")
    with pytest.raises(RuntimeError, match="chunk_size must be >= 0"):
        params.set_search_options(max_length=50, chunk_size=-3)
    with pytest.raises(RuntimeError, match="Expected a bool but saw a number"):
        params.set_search_options(top_k=7, do_sample=1)
    assert params.get_search_options() == before
    params.set_search_options(max_length=50, top_k=3, do_sample=True)
    after = params.get_search_options()
    assert (after["max_length"], after["top_k"], after["do_sample"]) == (50, 3, True)


@pytest.mark.parametrize("options, text", [
    (dict(batch_size=2), r"batch_size \(2\) must be 1 for a step-API request"),
    (dict(num_return_sequences=3), r"num_return_sequences \(3\) must be in \[1, 1\]"),
    (dict(max_length=1000), r"max_length \(1000\) cannot be greater than model context_length \(128\)"),
])
def test_the_step_api_refuses_params_it_cannot_honour(model, options, text):
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    with pytest.raises(RuntimeError, match=text):
        og.Request(params)


def test_a_request_of_a_destroyed_engine_cannot_be_removed_by_another(model):
    """The new engine may live at the destroyed one's address: ownership is by engine id."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16)
    for _ in range(4):  # several times: allocators reuse the freed address
        engine = og.Engine(model)
        request = og.Request(params)
        request.add_tokens([5, 6, 7])
        engine.add_request(request)
        engine.step()
        del engine
        other = og.Engine(model)
        with pytest.raises(RuntimeError, match="Cannot remove a request that belongs to another engine."):
            other.remove_request(request)
        fresh = og.Request(params)
        fresh.add_tokens([5, 6, 7])
        other.add_request(fresh)
        assert other.step() is fresh


def test_nan_held_logits_are_refused_and_the_generator_recovers(model):
    prompt = np.array([5, 6, 7], np.int32)
    generator = _generator(model)
    generator.append_tokens(prompt)
    logits = generator.get_logits()
    generator.set_logits(np.full(logits.size, np.nan, np.float32))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="every logit is NaN or masked"):
            generator.generate_next_token()
    assert generator.get_sequence(0).tolist() == [5, 6, 7]
    generator.set_logits(logits)
    for _ in range(5):
        generator.generate_next_token()
    assert [generator.get_sequence(0).tolist()] == _tokens(model, prompt, 5)


def test_one_nan_row_publishes_no_row(model):
    block = np.array([[5, 6, 7], [8, 9, 10]], np.int32)
    generator = _generator(model, batch_size=2)
    generator.append_tokens(block)
    logits = generator.get_logits()
    bad = logits.copy()
    bad.reshape(2, -1)[1] = np.nan
    generator.set_logits(bad)
    with pytest.raises(RuntimeError, match="every logit is NaN or masked"):
        generator.generate_next_token()
    assert [generator.get_sequence(i).tolist() for i in range(2)] == block.tolist()  # row 0 got nothing either
    generator.set_logits(logits)
    for _ in range(3):
        generator.generate_next_token()
    assert [generator.get_sequence(i).tolist() for i in range(2)] == _tokens(model, block, 3, batch_size=2)


@pytest.mark.parametrize("temperature", [1e-40, 1e-45, 1e-300])
def test_a_temperature_too_small_for_float_selects_the_top_logit(model, temperature):
    """1 / temperature overflows float below ~2.9e-39: sampled, the scaled top logit was NaN and the
    turn drew junk; the limit of sampling as the temperature goes to 0 is the greedy token."""
    def tokens(**options):
        engine = og.Engine(model)
        request = engine.create_request()
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(6)
        turn.set_min_generated_tokens(6)
        for name, value in options.items():
            getattr(turn, "set_" + name)(value)
        request.begin_turn(np.array([5, 9, 13], np.int32), turn)
        return [e.token for e in drive(engine) if e.flags & og.EngineEventFlags.TOKEN]

    greedy = tokens(do_sample=False)
    assert tokens(do_sample=True, temperature=temperature, seed=3) == greedy
    assert tokens(do_sample=True, temperature=temperature, seed=4) == greedy
