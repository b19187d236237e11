"""The conformance scenarios (dynamic path). Each is data: see scenario.py for the actions."""

from __future__ import annotations

from scenario import (NULL, events_except, streams, Difference, Scenario, all_of, begin, buffer, cancel, capabilities, capi, close, create,
                      destroy_engine, drafts, drain, engine, engine_from, has_flag, has_reason, ids, max_drafts, model,
                      off_thread, only, out, pending, py, raises, ref, release, release_buffer, release_options,
                      rewind, run, set_option, spec_stats, turn_options)

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
# Model configuration rejections (request creation; seed "Request lifecycle")
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

# ---------------------------------------------------------------------------------------------
# Rewind (RewindToStartOfTurn)
# ---------------------------------------------------------------------------------------------
REWIND_STATE = "Request rewind is only valid after the current turn is complete."
REWIND_PENDING = ("Cannot rewind a request while an Engine event is pending; call Engine::Run() to drain the event "
                  "before rewinding.")
REWIND_CLOSED = "Cannot rewind a closed request."
THREE_TURNS = [create("r1"), begin("r1", P_LONG, max_gen=3, label="turn 1"), drain(64, label="turn 1 events"),
               begin("r1", [9, 10], max_gen=2, label="turn 2"), drain(64, label="turn 2 events"),
               begin("r1", [12], max_gen=3, label="turn 3"), drain(64, label="turn 3 events")]
sc("rewind_to_the_first_turn",
   # rewinding turn 1 empties the sequence: the next turn generates as a fresh request would
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r1", [5], max_gen=2), drain(64),
    rewind("r1", 1, label="rewind"), pending(label="pending after rewind"),
    begin("r1", P_EOS, max_gen=8, label="after rewind"), drain(64, label="drain after rewind"),
    create("fresh"), begin("fresh", P_EOS, max_gen=8, label="fresh request"), drain(64, label="fresh events")],
   expect=has_reason(EOS_R))
sc("rewind_to_a_middle_turn",
   # turns 1, 2, 3 -> rewind 2: turn 3 is gone, turn 2's input again generates turn 2's tokens with id 4
   THREE_TURNS + [rewind("r1", 2, label="rewind 2"), rewind("r1", 3, label="discarded 3"),
                  rewind("r1", 2, label="discarded 2"), begin("r1", [9, 10], max_gen=2, label="turn 4"),
                  drain(64, label="turn 4 events"), rewind("r1", 3, label="still unknown 3"),
                  begin("r1", [12], max_gen=3, label="turn 5"), drain(64, label="turn 5 events"),
                  rewind("r1", 5, label="rewind the current turn"), begin("r1", [12], max_gen=3, label="turn 6"),
                  drain(64, label="turn 6 events")],
   expect=raises("Cannot rewind to unknown Turn ID 3."))
sc("rewind_then_rewind_further",
   THREE_TURNS + [rewind("r1", 3, label="rewind 3"), rewind("r1", 2, label="rewind 2"), rewind("r1", 1, label="rewind 1"),
                  rewind("r1", 1, label="rewind 1 again"), begin("r1", P_LONG, max_gen=3, label="turn 4"),
                  drain(64, label="turn 4 events")])
sc("rewind_unknown_turn_ids",
   THREE_TURNS + [rewind("r1", 0, label="id 0"), rewind("r1", 4, label="future id 4"),
                  rewind("r1", 2 ** 64 - 1, label="id max"), begin("r1", [5], max_gen=1, label="turn 4 unaffected"),
                  drain(64)],
   expect=raises("Cannot rewind to unknown Turn ID 0."))
sc("rewind_by_request_state",
   [create("r1"), rewind("r1", 0, label="unassigned id 0"), rewind("r1", 1, label="unassigned id 1"),
    begin("r1", P_LONG, max_gen=4, label="turn 1"), rewind("r1", 1, label="assigned"), rewind("r1", 2, label="assigned id 2"),
    run(64, label="first step"), rewind("r1", 1, label="active"), drain(64), rewind("r1", 1, label="complete"),
    begin("r1", [5], max_gen=2, label="turn 2"), rewind("r1", 1, label="continuation queued"), run(64),
    rewind("r1", 2, label="continuation active"), drain(64), pending(),
    off_thread(rewind("r1", 1), label="off the owner thread"), begin("r1", [6], max_gen=1, label="turn 3 after it"),
    drain(64)],
   expect=all_of(raises(REWIND_STATE), raises(OWNER)))
sc("rewind_while_event_pending",
   # a small buffer keeps r2's and r3's events retained: their (complete) turns cannot be rewound yet
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=1),
    begin("r3", P_C, max_gen=1), run(1, label="one event delivered"), rewind("r1", 1, label="r1 delivered"),
    rewind("r3", 1, label="r3 retained"), rewind("r3", 7, label="r3 retained, unknown id"), run(1),
    rewind("r3", 1, label="r3 still retained"), run(1), rewind("r3", 1, label="r3 drained"), pending(),
    begin("r3", P_C, max_gen=2), drain(64)],
   expect=raises(REWIND_PENDING))
sc("rewind_while_cancel_event_pending",
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r1", [5], max_gen=4), run(64), cancel("r1", 2),
    rewind("r1", 2, label="cancel event retained"), rewind("r1", 1, label="earlier turn, event retained"),
    pending(), run(64), rewind("r1", 2, label="after the cancel event"), pending(label="pending after rewind"),
    begin("r1", [5], max_gen=4, label="turn 3"), drain(64)],
   expect=raises(REWIND_PENDING))
sc("rewind_closed_request",
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), close("r1"), rewind("r1", 1, label="closed"),
    rewind("r1", 0, label="closed id 0"), create("r2"), close("r2"), rewind("r2", 1, label="closed unassigned"),
    create("r3"), begin("r3", P_LONG, max_gen=4), run(64), close("r3"), rewind("r3", 1, label="closed mid-turn"),
    pending()],
   expect=raises(REWIND_CLOSED))
sc("rewind_after_engine_destroyed",
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), create("r2"), begin("r2", P_B, max_gen=4), run(64),
    create("r3"), destroy_engine(), rewind("r1", 1, label="complete"), rewind("r1", 5, label="unknown id"),
    rewind("r2", 1, label="was active"), rewind("r3", 1, label="was unassigned")],
   expect=raises(REWIND_CLOSED))
sc("rewind_after_cancel_before_admission",
   # a first turn cancelled while queued has no KV: rewinding it leaves an empty request
   [create("r1"), begin("r1", P_LONG, max_gen=3), cancel("r1", 1), pending(), run(64, label="cancel event"),
    pending(label="pending before rewind"), rewind("r1", 1, label="rewind 1"), pending(label="pending after rewind"),
    run(64, label="rewind created no event"), begin("r1", P_EOS, max_gen=8, label="turn 2"), drain(64)],
   expect=has_reason(CANCELLED_R))
sc("rewind_continuation_cancelled_before_admission",
   [create("r1"), begin("r1", P_LONG, max_gen=3), drain(64), begin("r1", [9, 10], max_gen=3), cancel("r1", 2),
    run(64), rewind("r1", 2, label="rewind 2"), pending(), begin("r1", [9, 10], max_gen=3, label="turn 3"), drain(64),
    begin("r1", [11], max_gen=2, label="turn 4"), cancel("r1", 4), run(64), rewind("r1", 1, label="rewind 1"),
    begin("r1", P_LONG, max_gen=3, label="turn 5"), drain(64)],
   expect=has_reason(CANCELLED_R))
sc("rewind_after_cancel_mid_generation",
   [create("r1"), begin("r1", P_LONG, max_gen=10), run(64, times=3), cancel("r1", 1), run(64),
    rewind("r1", 1, label="rewind 1"), pending(), begin("r1", P_B, max_gen=4, label="turn 2"), drain(64),
    begin("r1", [7, 8], max_gen=10, label="turn 3"), run(64, times=2), cancel("r1", 3), run(64),
    rewind("r1", 3, label="rewind 3"), begin("r1", [8, 7], max_gen=4, label="turn 4"), drain(64)],
   expect=has_reason(CANCELLED_R))
sc("rewind_creates_no_event_and_keeps_peers_pending",
   [create("r1"), create("r2"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r2", P_B, max_gen=3),
    pending(label="peer queued"), rewind("r1", 1, label="rewind with a queued peer"), pending(label="still pending"),
    run(64, label="only the peer"), rewind("r1", 1, label="rewound turn is unknown"), drain(64), pending(),
    rewind("r2", 1), pending(label="nothing pending"), run(64, label="no event"), run(1, label="no event capacity 1")])
sc("rewind_to_a_boundary_inside_a_kv_block",
   # block_size 4: turn 2 starts at 5 tokens (3 prompt + 2 generated), inside the second block; the rewound
   # slots 5.. are rewritten by the next turn, whose tokens must be 0.18's
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r1", [9, 10, 11], max_gen=6, label="turn 2"),
    drain(64, label="turn 2 events"), rewind("r1", 2), begin("r1", [20, 21], max_gen=6, label="turn 3"),
    drain(64, label="turn 3 events"), create("ref"), begin("ref", P_LONG, max_gen=2), drain(64),
    begin("ref", [20, 21], max_gen=6, label="reference continuation"), drain(64, label="reference events")])
sc("rewind_to_a_block_edge",
   # turn 2 starts at 4 tokens (3 prompt + 1 generated): exactly one full block stays
   [create("r1"), begin("r1", P_LONG, max_gen=1), drain(64), begin("r1", P8, max_gen=5), drain(64),
    begin("r1", [5], max_gen=3), drain(64), rewind("r1", 2), begin("r1", [40, 41, 42], max_gen=6, label="turn 4"),
    drain(64, label="turn 4 events"), create("ref"), begin("ref", P_LONG, max_gen=1), drain(64),
    begin("ref", [40, 41, 42], max_gen=6), drain(64, label="reference events")])
sc("rewind_inside_a_block_after_eos",
   # P_EOS ends with EOS after 3 tokens (EOS never enters the sequence): turn 2 starts at 6 tokens
   # (turn 4 differs from turn 2 at its first token: see rewind_then_the_same_input_* for a repeat)
   [create("r1"), begin("r1", P_EOS, max_gen=8), drain(64), begin("r1", [13, 14, 15, 16, 17], max_gen=5), drain(64),
    rewind("r1", 2), begin("r1", [4], max_gen=6, label="turn 3"), drain(64, label="turn 3 events"),
    rewind("r1", 3), begin("r1", [14, 13, 15, 16, 17], max_gen=5, label="turn 4"),
    drain(64, label="turn 4 events")], expect=has_reason(EOS_R))
sc("rewind_frees_blocks_for_a_peer",
   # tight pool (5 blocks of 4): r1 holds 4 blocks; after rewinding to turn 2 (5 tokens, 2 blocks) r2's
   # 12-token prompt (3 blocks) fits
   [create("r1"), begin("r1", P_LONG, max_gen=2), drain(64), begin("r1", P8, max_gen=4), drain(64), create("r2"),
    begin("r2", P12B, max_gen=2), run(64, label="r2 blocked"), rewind("r1", 2, label="rewind r1"),
    drain(64, label="r2 after rewind"), begin("r1", [5], max_gen=2, label="r1 turn 3"),
    run(64, times=2, label="r1 blocked by r2's blocks"), close("r2"), drain(64, label="r1 events")],
   model="tight", expect=has_flag(CAPACITY_BLOCKED, DEFERRED))
sc("rewind_releases_residency",
   # batch2: r1 and r2 resident, r3 deferred; a rewind gives r1's residency back (0.18 re-prefills a
   # rewound request's history: its next turn is admitted like a first turn, here after r3)
   [create("r1"), create("r2"), create("r3"), begin("r1", P_LONG, max_gen=1), begin("r2", P_B, max_gen=1), drain(64),
    begin("r1", [9, 10], max_gen=2), drain(64), begin("r3", P_C, max_gen=2), run(64, times=2, label="r3 deferred"),
    rewind("r1", 2, label="rewind r1"), pending(label="r3 still pending"), drain(64, label="r3 admitted"),
    begin("r1", [5], max_gen=2, label="r1 turn 3"), run(64, times=2, label="r1 deferred"), close("r3"),
    drain(64, label="r1 events"), rewind("r2", 1, label="rewind r2 to its start"),
    begin("r1", [6], max_gen=1, label="r1 turn 4"), drain(64)],
   model="batch2", expect=has_flag(CAPACITY_BLOCKED, DEFERRED))

# 0.18 enables prefix caching unless engine.dynamic_batching.prefix_caching is false (0.18's own
# documentation says the default is false); oga has no prefix cache. A rewound request prefills its
# retained history again, and with the prefix cache 0.18 adopts the full blocks whose tokens are
# unchanged (reported in cached_prompt_tokens when they hold this turn's prompt tokens, always
# leaving at least one token to compute). The *_prefix_caching_off twins run the same actions with
# prefix_caching false, where 0.18 and oga agree.
SAME_INPUT = [create("r1"), begin("r1", P_LONG, max_gen=1), drain(64), begin("r1", P8, max_gen=2, label="turn 2"),
              drain(64, label="turn 2 events"), rewind("r1", 2), begin("r1", P8, max_gen=2, label="turn 3"),
              drain(64, label="turn 3 events"), rewind("r1", 3), begin("r1", P8 + [40], max_gen=2, label="turn 4"),
              drain(64, label="turn 4 events"), rewind("r1", 4), begin("r1", P8[:4] + [50, 51, 52], max_gen=2,
                                                                    label="turn 5"),
              drain(64, label="turn 5 events")]
CHUNKED_REPREFILL = [create("r1"), begin("r1", [5, 9, 13], max_gen=2), drain(64), begin("r1", P6, max_gen=2),
                     drain(64), rewind("r1", 2), begin("r1", P8, max_gen=3, label="turn 3"),
                     drain(64, label="turn 3 events"), rewind("r1", 1), begin("r1", P6, max_gen=2, label="turn 4"),
                     drain(64, label="turn 4 events")]
sc("rewind_then_the_same_input_prefix_caching_default", SAME_INPUT, model="chunk",
   expect=lambda recs: any(e[7][2] > 0 for e in _evs(recs)))
sc("rewind_then_the_same_input_prefix_caching_off", SAME_INPUT, model="chunk_noprefix")
sc("rewind_chunked_reprefill_prefix_caching_default", CHUNKED_REPREFILL, model="chunk")
sc("rewind_chunked_reprefill_prefix_caching_off", CHUNKED_REPREFILL, model="chunk_noprefix")
sc("prefix_caching_default_across_requests",
   # not a rewind: a second request with the first one's 9-token prompt (two full blocks)
   [create("r1"), begin("r1", P8 + [40], max_gen=2), drain(64, label="first"), create("r2"),
    begin("r2", P8 + [40], max_gen=2), drain(64, label="second")], model="chunk",
   expect=lambda recs: any(e[7][2] == 8 for e in _evs(recs)))
PREFIX_WAIT = "Prefix caching waits for a prefix being computed"


def cached_at_finish(record):
    """{request: cached_prompt_tokens of its TURN_FINISHED event} in a run / drain record."""
    return {e[1]: e[7][2] for e in _evs([("", record)]) if e[0] & TURN_FINISHED}
sc("prefix_caching_concurrent_shared_prefix",
   # two prompts sharing two full blocks (P8), begun together: 0.18 computes the shared blocks for
   # both; oga admits r2 once r1 has indexed them and adopts them (r2's cached_prompt_tokens 8).
   # The tokens are the same either way.
   [create("r1"), create("r2"), begin("r1", P8 + [40], max_gen=3), begin("r2", P8 + [41], max_gen=3),
    drain(64, label="drain"), create("r3"), begin("r3", P8 + [42], max_gen=2), drain(64, label="later")],
   model="chunk",
   differences={"drain": Difference(PREFIX_WAIT, "oga starts r2 after r1's shared blocks are indexed and adopts "
                                    "them; 0.18 prefills both at once", same=streams,
                                    oga={"r1": 0, "r2": 8}, oga_part=cached_at_finish)},
   expect=lambda recs: cached_at_finish(dict(recs)["drain"]) == {"r1": 0, "r2": 0})
sc("prefix_caching_off_across_requests",
   [create("r1"), begin("r1", P8 + [40], max_gen=2), drain(64, label="first"), create("r2"),
    begin("r2", P8 + [40], max_gen=2), drain(64, label="second")], model="chunk_noprefix")

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
sc("c_rewind_null_request",
   [create("r1"), capi("OgaRequestRewindToStartOfTurn", NULL, 1), capi("OgaRequestRewindToStartOfTurn", NULL, 0),
    capi("OgaRequestRewindToStartOfTurn", R1, 1)], backends=C, expect=raises("request must not be null."))
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
# Stop strings and guidance (docs/onnxruntime-genai-0.18-dynamic-engine.md) on the "tok" model: "base" with a tokenizer
# ---------------------------------------------------------------------------------------------
# The tokenizer (tokenizer_fixture.py) gives the model's greedy tokens known texts:
#   P_LONG -> "Hello" " wor" "ld" " ab" "c" " ab" "c" "!" " ab" "c" "!" " x" "yz" "." " (" ...
#   P_B    -> "The" " cat" "c" b"\xc3" b"\xa9t" " sat" " on" " a" " no" " mat" "," "." b"\xe2" b"\x82"
#             b"\xac" "5" "0" " then" ...   ("\u00e9" over two tokens, "\u20ac" over three)
#   P_EOS  -> "The" " cat" " too" EOS
# Every stop string below was chosen from those texts (decoded with the tokenizer after running
# 0.18 greedily); the comment next to it says where it should (or must not) match.
STOP_R = 2
TOK = "tok"
STOP_SPLIT = "Stop strings and guidance read the model's tokenizer through oga"
TOKENIZER = "Tokenizer"


def stop_turn(req, tokens, stops, max_gen=12, opts=None, label=None, **setters):
    """TurnOptions with max_generated_tokens and stop strings, then begin_turn."""
    opts = opts or "o_" + req
    return [turn_options(opts, req, max_generated_tokens=max_gen, stop_strings=stops, **setters),
            begin(req, tokens, opts=opts, label=label)]


def stopped_at(req_label, generated, index):
    """0.18's stream ends req's turn with StopString after `generated` tokens, stop index `index`."""
    def pred(recs):
        return any(e[1] == req_label and e[4] == STOP_R and e[7][1] == generated and e[5] in (index,)
                   for e in _evs(recs))
    return pred


sc("stop_string_inside_one_token",
   # "wo" lies inside " wor", the second token
   [create("r1"), *stop_turn("r1", P_LONG, ["wo"]), drain(64)], model=TOK, expect=stopped_at("r1", 2, 0))
sc("stop_string_spanning_two_tokens",
   # "world" = " wor" + "ld" (tokens 2 and 3)
   [create("r1"), *stop_turn("r1", P_LONG, ["world"]), drain(64)], model=TOK, expect=stopped_at("r1", 3, 0))
sc("stop_string_spanning_three_tokens",
   # "rld ab" = end of " wor" + "ld" + " ab" (tokens 2 to 4)
   [create("r1"), *stop_turn("r1", P_LONG, ["rld ab"]), drain(64)], model=TOK, expect=stopped_at("r1", 4, 0))
sc("stop_string_tie_breaks",
   [create("r1"), create("r2"), create("r3"), create("r4"),
    # earliest end wins over a lower index: "d a" ends on the " a" of " ab" (token 4), "ab" one byte later
    *stop_turn("r1", P_LONG, ["ab", "d a"]),
    # same end: the longest wins ("world" over "ld" and "rld", all ending with token 3)
    *stop_turn("r2", P_LONG, ["ld", "rld", "world"]),
    # same end and length (duplicates): the lowest index
    *stop_turn("r3", P_LONG, ["zz", "o world", "o world"]),
    # the match completed by the earliest token wins whatever its index ("Hello w" on token 2; the
    # other two only on token 4)
    *stop_turn("r4", P_LONG, ["Hello world a", "ld a", "Hello w"]),
    drain(64)], model=TOK,
   expect=all_of(stopped_at("r1", 4, 1), stopped_at("r2", 3, 2), stopped_at("r3", 3, 1), stopped_at("r4", 2, 2)))
sc("stop_string_inside_split_utf8_characters",
   [create("r1"), create("r2"), create("r3"), create("r4"),
    # "\u00e9" = b"\xc3" + b"\xa9t" (tokens 4 and 5); "\u00c3" shares the first byte and never matches
    *stop_turn("r1", P_B, ["\u00c3", "\u00e9"]),
    # "\u20ac" = b"\xe2" + b"\x82" + b"\xac" (tokens 13 to 15)
    *stop_turn("r2", P_B, ["\u20ac"], max_gen=20),
    # "c\u00e9t" = "c" + b"\xc3" + b"\xa9t" (tokens 3 to 5)
    *stop_turn("r3", P_B, ["c\u00e9t s", "c\u00e9t"]),
    # ".\u20ac5" = "." + the three "\u20ac" tokens + "5" (tokens 12 to 16)
    *stop_turn("r4", P_B, [".\u20ac5"], max_gen=20),
    drain(64)], model=TOK,
   expect=all_of(stopped_at("r1", 5, 1), stopped_at("r2", 15, 0), stopped_at("r3", 5, 1),
                 stopped_at("r4", 16, 0)))
sc("stop_strings_over_invalid_utf8",
   # model "tok_invalid_utf8": P_LONG reads "Hello" " wor" "ld" b"\x80" b"\xf0\x9f" b"\x80" b"\xf0\x9f" "!"
   # b"\x80" b"\xf0\x9f" "!" " x" "yz" ...
   [create("r1"), create("r2"), create("r3"), create("r4"),
    # oga: the lone continuation byte (token 4) reads as U+FFFD
    *stop_turn("r1", P_LONG, ["d\ufffd"], max_gen=14),
    # 0.18: the bytes of tokens 4 to 7 vanish, so "world!" ends on token 8
    *stop_turn("r2", P_LONG, ["world!"], max_gen=14),
    # 0.18: b"\xf0\x9f" (token 10) takes "!" (token 11) and the space of " x" (token 12) as its last
    # two bytes and the four vanish, so "!x" ends on token 12
    *stop_turn("r3", P_LONG, ["!x"], max_gen=14),
    # oga: " x" ends on token 12; no one reads a U+1F400 out of the bytes
    *stop_turn("r4", P_LONG, ["\U0001f400", " x"], max_gen=14),
    drain(64, label="drain")], model="tok_invalid_utf8",
   differences={"drain": Difference(
       STOP_SPLIT, "bytes that never form a character: 0.18's stream decoder drops them, and a lead byte takes "
       "the bytes after it (ASCII included) as its continuation, so 0.18 reads 'Hello world!xyz' (r2 stops on "
       "token 8, r3 on token 12, r1 and r4 run to max_generated_tokens); oga reads one U+FFFD per maximal "
       "invalid subpart, 'Hello world\ufffd\ufffd\ufffd!\ufffd\ufffd! xyz' (r1 stops on token 4, r4 on token "
       "12, r2 and r3 run to max_generated_tokens)")})
sc("stop_string_before_held_bytes_in_one_token",
   # model "tok_invalid_utf8": P_C reads "The" " cat" " said" " wor" b" o\xc3" b"\xa9k": " o" is text on
   # token 5 although the token ends with a held byte; "\u00e9" completes on token 6
   [create("r1"), create("r2"), create("r3"), *stop_turn("r1", P_C, [" o"]), *stop_turn("r2", P_C, ["wor o"]),
    *stop_turn("r3", P_C, ["\u00e9k"]), drain(64)], model="tok_invalid_utf8",
   expect=all_of(stopped_at("r1", 5, 0), stopped_at("r2", 5, 0), stopped_at("r3", 6, 0)))
sc("stop_string_leading_space_at_turn_start",
   # P_LONG + "Hello" generates " wor" "ld" ...: on the byte-level tokenizer the turn's text starts
   # with the space
   [create("r1"), create("r2"), *stop_turn("r1", P_LONG + [16], [" wor"]),
    *stop_turn("r2", P_LONG + [16], ["world"]), drain(64)], model=TOK,
   expect=all_of(stopped_at("r1", 1, 0), stopped_at("r2", 2, 0)))
sc("stop_string_leading_space_at_turn_start_spm",
   # the same turns with the Llama 2 style tokenizer, whose decoder (Strip) drops a text's first space
   [create("r1"), create("r2"), *stop_turn("r1", P_LONG + [16], [" wor"]),
    *stop_turn("r2", P_LONG + [16], ["world"]), drain(64)], model="tok_spm",
   expect=all_of(stopped_at("r1", 1, 0), stopped_at("r2", 2, 0)))
sc("stop_strings_skip_special_tokens",
   # turn 3 generates " wor" "ld" <unk> ")" (the history comes from turns 1 and 2, as in
   # guidance_is_turn_scoped): "ld)" spans the special token, "<unk>" is its content
   [create("r1"), turn_options("o", "r1", max_generated_tokens=4, guidance=("regex", "[a-z ]+")),
    begin("r1", P_LONG, opts="o"), drain(64), begin("r1", [16], max_gen=4), drain(64),
    *stop_turn("r1", [16], ["<unk>", "ld)"], max_gen=4), drain(64)], model=TOK)
sc("stop_string_and_limits_on_the_same_token",
   [create("r1"), create("r2", max_session=6), create("r3"),
    # "world" completes on token 3, the last one max_generated_tokens allows: StopString wins
    *stop_turn("r1", P_LONG, ["world"], max_gen=3),
    # and the last one max_session_tokens (6 = 3 prompt + 3) allows
    *stop_turn("r2", P_LONG, ["world"], max_gen=0),
    # min_generated_tokens only masks EOS: the stop string still ends the turn on token 3
    *stop_turn("r3", P_LONG, ["world"], max_gen=8, min_generated_tokens=6),
    drain(64)], model=TOK,
   expect=all_of(stopped_at("r1", 3, 0), stopped_at("r2", 3, 0), stopped_at("r3", 3, 0)))
sc("stop_string_never_matches",
   [create("r1"), create("r2"), create("r3"),
    # none of these is in "Hello world abc abc!"
    *stop_turn("r1", P_LONG, ["zzz", "Hello!", "abc abc abc"], max_gen=5),
    # EOS ends the turn; its text "</s>" never reaches the matcher
    *stop_turn("r2", P_EOS, ["dog", "</s>"], max_gen=8),
    # "The cat too" then EOS: "too" matches before EOS would
    *stop_turn("r3", P_EOS, ["</s>", "too"], max_gen=8),
    drain(64)], model=TOK,
   expect=all_of(has_reason(MAXGEN_R), has_reason(EOS_R), stopped_at("r3", 3, 1)))
sc("stop_strings_match_only_this_turns_text",
   [create("r1"), create("r2"),
    # turn 1: "Hello world"
    begin("r1", P_LONG, max_gen=3), drain(64),
    # turn 2's prompt [16, 63] reads "Hello wor"; it generates "ld" " ab" "c" " ab" "c" " ab" "c" "!":
    # "Hello" (turn 1 and the prompt), "world" and "rld" (prompt + generated) never match; "c!" ends
    # the turn on its 8th token
    *stop_turn("r1", [16, 63], ["world", "Hello", "rld", "c!"]), drain(64),
    # turn 3 without stop strings runs to its limit
    begin("r1", [9], max_gen=2), drain(64),
    # r2: turn 2's prompt [24, 90] reads "ld ab" and it generates "c" " ab" "c": "abc" matches only on
    # the third token, not on the first (which would complete "ab" + "c" across the prompt)
    begin("r2", P_LONG, max_gen=3), drain(64), *stop_turn("r2", [24, 90], ["abc"]), drain(64)], model=TOK,
   expect=all_of(stopped_at("r1", 8, 3), stopped_at("r2", 3, 0)))
sc("stop_strings_with_continuation_options_reused",
   # the same TurnOptions for two turns: each turn's matcher starts afresh (turn 1 ends with "ld",
   # turn 2, after the prompt [24, 90], starts with "c": "ldc" would span the two turns)
   [create("r1"), turn_options("o", "r1", max_generated_tokens=3, stop_strings=["ldc", "zz"]),
    begin("r1", P_LONG, opts="o"), drain(64), begin("r1", [24, 90], opts="o"), drain(64)], model=TOK)
sc("cancel_stop_string_turn",
   [create("r1"), create("r2"),
    *stop_turn("r1", P_LONG, ["zzz"], max_gen=10), *stop_turn("r2", P_B, ["zzz"], max_gen=10),
    cancel("r2", 1), run(64, times=3), cancel("r1", 1), drain(64),
    # the next turn (no stop strings) runs normally
    begin("r1", [9], max_gen=2), drain(64)], model=TOK, expect=has_reason(CANCELLED_R))
sc("stop_strings_validation",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=12, stop_strings=["world"]),
    set_option("o", "stop_strings", ["s%d" % i for i in range(17)], label="17 strings"),
    set_option("o", "stop_strings", ["a", ""], label="empty entry"),
    set_option("o", "stop_strings", ["x" * 16385], label="16385 bytes"),
    set_option("o", "stop_strings", ["x" * 8192, "y" * 8193], label="two strings, 16385 bytes"),
    # the failures kept ["world"]
    begin("r1", P_LONG, opts="o"), drain(64),
    set_option("o", "stop_strings", ["s%d" % i for i in range(15)] + ["y" * 16000], label="16 strings"),
    # "c" would end the next two turns on their first token: an empty list and reset clear it
    set_option("o", "stop_strings", ["c"]), set_option("o", "stop_strings", [], label="clear"),
    begin("r1", [24, 90], opts="o"), drain(64),
    set_option("o", "stop_strings", ["c"]), set_option("o", "reset"), set_option("o", "max_generated_tokens", 2),
    begin("r1", [24, 90], opts="o"), drain(64)], model=TOK,
   expect=all_of(raises("Too many stop strings: 17, the maximum is 16."), raises("is empty"),
                 stopped_at("r1", 3, 0)))
sc("python_stop_string_with_nul",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=3, stop_strings=["world"]),
    py(ref("opts", "o"), "set_stop_strings", ["a\x00b"], label="NUL"),
    py(ref("opts", "o"), "set_stop_strings", "world", message=False, label="a str"),
    begin("r1", P_LONG, opts="o"), drain(64)], model=TOK, backends=PY,
   expect=raises("Stop strings must not contain an embedded NUL byte."))
sc("c_stop_strings_and_guidance_null_arguments",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=3),
    capi("OgaTurnOptionsSetStopStrings", NULL, NULL),
    capi("OgaTurnOptionsSetStopStrings", ref("opts", "o"), NULL),
    capi("OgaTurnOptionsSetGuidance", NULL, b"regex", b"x"),
    capi("OgaTurnOptionsSetGuidance", ref("opts", "o"), NULL, b"x"),
    capi("OgaTurnOptionsSetGuidance", ref("opts", "o"), b"regex", NULL),
    capi("OgaTurnOptionsSetGuidance", ref("opts", "o"), b"regex", b""),
    begin("r1", P_LONG, opts="o"), drain(64)], model=TOK, backends=C,
   expect=raises("stop_strings must not be null."))
sc("stop_strings_without_tokenizer_files",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=3, stop_strings=["world"]),
    begin("r1", P_LONG, opts="o", label="begin"), pending(), begin("r1", P_LONG, max_gen=2), drain(64)],
   expect=raises("Failed to open a json file"),
   differences={"begin": Difference(STOP_SPLIT, "0.18 names the missing tokenizer_config.json; oga names the "
                                    "missing tokenizer.json")})
sc("stop_strings_without_tokenizer_config",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=3, stop_strings=["world"]),
    begin("r1", P_LONG, opts="o", label="begin"), pending(label="pending"), drain(64, label="drain")],
   model="tok_json_only", expect=raises("tokenizer_config.json"),
   differences={k: Difference(STOP_SPLIT, "0.18 refuses the turn at begin_turn ('Failed to open a json file: "
                              "<dir>/tokenizer_config.json'); oga needs only tokenizer.json and runs it (stops on "
                              "'world')") for k in ("begin", "pending", "drain")})

# Guidance: 0.18's wheel is built with llguidance, and guided turns run on this fixture.
REGEX_LOWER = r"[a-z ]+"
LARK_HELLO = 'start: "Hello" " " WORD "!"\nWORD: /[a-z]+/'
JSON_A = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def guided_turn(req, tokens, kind, data, max_gen=12, label=None, **setters):
    opts = "g_" + req
    return [turn_options(opts, req, max_generated_tokens=max_gen, guidance=(kind, data), **setters),
            begin(req, tokens, opts=opts, label=label)]


sc("guidance_regex",
   # unguided P_LONG starts "Hello" (upper case): the mask turns it into "ld" " ab" "c" ...
   [create("r1"), *guided_turn("r1", P_LONG, "regex", REGEX_LOWER), drain(64)], model=TOK,
   expect=lambda recs: _evs(recs)[0][3] == 24)
sc("guidance_lark_grammar",
   # 0.18: "Hello" " wor" "ld" "t" "c" "!" then EOS (the grammar is complete and only allows EOS)
   [create("r1"), *guided_turn("r1", P_LONG, "lark_grammar", LARK_HELLO), drain(64, label="drain")], model=TOK,
   expect=has_reason(EOS_R),
   differences={"drain": Difference(TOKENIZER, "the grammar forces 'Hello ': 0.18's tokenizer keeps the word "
                                    "'Hello' whole, the tokenizers package splits a BPE word without merges into "
                                    "characters, so llguidance allows different first tokens")})
sc("guidance_json_schema",
   [create("r1"), *guided_turn("r1", P_LONG, "json_schema", JSON_A), drain(64)], model=TOK,
   expect=lambda recs: _evs(recs)[0][3] == 7)  # "{"
sc("guidance_concurrent_with_unguided_peers",
   [create("r1"), create("r2"), create("r3"), *guided_turn("r1", P_B, "regex", "[0-9]+"),
    begin("r2", P_B, max_gen=12), *guided_turn("r3", P_C, "lark_grammar", LARK_HELLO), drain(64, label="drain")],
   model=TOK,
   differences={"drain": Difference(TOKENIZER, "r3's grammar forces 'Hello ' (see guidance_lark_grammar); r1 and "
                                    "r2 are identical", same=events_except("r3"))})
sc("guidance_with_stop_strings",
   # the regex turn's text is "ld abc..." (guidance_regex): "abc" completes on its third token
   [create("r1"), *guided_turn("r1", P_LONG, "regex", REGEX_LOWER, stop_strings=["abc"]), drain(64)], model=TOK,
   expect=stopped_at("r1", 3, 0))
sc("guidance_is_turn_scoped",
   # turn 2 (no options) and turn 3 (options whose guidance was cleared) are unguided
   [create("r1"), turn_options("o", "r1", max_generated_tokens=4, guidance=("regex", REGEX_LOWER)),
    begin("r1", P_LONG, opts="o"), drain(64), begin("r1", [16], max_gen=4), drain(64),
    set_option("o", "clear_guidance"), begin("r1", [16], opts="o"), drain(64),
    set_option("o", "guidance", ("regex", "[0-9]+")), set_option("o", "reset"),
    set_option("o", "max_generated_tokens", 2), begin("r1", [16], opts="o"), drain(64)], model=TOK)
sc("guidance_set_time_validation",
   [create("r1"), turn_options("o", "r1", max_generated_tokens=3),
    set_option("o", "guidance", ("bogus", "x"), label="bad type"),
    set_option("o", "guidance", ("regex", ""), label="empty data"),
    set_option("o", "guidance", ("", "x"), label="empty type"),
    begin("r1", P_LONG, opts="o"), drain(64)], model=TOK,
   expect=raises("Unsupported guidance type: bogus (only json_schema, regex, and lark_grammar are supported)."))
sc("guidance_invalid_grammar",
   [create("r1"), *guided_turn("r1", P_LONG, "regex", "(", label="bad regex"),
    *guided_turn("r1", P_LONG, "lark_grammar", "start: (", label="bad lark"),
    pending(), begin("r1", P_LONG, max_gen=2), drain(64)], model=TOK,
   expect=raises("invalid regex"),
   differences={k: Difference(STOP_SPLIT, "both refuse the grammar at begin_turn; 0.18's text is 'Error creating "
                              "grammar: ' and llguidance's whole multi-line report, oga's 'Invalid <type> guidance: ' "
                              "and its first line") for k in ("bad regex", "bad lark")})
sc("guidance_grammar_no_token_can_start",
   # no token of the vocabulary starts with "~": both refuse the turn at begin_turn, where the first
   # mask is computed
   [create("r1"), create("r2"), begin("r2", P_B, max_gen=3),
    *guided_turn("r1", P_LONG, "regex", "~", label="begin"), drain(64, label="drain"),
    pending(label="pending after")], model=TOK,
   expect=raises("panic"),
   differences={"begin": Difference(STOP_SPLIT, "0.18's llguidance panics computing the first mask ('Error "
                                    "computing mask: panic: index out of bounds ...'); oga's says 'Invalid regex "
                                    "guidance: no token of the model's vocabulary can start it.'")})
sc("guidance_forced_bytes_tokenization",
   # where the grammar forces bytes (after "x": "yz!"; after "Hello": " world"), llguidance allows
   # only the first token of their canonical tokenization, which it gets from the tokenizer it was
   # given. 0.18 gives it the model's tokenizer (onnxruntime-extensions: a pre-tokenized word that is
   # in the vocabulary is one token, else BPE merges, of which this fixture has none: "xyz!" ->
   # "x" "y" "z" "!", "Hello world" -> "Hello" " " "w" "o" "r" "l" "d"); oga gives it the tokenizers
   # package's tokenization, which splits a word without merges into characters: "xyz!" the same
   # (r1 equal), "Hello world" -> "H" "e" "l" "l" "o" " " "w" ... (r2 starts 92 35 46 46 58)
   [create("r1"), create("r2"),
    *guided_turn("r1", P_LONG, "regex", "(abc|xyz)!"),
    *guided_turn("r2", P_LONG, "lark_grammar", 'start: "Hello" " wor" "ld"'), drain(64, label="drain")], model=TOK,
   differences={"drain": Difference(TOKENIZER, "0.18: r1 'x' 'y' 'z' '!' EOS (71 73 75 96), r2 'Hello' ' ' 'w' 'o' "
                                    "'r' 'l' 'd' EOS (16 30 70 58 61 46 34); oga tokenizes the forced text with the "
                                    "tokenizers package, which splits a BPE word without merges into characters: r1 "
                                    "alike, r2 'H' 'e' 'l' 'l' 'o' ' ' 'w' ...", same=events_except("r2"))})

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
                                  "waits for the second wave", same=events_except("r3"))
                    for k in ("first run", "second run", "third run", "rest")})

static("static_stop_strings_rejected",
       # the static model has the SmolLM2 tokenizer, so only the batching mode refuses the turn
       [create("r1"), turn_options("o", "r1", max_generated_tokens=3, stop_strings=["a"]),
        begin("r1", S_A, opts="o", label="begin"), pending(), set_option("o", "stop_strings", []),
        begin("r1", S_A, opts="o"), drain(64)],
       expect=raises("Stop strings require an Engine configured for dynamic batching."))
static("static_whole_turn_guidance",
       # whole-turn guidance runs on the static path in both ("0" "5" "4" "6")
       [create("r1"), turn_options("o", "r1", max_generated_tokens=4, guidance=("regex", "[0-9]+")),
        begin("r1", S_A, opts="o"), drain(64)])

static("static_single_row_rewind",
       [create("r1"), begin("r1", S_A, max_gen=4), drain(64), begin("r1", [5, 6, 7], max_gen=4), drain(64),
        rewind("r1", 2, label="rewind 2"), rewind("r1", 2, label="discarded 2"),
        begin("r1", [5, 6, 7], max_gen=4, label="turn 3 repeats turn 2"), drain(64, label="turn 3 events"),
        rewind("r1", 1, label="rewind 1"), begin("r1", S_D, max_gen=3, label="turn 4"), drain(64, label="turn 4 events"),
        create("ref"), begin("ref", S_D, max_gen=3), drain(64, label="reference events")])
static("static_rewind_needs_one_resident_row",
       [create("r1"), create("r2"), begin("r1", S_A, max_gen=3), begin("r2", S_B, max_gen=2),
        rewind("r1", 1, label="assigned"), run(64), rewind("r1", 1, label="active"), drain(64),
        rewind("r1", 1, label="two resident rows"), rewind("r1", 9, label="two rows, unknown id"),
        close("r2"), rewind("r1", 1, label="after closing the peer"), pending()],
       expect=raises("Static Engine Request rewind requires exactly one resident Request"))
static("static_rewind_errors",
       [create("r1"), rewind("r1", 1, label="unassigned"), begin("r1", S_A, max_gen=3), drain(64),
        rewind("r1", 0, label="id 0"), rewind("r1", 2, label="future id"), begin("r1", [5], max_gen=4), run(64),
        cancel("r1", 2), rewind("r1", 2, label="cancel event pending"), run(64), rewind("r1", 2, label="after cancel"),
        pending(), begin("r1", [5], max_gen=2, label="turn 3"), drain(64), close("r1"), rewind("r1", 1, label="closed")])

static("static_rewind_after_the_batch_was_recycled",
       # r2's wave recycled the batch: r1's model state is gone
       [create("r1"), begin("r1", S_A, max_gen=2), drain(64), create("r2"), begin("r2", S_B, max_gen=2), drain(64),
        rewind("r1", 1, label="rewind 1"), rewind("r1", 0, label="id 0"), rewind("r1", 2, label="unknown id"),
        begin("r1", [5], max_gen=2, label="continuation"), rewind("r2", 1, label="r2 is the resident row"),
        begin("r2", S_C, max_gen=2), drain(64)])
static("static_rewind_check_order",
       # two resident rows: the one-resident-row rule is checked after the state and pending-event rules
       [create("r1"), create("r2"), begin("r1", S_A, max_gen=1), begin("r2", S_B, max_gen=1),
        run(1, label="one event delivered"), rewind("r2", 1, label="r2 event retained"),
        rewind("r2", 0, label="r2 event retained, id 0"), rewind("r1", 0, label="r1 id 0"), drain(64),
        rewind("r2", 5, label="r2 unknown id"), begin("r1", [5], max_gen=2, label="continuation with two rows")])

# ---------------------------------------------------------------------------------------------
# Caller-supplied speculative drafts (seed section of that name) on the "drafts" model: "base" whose decoder
# returns one logits row per packed token, so both libraries verify drafts
# (max_draft_tokens_per_proposal() == 7).
# ---------------------------------------------------------------------------------------------
# Plain greedy stream of P_LONG on the "drafts" model (recorded from 0.18 with max_generated_tokens
# 24, no drafts; the weights are "base"'s, so it is also base's stream):
G_LONG = [16, 63, 24, 90, 49, 90, 49, 96, 90, 49, 96, 88, 41, 39, 22, 90, 49, 96, 88, 55, 33, 10, 96, 88]
# P_EOS on the same model: [4, 81, 64] then EOS

# Speculative statistics: the counts both libraries fill alike ...
SPEC_SAME = ("rounds", "draft_tokens_proposed", "draft_tokens_accepted", "full_accept_rounds", "partial_accept_rounds",
             "zero_accept_rounds")
# ... and those they count differently (README "Speculative statistics"): 0.18 leaves correction_tokens,
# bonus_tokens, tokens_emitted and target_verify_forward_passes at 0 for caller-supplied drafts, counts
# every model run (prefill and plain decodes too) in target_forward_passes, and counts a round's drafts
# only up to the first rejected one in draft_tokens_evaluated; oga counts verification runs and every
# draft it verified.
SPEC_OGA = ("draft_tokens_evaluated", "correction_tokens", "bonus_tokens", "tokens_emitted", "target_forward_passes",
            "target_verify_forward_passes")
SPEC_STATS = "Speculative statistics"


def stats_records(label="counts", same=SPEC_SAME):
    """Two records: the counts that must match, and oga's own counts (declared with stats_difference)."""
    return [spec_stats(keys=same, label=label), spec_stats(keys=SPEC_OGA, label=label + " (oga-filled)")]


NO_PROPOSED = tuple(k for k in SPEC_SAME if k != "draft_tokens_proposed")
# 0.18 counts draft_tokens_proposed when a proposal is verified; oga when set_draft_tokens accepts it
# (so a proposal cleared, replaced or discarded by a cancel before any model run counts in oga only)
def proposed_difference(count):
    return Difference(SPEC_STATS, "0.18 counts proposed drafts at verification, oga at set_draft_tokens",
                      oga={"draft_tokens_proposed": count})


def stats_difference(pinned):
    """{label: oga's counts}: the "(oga-filled)" records of stats_records(label), oga's values pinned."""
    return {label + " (oga-filled)": Difference(SPEC_STATS, "0.18 does not count corrections, bonus tokens, "
                                                "emitted tokens or verification runs of caller-supplied drafts",
                                                oga=counts)
            for label, counts in pinned.items()}


def oga_counts(evaluated, corrections, bonus, emitted, verify_runs):
    """oga's SPEC_OGA counts: drafts verified, correction tokens, bonus tokens, tokens emitted by
    verification rounds, and model runs that verified drafts (target_forward_passes counts the same)."""
    return {"draft_tokens_evaluated": evaluated, "correction_tokens": corrections, "bonus_tokens": bonus,
            "tokens_emitted": emitted, "target_forward_passes": verify_runs, "target_verify_forward_passes": verify_runs}


NO_ROUNDS = oga_counts(0, 0, 0, 0, 0)


def dsc(name, actions, **kw):
    kw.setdefault("model", "drafts")
    sc(name, actions, **kw)


dsc("draft_max_tokens_per_proposal", [max_drafts(label="max")], expect=lambda recs: recs[0][1] == 7)
sc("draft_unsupported_engine",
   # the "base" decoder returns only the last row's logits: no draft verification
   [max_drafts(label="max"), create("r1"), begin("r1", P_LONG, max_gen=4), run(64, label="prefill"),
    drafts("r1", G_LONG[1:3], label="drafts"), drain(64)],
   expect=raises("does not support speculative draft verification"))
dsc("draft_correct_proposals",
    # drafts taken from G_LONG: every draft is accepted, then the bonus token
    [create("r1"), begin("r1", P_LONG, max_gen=16), run(64, label="prefill"),
     drafts("r1", G_LONG[1:5], label="4 drafts"), run(64, label="5 tokens"),
     drafts("r1", G_LONG[6:9], label="3 drafts"), run(64, label="4 tokens"),
     drain(64, label="rest")] + stats_records(),
    # 4 + 3 drafts, all accepted, each round ending with its bonus token: 5 + 4 tokens
    differences=stats_difference({"counts": oga_counts(7, 0, 2, 9, 2)}),
    expect=lambda recs: [e[3] for e in _evs(recs) if e[0] & TOKEN] == G_LONG[:16])
dsc("draft_partly_wrong_proposals",
    [create("r1"), begin("r1", P_LONG, max_gen=12), run(64, label="prefill"),
     drafts("r1", G_LONG[1:3] + [5, 5], label="2 right, 2 wrong"), run(64, label="2 accepted + correction"),
     drafts("r1", [1, 1], label="all wrong"), run(64, label="correction only"),
     drafts("r1", G_LONG[5:7] + [7], label="2 right, 1 wrong"), run(64, label="2 accepted + correction 2"),
     drain(64, label="rest")] + stats_records(),
    # rounds of 4, 2 and 3 drafts: 2 accepted + correction, correction, 2 accepted + correction
    differences=stats_difference({"counts": oga_counts(9, 3, 0, 7, 3)}),
    expect=lambda recs: [e[3] for e in _evs(recs) if e[0] & TOKEN] == G_LONG[:12])
dsc("draft_tokens_overflow_a_small_buffer",
    # 6 token events from one model run into a buffer of 2: the rest is retained and delivered by the
    # next runs before any model run; a proposal set meanwhile waits for the next model run
    [create("r1"), begin("r1", P_LONG, max_gen=16), buffer("b", 2), run(buf="b", label="prefill"),
     drafts("r1", G_LONG[1:6], label="5 drafts"), run(buf="b", label="2 of 6"),
     spec_stats(keys=("rounds",), label="rounds after 1"),
     drafts("r1", G_LONG[7:9], label="drafts while retained"), run(buf="b", label="2 more retained"),
     run(buf="b", label="last 2 retained"), spec_stats(keys=("rounds",), label="rounds still 1"),
     run(buf="b", label="next model run"), drain(buf="b", label="rest")] + stats_records(),
    differences=stats_difference({"counts": oga_counts(7, 0, 2, 9, 2)}),
    expect=lambda recs: [e[3] for e in _evs(recs) if e[0] & TOKEN] == G_LONG[:16])
dsc("draft_proposal_crosses_max_generated",
    # max_generated_tokens 6: after the first token 5 remain, the proposal has 7 correct drafts
    [create("r1"), begin("r1", P_LONG, max_gen=6), run(64, label="prefill"),
     drafts("r1", G_LONG[1:8], label="7 drafts"), run(64, label="turn ends inside the proposal"), pending()]
    + stats_records(same=("rounds", "draft_tokens_proposed", "zero_accept_rounds"))
    + [spec_stats(keys=("draft_tokens_accepted", "full_accept_rounds", "partial_accept_rounds"), label="accepted")],
    # with 5 tokens left, 0.18 verifies 5 of the 7 drafts and emits them as 5 accepted drafts (a
    # partial-accept round); oga verifies 4 and emits the 5th token as the bonus (a full-accept round);
    # the tokens are the same
    differences=dict(stats_difference({"counts": oga_counts(4, 0, 1, 5, 1)}), accepted=Difference(
        SPEC_STATS, "0.18 verifies as many drafts as tokens remain; oga one fewer, the last token is the bonus",
        oga={"draft_tokens_accepted": 4, "full_accept_rounds": 1, "partial_accept_rounds": 0})),
    expect=has_reason(MAXGEN_R))
dsc("draft_proposal_crosses_eos",
    # P_EOS greedy: 4, 81, 64, EOS; drafts past the EOS
    [create("r1"), begin("r1", P_EOS, max_gen=10), run(64, label="prefill"),
     drafts("r1", [81, 64, 2, 5, 6], label="drafts through EOS"), run(64, label="ends at EOS"), pending()],
    expect=has_reason(EOS_R))
dsc("draft_not_decode_ready",
    [create("r1"), drafts("r1", [5], label="no turn"), begin("r1", P_LONG, max_gen=4),
     drafts("r1", [5], label="queued"), drafts("r1", [], label="empty while queued"), run(64, label="prefill"),
     drafts("r1", [], label="empty clears"), drain(64), drafts("r1", [5], label="turn finished"),
     close("r1"), drafts("r1", [5], label="closed")],
    expect=raises("ready to decode"))
dsc("draft_too_many_keeps_previous",
    # an invalid replacement keeps the previous proposal
    [create("r1"), begin("r1", P_LONG, max_gen=8), run(64, label="prefill"),
     drafts("r1", G_LONG[1:4], label="3 drafts"), drafts("r1", G_LONG[1:9], label="8 drafts"),
     run(64, label="previous proposal verified"), drafts("r1", [5, 5], label="2 wrong"),
     drafts("r1", [], label="cleared"), run(64, label="one token"), drain(64)]
    + stats_records(same=NO_PROPOSED) + [spec_stats(keys=("draft_tokens_proposed",), label="proposed")],
    # 3 drafts verified, all right, then the bonus; proposed: the 3, and the 2 wrong ones cleared unverified
    differences=dict(stats_difference({"counts": oga_counts(3, 0, 1, 4, 1)}), proposed=proposed_difference(5)),
    expect=raises("at most 7 draft tokens"))
dsc("draft_rejected_turn_policies",
    [create("r1"), create("r2"), create("r3"),
     turn_options("o1", "r1", max_generated_tokens=4, repetition_penalty=1.1),
     turn_options("o2", "r2", max_generated_tokens=4, no_repeat_ngram_size=2),
     begin("r1", P_LONG, opts="o1"), begin("r2", P_B, opts="o2"), begin("r3", P_C, max_gen=8, min_gen=3),
     run(64, label="prefill"), drafts("r1", [5], label="repetition penalty"),
     drafts("r2", [5], label="no-repeat n-gram"), drafts("r3", [5], label="below the min floor"),
     run(64, label="1 more"), drafts("r3", [5], label="still below"), run(64, label="2 more"),
     drafts("r3", [63], label="at the floor"), drain(64)],
    expect=raises("repetition_penalty 1"))
dsc("draft_sampled_turns",
    # (top_p 0.01 keeps one candidate: the sampled prefill tokens are the greedy ones)
    # a sampled turn with top_k 0 is refused by both; with a positive top_k 0.18 verifies the
    # drafts by rejection sampling and oga refuses ("Not supported yet")
    [create("r1"), create("r2"),
     turn_options("o1", "r1", max_generated_tokens=4, do_sample=True, top_k=0, top_p=0.01, seed=1),
     turn_options("o2", "r2", max_generated_tokens=4, do_sample=True, top_k=5, top_p=0.01, seed=1),
     begin("r1", P_LONG, opts="o1"), begin("r2", P_B, opts="o2"), run(64, label="prefill"),
     drafts("r1", [5], label="no top_k"), drafts("r2", [5], label="top_k 5"),
     cancel("r1", 1, label="cancel r1"), cancel("r2", 1, label="cancel r2"), run(64, label="cancelled")],
    differences={"top_k 5": Difference(NOT_YET, "oga verifies drafts on greedy turns only")},
    expect=raises("positive top_k"))
dsc("draft_guided_turn",
    [create("r1"), turn_options("o", "r1", max_generated_tokens=4, guidance=("regex", "[a-z ]+")),
     begin("r1", [5], opts="o"), run(64, label="prefill"), drafts("r1", [5], label="guided"),
     cancel("r1", 1), run(64, label="cancelled")])
dsc("draft_cancel_with_pending_proposal",
    # cancel discards the pending proposal; the next turn starts without it
    [create("r1"), begin("r1", P_LONG, max_gen=8), run(64, label="prefill"),
     drafts("r1", G_LONG[1:5], label="4 drafts"), cancel("r1", 1, label="cancel"), run(64, label="cancelled"),
     pending(), drafts("r1", [5], label="after cancel"), begin("r1", [5], max_gen=3, label="next turn"),
     drain(64, label="next turn runs")]
    + stats_records(same=NO_PROPOSED) + [spec_stats(keys=("draft_tokens_proposed",), label="proposed")],
    # the 4 drafts are cancelled before any model run: proposed, never verified
    differences=dict(stats_difference({"counts": NO_ROUNDS}), proposed=proposed_difference(4)),
    expect=has_reason(CANCELLED_R))
dsc("draft_speculative_stats",
    # the counts oga fills, after a few rounds (one all-right, one partly wrong, one all-wrong)
    [create("r1"), begin("r1", P_LONG, max_gen=20), run(64, label="prefill"),
     *stats_records("before drafts"),
     drafts("r1", G_LONG[1:4], label="3 right"), run(64, label="round 1"),
     drafts("r1", G_LONG[5:7] + [1, 1], label="2 right 2 wrong"), run(64, label="round 2"),
     drafts("r1", [1], label="1 wrong"), run(64, label="round 3"),
     *stats_records("after 3 rounds"), drain(64), *stats_records("after drain")],
    # round 1: 3 accepted + bonus; round 2: 2 accepted + correction; round 3: correction
    differences=stats_difference({"before drafts": NO_ROUNDS, "after 3 rounds": oga_counts(8, 2, 1, 8, 3),
                                  "after drain": oga_counts(8, 2, 1, 8, 3)}),
    expect=lambda recs: [e[3] for e in _evs(recs) if e[0] & TOKEN] == G_LONG[:20])

# ---------------------------------------------------------------------------------------------
# Sliding-window ring models (seed "Sliding-window paged layers"; scenario.RING_MODEL_CONFIGS)
# ---------------------------------------------------------------------------------------------
# ring4: layers 0 and 2 windowed (W 10) in a ring of 4 blocks of 4 (16 slots), C 4; ring6: W 9, C 6.
# A 30-token prompt prefills in ceil(30 / C) steps and, with 30 generated tokens, laps the ring
# almost four times.
RING_P30 = list(range(3, 33))
RING_P30B = [(7 * i + 5) % 90 + 3 for i in range(30)]
RING_P21 = list(range(60, 81))
RING_P13 = [(11 * i + 4) % 90 + 3 for i in range(13)]
RING_NEEDS_CHUNK = ("This model holds its sliding-window layers in a ring of blocks, which only works if the prefill "
                    "is chunked. Set search.chunk_size in genai_config.json.")
RING_OUT_OF_RANGE = "Sliding-window layer index is outside the decoder layer range."

# Differences the scenarios below show, declared under README "Sliding-window settings are checked when
# the model loads"
RING_XFAIL_RANGE = (
    '0.18 creates the Model and refuses at Engine creation; oga refuses at Model creation (og.Model / '
    'OgaCreateModelFromConfig, src/capi/c_api_model.cpp) with the same text')
RING_XFAIL_ALL_WINDOWED = (
    "0.18: og.Model succeeds, the Engine raises 'A paged model needs at least one layer that keeps the "
    "whole sequence.'; oga: og.Model raises '<dir>/model.onnx: every paged layer is a sliding-window ring"
    " layer; a paged model needs at least one layer that keeps the whole sequence.' (oga/executors.py"
    ' _validate_window)')
RING_XFAIL_WINDOW_ZERO = (
    "0.18: og.Model succeeds, the Engine raises 'Sliding-window size must be greater than zero.'; oga: "
    "the config raises 'JSON Error: window_size must be > 0 at line 1 index 58'")
RING_XFAIL_OVERLAY = (
    '0.18 replaces model.decoder.sliding_window when an overlay names it (missing fields reset: layers '
    "only -> Engine 'Sliding-window size must be greater than zero.'; window only / layers [] -> no ring "
    'layers, every turn ends FAILED with ENGINE_EXECUTION_FAILURE, missing input block_table_windowed); '
    'oga merges the overlay into the object (layers only and window only run the ring) and refuses layers'
    " [] at og.Model ('<dir>/model.onnx: the graph takes 'block_table_windowed' ..., but "
    "model.decoder.sliding_window names no layers to keep in the ring.')")


RING_LOAD = "Sliding-window settings are checked when the model loads"


def _ring_load_difference(why, *labels):
    """Every record of `labels` (model and engine creation) may differ, for the reason `why`."""
    return {f"{label}: {step}": Difference(RING_LOAD, why) for label in labels for step in ("model", "engine")}


def ring(name, actions, model="ring4", **kw):
    sc(name, actions, model=model, **kw)


def ring_overlay(label, overlay, name):
    """model(overlay) then an engine from it, then one short turn on that engine (if it exists)."""
    return [model(overlay, name=name, label=f"{label}: model"), engine_from(f"e_{name}", name, label=f"{label}: engine")]


ring("ring_long_prompt_long_generation",
     [capabilities(), create("r1"), begin("r1", RING_P30, max_gen=30), pending(), drain(64)],
     expect=has_reason(MAXGEN_R))
ring("ring_long_prompt_long_generation_c6",
     [capabilities(), create("r1"), begin("r1", RING_P30, max_gen=30), drain(64), create("r2"),
      begin("r2", RING_P30B, max_gen=30), drain(64)], model="ring6", expect=has_reason(MAXGEN_R))
ring("ring_prefill_step_by_step",
     # C 4: the 30-token prompt takes 8 steps, the first token comes with the last prefill step
     [create("r1"), begin("r1", RING_P30, max_gen=4), run(64, times=9, label="nine runs"), drain(64)])
ring("ring_concurrent_admissions_and_departures",
     [create("r1"), create("r2"), create("r3"), begin("r1", RING_P30, max_gen=6), begin("r2", RING_P21, max_gen=20),
      begin("r3", RING_P13, max_gen=12), run(64, times=4, label="mixed prefill"), create("r4"),
      begin("r4", RING_P30B, max_gen=25), drain(64, label="r1 departs, r4 admitted"), create("r5"),
      begin("r5", RING_P30, max_gen=6, label="r5 repeats r1 on a reused ring"), drain(64)],
     expect=has_reason(MAXGEN_R))
ring("ring_concurrent_admissions_and_departures_c6",
     [create("r1"), create("r2"), create("r3"), begin("r1", RING_P30, max_gen=6), begin("r2", RING_P21, max_gen=20),
      begin("r3", RING_P13, max_gen=12), run(64, times=3), create("r4"), begin("r4", RING_P30B, max_gen=25),
      drain(64)], model="ring6", expect=has_reason(MAXGEN_R))
ring("ring_waits_for_a_free_ring",
     # two residents at most: a third request waits (r1's completed turn keeps its ring) until r1 is closed
     [create("r1"), create("r2"), create("r3"), begin("r1", RING_P30, max_gen=3), begin("r2", RING_P21, max_gen=10),
      drain(64), begin("r3", RING_P30B, max_gen=8), run(64, times=2, label="r3 blocked"),
      begin("r2", RING_P13, max_gen=12, label="r2 turn 2"), run(64, times=3), close("r1", label="r1 departs"),
      drain(64, label="r3 takes r1's ring"), close("r2"), create("r4"), begin("r4", RING_P13, max_gen=20), drain(64)],
     model="ring4_batch2", expect=all_of(has_flag(CAPACITY_BLOCKED, DEFERRED), has_reason(MAXGEN_R)))
ring("ring_continuation_turns",
     [create("r1"), begin("r1", RING_P21, max_gen=10), drain(64), begin("r1", RING_P13, max_gen=10), drain(64),
      begin("r1", [5, 6, 7], max_gen=8), drain(64)], expect=has_reason(MAXGEN_R))
ring("ring_continuation_turns_c6",
     [create("r1"), begin("r1", RING_P21, max_gen=10), drain(64), begin("r1", RING_P13, max_gen=10), drain(64),
      begin("r1", [5, 6, 7], max_gen=8), drain(64)], model="ring6")
ring("ring_cancel_during_prefill_and_decode",
     [create("r1"), create("r2"), begin("r1", RING_P30, max_gen=10), begin("r2", RING_P21, max_gen=12),
      run(64, times=3, label="prefill steps"), cancel("r1", 1, label="cancel r1 mid-prefill"), run(64, times=5),
      cancel("r2", 1, label="cancel r2 mid-decode"), drain(64), begin("r1", RING_P13, max_gen=6, label="r1 turn 2"),
      begin("r2", [9, 10], max_gen=6, label="r2 turn 2"), drain(64)], expect=has_reason(CANCELLED_R))
ring("ring_rewind_then_continue",
     [create("r1"), begin("r1", RING_P21, max_gen=6), drain(64), begin("r1", RING_P13, max_gen=6), drain(64),
      begin("r1", [40, 41, 42], max_gen=6), drain(64), rewind("r1", 2, label="rewind 2"),
      begin("r1", RING_P13, max_gen=6, label="turn 4 repeats turn 2"), drain(64, label="turn 4 events"),
      rewind("r1", 1, label="rewind 1"), begin("r1", RING_P30B, max_gen=20, label="turn 5"),
      drain(64, label="turn 5 events"), create("ref"), begin("ref", RING_P21, max_gen=6), drain(64),
      begin("ref", RING_P30B, max_gen=20), drain(64, label="reference events")])
ring("ring_rewind_inside_the_window",
     # a rewind by fewer than W positions: the ring still holds positions the new turn's queries read
     [create("r1"), begin("r1", RING_P30, max_gen=5), drain(64), begin("r1", [9, 10], max_gen=3), drain(64),
      rewind("r1", 2, label="rewind 2"), begin("r1", [11, 12, 13], max_gen=12, label="turn 3"),
      drain(64, label="turn 3 events")])
ring("ring_global_budget_below_chunk_size",
     # engine.dynamic_batching.max_scheduled_tokens 3 < C 4: the global budget chunks the prefills
     [capabilities(), create("r1"), create("r2"), begin("r1", RING_P30, max_gen=12), begin("r2", RING_P21, max_gen=8),
      run(64, times=6, label="budget-bound steps"), drain(64)], model="ring4_budget3", expect=has_reason(MAXGEN_R))
ring("ring_chunk_size_overlays",
     # search.chunk_size 2 (smaller ring) and 12 (larger steps, larger ring) on the same graph
     ring_overlay("chunk 2", '{"search": {"chunk_size": 2}}', "c2")
     + [create("a", engine="e_c2"), begin("a", RING_P30, max_gen=20), drain(64, engine="e_c2", label="chunk 2 events")]
     + ring_overlay("chunk 12", '{"search": {"chunk_size": 12}}', "c12")
     + [create("b", engine="e_c12"), begin("b", RING_P30, max_gen=20),
        drain(64, engine="e_c12", label="chunk 12 events")], expect=has_reason(MAXGEN_R))
ring("ring_chunk_size_zero",
     ring_overlay("chunk 0", '{"search": {"chunk_size": 0}}', "c0"), expect=raises(RING_NEEDS_CHUNK))
ring("ring_chunk_size_absent", [capabilities()], model="ring4_nochunk", expect=raises(RING_NEEDS_CHUNK))
ring("ring_window_layer_out_of_range",
     ring_overlay("layer 3", '{"model": {"decoder": {"sliding_window": {"window_size": 10, "layers": [0, 3]}}}}', "l3")
     + ring_overlay("layer -1", '{"model": {"decoder": {"sliding_window": {"window_size": 10, "layers": [0, -1]}}}}',
                    "lm1"), expect=raises(RING_OUT_OF_RANGE),
     differences=_ring_load_difference(RING_XFAIL_RANGE, "layer 3", "layer -1"))
ring("ring_every_layer_windowed",
     ring_overlay("all layers",
                  '{"model": {"decoder": {"sliding_window": {"window_size": 10, "layers": [0, 1, 2]}}}}', "all"),
     expect=raises("A paged model needs at least one layer that keeps the whole sequence."),
     differences=_ring_load_difference(RING_XFAIL_ALL_WINDOWED, "all layers"))
ring("ring_window_size_zero",
     ring_overlay("window 0", '{"model": {"decoder": {"sliding_window": {"window_size": 0, "layers": [0, 2]}}}}', "w0"),
     expect=raises("Sliding-window size must be greater than zero."),
     differences=_ring_load_difference(RING_XFAIL_WINDOW_ZERO, "window 0"))
ring("ring_sliding_window_overlay_replaces_the_object",
     # 0.18 parses an overlaid model.decoder.sliding_window as a whole new object: the fields it leaves out reset
     ring_overlay("layers only", '{"model": {"decoder": {"sliding_window": {"layers": [0, 2]}}}}', "lo")
     + ring_overlay("window only", '{"model": {"decoder": {"sliding_window": {"window_size": 10}}}}', "wo")
     + [create("a", engine="e_wo"), begin("a", RING_P21, max_gen=4), drain(64, engine="e_wo", label="window only events")]
     + ring_overlay("no layers", '{"model": {"decoder": {"sliding_window": {"window_size": 10, "layers": []}}}}', "nl")
     + [create("b", engine="e_nl", label="no layers create"), begin("b", RING_P21, max_gen=4, label="no layers begin"),
        drain(64, engine="e_nl", label="no layers events")],
     differences={"layers only: engine": Difference(RING_LOAD, RING_XFAIL_OVERLAY),
                  **_ring_load_difference(RING_XFAIL_OVERLAY, "no layers"),
                  "window only events": Difference(RING_LOAD, RING_XFAIL_OVERLAY),
                  **{label: Difference(RING_LOAD, RING_XFAIL_OVERLAY)
                     for label in ("no layers create", "no layers begin", "no layers events")}})
ring("ring_prefix_caching",
     # absent: both run without caching (cached_prompt_tokens 0 for a repeated prompt); explicit true is refused
     [create("r1"), begin("r1", RING_P21, max_gen=3), drain(64), create("r2"), begin("r2", RING_P21, max_gen=3),
      drain(64, label="repeated prompt")]
     + ring_overlay("prefix caching false", '{"engine": {"dynamic_batching": {"prefix_caching": false}}}', "pf")
     + [create("r3", engine="e_pf"), begin("r3", RING_P21, max_gen=3), drain(64, engine="e_pf", label="false events")]
     + ring_overlay("prefix caching true", '{"engine": {"dynamic_batching": {"prefix_caching": true}}}', "pt"),
     expect=raises("Prefix caching does not yet support sliding-window"))

# ---------------------------------------------------------------------------------------------
# Hybrid models (scenario.HYBRID_MODEL_CONFIGS): fixed_conv / fixed_recurrent state beside paged KV
# ---------------------------------------------------------------------------------------------
# hybrid_crca: conv, attention, recurrent, attention; 3 slots, 8 query tokens per step (a 40-token
# prompt prefills in five steps, the first token comes with the fifth). hybrid_mixed5: recurrent,
# conv, attention, conv, recurrent; 3 slots, 6 query tokens per step. Both set prefix_caching false
# (0.18 would otherwise adopt cached blocks of a repeated prompt; see hybrid_prefix_caching_absent).
HYB_P40 = list(range(3, 43))
HYB_P40B = [(7 * i + 5) % 90 + 3 for i in range(40)]
HYB_P27 = list(range(60, 87))
HYB_P13 = [(11 * i + 4) % 90 + 3 for i in range(13)]
HYB_P5 = [9, 4, 77, 31, 8]
HYBRID_DRAFTS = "Drafts on hybrid models need per-token state outputs"


def turn_tokens(recs, req, turn):
    """The tokens of req's turn `turn` in a recorded stream."""
    return [e[3] for e in _evs(recs) if e[1] == req and e[2] == turn and e[0] & TOKEN]


def same_turn_tokens(a, b, min_tokens=1):
    """0.18 streams the same tokens (at least min_tokens) for turns a and b, each (request, turn)."""
    def pred(recs):
        ta, tb = turn_tokens(recs, *a), turn_tokens(recs, *b)
        return len(ta) >= min_tokens and ta == tb
    return pred


def hybrid(name, actions, model="hybrid_crca", **kw):
    sc(name, actions, model=model, **kw)


hybrid_overlay = ring_overlay  # model(overlay) then an engine from it


hybrid("hybrid_long_prompt_long_generation",
       [capabilities(), create("r1"), begin("r1", HYB_P40, max_gen=80), pending(), drain(64)],
       expect=has_reason(MAXGEN_R))
hybrid("hybrid_long_prompt_long_generation_mixed5",
       [capabilities(), create("r1"), begin("r1", HYB_P40, max_gen=80), drain(64), create("r2"),
        begin("r2", HYB_P40B, max_gen=60), drain(64)], model="hybrid_mixed5", expect=has_reason(MAXGEN_R))
hybrid("hybrid_prefill_step_by_step",
       # 8 query tokens per step: alone, the 40-token prompt takes 5 steps and its first token comes with
       # the fifth; r2's prompt joins after two steps and shares the budget
       [create("r1"), create("r2"), begin("r1", HYB_P40, max_gen=4), run(64, times=2, label="two runs"),
        begin("r2", HYB_P27, max_gen=4), run(64, times=8, label="eight runs"), drain(64)])
hybrid("hybrid_concurrent_admissions_and_departures",
       # three slots: r2 closes mid-decode, r3 closes during its prefill; r4 and r5 take their slots,
       # r5 repeats r1's prompt and r6 r2's on reused slots (the same tokens)
       [create("r1"), create("r2"), create("r3"), begin("r1", HYB_P40, max_gen=12), begin("r2", HYB_P13, max_gen=20),
        run(64, times=8, label="mixed prefill, then decodes"), begin("r3", HYB_P40B, max_gen=10),
        run(64, times=2, label="r3 prefilling"), close("r2", label="r2 closes mid-decode"),
        run(64, label="r3 still prefilling"), close("r3", label="r3 closes during prefill"), create("r4"),
        begin("r4", HYB_P27, max_gen=16), create("r5"),
        begin("r5", HYB_P40, max_gen=12, label="r5 repeats r1 on a reused slot"), drain(64, label="r4 and r5 run"),
        close("r1"), create("r6"), begin("r6", HYB_P13, max_gen=20, label="r6 repeats r2 on a reused slot"),
        drain(64, label="r6 runs")],
       expect=all_of(has_reason(MAXGEN_R), same_turn_tokens(("r1", 1), ("r5", 1), 12),
                     lambda recs: len(turn_tokens(recs, "r2", 1)) >= 3
                     and turn_tokens(recs, "r6", 1)[:len(turn_tokens(recs, "r2", 1))] == turn_tokens(recs, "r2", 1),
                     lambda recs: turn_tokens(recs, "r3", 1) == []))
hybrid("hybrid_concurrent_admissions_and_departures_mixed5",
       # r3 (short prompt) closes mid-decode, r4 takes its slot while r1 and r2 are still prefilling or
       # decoding; after r1 departs, r5 repeats r3's prompt on a reused slot
       [create("r1"), create("r2"), create("r3"), begin("r1", HYB_P40, max_gen=10), begin("r2", HYB_P27, max_gen=20),
        begin("r3", HYB_P5, max_gen=14), run(64, times=12, label="mixed prefill"),
        close("r3", label="r3 closes mid-decode"), create("r4"), begin("r4", HYB_P40B, max_gen=25),
        drain(64, label="r1 departs, r4 admitted"), close("r1"), create("r5"),
        begin("r5", HYB_P5, max_gen=14, label="r5 repeats r3"), drain(64, label="r5 events")],
       model="hybrid_mixed5",
       expect=all_of(has_reason(MAXGEN_R), lambda recs: 2 <= len(turn_tokens(recs, "r3", 1)) < 14
                     and turn_tokens(recs, "r5", 1)[:len(turn_tokens(recs, "r3", 1))] == turn_tokens(recs, "r3", 1)))
hybrid("hybrid_three_residents_capacity_1",
       # one event per run: a step's events are retained and handed out one per run before the next step
       # runs; r1 closes with a token event retained and r4 (r1's prompt) takes its slot
       [create("r1"), create("r2"), create("r3"), begin("r1", HYB_P5, max_gen=6), begin("r2", HYB_P13, max_gen=4),
        begin("r3", [8, 9], max_gen=8), run(1, times=3, label="first runs"), close("r1", label="r1 closes"),
        create("r4"), begin("r4", HYB_P5, max_gen=6, label="r4 repeats r1"), drain(1)],
       expect=has_reason(MAXGEN_R))
hybrid("hybrid_waits_for_a_free_slot",
       # three slots held by turn-complete residents: a fourth request waits (CAPACITY_BLOCKED) until one closes
       [create("r1"), create("r2"), create("r3"), create("r4"), begin("r1", HYB_P13, max_gen=3),
        begin("r2", HYB_P27, max_gen=4), begin("r3", HYB_P5, max_gen=5), drain(64),
        begin("r4", HYB_P40, max_gen=8), run(64, times=2, label="r4 blocked"),
        begin("r2", [5, 6, 7], max_gen=6, label="r2 turn 2"), run(64, times=3, label="r2 continues, r4 waits"),
        close("r1", label="r1 departs"), drain(64, label="r4 takes r1's slot"), close("r3"), create("r5"),
        begin("r5", HYB_P13, max_gen=3, label="r5 repeats r1"), drain(64)],
       expect=all_of(has_flag(CAPACITY_BLOCKED, DEFERRED), has_reason(MAXGEN_R),
                     same_turn_tokens(("r1", 1), ("r5", 1), 3)))
hybrid("hybrid_waits_for_a_free_slot_batch2",
       [create("r1"), create("r2"), create("r3"), begin("r1", HYB_P40, max_gen=3), begin("r2", HYB_P27, max_gen=10),
        drain(64), begin("r3", HYB_P40B, max_gen=8), run(64, times=2, label="r3 blocked"),
        begin("r2", HYB_P13, max_gen=12, label="r2 turn 2"), run(64, times=3), close("r1", label="r1 departs"),
        drain(64, label="r3 takes r1's slot"), close("r2"), create("r4"), begin("r4", HYB_P13, max_gen=20), drain(64)],
       model="hybrid_crca_batch2", expect=all_of(has_flag(CAPACITY_BLOCKED, DEFERRED), has_reason(MAXGEN_R)))
hybrid("hybrid_continuation_turns",
       [create("r1"), begin("r1", HYB_P27, max_gen=10), drain(64), begin("r1", HYB_P13, max_gen=10), drain(64),
        begin("r1", [5, 6, 7], max_gen=8), drain(64), begin("r1", HYB_P40, max_gen=6), drain(64)],
       expect=has_reason(MAXGEN_R))
hybrid("hybrid_continuation_turns_mixed5",
       [create("r1"), create("r2"), begin("r1", HYB_P27, max_gen=10), begin("r2", HYB_P40B, max_gen=30), drain(64),
        begin("r1", HYB_P13, max_gen=10), drain(64), begin("r1", [5, 6, 7], max_gen=8), begin("r2", [8], max_gen=8),
        drain(64)], model="hybrid_mixed5")
hybrid("hybrid_cancel_during_prefill_and_decode",
       [create("r1"), create("r2"), begin("r1", HYB_P40, max_gen=10), begin("r2", HYB_P27, max_gen=12),
        run(64, times=3, label="prefill steps"), cancel("r1", 1, label="cancel r1 mid-prefill"), run(64, times=5),
        cancel("r2", 1, label="cancel r2 mid-decode"), drain(64), begin("r1", HYB_P13, max_gen=6, label="r1 turn 2"),
        begin("r2", [9, 10], max_gen=6, label="r2 turn 2"), drain(64), create("ref"),
        begin("ref", HYB_P13, max_gen=6), drain(64, label="reference events")],
       expect=has_reason(CANCELLED_R))
hybrid("hybrid_rewind_then_continue",
       # rewinding to the start of turn 2 keeps turn 1 (prompt and tokens) and the fixed state after it:
       # turn 4 equals a fresh request that runs turn 1 then turn 4's input; turn 5 (after rewinding turn
       # 4) repeats turn 4; after rewinding to turn 1, turn 6 equals a fresh request's first turn
       [create("r1"), begin("r1", HYB_P27, max_gen=6), drain(64), begin("r1", HYB_P13, max_gen=6), drain(64),
        begin("r1", [40, 41, 42], max_gen=6), drain(64), rewind("r1", 2, label="rewind 2"),
        begin("r1", HYB_P40B, max_gen=20, label="turn 4"), drain(64, label="turn 4 events"),
        rewind("r1", 4, label="rewind 4"), begin("r1", HYB_P40B, max_gen=20, label="turn 5 repeats turn 4"),
        drain(64, label="turn 5 events"), rewind("r1", 1, label="rewind 1"),
        begin("r1", HYB_P5, max_gen=10, label="turn 6"), drain(64, label="turn 6 events"),
        create("ref"), begin("ref", HYB_P27, max_gen=6), drain(64), begin("ref", HYB_P40B, max_gen=20),
        drain(64, label="reference events"), create("ref2"), begin("ref2", HYB_P5, max_gen=10),
        drain(64, label="fresh request events")],
       expect=all_of(same_turn_tokens(("r1", 4), ("ref", 2), 20), same_turn_tokens(("r1", 4), ("r1", 5), 20),
                     same_turn_tokens(("r1", 6), ("ref2", 1), 10)))
hybrid("hybrid_rewind_then_continue_mixed5",
       [create("r1"), begin("r1", HYB_P27, max_gen=6), drain(64), begin("r1", HYB_P13, max_gen=6), drain(64),
        rewind("r1", 2, label="rewind 2"), begin("r1", [5, 6, 7], max_gen=12, label="turn 3"),
        drain(64, label="turn 3 events"), create("ref"), begin("ref", HYB_P27, max_gen=6), drain(64),
        begin("ref", [5, 6, 7], max_gen=12), drain(64, label="reference events")],
       model="hybrid_mixed5", expect=lambda recs: turn_tokens(recs, "r1", 3) == turn_tokens(recs, "ref", 2) != [])
hybrid("hybrid_release_during_prefill",
       # the caller drops r1 mid-prefill; r2 carries on and r3 takes the freed slot
       [create("r1"), create("r2"), begin("r1", HYB_P40, max_gen=6), begin("r2", HYB_P13, max_gen=10),
        run(64, times=2, label="prefill"), release("r1"), run(64, times=2, label="after release"), create("r3"),
        begin("r3", HYB_P40, max_gen=6, label="r3 repeats r1"), create("r4"), begin("r4", HYB_P5, max_gen=4),
        drain(64)], expect=has_reason(MAXGEN_R))
hybrid("hybrid_budget_overlay",
       # engine.dynamic_batching.max_scheduled_tokens 3: prefill steps end off block boundaries
       hybrid_overlay("budget 3", '{"engine": {"dynamic_batching": {"max_scheduled_tokens": 3}}}', "b3")
       + [create("a", engine="e_b3"), create("b", engine="e_b3"), begin("a", HYB_P27, max_gen=12),
          begin("b", HYB_P13, max_gen=8), drain(64, engine="e_b3", label="budget 3 events"), create("c"),
          begin("c", HYB_P27, max_gen=12), drain(64, label="default budget events")],
       expect=same_turn_tokens(("a", 1), ("c", 1), 12))
hybrid("hybrid_drafts_are_not_verified",
       # per-token logits but no per-token fixed-state outputs: no draft verification (0 drafts per proposal)
       [max_drafts(label="max"), capabilities(), create("r1"), begin("r1", HYB_P13, max_gen=6),
        run(64, times=2, label="prefill"), drafts("r1", [5, 6], label="drafts"),
        drafts("r1", [5] * 9, label="9 drafts"), drafts("r1", [500], label="out of range"), drain(64)],
       model="hybrid_drafts", expect=all_of(lambda recs: recs[0][1] == 0,
                                            raises("This engine does not support speculative draft verification.")))
hybrid("hybrid_prefix_caching_false",
       # prefix_caching false (in genai_config.json and as an overlay): a repeated prompt is computed again
       [create("r1"), begin("r1", HYB_P27, max_gen=3), drain(64), create("r2"), begin("r2", HYB_P27, max_gen=3),
        drain(64, label="repeated prompt")]
       + hybrid_overlay("prefix caching false", '{"engine": {"dynamic_batching": {"prefix_caching": false}}}', "pf")
       + [create("r3", engine="e_pf"), begin("r3", HYB_P40, max_gen=3), drain(64, engine="e_pf"),
          create("r4", engine="e_pf"), begin("r4", HYB_P40, max_gen=3), drain(64, engine="e_pf", label="false events")],
       expect=lambda recs: all(e[7][2] == 0 for e in _evs(recs)))
HYB_P16 = list(range(5, 21))
HYB_P10 = list(range(30, 40))


def distinct_prompt(k):
    return [3 + k] + [3 + (k * 7 + j * 3) % 90 for j in range(16)]


hybrid("hybrid_prefix_caching_absent",
       # prefix_caching absent: adoption up to a fixed-state checkpoint, which a prefill step leaves where
       # it ends on a block boundary (8-token steps: 8, 16, 24 -> 24 of 27 prompt tokens)
       [create("r1"), begin("r1", HYB_P27, max_gen=3), drain(64, label="first prompt"), create("r2"),
        begin("r2", HYB_P27, max_gen=3), drain(64, label="repeated prompt"), create("r3"),
        begin("r3", HYB_P13, max_gen=3), drain(64, label="another prompt"),
        # a 16-token prompt repeated: at most 12 adoptable tokens, no checkpoint below 16
        create("r4"), begin("r4", HYB_P16, max_gen=2), drain(64), create("r5"), begin("r5", HYB_P16, max_gen=2),
        drain(64, label="16 tokens again"), create("r6"), begin("r6", HYB_P16 + [50, 51, 52, 53], max_gen=2),
        drain(64, label="16 tokens and 4 more")],
       model="hybrid_crca_prefix",
       expect=lambda recs: any(e[1] == "r2" and e[0] & TURN_FINISHED and e[7][2] == 24 for e in _evs(recs)))
hybrid("hybrid_prefix_caching_decodes_leave_no_checkpoint",
       # 10 prompt tokens and 8 generated reach 16 by decoding: nothing adoptable; a continuation prefill
       # that ends on a boundary leaves one
       [create("r1"), begin("r1", HYB_P10, max_gen=12), drain(64), create("r2"),
        begin("r2", HYB_P10 + HYB_P13[:8], max_gen=1, label="history through decodes"), drain(64),
        create("a"), begin("a", [20 + i for i in range(10)], max_gen=3), drain(64),
        begin("a", [50, 51, 52], max_gen=2, label="continuation ends at 16"), drain(64)],
       model="hybrid_crca_prefix")
hybrid("hybrid_prefix_caching_checkpoints_least_recently_used",
       # max_batch_size (3) checkpoints, least recently used replaced first: re-running the six most
       # recent prompts finds three
       [a for k in range(8) for a in (create(f"d{k}"), begin(f"d{k}", distinct_prompt(k), max_gen=1), drain(64),
                                      close(f"d{k}"))]
       + [a for k in reversed(range(2, 8)) for a in (create(f"x{k}"),
                                                     begin(f"x{k}", distinct_prompt(k) + [5], max_gen=1),
                                                     drain(64, label=f"again {k}"), close(f"x{k}"))],
       model="hybrid_crca_prefix",
       expect=lambda recs: [e[7][2] for e in _evs(recs) if e[1].startswith("x") and e[0] & TURN_FINISHED]
       == [16, 16, 16, 0, 0, 0])
HYB_B33 = list(range(50, 66)) + [5] * 16 + [6]
HYB_C33 = list(range(50, 66)) + [7] * 16 + [8]


def one_turn(req, prompt, label=None):
    return [create(req), begin(req, prompt, max_gen=1), drain(64, label=label), close(req)]


hybrid("hybrid_prefix_caching_full_pool",
       # three checkpoints: a full pool replaces a checkpoint of a shorter prefix of the same tokens first,
       # else the least recently used one; each probe's own prefill leaves checkpoints too
       one_turn("a", HYB_P40) + one_turn("b", HYB_B33) + one_turn("c", HYB_C33)
       + one_turn("p1", HYB_P40[:16] + [90], "a16") + one_turn("p2", HYB_B33[:32] + [91], "b32")
       + one_turn("p3", HYB_C33[:32] + [91], "c32") + one_turn("p4", HYB_P40[:32] + [90], "a32")
       + one_turn("p5", HYB_B33[:16] + [91], "b16") + one_turn("p6", HYB_P40[:24] + [9], "a24"),
       model="hybrid_crca_prefix")
hybrid("hybrid_prefix_caching_true",
       # an explicit prefix_caching true on a hybrid model: the same checkpointed adoption
       hybrid_overlay("prefix caching true", '{"engine": {"dynamic_batching": {"prefix_caching": true}}}', "pt")
       + [create("r1", engine="e_pt"), begin("r1", HYB_P27, max_gen=3), drain(64, engine="e_pt"),
          create("r2", engine="e_pt"), begin("r2", HYB_P27, max_gen=3), drain(64, engine="e_pt", label="repeated")])
hybrid("hybrid_drafts_with_per_token_state",
       # per-token fixed-state outputs: oga verifies drafts on the hybrid model, 0.18 does not
       [max_drafts(label="max"), create("r1"), begin("r1", HYB_P13, max_gen=6), run(64, times=2, label="prefill"),
        drafts("r1", [5, 6], label="drafts"), drain(64, label="events")],
       model="hybrid_drafts_capture",
       differences={"max": Difference(HYBRID_DRAFTS, "0.18: 0 (no draft verification on hybrid models); oga: 7"),
                    "drafts": Difference(HYBRID_DRAFTS, "0.18 refuses the proposal ('This engine does not support "
                                                        "speculative draft verification.'); oga accepts it")})
hybrid("hybrid_static_batching_refused",
       # fixed state groups without engine.dynamic_batching: the model loads, the engine is refused
       [capabilities()], model="hybrid_crca_static",
       expect=raises("Fixed decoder state groups require engine.dynamic_batching"))

SCENARIOS = {s.name: s for s in S}
assert len(SCENARIOS) == len(S), "duplicate scenario names"
