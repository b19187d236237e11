"""og.Generator on the engine core, driven through the built-in test model and checked token by token
against the test executor's oracle (tests/helpers.py): greedy rows, EOS and padding, batches of
different lengths, min_length, pacing (rows beyond the configured batch, chunked prefills,
preemption), rewind, logits, continuation, terminate_session, and the errors of misuse. The same
API side by side with onnxruntime-genai 0.18 is tests/test_generator_vs_0_18.py."""

import threading

import numpy as np
import pytest

import oga as og
import oga.testing as ogt
from helpers import OracleSequence, logits as oracle_logits, prompt_without_eos

VOCAB, EOS, PAD = 64, 1, 0


def make_generator(model=None, **search):
    model = model or ogt.create_test_model()
    params = og.GeneratorParams(model)
    params.set_search_options(**search)
    return og.Generator(model, params)


def run_to_end(generator):
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
        assert steps < 1000
    return steps


def expected_row(prompt, max_length, min_length=0):
    """A lone row as 0.18's Generator shows it: the prompt and the greedy tokens (the EOS that ends
    the last generating row is not appended); plus whether it ended by EOS."""
    oracle = OracleSequence(VOCAB, (EOS,), max_session=10**6)
    oracle.extend(prompt)
    sequence = list(prompt)
    while len(sequence) < max_length:
        token = oracle.greedy(mask_eos=len(sequence) < min_length)
        if token == EOS:
            return sequence, True
        sequence.append(token)
        oracle.append(token)
    return sequence, False


def eos_prompt(after, length=3):
    """A prompt whose greedy continuation selects EOS exactly `after` tokens in."""
    from helpers import find_prompt

    def ends_after(p):
        seq, ended = expected_row(p, len(p) + after + 1)
        return ended and len(seq) == len(p) + after

    return find_prompt(ends_after, length=length)


def test_greedy_row_is_the_oracle_sequence():
    prompt = prompt_without_eos(20)
    g = make_generator(max_length=20)
    assert not g.is_done() and g.token_count() == 0
    g.append_tokens(np.array(prompt, np.int32))
    assert g.token_count() == 3 and list(g.get_next_tokens()) == [prompt[-1]]
    assert run_to_end(g) == 17
    assert g.get_sequence(0).tolist() == expected_row(prompt, 20)[0]
    assert g.token_count() == 20 and g.get_next_tokens().tolist() == [g.get_sequence(0)[-1]]
    with pytest.raises(RuntimeError, match=r"^GenerateNextToken called with sequence length already at max_length \(20\)$"):
        g.generate_next_token()


def test_eos_ends_a_lone_row_without_being_appended():
    prompt = eos_prompt(4)
    g = make_generator(max_length=30)
    g.append_tokens(prompt)
    assert run_to_end(g) == 5
    sequence = g.get_sequence(0).tolist()
    assert sequence == expected_row(prompt, 30)[0] and len(sequence) == len(prompt) + 4
    assert g.get_next_tokens().tolist() == [EOS] and g.token_count() == len(sequence)
    g.generate_next_token()  # every row ended: a no-op, as in 0.18
    assert g.get_sequence(0).tolist() == sequence


def test_min_length_masks_eos_until_the_sequence_is_long_enough():
    prompt = eos_prompt(2)
    g = make_generator(max_length=30, min_length=10)
    g.append_tokens(prompt)
    run_to_end(g)
    sequence = g.get_sequence(0).tolist()
    assert sequence == expected_row(prompt, 30, min_length=10)[0]
    assert EOS not in sequence[:10] and len(sequence) > 6


def test_batch_rows_of_different_lengths_are_padded_and_end_on_their_own():
    long_prompt = prompt_without_eos(25, length=5)
    short_prompt = eos_prompt(3, length=2)
    mid_prompt = prompt_without_eos(25, length=4, offset=1)
    prompts = [long_prompt, short_prompt, mid_prompt]
    width = max(map(len, prompts))
    block = np.array([p + [PAD] * (width - len(p)) for p in prompts], np.int32)
    g = make_generator(max_length=16, batch_size=3)
    g.append_tokens(block)  # a 2-D [batch, length] block, right-padded
    assert g.token_count() == width
    run_to_end(g)
    rows = [g.get_sequence(i).tolist() for i in range(3)]
    assert all(len(row) == 16 for row in rows)
    for prompt, row in zip(prompts, rows):
        # Padding is part of the sequence but not model input: each row continues its own prompt.
        tokens, ended = expected_row(prompt, 16 - (width - len(prompt)))
        generated = tokens[len(prompt):]
        assert row[:width] == prompt + [PAD] * (width - len(prompt))
        assert row[width:width + len(generated)] == generated
        if ended:  # while other rows generate: its EOS, then a pad per call
            assert row[width + len(generated):] == [EOS] + [PAD] * (15 - width - len(generated))
    assert rows[1][width + 3] == EOS


def test_append_token_sequences_pads_ragged_rows():
    prompts = [prompt_without_eos(10, length=4), prompt_without_eos(10, length=2, offset=2)]
    g = make_generator(max_length=12, batch_size=2)
    from oga import _core  # noqa: F401  (the C API is reached through ctypes in test_generator_c_api)
    g.append_tokens(np.array([prompts[0], prompts[1] + [PAD, PAD]], np.int32))
    run_to_end(g)
    for prompt, i in zip(prompts, range(2)):
        row = g.get_sequence(i).tolist()
        width = 4
        generated = expected_row(prompt, 12 - (width - len(prompt)))[0][len(prompt):]
        assert row[width:] == generated[:12 - width]


@pytest.mark.parametrize("engine_config", [
    dict(max_batch_size=2),                            # rows beyond the configured batch
    dict(max_scheduled_tokens=3),                      # every prompt's prefill is chunked
    dict(num_blocks=12, block_size=4),                 # the rows do not fit together: preemption
], ids=["more-rows-than-max-batch", "chunked-prefill", "preemption"])
def test_every_row_gets_exactly_one_token_per_call(engine_config):
    prompts = [prompt_without_eos(30, length=n, offset=i) for i, n in enumerate([2, 7, 4, 9, 3, 5])]
    width = max(map(len, prompts))
    block = [p + [PAD] * (width - len(p)) for p in prompts]
    model = ogt.create_test_model(**engine_config)
    g = make_generator(model, max_length=width + 8, batch_size=6)
    g.append_tokens(np.array(block, np.int32))
    for step in range(1, 9):
        g.generate_next_token()
        assert {len(g.get_sequence(i)) for i in range(6)} == {width + step}
    for prompt, i in zip(prompts, range(6)):
        expected = expected_row(prompt, len(prompt) + 8)[0]
        assert g.get_sequence(i).tolist()[width:] == expected[len(prompt):]
    assert g.is_done()


def test_rewind_then_continue_follows_the_kept_prefix():
    prompt = prompt_without_eos(30)
    g = make_generator(max_length=30)
    g.append_tokens(prompt)
    for _ in range(8):
        g.generate_next_token()
    full = g.get_sequence(0).tolist()
    with pytest.raises(RuntimeError, match="^Cannot rewind to a length greater than the current sequence length$"):
        g.rewind_to(12)
    g.rewind_to(6)
    assert g.get_sequence(0).tolist() == full[:6] and g.token_count() == 6
    # As in 0.18, the first discarded token stays the next token: the next call appends it again.
    assert g.get_next_tokens().tolist() == [full[6]]
    for _ in range(4):
        g.generate_next_token()
    assert g.get_sequence(0).tolist() == full
    # ... also when it is not the model's choice, and also for get_logits.
    g.rewind_to(9)
    forced = np.full((1, VOCAB), -10.0, np.float32)
    forced[0, 33] = 10.0
    g.get_logits()
    assert g.get_sequence(0).tolist() == full[:10]
    g.set_logits(forced)
    g.generate_next_token()
    g.rewind_to(10)
    g.generate_next_token()
    assert g.get_sequence(0).tolist()[:11] == full[:10] + [33]
    # Rewind into the prompt, then continue with new input.
    g.rewind_to(2)
    g.append_tokens([5, 6])
    g.generate_next_token()
    assert g.get_sequence(0).tolist() == expected_row(full[:2] + [5, 6], 5)[0]
    g.rewind_to(0)
    assert g.token_count() == 0 and g.get_next_tokens().tolist() == [0] and not g.is_done()
    with pytest.raises(RuntimeError, match="^GenerateNextToken called with no prior state"):
        g.generate_next_token()
    g.append_tokens(prompt)
    g.generate_next_token()
    assert g.get_sequence(0).tolist() == full[:4]


def test_batch_rewind_is_only_to_zero_and_append_is_only_once():
    g = make_generator(max_length=12, batch_size=2)
    g.append_tokens([[5, 6], [7, 8]])
    with pytest.raises(RuntimeError, match=r"^AppendTokens can only be called once for batch_size > 1\. To call AppendTokens again, use RewindToLength\(0\)$"):
        g.append_tokens([[5], [6]])
    g.generate_next_token()
    with pytest.raises(RuntimeError, match="^RewindToLength must be called with new_length=0 when batch_size > 1$"):
        g.rewind_to(1)
    g.rewind_to(0)
    assert [g.get_sequence(i).tolist() for i in range(2)] == [[], []]
    g.append_tokens([[9, 10], [11, 12]])
    g.generate_next_token()
    assert g.get_sequence(1).tolist() == expected_row([11, 12], 3)[0]


def test_continuation_after_generated_tokens_and_after_eos():
    prompt = eos_prompt(3)
    g = make_generator(max_length=40)
    g.append_tokens(prompt)
    run_to_end(g)
    first = g.get_sequence(0).tolist()
    assert first == expected_row(prompt, 40)[0]
    # 0.18 continues after the EOS as if it had not been selected: it is neither shown nor context.
    g.append_tokens([7, 8, 9])
    assert not g.is_done()
    for _ in range(3):
        g.generate_next_token()
    second = g.get_sequence(0).tolist()
    oracle = OracleSequence(VOCAB, (EOS,), 10**6)
    oracle.extend(first + [7, 8, 9])
    assert second[:len(first) + 3] == first + [7, 8, 9]
    tail = []
    for _ in range(3):
        token = oracle.greedy()
        tail.append(token)
        oracle.append(token)
    assert second[len(first) + 3:] == tail[:len(second) - len(first) - 3]
    # Appending while a turn runs: the pending sampled token is context too.
    g.append_tokens([10])
    g.generate_next_token()
    oracle = OracleSequence(VOCAB, (EOS,), 10**6)
    oracle.extend(g.get_sequence(0).tolist()[:-1])
    assert g.get_sequence(0).tolist()[-1] == oracle.greedy()


def test_get_logits_are_the_model_logits_and_set_logits_chooses_the_token():
    prompt = prompt_without_eos(10)
    g = make_generator(max_length=20)
    g.append_tokens(prompt)
    oracle = OracleSequence(VOCAB, (EOS,), 10**6)
    oracle.extend(prompt)
    logits = g.get_logits()
    assert logits.shape == (1, 1, VOCAB) and logits.dtype == np.float32
    np.testing.assert_array_equal(logits[0, 0], oracle_logits(oracle.state, VOCAB))
    g.generate_next_token()  # selects from the held logits: the greedy token, no second model run
    token = oracle.greedy()
    assert g.get_sequence(0).tolist() == prompt + [token]
    oracle.append(token)
    np.testing.assert_array_equal(g.get_logits()[0, 0], oracle_logits(oracle.state, VOCAB))
    forced = np.full((1, VOCAB), -10.0, np.float32)
    forced[0, 42] = 10.0
    g.set_logits(forced)
    g.generate_next_token()
    assert g.get_sequence(0).tolist()[-1] == 42
    oracle.append(42)
    g.generate_next_token()
    assert g.get_sequence(0).tolist()[-1] == oracle.greedy()


def test_set_logits_needs_computed_logits_and_the_right_size():
    g = make_generator(max_length=20)
    g.append_tokens([5, 6, 7])
    with pytest.raises(RuntimeError, match=r"^Generator::SetLogits passed an array of size 3 but should be size 64$"):
        g.set_logits(np.zeros(3, np.float32))
    g.generate_next_token()
    with pytest.raises(RuntimeError, match=r"^logits are not computed yet\. Please call GenerateNextToken or AppendTokens before calling SetLogits\.$"):
        g.set_logits(np.zeros(VOCAB, np.float32))
    g.get_logits()
    g.set_logits(np.zeros(VOCAB, np.float32))  # allowed again once computed


def test_set_logits_to_eos_ends_a_row_and_pads_it():
    g = make_generator(max_length=12, batch_size=2)
    prompts = [prompt_without_eos(12, offset=0), prompt_without_eos(12, offset=1)]
    g.append_tokens(prompts)
    forced = np.full((2, VOCAB), -5.0, np.float32)
    forced[0, EOS] = 5.0
    forced[1, 30] = 5.0
    g.set_logits(forced)
    g.generate_next_token()
    assert [g.get_sequence(i).tolist()[-1] for i in range(2)] == [EOS, 30]
    g.generate_next_token()
    assert g.get_sequence(0).tolist() == prompts[0] + [EOS, PAD]
    logits = g.get_logits()
    assert not logits[0].any() and logits[1].any()  # an ended row's logits read 0


def test_logits_on_a_device_are_read_back():
    model = ogt.create_test_model(device_ops=True, device_logits=True)
    prompt = prompt_without_eos(10)
    g = make_generator(model, max_length=20)
    g.append_tokens(prompt)
    oracle = OracleSequence(VOCAB, (EOS,), 10**6)
    oracle.extend(prompt)
    np.testing.assert_array_equal(g.get_logits()[0, 0], oracle_logits(oracle.state, VOCAB))
    run_to_end(g)
    assert g.get_sequence(0).tolist() == expected_row(prompt, 20)[0]


def test_seeded_sampling_is_reproducible_and_rows_draw_their_own():
    prompt = prompt_without_eos(20)

    def sample(seed, batch=1):
        g = make_generator(max_length=20, do_sample=True, top_k=0, temperature=2.0, random_seed=seed, batch_size=batch)
        g.append_tokens([prompt] * batch)
        run_to_end(g)
        return [g.get_sequence(i).tolist() for i in range(batch)]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    single = sample(7)[0]
    a, b = sample(7, batch=2)
    assert a[:len(single)] == single and a != b  # row 0 draws like a lone row; a row that ended gets pads


def test_search_options_round_trip_with_0_18_names_and_texts():
    params = og.GeneratorParams(ogt.create_test_model(context_length=100, max_length=None))
    options = params.get_search_options()
    assert sorted(options) == sorted([
        "batch_size", "chunk_size", "diversity_penalty", "do_sample", "early_stopping", "length_penalty",
        "max_length", "min_length", "no_repeat_ngram_size", "num_beams", "num_return_sequences",
        "past_present_share_buffer", "random_seed", "repetition_penalty", "temperature", "top_k", "top_p"])
    assert options["max_length"] == 100.0 and options["random_seed"] == -1.0 and options["do_sample"] is False
    params.set_search_options(max_length=12, temperature=0.5, do_sample=True, random_seed=9, early_stopping=False)
    options = params.get_search_options()
    assert (options["max_length"], options["temperature"], options["do_sample"], options["random_seed"],
            options["early_stopping"]) == (12.0, 0.5, True, 9.0, False)
    for kwargs, message in [
        (dict(foo=1), ' Unknown value "foo"'),
        (dict(do_sample=1), "do_sample - Expected a bool but saw a number"),
        (dict(top_k=True), "top_k - Expected a number but saw a bool"),
        (dict(max_length=10.5), "Field 'max_length' value 10.5 is not an integer"),
        (dict(top_k=1e20), "Field 'top_k' value 1e+20 is out of int32 range [-2147483648, 2147483647]"),
        (dict(max_length=float("nan")), "Field 'max_length' cannot be converted to int32 (NaN or Inf)"),
    ]:
        with pytest.raises(RuntimeError) as error:
            params.set_search_options(**kwargs)
        assert str(error.value) == message
    assert params.get_search_options()["max_length"] == 12.0  # failed sets change nothing


@pytest.mark.parametrize("search,message", [
    (dict(batch_size=0), r"^batch_size \(0\) must be in \[1, 32\]$"),
    (dict(batch_size=33), r"^batch_size \(33\) must be in \[1, 32\]$"),
    (dict(num_return_sequences=2), r"^num_return_sequences \(2\) must be in \[1, 1\]$"),
    (dict(max_length=129), r"^max_length \(129\) cannot be greater than model context_length \(128\)$"),
    (dict(max_length=0), r"^search max_length is 0$"),
    (dict(num_beams=4), r"^num_beams \(4\): beam search is not supported by oga's Generator"),
])
def test_generator_creation_checks(search, message):
    with pytest.raises(RuntimeError, match=message):
        make_generator(**search)


def test_a_max_length_the_kv_cache_cannot_hold_is_refused():
    model = ogt.create_test_model(num_blocks=4, block_size=4, context_length=128)
    with pytest.raises(RuntimeError, match=r"max_length \(40\) exceeds the longest sequence the engine's KV cache holds \(max_request_length 17"):
        make_generator(model, max_length=40)


@pytest.mark.parametrize("search,message", [
    (dict(do_sample=True, top_p=2.0), "^top_p must be between 0.0 and 1.0$"),
    (dict(do_sample=True, top_k=-2), "^top_k must be 0 or greater$"),
    (dict(do_sample=True, top_k=1000), r"^top_k \(1000\) must be less than or equal to vocab_size \(64\)$"),
])
def test_sampling_options_are_checked_when_a_sampling_generator_is_created(search, message):
    with pytest.raises(RuntimeError, match=message):
        make_generator(max_length=10, **search)


def test_greedy_ignores_sampling_values_as_0_18_does():
    g = make_generator(max_length=8, top_p=2.0, temperature=-1.0, top_k=-5)
    prompt = prompt_without_eos(8)
    g.append_tokens(prompt)
    run_to_end(g)
    assert g.get_sequence(0).tolist() == expected_row(prompt, 8)[0]


@pytest.mark.parametrize("tokens,message", [
    ([], "^input_ids is empty$"),
    ([5, 64], r"^input_ids\[1\] \(64\) is outside the model's vocabulary \[0, 64\)\.$"),
    (list(range(2, 30)), r"^input_ids size \(28\) \+ current sequence length \(0\) exceeds max length \(20\)$"),
])
def test_append_tokens_errors_change_nothing(tokens, message):
    g = make_generator(max_length=20)
    with pytest.raises(RuntimeError, match=message):
        g.append_tokens(np.array(tokens, np.int32))
    assert g.token_count() == 0


def test_append_tokens_argument_types():
    g = make_generator(max_length=20, batch_size=2)
    with pytest.raises(TypeError):
        g.append_tokens(np.array([1.5, 2.0]))
    with pytest.raises(ValueError):
        g.append_tokens(np.zeros((1, 2, 2), np.int32))
    with pytest.raises(RuntimeError, match="not a positive multiple of batch_size 2"):
        g.append_tokens([5, 6, 7])
    with pytest.raises(IndexError):
        g.get_sequence(2)


def test_terminate_session_stops_generation_until_cleared():
    prompt = prompt_without_eos(20)
    g = make_generator(max_length=20)
    g.append_tokens(prompt)
    with pytest.raises(RuntimeError, match="^terminate_session key value unexpected: yes$"):
        g.set_runtime_option("terminate_session", "yes")
    with pytest.raises(RuntimeError, match='^Unknown runtime option "enable_profiling"'):
        g.set_runtime_option("enable_profiling", "1")
    g.set_runtime_option("terminate_session", "1")
    for call in (g.generate_next_token, g.is_done, lambda: g.append_tokens([5])):
        with pytest.raises(RuntimeError, match="^Session in Terminated state, exiting!$"):
            call()
    g.set_runtime_option("terminate_session", "0")
    run_to_end(g)
    assert g.get_sequence(0).tolist() == expected_row(prompt, 20)[0]


def test_generators_are_independent_and_usable_from_another_thread():
    prompt = prompt_without_eos(20)
    model = ogt.create_test_model()
    g = make_generator(model, max_length=20)
    g.append_tokens(prompt)
    other = make_generator(model, max_length=20)
    other.append_tokens(prompt)
    worker = threading.Thread(target=run_to_end, args=(g,))
    worker.start()
    worker.join()
    run_to_end(other)
    assert g.get_sequence(0).tolist() == other.get_sequence(0).tolist() == expected_row(prompt, 20)[0]


def test_speculative_stats_and_unsupported_methods():
    g = make_generator(max_length=20)
    stats = g.get_speculative_stats()
    assert stats["rounds"] == 0 and stats["acceptance_length_histogram"] == [0] * 8
    for call in (lambda: g.get_input("input_ids"), lambda: g.get_output("logits"), g.snapshot_state,
                 lambda: g.set_model_input("x", np.zeros(1)), lambda: g.set_hidden_states(np.zeros(1)),
                 lambda: g.set_inputs(None)):
        with pytest.raises(RuntimeError, match="is not supported by oga"):
            call()
    params = og.GeneratorParams(ogt.create_test_model())
    with pytest.raises(RuntimeError, match="is not supported by oga"):
        params.set_speculative_options(max_draft_tokens=2)
    with pytest.raises(RuntimeError, match="enable_ff_tokens"):
        params.set_guidance("regex", "a+", enable_ff_tokens=True)
    with pytest.raises(RuntimeError, match='^Unknown guidance type "bogus"'):
        params.set_guidance("bogus", "a+")


@pytest.mark.parametrize("skip", [0, 3, 7])
def test_an_interrupted_step_is_delivered_by_the_next_call(skip):
    """An interruption inside a step (OgaExtExecutionStatus_Interrupted; from Python, a
    KeyboardInterrupt) stops generate_next_token without a token; the next call delivers that
    token, and the sequences are those of an uninterrupted run."""
    prompts = [prompt_without_eos(12, offset=0), prompt_without_eos(12, offset=1)]
    model = ogt.create_test_model()
    g = make_generator(model, max_length=12, batch_size=2)
    g.append_tokens(prompts)
    ogt.inject_fault(model, "execute", kind="interrupted", skip=skip)
    interrupted = 0
    calls = 0
    while not g.is_done():
        calls += 1
        try:
            g.generate_next_token()
        except RuntimeError as error:
            assert str(error) == "The Generator's step was interrupted."
            interrupted += 1
    assert interrupted == 1 and calls == 12 - 3 + 1
    assert [g.get_sequence(i).tolist() for i in range(2)] == [expected_row(p, 12)[0] for p in prompts]


def test_a_retryable_step_is_retried_and_a_fatal_one_is_raised():
    prompt = prompt_without_eos(12)
    model = ogt.create_test_model()
    g = make_generator(model, max_length=12)
    g.append_tokens(prompt)
    ogt.inject_fault(model, "execute", kind="retryable", skip=2, count=2)
    run_to_end(g)
    assert g.get_sequence(0).tolist() == expected_row(prompt, 12)[0]
    model = ogt.create_test_model()
    g = make_generator(model, max_length=12)
    g.append_tokens(prompt)
    ogt.inject_fault(model, "execute", kind="fatal", skip=1)
    g.generate_next_token()
    with pytest.raises(RuntimeError, match="no longer healthy"):
        g.generate_next_token()
    with pytest.raises(RuntimeError, match="no longer healthy"):
        g.generate_next_token()
