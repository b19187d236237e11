"""The conformance scenarios (dynamic path). Each is data: see scenario.py for the actions."""

from __future__ import annotations

from scenario import (NULL, Difference, Scenario, all_of, begin, buffer, cancel, capabilities, capi, close, create,
                      destroy_engine, drain, engine, engine_from, has_flag, has_reason, ids, model, off_thread, only,
                      out, pending, py, raises, ref, release, release_buffer, release_options, run, set_option,
                      turn_options)

# Greedy streams of the seed-3 model (vocab 97, EOS 2), found by running 0.18 (see `expect`):
P_LONG = [3, 7, 11]      # no EOS within 40 generated tokens
P_B = [3, 61, 50]        # no EOS within 40 generated tokens
P_C = [8, 7, 50]         # no EOS within 40 generated tokens
P_EOS = [8, 61, 50]      # 3 tokens, then EOS
P_EOS2 = [53, 61, 11]    # 2 tokens, then EOS
P_EOS0 = [15, 64]        # EOS is the first greedy token
P6 = [3, 7, 11, 13, 17, 19]
P8 = [30, 31, 32, 33, 34, 35, 36, 37]
P12 = list(range(40, 52))
P12B = list(range(60, 72))

TOKEN, TURN_FINISHED, CAPACITY_BLOCKED, FAILED = 1, 2, 4, 8
EOS_R, MAXGEN_R, MAXSESS_R, CANCELLED_R, FAILED_R = 1, 3, 4, 5, 6
DEFERRED = 1

OWNER = "Engine operations must be called from the Engine owner thread."

# README "Deliberate differences" bullet names
NULL_SAFE = "NULL-safe destroy functions"
TOKEN_RANGE = "Token ids are range-checked"
STALE_VIEWS = "Stale event views raise"
SEED_ERA = "Seed-era compatibility forms are accepted"
NOT_YET = "Not supported yet"
HUGE_BUFFERS = "Absurd event-buffer capacities are refused before allocating"
STATIC_BATCH_SIZE = "engine.static_batching.max_batch_size is honoured"
PY_ARGUMENT_ERRORS = "Python argument errors use Python's exception types"

S = []


def sc(name, actions, **kw):
    S.append(Scenario(name=name, actions=actions, **kw))


# ---------------------------------------------------------------------------------------------
# Single turns, EOS, per-turn limits
# ---------------------------------------------------------------------------------------------
sc("single_turn_max_generated", [create("r1"), begin("r1", P_LONG, max_gen=5), pending(), drain(64), pending()],
   expect=has_reason(MAXGEN_R))
sc("single_turn_no_options_eos", [create("r1"), begin("r1", P_EOS), drain(64)], expect=has_reason(EOS_R))
sc("eos_as_first_token", [create("r1"), begin("r1", P_EOS0, max_gen=8), drain(64)],
   expect=lambda recs: any(e[4] == EOS_R and e[7][1] == 0 for e in _evs(recs)),
   doc="terminal-only event, reason EOS, zero generated tokens")
sc("eos_after_two_tokens", [create("r1"), begin("r1", P_EOS2, max_gen=8), drain(64)], expect=has_reason(EOS_R))
sc("min_generated_masks_eos", [create("r1"), begin("r1", P_EOS, max_gen=8, min_gen=6), drain(64)],
   expect=has_reason(MAXGEN_R))
sc("min_generated_masks_first_token_eos", [create("r1"), begin("r1", P_EOS0, max_gen=4, min_gen=2), drain(64)])
sc("min_equals_max", [create("r1"), begin("r1", P_EOS, max_gen=4, min_gen=4), drain(64)])
sc("max_generated_one", [create("r1"), begin("r1", P_LONG, max_gen=1), drain(64)])
sc("max_generated_zero_means_session_cap", [create("r1", max_session=12), begin("r1", P_LONG, max_gen=0), drain(64)],
   expect=has_reason(MAXSESS_R))
sc("turn_options_reset_restores_defaults",
   [create("r1", max_session=10), turn_options("o", "r1", max_generated_tokens=2, min_generated_tokens=1),
    set_option("o", "reset"), begin("r1", P_LONG, opts="o"), drain(64)], expect=has_reason(MAXSESS_R))
sc("turn_options_are_snapshotted",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=2), begin("r1", P_LONG, opts="o"),
    set_option("o", "max_generated_tokens", 5), drain(64), begin("r1", [9], opts="o"), drain(64)])
sc("idle_run_returns_nothing", [run(64), create("r1"), pending(), run(64), run(1)])

# ---------------------------------------------------------------------------------------------
# Concurrent turns and buffer capacities
# ---------------------------------------------------------------------------------------------
THREE = [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=4), begin("r2", P_B, max_gen=6),
         begin("r3", P_EOS, max_gen=10)]
sc("concurrent_three_capacity_64", THREE + [drain(64)], expect=has_reason(EOS_R))
sc("concurrent_three_capacity_1", THREE + [drain(1)])
sc("concurrent_three_capacity_2", THREE + [drain(2)])
sc("capacity_0_is_a_no_op", THREE + [run(0, times=3), pending(), run(1), run(0), drain(64)])
sc("retained_overflow_drains_before_new_work",
   THREE + [run(1), create("r4"), begin("r4", P_C, max_gen=2), run(1, times=3), drain(64)])
sc("buffers_of_different_capacity_share_retained_events",
   THREE + [buffer("one", 1), buffer("big", 64), run(buf="one"), run(buf="big"), run(buf="one"), drain(2)])
sc("staggered_admission",
   [create("r1"), begin("r1", P_LONG, max_gen=6), run(64, times=2), create("r2"), begin("r2", P_B, max_gen=3),
    run(64), create("r3"), begin("r3", P_C, max_gen=2), drain(64)])
sc("isolated_equals_batched",
   [create("a"), begin("a", P_B, max_gen=8), drain(64), create("r1"), create("r2"), begin("r1", P_LONG, max_gen=8),
    begin("r2", P_B, max_gen=8), drain(64)])
sc("same_prompt_twice", [create("r1"), create("r2"), begin("r1", P_C, max_gen=5), begin("r2", P_C, max_gen=5),
                         drain(64)])

# ---------------------------------------------------------------------------------------------
# Continuation turns
# ---------------------------------------------------------------------------------------------
sc("continuation_turns_ids_and_usage",
   [create("r1"), begin("r1", P_LONG, max_gen=3), drain(64), begin("r1", [9, 10], max_gen=2), drain(64),
    begin("r1", [12], max_gen=4), drain(64)])
sc("continuation_after_eos", [create("r1"), begin("r1", P_EOS, max_gen=8), drain(64), begin("r1", [4], max_gen=3),
                              drain(64)], expect=has_reason(EOS_R))
sc("continuation_input_contains_eos",
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r1", [2, 5, 2], max_gen=3), drain(64)])
sc("continuation_while_peer_active",
   [create("r1"), create("r2"), begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=8), run(64),
    begin("r1", [6], max_gen=2), drain(64)])
sc("begin_while_assigned_or_active",
   [create("r1"), begin("r1", P_LONG, max_gen=4), begin("r1", [5], label="while queued"), run(64),
    begin("r1", [5], label="while active"), drain(64)],
   expect=raises("BeginTurn is only valid for a new request or after the current turn is complete."))
sc("begin_while_event_pending",
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r1", [5], max_gen=2), cancel("r1", 2),
    begin("r1", [6], label="pending cancel event"), pending(), drain(64), begin("r1", [6], max_gen=1), drain(64)],
   expect=raises("while an Engine event is pending"))
sc("begin_while_token_event_retained",
   THREE[:3] + [begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=1), begin("r3", P_C, max_gen=1), run(1),
                begin("r3", [5], label="r3 terminal retained"), begin("r1", [5], max_gen=1), drain(64)])

# ---------------------------------------------------------------------------------------------
# Session limits and max_session_tokens resolution
# ---------------------------------------------------------------------------------------------
sc("session_limit_single_turn", [create("r1", max_session=8), begin("r1", P_LONG), drain(64)],
   expect=has_reason(MAXSESS_R))
sc("session_limit_across_turns",
   [create("r1", max_session=12), begin("r1", P_LONG, max_gen=3), drain(64), begin("r1", [9, 10]), drain(64),
    begin("r1", [11], label="no room left")], expect=has_reason(MAXSESS_R))
sc("begin_must_leave_room_for_one_token",
   [create("r1", max_session=4), begin("r1", [5, 6, 7, 8], label="4 of 4"), begin("r1", [5, 6, 7], max_gen=5),
    drain(64)], expect=raises("must leave room for at least one generated token"))
sc("max_session_tokens_range",
   [create("r0", max_session=0, label="0 = default"), create("r64", max_session=64, label="64 = max_request_length"),
    create("r65", max_session=65, label="65"), create("rmax", max_session=2 ** 64 - 1, label="uint64 max"),
    begin("r64", P_LONG, max_gen=1), begin("r0", P_B, max_gen=1), drain(64)],
   expect=raises("must be greater than zero and no greater than the Engine's max_request_length (64)"))
sc("session_default_follows_search_max_length", [create("r1"), begin("r1", P_LONG), drain(64),
                                                 create("r2", max_session=30), begin("r2", P_B), drain(64),
                                                 create("r3", max_session=65)],
   model="maxlen20", expect=has_reason(MAXSESS_R))
sc("min_greater_than_max", [create("r1"), begin("r1", P_LONG, max_gen=2, min_gen=3), pending(),
                            begin("r1", P_LONG, max_gen=3, min_gen=3), drain(64)],
   expect=raises("min_generated_tokens (3) must not exceed max_generated_tokens (2)."))
sc("min_generated_does_not_fit", [create("r1", max_session=8), begin("r1", P_LONG, min_gen=6), pending(),
                                  begin("r1", P_LONG, min_gen=4), drain(64)], expect=raises("does not fit"))
sc("zero_tokens", [create("r1"), begin("r1", [], label="empty"), begin("r1", [], max_gen=3, label="empty+opts"),
                   pending(), begin("r1", P_LONG, max_gen=1), drain(64)],
   expect=raises("Expected at least one input token for generation. Received 0."))
sc("capabilities_base", [capabilities()])
sc("capabilities_tight", [capabilities(), create("r1", max_session=21), create("r2", max_session=22)], model="tight")
sc("capabilities_batch2", [capabilities()], model="batch2")
sc("capabilities_chunk", [capabilities()], model="chunk")

# ---------------------------------------------------------------------------------------------
# Cancellation
# ---------------------------------------------------------------------------------------------
sc("cancel_before_admission",
   [create("r1"), begin("r1", P_LONG, max_gen=4), cancel("r1", 1), cancel("r1", 1), pending(), drain(64), pending(),
    begin("r1", [9], max_gen=2), drain(64)], expect=has_reason(CANCELLED_R))
sc("cancel_during_prefill",
   [create("r1"), begin("r1", P6, max_gen=4), run(64), run(64), pending(), cancel("r1", 1), drain(64),
    begin("r1", [9], max_gen=2), drain(64)], model="chunk", expect=has_reason(CANCELLED_R))
sc("cancel_during_decode",
   [create("r1"), begin("r1", P_LONG, max_gen=10), run(64, times=3), cancel("r1", 1), cancel("r1", 1), drain(64),
    begin("r1", [9], max_gen=2), drain(64)], expect=has_reason(CANCELLED_R))
sc("cancel_after_completion",
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), cancel("r1", 1), cancel("r1", 0), cancel("r1", 2),
    cancel("r1", 99), pending()])
sc("cancel_stale_and_future_ids",
   [create("r1"), begin("r1", P_LONG, max_gen=1), drain(64), begin("r1", [5], max_gen=6), cancel("r1", 1),
    cancel("r1", 3), cancel("r1", 0), run(64), cancel("r1", 2), drain(64)])
sc("cancel_before_any_turn", [create("r1"), cancel("r1", 0), cancel("r1", 1), pending()],
   expect=raises("Cannot cancel a request before a turn has begun."))
sc("cancel_after_close", [create("r1"), begin("r1", P_LONG, max_gen=2), close("r1"), cancel("r1", 1)],
   expect=raises("Cannot cancel after the request's engine has been destroyed."))
sc("cancel_merges_into_retained_token_event",
   THREE[:3] + [begin("r1", P_LONG, max_gen=5), begin("r2", P_B, max_gen=5), begin("r3", P_C, max_gen=5),
                run(64), run(1), cancel("r3", 1), cancel("r2", 1), drain(1)], expect=has_reason(CANCELLED_R))
sc("cancel_one_of_three_peers_continue",
   THREE + [run(64, times=2), cancel("r2", 1), drain(64)])
sc("cancel_queued_in_capacity_wait",
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=1),
    drain(64), begin("r3", P_C, max_gen=2), run(64), cancel("r3", 1), drain(64)], model="batch2",
   expect=all_of(has_flag(CAPACITY_BLOCKED, DEFERRED), has_reason(CANCELLED_R)))

# ---------------------------------------------------------------------------------------------
# Close in every state
# ---------------------------------------------------------------------------------------------
sc("close_unassigned_idempotent",
   [create("r1"), close("r1"), close("r1"), pending(), begin("r1", P_LONG), turn_options("o", "r1"),
    cancel("r1", 1)], expect=raises("Cannot use a closed request."))
sc("close_queued", [create("r1"), begin("r1", P_LONG, max_gen=3), close("r1"), pending(), run(64)])
sc("close_during_prefill", [create("r1"), create("r2"), begin("r1", P6, max_gen=3), begin("r2", [5, 9], max_gen=3),
                            run(64), close("r1"), drain(64)], model="chunk")
sc("close_active_peer_continues",
   [create("r1"), create("r2"), begin("r1", P_LONG, max_gen=8), begin("r2", P_B, max_gen=8), run(64, times=3),
    close("r1"), drain(64)])
sc("close_with_retained_events", THREE + [run(1), close("r2"), drain(1)])
sc("close_turn_complete_frees_residency",
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=1),
    drain(64), begin("r3", P_C, max_gen=2), run(64), pending(), close("r1"), drain(64)], model="batch2",
   expect=has_flag(CAPACITY_BLOCKED, DEFERRED))
sc("close_after_engine_destroyed",
   [create("r1"), begin("r1", P_LONG, max_gen=2), destroy_engine(), close("r1"), close("r1"),
    begin("r1", [5]), cancel("r1", 1)])

# ---------------------------------------------------------------------------------------------
# Abandonment (final handle release)
# ---------------------------------------------------------------------------------------------
sc("release_unassigned_and_queued", [create("r1"), create("r2"), begin("r2", P_LONG, max_gen=3), release("r1"),
                                     release("r2"), pending(), run(64)])
sc("release_active_peer_continues",
   [create("r1"), create("r2"), begin("r1", P_LONG, max_gen=8), begin("r2", P_B, max_gen=8), run(64, times=2),
    release("r1"), drain(64)])
sc("release_with_retained_events", THREE + [run(1), release("r2"), drain(1)])
sc("release_turn_complete_frees_residency",
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=1),
    drain(64), begin("r3", P_C, max_gen=2), run(64), release("r1"), drain(64)], model="batch2",
   expect=has_flag(CAPACITY_BLOCKED, DEFERRED))
sc("release_off_thread_reclaimed_at_next_boundary",
   [create("r1"), create("r2"), begin("r1", P_LONG, max_gen=8), begin("r2", P_B, max_gen=3), run(64),
    off_thread(release("r1")), run(0), drain(64)])
sc("release_then_create_reclaims_residency",
   [create("r1"), create("r2"), begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=1), drain(64),
    release("r1"), release("r2"), create("r3"), create("r4"), begin("r3", P_C, max_gen=2),
    begin("r4", P_EOS, max_gen=2), drain(64)], model="batch2")

# ---------------------------------------------------------------------------------------------
# Capacity pressure and chunked prefill
# ---------------------------------------------------------------------------------------------
sc("residency_blocks_third_request",
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=3), begin("r2", P_B, max_gen=5),
    begin("r3", P_C, max_gen=2), drain(64, limit=12), pending(), close("r2"), drain(64)], model="batch2",
   expect=has_flag(CAPACITY_BLOCKED, DEFERRED))
sc("blocks_defer_second_prompt",
   [create("r1"), create("r2"), begin("r1", P12, max_gen=3), begin("r2", P12B, max_gen=2), drain(64, limit=8),
    close("r1"), drain(64)], model="tight", expect=has_flag(CAPACITY_BLOCKED, DEFERRED))
sc("prompt_fills_the_whole_pool", [create("r1", max_session=21), begin("r1", list(range(10, 30))), drain(64)],
   model="tight", expect=has_reason(MAXSESS_R))
sc("decode_growth_exhausts_blocks",
   [create("r1"), create("r2"), begin("r1", P8, max_gen=6), begin("r2", list(range(70, 78)), max_gen=6),
    drain(64, limit=16), close("r1"), drain(64)], model="tight")
sc("capacity_blocked_only_when_nothing_fits",
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=6), begin("r2", P_B, max_gen=6),
    begin("r3", P_C, max_gen=1), drain(64)], model="batch2")
sc("chunked_prefill_emits_nothing_until_done", [create("r1"), begin("r1", P6, max_gen=3), run(64), pending(),
                                                run(64, times=2), drain(64)], model="chunk")
sc("chunked_prefill_with_decoding_peer",
   [create("r1"), create("r2"), begin("r1", [5, 9], max_gen=6), run(64, times=2), begin("r2", P8, max_gen=2),
    drain(64)], model="chunk")

# ---------------------------------------------------------------------------------------------
# Errors: owner thread, closed requests, bindings between handles
# ---------------------------------------------------------------------------------------------
sc("owner_thread_errors",
   [create("r1"), begin("r1", P_LONG, max_gen=2), turn_options("o", "r1"), buffer("b", 4),
    off_thread(create("r2")), off_thread(begin("r1", [5])), off_thread(cancel("r1", 1)),
    off_thread(turn_options("o2", "r1")), off_thread(set_option("o", "max_generated_tokens", 3)),
    off_thread(buffer("b2", 4)), off_thread(run(buf="b")), off_thread(run(0)), off_thread(pending()),
    off_thread(capabilities()), off_thread(close("r1")), pending(), drain(64)], expect=raises(OWNER))
sc("closed_request_errors",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=2), begin("r1", P_LONG, opts="o"), drain(64),
    close("r1"), set_option("o", "max_generated_tokens", 3), begin("r1", [5]), begin("r1", [5], opts="o"),
    turn_options("o2", "r1"), cancel("r1", 1), close("r1")], expect=raises("Cannot use a closed request."))
sc("buffer_of_another_engine",
   [engine("e2"), buffer("b2", 4, engine="e2"), create("r1"), begin("r1", P_LONG, max_gen=1),
    run(buf="b2"), pending(), drain(64), run(buf="b2", engine="e2")],
   expect=raises("buffer must be used with the Engine that created it."))
sc("buffer_after_its_engine_destroyed",
   [engine("e2"), buffer("b2", 4, engine="e2"), create("q", engine="e2"), begin("q", P_LONG, max_gen=1),
    run(buf="b2", engine="e2"), destroy_engine("e2"), create("r1"), begin("r1", P_B, max_gen=1), run(buf="b2"),
    drain(64)])
sc("turn_options_of_another_request",
   [create("r1"), create("r2"), turn_options("o1", "r1", max_generated_tokens=1), begin("r2", P_LONG, opts="o1"),
    pending(), begin("r1", P_LONG, opts="o1"), drain(64)])
sc("turn_options_of_another_engine_request",
   [engine("e2"), create("q", engine="e2"), turn_options("oq", "q", max_generated_tokens=1), create("r1"),
    begin("r1", P_LONG, opts="oq"), pending()])
sc("turn_options_after_request_released",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=1), release("r1"),
    set_option("o", "max_generated_tokens", 2, label="set before a boundary"), create("r2"),
    begin("r2", P_LONG, opts="o"), pending()])
sc("turn_options_after_request_reclaimed",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=1), release("r1"), pending(),
    set_option("o", "max_generated_tokens", 2), create("r2"), begin("r2", P_LONG, opts="o"), pending()],
   expect=raises("Cannot use Turn options after their Request has been destroyed."))
sc("engine_destroyed_with_live_handles",
   [create("r1"), create("r2"), turn_options("o", "r2"), begin("r1", P_LONG, max_gen=3), buffer("b", 4), run(buf="b"),
    destroy_engine(), begin("r1", [5]), begin("r2", [5]), turn_options("o3", "r1"),
    set_option("o", "max_generated_tokens", 3), cancel("r1", 1), cancel("r2", 1), close("r1"), release("r2")])
sc("engine_teardown_and_recreation",
   [create("r1"), begin("r1", P_B, max_gen=5), drain(64), destroy_engine(), engine("e"), create("r2"),
    begin("r2", P_B, max_gen=5), drain(64)])
sc("two_engines_are_independent",
   [engine("e2"), create("r1"), create("q", engine="e2"), begin("r1", P_LONG, max_gen=3), begin("q", P_B, max_gen=3),
    drain(64), pending(engine="e2"), drain(64, engine="e2")])
sc("has_pending_semantics",
   [pending(), create("r1"), pending(), begin("r1", P_LONG, max_gen=1), pending(), drain(64), pending(),
    begin("r1", [5], max_gen=1), cancel("r1", 2), pending(), run(64), pending()])

# ---------------------------------------------------------------------------------------------
# More limits, boundaries and mixed workloads
# ---------------------------------------------------------------------------------------------
sc("per_turn_and_session_limit_coincide", [create("r1", max_session=8), begin("r1", P_LONG, max_gen=5), drain(64)])
sc("session_limit_one_past_per_turn", [create("r1", max_session=8), begin("r1", P_LONG, max_gen=6), drain(64)],
   expect=has_reason(MAXSESS_R))
sc("begin_boundary_prompt_lengths",
   [create("r1", max_session=8), begin("r1", list(range(10, 18)), label="8 of 8"),
    begin("r1", list(range(10, 17)), label="7 of 8"), drain(64), begin("r1", [5], label="full")])
sc("min_generated_boundaries",
   [create("r1", max_session=8), begin("r1", P_EOS0, min_gen=6, label="min 6"), begin("r1", P_EOS0, min_gen=5,
                                                                                      label="min 5"),
    drain(64), create("r2", max_session=8), begin("r2", P_EOS0, min_gen=4, label="min 4"), drain(64)])
sc("create_request_without_options", [create("r1", options=False), begin("r1", P_LONG, max_gen=2), drain(64)])
sc("four_requests_full_batch_capacity_3",
   THREE + [create("r4"), begin("r4", P_EOS0, max_gen=3), drain(3)])
sc("batch2_four_requests_closed_as_they_finish",
   [create("r1"), create("r2"), create("r3"), create("r4"), begin("r1", P_EOS2, max_gen=5),
    begin("r2", P_EOS, max_gen=5), begin("r3", P_LONG, max_gen=2), begin("r4", P_B, max_gen=2), drain(64, limit=8),
    close("r1"), drain(64, limit=4), close("r2"), drain(64), close("r3"), close("r4"), pending()], model="batch2",
   expect=has_flag(CAPACITY_BLOCKED, DEFERRED))
sc("tight_pool_reused_after_close",
   [create("r1", max_session=21), begin("r1", list(range(10, 30)), max_gen=1), drain(64), create("r2"),
    begin("r2", P_LONG, max_gen=2), run(64), pending(), close("r1"), drain(64)], model="tight",
   expect=has_flag(CAPACITY_BLOCKED, DEFERRED))
sc("close_blocked_request", [create("r1"), create("r2"), begin("r1", P12, max_gen=2), begin("r2", P12B, max_gen=2),
                             drain(64, limit=4), close("r2"), pending(), close("r1"), pending()], model="tight")
sc("chunked_prefill_capacity_1_three_requests",
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=2), begin("r2", P6, max_gen=2),
    begin("r3", [5], max_gen=2), drain(1)], model="chunk")
sc("chunked_continuation", [create("r1"), begin("r1", [5, 9], max_gen=2), drain(64), begin("r1", P6, max_gen=2),
                            run(64), cancel("r1", 2), drain(64)], model="chunk", expect=has_reason(CANCELLED_R))
sc("release_during_chunked_prefill",
   [create("r1"), create("r2"), begin("r1", P8, max_gen=2), begin("r2", [5], max_gen=3), run(64), release("r1"),
    drain(64)], model="chunk")
sc("release_with_pending_cancel_event",
   [create("r1"), create("r2"), begin("r1", P_LONG, max_gen=4), begin("r2", P_B, max_gen=2), cancel("r1", 1),
    release("r1"), drain(64)])
sc("off_thread_release_with_retained_events",
   THREE + [run(1), off_thread(release("r3")), pending(), drain(1)])
sc("eos_streams_interleaved_capacity_2",
   [create("r1"), create("r2"), create("r3"), begin("r1", P_EOS0, max_gen=4), begin("r2", P_EOS2, max_gen=4),
    begin("r3", P_EOS, max_gen=4), drain(2)], expect=has_reason(EOS_R))
sc("huge_event_buffer_capacity", [buffer("b", 2 ** 62, label="2**62"), buffer("c", 2 ** 50, label="2**50"),
                                  pending()],
   differences={k: Difference(HUGE_BUFFERS, "0.18 tries to allocate and reports 'cannot create std::vector larger "
                              "than max_size()' / 'std::bad_alloc'; oga refuses capacities over 2**24 events with "
                              "'Engine event capacity exceeds the supported size.'") for k in ("2**62", "2**50")})
sc("config_overlay_bad_engine_values",
   [model('{"engine": {"dynamic_batching": {"max_scheduled_tokens": 0}}}', name="m0", label="zero budget"),
    model('{"engine": {"dynamic_batching": {"foo": 1}}}', name="m1", label="unknown key")])

# ---------------------------------------------------------------------------------------------
# Model configuration rejections (reference C.2)
# ---------------------------------------------------------------------------------------------
sc("config_num_beams_rejected_at_create_request",
   [model('{"search": {"num_beams": 4}}'), engine_from("e4", "m"), create("r1", engine="e4")],
   expect=raises("search.num_beams = 4"))
sc("config_min_length_rejected_at_create_request",
   [model('{"search": {"min_length": 3}}'), engine_from("e4", "m"), create("r1", engine="e4")],
   expect=raises("nonzero search.min_length (3)"))
sc("config_overlay_engine_settings",
   [model('{"engine": {"dynamic_batching": {"max_batch_size": 3, "max_scheduled_tokens": 5}}}'),
    engine_from("e4", "m"), capabilities("e4"), create("r1", engine="e4"), begin("r1", P6, max_gen=2),
    drain(64, engine="e4")])

# ---------------------------------------------------------------------------------------------
# Python-only surface
# ---------------------------------------------------------------------------------------------
PY = ("python",)
sc("python_negative_integer_arguments",
   [create("r1"), py(ref("engine"), "create_event_buffer", -1, message=False, label="buffer(-1)"),
    py(ref("req", "r1"), "cancel_turn", -1, message=False, label="cancel(-1)"), py("module", "RequestOptions", store="ro"),
    py(ref("view", "ro"), "set_max_session_tokens", -1, message=False, label="session(-1)"),
    turn_options("o", "r1"), py(ref("opts", "o"), "set_max_generated_tokens", -1, message=False, label="max_gen(-1)"),
    py(ref("engine"), "create_event_buffer", 2 ** 64, message=False, label="buffer(2**64)"), pending()], backends=PY,
   differences={k: Difference(PY_ARGUMENT_ERRORS, "0.18 (pybind) raises TypeError for negative or >= 2**64 "
                              "integers; oga's conversion raises OverflowError", backends=PY)
                for k in ("buffer(-1)", "cancel(-1)", "session(-1)", "max_gen(-1)", "buffer(2**64)")})
sc("python_two_dimensional_tokens",
   [create("r1"), py(ref("req", "r1"), "begin_turn", [[5, 9], [13, 14]]), pending(),
    py(ref("req", "r1"), "begin_turn", [5, 9, 13]), drain(64)], backends=PY,
   expect=raises("tokens must be a one-dimensional array."))
sc("python_run_wrong_buffer_type",
   [py(ref("engine"), "run", 5, message=False, label="run(5)"), py(ref("engine"), "run", None, message=False)],
   backends=PY,
   differences={"run(5)": Difference(PY_ARGUMENT_ERRORS, "engine.run(5): 0.18 raises RuntimeError (pybind's "
                                     "'Unable to cast ...'); oga raises TypeError", backends=PY)})
sc("python_run_returns_same_buffer_and_indexes",
   THREE + [buffer("b", 4), py(ref("engine"), "run", ref("buf", "b")), py(ref("buf", "b"), "__len__"),
            py(ref("buf", "b"), "__getitem__", -1, store="last"), py(ref("view", "last"), ".turn_id"),
            py(ref("buf", "b"), "__getitem__", 3, message=False), drain(64)], backends=PY)
sc("python_event_request_identity",
   [create("r1"), begin("r1", P_LONG, max_gen=1), buffer("b", 4), run(buf="b"),
    py(ref("buf", "b"), "__getitem__", 0, store="ev"), py(ref("view", "ev"), ".request", label="request")],
   backends=PY, expect=lambda recs: dict(recs)["request"] == "$req:r1")
sc("python_stale_event_view",
   [create("r1"), begin("r1", P_LONG, max_gen=3), buffer("b", 4), run(buf="b"),
    py(ref("buf", "b"), "__getitem__", 0, store="ev"), py(ref("view", "ev"), ".token"), run(buf="b"),
    py(ref("view", "ev"), ".token", label="stale token"), py(ref("view", "ev"), ".turn_id", label="stale turn_id"),
    drain(64)], backends=PY,
   differences={"stale token": Difference(STALE_VIEWS, "oga raises RuntimeError on a view read after the next run; "
                                                      "0.18 shows the slot's new contents"),
                "stale turn_id": Difference(STALE_VIEWS, "same view, another property")})
sc("python_create_request_positional_params",
   [py("module", "GeneratorParams", ref("model", "$default"), store="params"),
    py(ref("engine"), "create_request", ref("view", "params"), label="positional params"),
    py(ref("engine"), "create_request", ref("view", "params"), None, label="params and options")], backends=PY,
   differences={k: Difference(SEED_ERA, "oga accepts create_request(params, options) with a positional "
                                        "GeneratorParams; 0.18 raises TypeError")
                for k in ("positional params", "params and options")})
sc("python_run_max_events_form",
   [create("r1"), begin("r1", P_LONG, max_gen=1), py(ref("engine"), "run", label="run(max_events=4)", max_events=4),
    pending(label="pending after")], backends=PY,
   differences={"run(max_events=4)": Difference(SEED_ERA, "oga runs an engine-cached buffer of capacity N and returns "
                                                          "a list; 0.18 raises TypeError"),
                "pending after": Difference(SEED_ERA, "the seed-era run delivered the turn's only event in oga")})
sc("python_token_ids_beyond_int32",
   [create("r1"), begin("r1", [2 ** 31], max_gen=1, label="2**31"), pending()], backends=PY,
   differences={"2**31": Difference(TOKEN_RANGE, "oga raises ValueError for values outside int32; 0.18 does "
                                                 "its own conversion")})

# ---------------------------------------------------------------------------------------------
# Deliberate differences on both surfaces
# ---------------------------------------------------------------------------------------------
sc("out_of_vocab_token",
   [create("r1"), create("r2"), begin("r2", P_B, max_gen=3), begin("r1", [5, 97, 6], max_gen=2, label="oov begin"),
    drain(64, label="drain after oov"), pending(label="pending after"), create("r3", label="create after"),
    close("r1"), close("r2")],
   differences={
       "oov begin": Difference(TOKEN_RANGE, "oga rejects token id 97 (vocab 97) at begin_turn; 0.18 accepts it"),
       "drain after oov": Difference(TOKEN_RANGE, "0.18 runs the bad id and poisons the engine; oga runs r2 alone"),
       "create after": Difference(TOKEN_RANGE, "0.18's engine is poisoned and rethrows the stored error"),
   })
sc("negative_token_id",
   [create("r1"), begin("r1", [5, -1], max_gen=2, label="negative begin"), drain(64, label="drain after")],
   differences={
       "negative begin": Difference(TOKEN_RANGE, "oga rejects a negative id at begin_turn; 0.18 accepts it"),
       "drain after": Difference(TOKEN_RANGE, "0.18 runs the bad id"),
   })
sc("greedy_top_k_one_is_accepted",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=2, top_k=1, label="top_k 1"),
    begin("r1", P_LONG, opts="o", label="greedy top_k=1 begin"), drain(64, label="drain")])
sc("contradicting_sampling_options",
   [create("r1"), turn_options("o", "r1", do_sample=False, top_k=40), begin("r1", P_LONG, opts="o", label="begin"),
    pending()], expect=raises("contradict it: top_k"))
sc("greedy_consistent_combinations_are_accepted",
   [create("r1"), turn_options("o1", "r1", max_generated_tokens=1, temperature=0.0), begin("r1", P_LONG, opts="o1"),
    drain(64), turn_options("o2", "r1", max_generated_tokens=1, do_sample=False, top_p=1.0, top_k=0),
    begin("r1", [5], opts="o2"), drain(64), turn_options("o3", "r1", max_generated_tokens=1, do_sample=False,
                                                          temperature=1.0),
    begin("r1", [6], opts="o3"), drain(64), turn_options("o4", "r1", max_generated_tokens=1, do_sample=True, top_k=1,
                                                         temperature=0.0),
    begin("r1", [7], opts="o4"), drain(64)])
sc("invalid_policy_values",
   [create("r1"), turn_options("t", "r1", temperature=-1.0), begin("r1", P_LONG, opts="t", label="temperature -1"),
    turn_options("p", "r1", top_p=1.5), begin("r1", P_LONG, opts="p", label="top_p 1.5"),
    turn_options("k", "r1", top_k=-1), begin("r1", P_LONG, opts="k", label="top_k -1"),
    turn_options("r", "r1", repetition_penalty=0.0), begin("r1", P_LONG, opts="r", label="penalty 0"),
    turn_options("n", "r1", no_repeat_ngram_size=-1), begin("r1", P_LONG, opts="n", label="ngram -1"),
    turn_options("z", "r1", do_sample=True, top_k=0, top_p=0.0), begin("r1", P_LONG, opts="z", label="k0 p0"),
    turn_options("v", "r1", do_sample=True, top_k=1000), begin("r1", P_LONG, opts="v", label="top_k > vocab"),
    begin("r1", P_LONG, max_gen=2, label="still turn 1"), drain(64)],
   expect=raises("must be finite and 0 or greater"))
sc("do_sample_under_model_greedy_default",
   [model('{"search": {"top_k": 1}}'), engine_from("e4", "m"), create("r1", engine="e4"),
    turn_options("o", "r1", do_sample=True), begin("r1", P_LONG, opts="o", label="do_sample"),
    turn_options("o2", "r1", do_sample=True, top_k=4, temperature=0.8, max_generated_tokens=1),
    begin("r1", P_LONG, opts="o2", label="sampling admitted"), pending(engine="e4")],
   expect=raises("do_sample=true"))
sc("rewind_not_supported_yet",
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r1", [5], max_gen=2), drain(64),
    py(ref("req", "r1"), "rewind_to_start_of_turn", 1, label="rewind"),
    begin("r1", P_EOS, max_gen=8, label="after rewind"), drain(64, label="drain after rewind")], backends=PY,
   differences={
       "rewind": Difference(NOT_YET, "rewind_to_start_of_turn is rejected until a later issue"),
       "drain after rewind": Difference(NOT_YET, "0.18 generates from the rewound (empty) sequence, oga from the "
                                                 "whole history"),
   })

# ---------------------------------------------------------------------------------------------
# C ABI only: NULL arguments, direct returns, zeroed outputs
# ---------------------------------------------------------------------------------------------
C = ("ctypes",)
E = ref("engine")
sc("c_null_engine_arguments",
   [capi("OgaCreateEngine", NULL, out("c_void_p")),
    capi("OgaEngineCreateRequest", NULL, NULL, out("c_void_p")),
    capi("OgaEngineCreateRequest", E, NULL, NULL),
    capi("OgaEngineHasPendingRequests", NULL, out("c_bool")),
    capi("OgaEngineHasPendingRequests", E, NULL),
    capi("OgaCreateEngineEventBuffer", NULL, 4, out("c_void_p")),
    capi("OgaCreateEngineEventBuffer", E, 4, NULL),
    buffer("b", 4),
    capi("OgaEngineRun", NULL, ref("buf", "b")),
    capi("OgaEngineRun", E, NULL),
    capi("OgaEngineGetCapabilities", NULL, out("c_void_p")),
    capi("OgaEngineGetCapabilities", E, NULL),
    capi("OgaCreateRequestOptions", NULL),
    capi("OgaRequestOptionsSetMaxSessionTokens", NULL, 5)], backends=C,
   expect=raises("engine must not be null."))
R1 = ref("req", "r1")
sc("c_null_request_arguments",
   [create("r1"),
    capi("OgaRequestBeginTurn", NULL, NULL, ids([5]), 1, out("c_uint64")),
    capi("OgaRequestBeginTurn", R1, NULL, ids([5]), 1, NULL),
    capi("OgaRequestBeginTurn", R1, NULL, NULL, 2, out("c_uint64"), outs=False),
    capi("OgaRequestBeginTurn", R1, NULL, NULL, 0, out("c_uint64"), outs=False),
    capi("OgaRequestCancelTurn", NULL, 1, out("c_bool")),
    capi("OgaRequestCancelTurn", R1, 1, NULL),
    capi("OgaRequestClose", NULL),
    capi("OgaRequestCreateTurnOptions", NULL, out("c_void_p"), outs=False),
    capi("OgaRequestCreateTurnOptions", R1, NULL),
    capi("OgaTurnOptionsSetMaxGeneratedTokens", NULL, 3),
    capi("OgaTurnOptionsSetMinGeneratedTokens", NULL, 3),
    capi("OgaTurnOptionsReset", NULL),
    capi("OgaRequestBeginTurn", R1, NULL, ids([5, 9, 13]), 3, out("c_uint64")),
    pending(), drain(64)], backends=C, expect=raises("request must not be null."))
sc("c_begin_turn_failure_output",
   [create("r1"), capi("OgaRequestBeginTurn", R1, NULL, NULL, 2, out("c_uint64")),
    capi("OgaRequestBeginTurn", R1, NULL, NULL, 0, out("c_uint64")),
    capi("OgaRequestBeginTurn", R1, NULL, ids([]), 0, out("c_uint64"))], backends=C)
sc("c_create_turn_options_null_request_output",
   [capi("OgaRequestCreateTurnOptions", NULL, out("c_void_p"))], backends=C)
sc("c_null_event_getters_zero_their_outputs",
   [capi("OgaEngineEventGetFlags", NULL, out("c_uint32")),
    capi("OgaEngineEventGetRequest", NULL, out("c_void_p")),
    capi("OgaEngineEventGetTurnId", NULL, out("c_uint64")),
    capi("OgaEngineEventGetToken", NULL, out("c_int32")),
    capi("OgaEngineEventGetFinishReason", NULL, out("c_uint32")),
    capi("OgaEngineEventGetMatchedStopStringIndex", NULL, out("c_int32")),
    capi("OgaEngineEventGetErrorCode", NULL, out("c_uint32")),
    capi("OgaEngineEventGetUsage", NULL, out("c_void_p")),
    capi("OgaTurnUsageGetPromptTokens", NULL, out("c_uint64")),
    capi("OgaTurnUsageGetGeneratedTokens", NULL, out("c_uint64")),
    capi("OgaTurnUsageGetCachedPromptTokens", NULL, out("c_uint64")),
    capi("OgaEngineEventBufferGetCount", NULL),
    capi("OgaEngineEventBufferGet", NULL, 0),
    capi("OgaEngineCapabilitiesGetConfiguredMaxBatchSize", NULL),
    capi("OgaEngineCapabilitiesGetMaxScheduledTokens", NULL),
    capi("OgaEngineCapabilitiesGetMaxRequestLength", NULL)], backends=C,
   expect=raises("event must not be null."))
sc("c_event_getters_with_null_out",
   [create("r1"), begin("r1", P_LONG, max_gen=1), buffer("b", 4), run(buf="b"),
    capi("OgaEngineEventGetFlags", ref("event", ("b", 0)), NULL),
    capi("OgaEngineEventGetToken", ref("event", ("b", 0)), NULL),
    capi("OgaEngineEventGetUsage", ref("event", ("b", 0)), NULL),
    capi("OgaTurnUsageGetPromptTokens", ref("usage", ("b", 0)), NULL),
    capi("OgaEngineEventBufferGetCount", ref("buf", "b")),
    capi("OgaEngineEventBufferGet", ref("buf", "b"), 1)], backends=C)
sc("c_failed_run_leaves_buffer_untouched",
   [engine("e2"), create("r1"), begin("r1", P_LONG, max_gen=2), buffer("b", 4), run(buf="b"),
    capi("OgaEngineRun", ref("engine", "e2"), ref("buf", "b")),
    capi("OgaEngineEventBufferGetCount", ref("buf", "b")),
    capi("OgaEngineEventGetToken", ref("event", ("b", 0)), out("c_int32")),
    off_thread(capi("OgaEngineRun", E, ref("buf", "b"))),
    capi("OgaEngineEventBufferGetCount", ref("buf", "b")), drain(64)], backends=C,
   expect=raises("buffer must be used with the Engine that created it."))
sc("c_null_safe_destroys",
   [capi("OgaDestroyEngineEventBuffer", NULL), capi("OgaDestroyTurnOptions", NULL),
    capi("OgaDestroyRequestOptions", NULL), capi("OgaDestroyEngineCapabilities", NULL),
    capi("OgaDestroyResult", NULL),
    only("oga", capi("OgaDestroyRequest", NULL, label="destroy request NULL"), "0.18 segfaults"),
    only("oga", capi("OgaDestroyEngine", NULL, label="destroy engine NULL"), "0.18 segfaults"),
    only("oga", capi("OgaDestroyModel", NULL, label="destroy model NULL"), "0.18 segfaults")], backends=C,
   differences={k: Difference(NULL_SAFE, "oga accepts NULL; 0.18 segfaults, so it is not called there",
                              backends=C)
                for k in ("destroy request NULL", "destroy engine NULL", "destroy model NULL")})
sc("c_buffer_readable_after_engine_destroyed",
   [create("r1"), begin("r1", P_LONG, max_gen=1), buffer("b", 4), run(buf="b"), destroy_engine(),
    capi("OgaEngineEventBufferGetCount", ref("buf", "b")),
    capi("OgaEngineEventGetTurnId", ref("event", ("b", 0)), out("c_uint64")), release_buffer("b")], backends=C)
sc("c_turn_options_on_destroyed_request",
   [create("r1"), turn_options("o", "r1"), release("r1"), pending(),
    capi("OgaTurnOptionsSetMaxGeneratedTokens", ref("opts", "o"), 3), release_options("o")], backends=C,
   expect=raises("Cannot use Turn options after their Request has been destroyed."))


def _evs(recs):
    from scenario import events_of

    return events_of(recs)




# ---------------------------------------------------------------------------------------------
# Static batching (OGA's CPU build: contiguous caches, attention_mask, waves of at most 4 rows)
# ---------------------------------------------------------------------------------------------
S_A = [504, 3575, 282, 4649, 314]
S_B = [2705, 28, 827, 28, 1296, 28, 1876, 28]
S_C = [42]
S_D = [10, 11, 12]
S_E = [7, 8, 9, 10, 11, 12, 13]
S_F = [300, 301]


def static(name, actions, **kw):
    sc(name, actions, model="static", **kw)


FOUR = [create("r1"), create("r2"), create("r3"), create("r4"), begin("r1", S_A, max_gen=6), begin("r2", S_B, max_gen=4),
        begin("r3", S_C, max_gen=5), begin("r4", S_D, max_gen=3)]
static("static_four_rows_right_padded", FOUR + [drain(64)])
static("static_capacity_one_drains_a_step", FOUR + [drain(1)])
static("static_capacity_two_retains_overflow", FOUR + [run(2), pending(), run(2), drain(3)])
static("static_six_requests_run_in_two_waves",
       FOUR + [create("r5"), create("r6"), begin("r5", S_E, max_gen=2), begin("r6", S_F, max_gen=3), drain(64)])
static("static_queued_requests_wait_for_the_wave",
       [create("r1"), begin("r1", S_A, max_gen=3), run(64), create("r2"), begin("r2", S_B, max_gen=2), run(64),
        pending(), drain(64)])
static("static_close_resident_row_mid_wave",
       [create("r1"), create("r2"), begin("r1", S_A, max_gen=5), begin("r2", S_B, max_gen=5), run(64), close("r1"),
        drain(64), begin("r2", [5, 6], max_gen=2, label="continuation with two resident rows"), pending()])
static("static_release_resident_row_mid_wave",
       [create("r1"), create("r2"), begin("r1", S_A, max_gen=5), begin("r2", S_B, max_gen=5), run(64), release("r1"),
        drain(64)])
static("static_single_row_continuation",
       [create("r1"), begin("r1", S_A, max_gen=4), drain(64), begin("r1", [5, 6, 7], max_gen=4), drain(64),
        begin("r1", [8], max_gen=2), drain(64)])
static("static_continuation_after_the_batch_was_recycled",
       [create("r1"), begin("r1", S_A, max_gen=2), drain(64), create("r2"), begin("r2", S_B, max_gen=2), drain(64),
        begin("r1", [5], max_gen=2), pending()])
static("static_cancel_queued_request",
       FOUR + [create("r5"), begin("r5", S_E, max_gen=2), cancel("r5", 1), drain(64), begin("r5", [5, 6], max_gen=2),
               drain(64)])
static("static_cancel_active_row",
       [create("r1"), create("r2"), begin("r1", S_A, max_gen=6), begin("r2", S_B, max_gen=6), run(64), run(64),
        cancel("r1", 1), cancel("r1", 1), drain(64)])
static("static_session_limit_ends_the_turn",
       [create("r1", max_session=9), begin("r1", S_A, max_gen=20), drain(64), pending()])
static("static_session_cap_above_max_length",
       [create("r1", max_session=65), pending()], expect=raises("model-configured search.max_length (64)"))
static("static_prompt_must_leave_room",
       [create("r1", max_session=5), begin("r1", S_A), pending()],
       expect=raises("must leave room for at least one generated token"))
static("static_capabilities", [capabilities(), pending()])
static("static_per_turn_seed_rejected",
       [create("r1"), turn_options("o", "r1", seed=5), begin("r1", S_A, opts="o"), pending()],
       expect=raises("A per-turn seed requires an Engine configured for dynamic batching."))
static("static_chunk_size_rejected_at_engine_creation",
       [model('{"search": {"chunk_size": 4}}'), engine_from("e4", "m")],
       expect=raises("search.chunk_size requires dynamic batching; the static batch scheduler cannot chunk a prefill."))
static("static_min_generated_tokens",
       [create("r1"), turn_options("o", "r1", min_generated_tokens=3, max_generated_tokens=4), begin("r1", S_C, opts="o"),
        drain(64)])
static("static_close_every_state",
       [create("r1"), close("r1"), create("r2"), begin("r2", S_A, max_gen=3), close("r2"), create("r3"),
        begin("r3", S_B, max_gen=3), run(64), close("r3"), close("r3"), pending(), drain(64)])
static("static_batch_size_overlay",
       [model('{"engine": {"static_batching": {"max_batch_size": 2}}}'), engine_from("e2", "m"),
        capabilities("e2"), create("r1", engine="e2"), create("r2", engine="e2"), create("r3", engine="e2"),
        begin("r1", S_A, max_gen=2), begin("r2", S_B, max_gen=2), begin("r3", S_C, max_gen=2),
        run(64, engine="e2", label="first run"), run(64, engine="e2", label="second run"),
        run(64, engine="e2", label="third run"), drain(64, engine="e2", label="rest")],
       differences={k: Difference(STATIC_BATCH_SIZE, "0.18 reports the configured size but always batches 4 rows; "
                                  "oga batches engine.static_batching.max_batch_size (2) rows, so the third request "
                                  "waits for the second wave") for k in ("first run", "second run", "third run", "rest")})


SCENARIOS = {s.name: s for s in S}
assert len(SCENARIOS) == len(S), "duplicate scenario names"
