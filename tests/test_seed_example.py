"""The seed document's Python example loop ("Experimental low-level public API shape") runs as
written, with `import oga as og`, and produces the oracle's tokens."""

import oga as og
import oga.testing as ogt
from helpers import R_EOS, R_MAX_GEN, OracleSequence, counters


def test_seed_example_loop_runs_as_written():
    # A test model large enough for the example's session cap of 4096 tokens.
    model = ogt.create_test_model(context_length=4096, num_blocks=1024)
    engine = og.Engine(model)
    generation_params = og.GeneratorParams(model)
    initial_tokens = [5, 9, 13, 21]
    next_turn_tokens = [2, 3, 4]
    streamed = []
    reasons = []

    # ---- begin: seed example, verbatim except for recording tokens and reasons ----
    request_options = og.RequestOptions()
    request_options.set_max_session_tokens(4096)
    request = engine.create_request(generation_params, request_options)
    turn_options = og.TurnOptions(request)
    turn_options.set_max_generated_tokens(128)
    turn_id = request.begin_turn(initial_tokens, turn_options)

    while engine.has_pending_requests():
        for event in engine.run(max_events=8):
            if event.request is None:
                if event.flags & (
                    og.EngineEventFlags.CAPACITY_BLOCKED
                    | og.EngineEventFlags.RETRYABLE
                ):
                    # No progress committed. The Engine remains healthy and pending work can retry.
                    continue
                raise RuntimeError(
                    f"Engine-level event: flags={event.flags}, error_code={event.error_code}"
                )
            if event.flags & og.EngineEventFlags.TOKEN:
                # event.request is a borrowed identity alias; event.turn_id is Request-local.
                token = event.token
                # Stream or process the token.
                streamed.append((event.turn_id, token))
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                reason = event.finish_reason
                reasons.append((event.turn_id, reason))

    turn_options.set_max_generated_tokens(64)
    turn_id = request.begin_turn(next_turn_tokens, turn_options)

    # Repeat engine.run(max_events=...), then close when continuation is no longer needed.
    while engine.has_pending_requests():
        for event in engine.run(max_events=8):
            if event.request is None:
                continue
            if event.flags & og.EngineEventFlags.TOKEN:
                streamed.append((event.turn_id, event.token))
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                reasons.append((event.turn_id, event.finish_reason))
    request.close()
    # ---- end ----

    assert turn_id == 2
    oracle = OracleSequence(max_session=4096)
    t1, r1 = oracle.turn(initial_tokens, max_gen=128)
    t2, r2 = oracle.turn(next_turn_tokens, max_gen=64)
    assert streamed == [(1, t) for t in t1] + [(2, t) for t in t2]
    assert reasons == [(1, r1), (2, r2)]
    assert all(isinstance(r, og.FinishReason) for _, r in reasons)
    assert {r1, r2} <= {R_EOS, R_MAX_GEN}
    assert counters(engine)["free_blocks"] == counters(engine)["total_blocks"]
    assert not engine.has_pending_requests()


def test_seed_example_with_one_event_pacing():
    model = ogt.create_test_model()
    engine = og.Engine(model)
    params = og.GeneratorParams(model)
    requests = [engine.create_request(params, og.RequestOptions()) for _ in range(3)]
    prompts = [[5, 9, 13], [7, 7], [20, 21, 22]]
    for r, p in zip(requests, prompts):
        t = og.TurnOptions(r)
        t.set_max_generated_tokens(5)
        r.begin_turn(p, t)
    out = {r: [] for r in requests}
    calls = 0
    while engine.has_pending_requests():
        events = engine.run(max_events=1)
        calls += 1
        assert len(events) <= 1
        for event in events:
            if event.flags & og.EngineEventFlags.TOKEN:
                out[event.request].append(event.token)
    for r, p in zip(requests, prompts):
        toks, _ = OracleSequence().turn(p, max_gen=5)
        assert out[r] == toks
    assert counters(engine)["model_runs"] < calls


def test_seed_params_max_length_sets_the_default_session_cap():
    from helpers import R_MAX_SESSION, find_prompt

    prompt = find_prompt(lambda p: OracleSequence(max_session=12).turn(p)[1] == R_MAX_SESSION, length=3)
    model = ogt.create_test_model()
    engine = og.Engine(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=12)
    request = engine.create_request(params)
    request.begin_turn(prompt)
    tokens = []
    last = None
    while engine.has_pending_requests():
        for event in engine.run(max_events=4):
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens.append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                last = (event.finish_reason, event.usage.generated_tokens)
    toks, reason = OracleSequence(max_session=12).turn(prompt)
    assert tokens == toks and last == (og.FinishReason.MAX_SESSION_TOKENS, 9)
