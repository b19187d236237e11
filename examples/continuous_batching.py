"""Continuous batching with oga's built-in deterministic test model.

Submits several requests with different prompt lengths and per-turn limits, drives the engine with
the event loop of the 0.18 Engine API, prints each request's tokens and finish reason, then runs a
continuation turn on one request. Run: python examples/continuous_batching.py
"""
import numpy as np

import oga
import oga.testing

EngineEventFlags = oga.EngineEventFlags


def drain(engine, buffer, tokens, finished, keep=()):
    """Runs the engine until no work is left, copying event values out of the borrowed views.

    A request whose turn finished stays resident (it keeps its KV cache for a continuation) and
    holds one of the engine's max_batch_size slots until it is closed, so every finished request
    that is not in `keep` is closed to make room for waiting ones."""
    steps = 0
    while engine.has_pending_requests():
        steps += 1
        done = []
        for event in engine.run(buffer):
            request = event.request
            flags = event.flags
            if request is None:
                # Engine-level events: capacity back-pressure and retryable steps just mean "run again".
                if flags & (EngineEventFlags.CAPACITY_BLOCKED | EngineEventFlags.RETRYABLE):
                    continue
                raise RuntimeError(f"engine failure: {event.error_code!r}")
            if flags & EngineEventFlags.TOKEN:
                tokens[request].append(event.token)
            if flags & EngineEventFlags.TURN_FINISHED:
                finished[request] = (event.finish_reason, event.usage.generated_tokens)
                done.append(request)
        for request in done:
            if request not in keep:
                request.close()
    return steps


def main():
    model = oga.testing.create_test_model(vocab_size=64, context_length=128, block_size=4, num_blocks=128,
                                          max_batch_size=4)
    engine = oga.Engine(model)
    caps = engine.get_capabilities()
    print(f"engine: max_batch_size={caps.configured_max_batch_size} "
          f"max_scheduled_tokens={caps.max_scheduled_tokens} max_request_length={caps.max_request_length}")

    rng = np.random.default_rng(0)
    # (prompt length, max_generated_tokens) per request: more requests than batch rows, so the
    # scheduler admits waiting requests as earlier ones finish and are closed.
    plan = [(3, 8), (17, 5), (1, 12), (40, 6), (9, 10), (25, 4)]
    requests, tokens, finished = [], {}, {}
    for prompt_length, max_new in plan:
        request = engine.create_request()
        turn_options = oga.TurnOptions(request)
        turn_options.set_max_generated_tokens(max_new)
        prompt = rng.integers(2, 64, size=prompt_length, dtype=np.int32)
        request.begin_turn(prompt, turn_options)
        requests.append(request)
        tokens[request] = []

    buffer = engine.create_event_buffer(16)
    steps = drain(engine, buffer, tokens, finished, keep=(requests[0],))
    print(f"first turns done in {steps} runs")
    for i, request in enumerate(requests):
        reason, generated = finished[request]
        print(f"request {i}: prompt={plan[i][0]:2d} limit={plan[i][1]:2d} -> {tokens[request]} "
              f"({reason.name}, {generated} generated)")

    # Continuation: the first request keeps its history and answers a follow-up turn.
    follow_up = requests[0]
    turn_options = oga.TurnOptions(follow_up)
    turn_options.set_max_generated_tokens(5)
    tokens[follow_up] = []
    turn_id = follow_up.begin_turn([7, 8, 9], turn_options)
    drain(engine, buffer, tokens, finished, keep=(follow_up,))
    reason, generated = finished[follow_up]
    print(f"request 0, turn {turn_id}: {tokens[follow_up]} ({reason.name}, {generated} generated)")

    follow_up.close()


if __name__ == "__main__":
    main()
