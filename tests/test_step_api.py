"""OGA's earlier step API (onnxruntime-genai 0.10-0.15) on the engine core: og.Request(params),
request.add_tokens / continue_with, engine.add_request / remove_request / step(),
has_unseen_tokens / get_unseen_token, is_done / is_turn_complete, opaque data; and the same C
functions through ctypes. What OGA's engine tests of that era pin, written here from scratch: a
continuation while a peer stays active, tokens rejected while awaiting admission, no removal
through another engine, the lifecycle operations, the last handle's release reclaiming the
capacity it retained, removal freezing output, engine teardown and recreation, and add_request
from a producer thread marshalled to the owner thread. Tokens are checked against the test
executor's oracle, and on a small paged ONNX decoder against the Engine API's greedy tokens."""

import threading
from ctypes import byref, c_bool, c_int32, c_void_p

import numpy as np
import pytest

import oga as og
import oga.testing as ogt
from capi import P, error, load, ok
from greedy_runs import greedy
from helpers import OracleSequence, find_prompt, prompt_without_eos
from model_dirs import executor_model_dir

VOCAB, EOS = 64, 1


def oracle_turn(context, prompt, max_length):
    """Greedy tokens after `context` + `prompt` until EOS or max_length; (tokens, ended by EOS)."""
    oracle = OracleSequence(VOCAB, (EOS,), 10**6)
    oracle.extend(list(context) + list(prompt))
    out = []
    while len(oracle.tokens) < max_length:
        token = oracle.greedy()
        if token == EOS:
            return out, True
        out.append(token)
        oracle.append(token)
    return out, False


def params_for(model, **search):
    params = og.GeneratorParams(model)
    params.set_search_options(**search)
    return params


def new_request(params, prompt, tag=None):
    request = og.Request(params)
    request.add_tokens(np.array(prompt, np.int32))
    if tag is not None:
        request.set_opaque_data(tag)
    return request


def drain(engine, limit=10000):
    """Steps until idle; returns {opaque tag: tokens} in the order step() handed them back."""
    tokens = {}
    for _ in range(limit):
        if not engine.has_pending_requests():
            return tokens
        ready = engine.step()
        if ready is None:
            continue
        assert ready.has_unseen_tokens()
        while ready.has_unseen_tokens():
            tokens.setdefault(ready.get_opaque_data(), []).append(ready.get_unseen_token())
        assert not ready.has_unseen_tokens()
    raise AssertionError("the engine did not become idle")


def eos_prompt(after):
    def ends(p):
        tokens, ended = oracle_turn([], p, 200)
        return ended and len(tokens) == after
    return find_prompt(ends)


def test_the_lifecycle_on_the_test_model():
    model = ogt.create_test_model()
    params = params_for(model, max_length=24)
    engine = og.Engine(model)
    prompts = {i: prompt_without_eos(30, offset=i) for i in range(3)}
    prompts[0] = eos_prompt(3)  # its turn ends early, by EOS
    requests = [new_request(params, prompts[i], tag=i) for i in range(3)]
    for request in requests:
        assert not request.is_done() and not request.has_unseen_tokens()
        with pytest.raises(RuntimeError, match="^All tokens have been seen.$"):
            request.get_unseen_token()
        assert engine.add_request(request) is None
    assert engine.has_pending_requests()
    got = drain(engine)
    assert got == {i: oracle_turn([], prompts[i], 24)[0] for i in range(3)}
    assert all(r.is_done() and r.is_turn_complete() for r in requests)
    assert engine.step() is None and not engine.has_pending_requests()
    # A continuation (add_tokens once the turn is complete, or continue_with) keeps the history.
    history = prompts[0] + got[0]
    requests[0].add_tokens([5, 6])
    assert not requests[0].is_done()
    more = drain(engine)
    assert more == {0: oracle_turn(history, [5, 6], 24)[0]}
    assert requests[0].get_opaque_data() == 0


def test_a_continuation_while_a_peer_stays_active():
    model = ogt.create_test_model()
    params = params_for(model, max_length=60)
    engine = og.Engine(model)
    short = eos_prompt(2)
    long = prompt_without_eos(60)
    a, b = new_request(params, short, "a"), new_request(params, long, "b")
    engine.add_request(a)
    engine.add_request(b)
    tokens = {"a": [], "b": []}
    while not a.is_done():
        ready = engine.step()
        while ready is not None and ready.has_unseen_tokens():
            tokens[ready.get_opaque_data()].append(ready.get_unseen_token())
    assert tokens["a"] == oracle_turn([], short, 60)[0] and not b.is_done()
    a.continue_with([7, 8, 9])  # B keeps generating meanwhile
    with pytest.raises(RuntimeError, match="^Cannot add tokens while the request is generating"):
        b.continue_with([7])
    with pytest.raises(RuntimeError, match="^Continue is only valid after the request's turn is complete.$"):
        og.Request(params).continue_with([7])
    rest = drain(engine)
    assert rest["a"] == oracle_turn(short + tokens["a"], [7, 8, 9], 60)[0]
    assert tokens["b"] + rest["b"] == oracle_turn([], long, 60)[0]


def test_tokens_are_rejected_while_awaiting_admission():
    model = ogt.create_test_model(max_batch_size=1)
    params = params_for(model, max_length=20)
    engine = og.Engine(model)
    first, second = prompt_without_eos(20, offset=0), prompt_without_eos(20, offset=1)
    a, b = new_request(params, first, "a"), new_request(params, second, "b")
    engine.add_request(a)
    engine.add_request(b)
    engine.step()  # a is admitted; b waits for the one residency slot
    for request in (a, b):
        with pytest.raises(RuntimeError) as raised:
            request.add_tokens([5])
        assert str(raised.value) in ("Cannot add tokens to a request that is waiting for admission to the engine.",
                                     "Cannot add tokens while the request is generating; add them once its turn is "
                                     "complete.")
    with pytest.raises(RuntimeError, match="^Cannot add tokens to a request that is waiting for admission"):
        b.add_tokens([5])
    tokens = drain(engine)
    assert tokens["b"] == oracle_turn([], second, 20)[0]  # the rejected tokens changed nothing
    assert engine.step() is None


def test_a_request_cannot_be_removed_from_another_engine():
    model = ogt.create_test_model()
    params = params_for(model, max_length=20)
    engine, other = og.Engine(model), og.Engine(model)
    prompt = prompt_without_eos(20)
    request = new_request(params, prompt, "r")
    with pytest.raises(RuntimeError, match="^Cannot remove a request that was never added to an engine.$"):
        engine.remove_request(request)
    engine.add_request(request)
    with pytest.raises(RuntimeError, match="^Cannot remove a request that belongs to another engine.$"):
        other.remove_request(request)
    with pytest.raises(RuntimeError, match="^Cannot add the request to the engine since it is already assigned.$"):
        other.add_request(request)
    assert drain(engine) == {"r": oracle_turn([], prompt, 20)[0]}


def test_removal_freezes_output_and_frees_the_cache():
    model = ogt.create_test_model()
    params = params_for(model, max_length=40)
    engine = og.Engine(model)
    prompt = prompt_without_eos(40)
    request = new_request(params, prompt, "r")
    engine.add_request(request)
    for _ in range(4):
        engine.step()
    before = ogt.engine_counters(engine)
    assert before["free_blocks"] < before["total_blocks"]
    engine.remove_request(request)
    engine.remove_request(request)  # idempotent
    assert request.is_done()
    counters = ogt.engine_counters(engine)
    assert counters["free_blocks"] == counters["total_blocks"]
    frozen = []
    while request.has_unseen_tokens():
        frozen.append(request.get_unseen_token())
    assert frozen == oracle_turn([], prompt, 40)[0][:len(frozen)] and frozen
    assert engine.step() is None and not engine.has_pending_requests() and not request.has_unseen_tokens()
    with pytest.raises(RuntimeError, match="^Cannot add tokens to a request that was removed from its engine.$"):
        request.add_tokens([5])


def test_engine_teardown_and_recreation():
    model = ogt.create_test_model()
    params = params_for(model, max_length=30)
    engine = og.Engine(model)
    prompt = prompt_without_eos(30)
    request = new_request(params, prompt, "old")
    engine.add_request(request)
    engine.step()
    del engine  # its requests are removed with it
    assert request.is_done()
    with pytest.raises(RuntimeError, match="was removed from its engine"):
        request.add_tokens([5])
    recreated = og.Engine(model)
    with pytest.raises(RuntimeError, match="already assigned"):
        recreated.add_request(request)
    fresh = new_request(params, prompt, "new")
    recreated.add_request(fresh)
    assert drain(recreated) == {"new": oracle_turn([], prompt, 30)[0]}


def test_add_request_from_a_producer_thread_is_marshalled_to_the_owner():
    model = ogt.create_test_model()
    params = params_for(model, max_length=24)
    engine = og.Engine(model)
    prompts = {i: prompt_without_eos(24, offset=i) for i in range(6)}
    added = threading.Semaphore(0)

    def producer():
        for i, prompt in prompts.items():
            engine.add_request(new_request(params, prompt, i))  # not the owner thread: queued
            added.release()

    thread = threading.Thread(target=producer)
    thread.start()
    tokens, seen = {}, 0
    while seen < len(prompts) or engine.has_pending_requests():
        while added.acquire(blocking=False):
            seen += 1
        ready = engine.step()
        while ready is not None and ready.has_unseen_tokens():
            tokens.setdefault(ready.get_opaque_data(), []).append(ready.get_unseen_token())
    thread.join()
    assert tokens == {i: oracle_turn([], p, 24)[0] for i, p in prompts.items()}


def test_misuse_is_refused_and_changes_nothing():
    model = ogt.create_test_model()
    params = params_for(model, max_length=20)
    engine = og.Engine(model)
    with pytest.raises(TypeError, match="No constructor defined!"):
        og.Request()
    empty = og.Request(params)
    with pytest.raises(RuntimeError, match="^Cannot schedule a request with no tokens.$"):
        engine.add_request(empty)
    with pytest.raises(RuntimeError, match=r"^Expected at least one token for generation\. Received 0\.$"):
        empty.add_tokens([])
    with pytest.raises(RuntimeError, match=r"outside the model's vocabulary"):
        empty.add_tokens([64])
    with pytest.raises(RuntimeError, match="leaves no room to generate before max_length"):
        empty.add_tokens(list(range(2, 22)))
    beams = params_for(model, max_length=20, num_beams=2)
    with pytest.raises(RuntimeError, match="beam search is not supported"):
        og.Request(beams)
    request = new_request(params, [5, 6], "r")
    with pytest.raises(RuntimeError, match="created by OgaCreateRequest"):
        request.begin_turn([5])
    engine.add_request(request)
    with pytest.raises(RuntimeError, match="drive it with OgaEngineStep"):
        engine.run(engine.create_event_buffer(4))
    turn_request = engine.create_request()
    with pytest.raises(RuntimeError, match="created by OgaEngineCreateRequest"):
        turn_request.add_tokens([5])
    drain(engine)
    other_model = ogt.create_test_model()
    foreign = new_request(params_for(other_model, max_length=20), [5], "f")
    with pytest.raises(RuntimeError, match="another model"):
        engine.add_request(foreign)


def test_on_a_paged_onnx_decoder_the_tokens_are_the_engines(tmp_path_factory):
    directory = executor_model_dir(tmp_path_factory, "tiny-llama")
    prompts = [[1, 5, 9, 13], [1, 7, 7, 2, 30], [1, 40, 41]]
    expected = greedy(og, directory, prompts, 12)
    model = og.Model(directory)
    lengths = {i: len(p) + 12 for i, p in enumerate(prompts)}
    engine = og.Engine(model)
    requests = []
    for i, prompt in enumerate(prompts):
        p = params_for(model, max_length=lengths[i])
        requests.append(new_request(p, prompt, i))
        engine.add_request(requests[-1])
    got = drain(engine)
    assert [got[i] for i in range(3)] == [e[:len(got[i])] for e in expected]
    assert all(len(got[i]) == 12 or requests[i].is_done() for i in range(3))


def test_the_c_api_lifecycle_and_release_of_the_last_handle():
    """Through ctypes. With max_batch_size 1 and no preemption, a finished request keeps the only
    residency slot; releasing its last handle gives it back, and the next request then runs."""
    lib = load()
    model_py = ogt.create_test_model(max_batch_size=1, preemption="none")
    params = params_for(model_py, max_length=16)
    engine = og.Engine(model_py)
    first, second = prompt_without_eos(16, offset=0), prompt_without_eos(16, offset=1)
    a = new_request(params, first, "a")
    engine.add_request(a)
    assert drain(engine) == {"a": oracle_turn([], first, 16)[0]}
    b = new_request(params, second, "b")
    engine.add_request(b)
    for _ in range(5):  # a holds the slot: b cannot start
        assert engine.step() is None
    assert not b.is_done()
    engine.remove_request(a)  # the engine's reference goes ...
    del a                     # ... and so does the last handle
    assert drain(engine) == {"b": oracle_turn([], second, 16)[0]}

    # The same functions with 0.13's C signatures.
    model = P()
    ok(lib, lib.OgaExtCreateTestModel(b'{"model": {"type": "oga_test", "vocab_size": 64, "context_length": 128, '
                                      b'"eos_token_id": 1, "bos_token_id": 0, "pad_token_id": 0, "decoder": {}}, '
                                      b'"search": {"max_length": 16}, "engine": {"dynamic_batching": '
                                      b'{"block_size": 4, "num_blocks": 64, "max_batch_size": 1, "preemption": "none"}}}',
                                      byref(model)))
    c_params, c_engine = P(), P()
    ok(lib, lib.OgaCreateGeneratorParams(model, byref(c_params)))
    ok(lib, lib.OgaCreateEngine(model, byref(c_engine)))

    def request(prompt):
        handle, sequences = P(), P()
        ok(lib, lib.OgaCreateRequest(c_params, byref(handle)))
        ok(lib, lib.OgaCreateSequences(byref(sequences)))
        ok(lib, lib.OgaAppendTokenSequence((c_int32 * len(prompt))(*prompt), len(prompt), sequences))
        ok(lib, lib.OgaRequestAddTokens(handle, sequences))
        lib.OgaDestroySequences(sequences)
        return handle

    def run_until_idle():
        out = []
        pending, ready, flag, token = c_bool(True), P(), c_bool(), c_int32()
        for _ in range(1000):
            ok(lib, lib.OgaEngineHasPendingRequests(c_engine, byref(pending)))
            if not pending.value:
                return out
            ok(lib, lib.OgaEngineStep(c_engine, byref(ready)))
            while ready.value:
                ok(lib, lib.OgaRequestHasUnseenTokens(ready, byref(flag)))
                if not flag.value:
                    break
                ok(lib, lib.OgaRequestGetUnseenToken(ready, byref(token)))
                out.append(token.value)
        return out

    c_a = request(first)
    ok(lib, lib.OgaRequestSetOpaqueData(c_a, c_void_p(1234)))
    opaque = c_void_p()
    ok(lib, lib.OgaRequestGetOpaqueData(c_a, byref(opaque)))
    assert opaque.value == 1234
    ok(lib, lib.OgaEngineAddRequest(c_engine, c_a))
    assert error(lib, lib.OgaEngineAddRequest(c_engine, c_a)) == "Cannot add the request to the engine since it is already assigned."
    assert run_until_idle() == oracle_turn([], first, 16)[0]
    done = c_bool()
    ok(lib, lib.OgaRequestIsDone(c_a, byref(done)))
    assert done.value
    c_b = request(second)
    ok(lib, lib.OgaEngineAddRequest(c_engine, c_b))
    ready = P()
    for _ in range(3):
        ok(lib, lib.OgaEngineStep(c_engine, byref(ready)))
        assert not ready.value  # blocked behind a's retained slot
    lib.OgaDestroyRequest(c_a)  # the last handle: the engine reclaims a at its next step
    assert run_until_idle() == oracle_turn([], second, 16)[0]
    assert error(lib, lib.OgaEngineStep(None, byref(ready))) == "engine must not be null."
    lib.OgaDestroyRequest(c_b)
    lib.OgaDestroyEngine(c_engine)
    lib.OgaDestroyGeneratorParams(c_params)
    lib.OgaDestroyModel(model)
