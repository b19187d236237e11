"""The C API through ctypes on the built library: a full request end to end, exact NULL-argument
texts, NULL-safe destroys, direct-return getters, engine destruction with live handles, the owner
thread, static batching rejected."""

import threading
from ctypes import byref, c_bool, c_char_p, c_double, c_int32, c_size_t, c_uint32, c_uint64

import pytest

import oga as og
from capi import DESTROYS, OWNER, P, Handles, config, error, lib, ok  # noqa: F401 (lib is a fixture)
from helpers import OracleSequence, expected_turn_events


def test_full_request_through_the_c_api(lib):
    h = Handles(lib)
    req = h.request()
    assert not h.pending()
    assert h.begin(req, [5, 9, 13], max_gen=6) == 1
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 2, byref(buf)))
    assert lib.OgaExtEngineEventBufferGetCapacity(buf) == 2
    assert lib.OgaEngineEventBufferGetCount(buf) == 0
    gen0 = lib.OgaExtEngineEventBufferGetGeneration(buf)
    events = h.drain(buf)
    assert lib.OgaExtEngineEventBufferGetGeneration(buf) > gen0
    assert all(r == req.value for r, _ in events)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=6)
    assert [e for _, e in events] == expected_turn_events(1, 3, toks, reason)
    # Continuation, then cancel it while queued.
    assert h.begin(req, [4], max_gen=2) == 2
    cancelled = c_bool()
    ok(lib, lib.OgaRequestCancelTurn(req, 2, byref(cancelled)))
    assert cancelled.value is True
    ok(lib, lib.OgaRequestCancelTurn(req, 2, byref(cancelled)))
    assert cancelled.value is False
    events = h.drain(buf)
    assert [e for _, e in events] == [(2, 2, None, 5, 0, (1, 0, 0))]
    ok(lib, lib.OgaRequestClose(req))
    ok(lib, lib.OgaRequestClose(req))
    lib.OgaDestroyRequest(req)
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()


def test_destroying_a_queued_request_handle_leaves_nothing_pending(lib):
    h = Handles(lib)
    created = h.request()
    queued = h.request()
    h.begin(queued, [5, 9, 13])
    lib.OgaDestroyRequest(created)
    lib.OgaDestroyRequest(queued)
    assert not h.pending()
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    assert lib.OgaEngineEventBufferGetCount(buf) == 0
    assert lib.OgaEngineEventBufferGet(buf, 0) is None
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()


def test_capabilities_drafts_and_stats(lib):
    h = Handles(lib)
    caps = P()
    ok(lib, lib.OgaEngineGetCapabilities(h.engine, byref(caps)))
    assert lib.OgaEngineCapabilitiesGetConfiguredMaxBatchSize(caps) == 8
    assert lib.OgaEngineCapabilitiesGetMaxScheduledTokens(caps) == 2048
    assert lib.OgaEngineCapabilitiesGetMaxRequestLength(caps) == 128
    lib.OgaDestroyEngineCapabilities(caps)
    for getter in ("OgaEngineCapabilitiesGetConfiguredMaxBatchSize", "OgaEngineCapabilitiesGetMaxScheduledTokens",
                   "OgaEngineCapabilitiesGetMaxRequestLength"):
        assert getattr(lib, getter)(None) == 0
    n = c_size_t(99)
    ok(lib, lib.OgaEngineMaxDraftTokensPerProposal(h.engine, byref(n)))
    assert n.value == 0
    stats = P()
    ok(lib, lib.OgaEngineGetSpeculativeStats(h.engine, byref(stats)))
    v = c_uint64(5)
    ok(lib, lib.OgaSpeculativeStatsGetCount(stats, b"rounds", byref(v)))
    assert v.value == 0
    d = c_double(5)
    ok(lib, lib.OgaSpeculativeStatsGetNumber(stats, b"acceptance_rate", byref(d)))
    assert d.value == 0.0
    b = c_bool()
    ok(lib, lib.OgaSpeculativeStatsGetBool(stats, b"formula_supported", byref(b)))
    size = c_size_t()
    ok(lib, lib.OgaSpeculativeStatsGetAcceptanceLengthHistogramSize(stats, byref(size)))
    assert size.value == 8
    assert error(lib, lib.OgaSpeculativeStatsGetCount(stats, b"nope", byref(v))) == \
        "nope is an invalid name for OgaSpeculativeStatsGetCount."
    assert error(lib, lib.OgaSpeculativeStatsGetNumber(stats, b"nope", byref(d))) == \
        "nope is an invalid name for OgaSpeculativeStatsGetNumber."
    assert error(lib, lib.OgaSpeculativeStatsGetBool(stats, b"nope", byref(b))) == \
        "nope is an invalid name for OgaSpeculativeStatsGetBool."
    assert error(lib, lib.OgaSpeculativeStatsGetCount(None, b"rounds", byref(v))) == \
        "stats, name, and value must not be null."
    assert error(lib, lib.OgaSpeculativeStatsGetCount(stats, None, byref(v))) == \
        "stats, name, and value must not be null."
    assert error(lib, lib.OgaSpeculativeStatsGetAcceptanceLengthHistogramSize(stats, None)) == \
        "stats and value must not be null."
    lib.OgaDestroySpeculativeStats(stats)
    h.destroy()


def test_null_arguments_give_exact_texts(lib):
    h = Handles(lib)
    req = h.request()
    fresh = h.request()
    h.begin(req, [5, 9, 13], max_gen=1)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    t = P()
    ok(lib, lib.OgaRequestCreateTurnOptions(req, byref(t)))
    model = P()
    ok(lib, lib.OgaExtCreateTestModel(config(), byref(model)))
    out = P()
    b = c_bool()
    u64 = c_uint64()
    arr = (c_int32 * 1)(5)
    cases = [
        (lambda: lib.OgaCreateEngine(None, byref(out)), "model must not be null."),
        (lambda: lib.OgaCreateEngine(model, None), "out must not be null."),
        (lambda: lib.OgaEngineHasPendingRequests(None, byref(b)), "engine must not be null."),
        (lambda: lib.OgaEngineHasPendingRequests(h.engine, None), "out must not be null."),
        (lambda: lib.OgaEngineMaxDraftTokensPerProposal(None, byref(c_size_t())), "engine must not be null."),
        (lambda: lib.OgaEngineGetCapabilities(None, byref(out)), "engine must not be null."),
        (lambda: lib.OgaEngineGetCapabilities(h.engine, None), "out must not be null."),
        (lambda: lib.OgaEngineGetSpeculativeStats(None, byref(out)), "engine must not be null."),
        (lambda: lib.OgaCreateRequestOptions(None), "out must not be null."),
        (lambda: lib.OgaRequestOptionsSetMaxSessionTokens(None, 3), "options must not be null."),
        (lambda: lib.OgaEngineCreateRequest(None, None, byref(out)), "engine must not be null."),
        (lambda: lib.OgaEngineCreateRequest(h.engine, None, None), "out must not be null."),
        (lambda: lib.OgaRequestBeginTurn(None, None, arr, 1, byref(u64)), "request must not be null."),
        (lambda: lib.OgaRequestBeginTurn(req, None, arr, 1, None), "out_turn_id must not be null."),
        (lambda: lib.OgaRequestBeginTurn(fresh, None, None, 1, byref(u64)),
         "input_ids must not be null when input_ids_count is nonzero."),
        (lambda: lib.OgaRequestBeginTurn(fresh, None, None, 0, byref(u64)),
         "Expected at least one input token for generation. Received 0."),
        (lambda: lib.OgaRequestBeginTurn(fresh, None, arr, 1, None), "out_turn_id must not be null."),
        (lambda: lib.OgaRequestCancelTurn(None, 1, byref(b)), "request must not be null."),
        (lambda: lib.OgaRequestCancelTurn(req, 1, None), "out_cancelled must not be null."),
        (lambda: lib.OgaRequestRewindToStartOfTurn(None, 1), "request must not be null."),
        (lambda: lib.OgaRequestClose(None), "request must not be null."),
        (lambda: lib.OgaRequestSetDraftTokens(None, None), "request must not be null."),
        (lambda: lib.OgaRequestCreateTurnOptions(None, byref(out)), "request must not be null."),
        (lambda: lib.OgaRequestCreateTurnOptions(req, None), "out must not be null."),
        (lambda: lib.OgaTurnOptionsSetMaxGeneratedTokens(None, 3), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetMinGeneratedTokens(None, 3), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetDoSample(None, True), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetTemperature(None, 1.0), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetTopP(None, 1.0), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetTopK(None, 1), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetRepetitionPenalty(None, 1.0), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetNoRepeatNgramSize(None, 0), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetSeed(None, 0), "options must not be null."),
        (lambda: lib.OgaTurnOptionsClearSeed(None), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetStopStrings(None, None), "options must not be null."),
        (lambda: lib.OgaTurnOptionsSetStopStrings(t, None), "stop_strings must not be null."),
        (lambda: lib.OgaTurnOptionsSetGuidance(t, None, None), "guidance_type and guidance_data must not be null."),
        (lambda: lib.OgaTurnOptionsSetDelimitedGuidance(t, 3, 4, None), "grammar must not be null."),
        (lambda: lib.OgaTurnOptionsClearGuidance(None), "options must not be null."),
        (lambda: lib.OgaTurnOptionsReset(None), "options must not be null."),
        (lambda: lib.OgaCreateEngineEventBuffer(None, 1, byref(out)), "engine must not be null."),
        (lambda: lib.OgaCreateEngineEventBuffer(h.engine, 1, None), "out must not be null."),
        (lambda: lib.OgaEngineRun(None, buf), "engine must not be null."),
        (lambda: lib.OgaEngineRun(h.engine, None), "buffer must not be null."),
        (lambda: lib.OgaTurnUsageGetPromptTokens(None, byref(u64)), "usage must not be null."),
        (lambda: lib.OgaTurnUsageGetGeneratedTokens(None, byref(u64)), "usage must not be null."),
        (lambda: lib.OgaTurnUsageGetCachedPromptTokens(None, byref(u64)), "usage must not be null."),
    ]
    for i, (call, text) in enumerate(cases):
        assert error(lib, call()) == text, f"case {i}: {text}"
    assert out.value is None
    # Nothing above changed the engine: the turn still runs normally.
    events = h.drain(buf)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=1)
    assert [e for _, e in events] == expected_turn_events(1, 3, toks, reason)
    lib.OgaDestroyModel(model)
    lib.OgaDestroyTurnOptions(t)
    lib.OgaDestroyRequest(req)
    lib.OgaDestroyRequest(fresh)
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()


def test_null_event_getters_zero_their_output(lib):
    cases = [
        ("OgaEngineEventGetFlags", c_uint32(7), 0),
        ("OgaEngineEventGetTurnId", c_uint64(7), 0),
        ("OgaEngineEventGetToken", c_int32(7), 0),
        ("OgaEngineEventGetFinishReason", c_uint32(7), 0),
        ("OgaEngineEventGetMatchedStopStringIndex", c_int32(7), -1),
        ("OgaEngineEventGetErrorCode", c_uint32(7), 0),
        ("OgaTurnUsageGetPromptTokens", c_uint64(7), 0),
        ("OgaTurnUsageGetGeneratedTokens", c_uint64(7), 0),
        ("OgaTurnUsageGetCachedPromptTokens", c_uint64(7), 0),
    ]
    for name, out, zero in cases:
        text = "usage must not be null." if name.startswith("OgaTurnUsage") else "event must not be null."
        assert error(lib, getattr(lib, name)(None, byref(out))) == text, name
        assert out.value == zero, name
    for name in ("OgaEngineEventGetRequest", "OgaEngineEventGetUsage"):
        out = P(12345)
        assert error(lib, getattr(lib, name)(None, byref(out))) == "event must not be null."
        assert out.value is None


def test_event_getters_reject_null_out(lib):
    h = Handles(lib)
    req = h.request()
    h.begin(req, [5, 9, 13], max_gen=1)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    ev = lib.OgaEngineEventBufferGet(buf, 0)
    assert ev is not None
    for name in ("OgaEngineEventGetFlags", "OgaEngineEventGetRequest", "OgaEngineEventGetTurnId",
                 "OgaEngineEventGetToken", "OgaEngineEventGetFinishReason", "OgaEngineEventGetMatchedStopStringIndex",
                 "OgaEngineEventGetErrorCode", "OgaEngineEventGetUsage"):
        assert error(lib, getattr(lib, name)(ev, None)) == "out must not be null.", name
    req_out = P()
    ok(lib, lib.OgaEngineEventGetRequest(ev, byref(req_out)))
    assert req_out.value == req.value
    lib.OgaDestroyRequest(req)
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()


def test_direct_return_functions_tolerate_null(lib):
    assert lib.OgaEngineEventBufferGetCount(None) == 0
    assert lib.OgaEngineEventBufferGet(None, 0) is None
    assert lib.OgaExtEngineEventBufferGetGeneration(None) == 0
    assert lib.OgaExtEngineEventBufferGetCapacity(None) == 0
    assert lib.OgaResultGetError(None) is None
    assert lib.OgaSequencesCount(None) == 0


@pytest.mark.parametrize("name", DESTROYS)
def test_destroy_functions_are_null_safe(lib, name):
    getattr(lib, name)(None)


def test_out_of_range_buffer_get_is_null(lib):
    h = Handles(lib)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    for i in (0, 1, 3, 4, 2 ** 63):
        assert lib.OgaEngineEventBufferGet(buf, i) is None
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()


def test_engine_destruction_with_live_handles(lib):
    h = Handles(lib)
    req = h.request()
    h.begin(req, [5, 9, 13], max_gen=4)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    assert lib.OgaEngineEventBufferGetCount(buf) == 1
    t = P()
    ok(lib, lib.OgaRequestCreateTurnOptions(req, byref(t)))
    h.destroy()
    # The buffer's last contents stay readable.
    assert lib.OgaEngineEventBufferGetCount(buf) == 1
    # The request is a closed tombstone.
    arr = (c_int32 * 1)(5)
    tid = c_uint64()
    assert error(lib, lib.OgaRequestBeginTurn(req, None, arr, 1, byref(tid))) == "Cannot use a closed request."
    b = c_bool()
    assert error(lib, lib.OgaRequestCancelTurn(req, 1, byref(b))) == \
        "Cannot cancel after the request's engine has been destroyed."
    out = P()
    assert error(lib, lib.OgaRequestCreateTurnOptions(req, byref(out))) == "Cannot use a closed request."
    assert error(lib, lib.OgaTurnOptionsSetMaxGeneratedTokens(t, 3)) == "Cannot use a closed request."
    ok(lib, lib.OgaRequestClose(req))
    # Another engine cannot run it.
    h2 = Handles(lib)
    assert error(lib, lib.OgaEngineRun(h2.engine, buf)) == "buffer must be used with the Engine that created it."
    lib.OgaDestroyTurnOptions(t)
    lib.OgaDestroyRequest(req)
    lib.OgaDestroyEngineEventBuffer(buf)
    h2.destroy()


def test_turn_options_of_a_released_request(lib):
    h = Handles(lib)
    req = h.request()
    t = P()
    ok(lib, lib.OgaRequestCreateTurnOptions(req, byref(t)))
    lib.OgaDestroyRequest(req)
    assert not h.pending()  # reclaims the abandoned request
    assert error(lib, lib.OgaTurnOptionsSetMaxGeneratedTokens(t, 3)) in (
        "Cannot use Turn options after their Request has been destroyed.", "Cannot use a closed request.")
    lib.OgaDestroyTurnOptions(t)
    h.destroy()


def test_owner_thread_is_enforced_in_c(lib):
    h = Handles(lib)
    req = h.request()
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    results = {}

    def worker():
        b = c_bool()
        out = P()
        tid = c_uint64()
        arr = (c_int32 * 1)(5)
        results["pending"] = error(lib, lib.OgaEngineHasPendingRequests(h.engine, byref(b)))
        results["run"] = error(lib, lib.OgaEngineRun(h.engine, buf))
        results["create"] = error(lib, lib.OgaEngineCreateRequest(h.engine, None, byref(out)))
        results["begin"] = error(lib, lib.OgaRequestBeginTurn(req, None, arr, 1, byref(tid)))
        results["turn_options"] = error(lib, lib.OgaRequestCreateTurnOptions(req, byref(out)))
        results["buffer"] = error(lib, lib.OgaCreateEngineEventBuffer(h.engine, 1, byref(out)))
        results["caps"] = error(lib, lib.OgaEngineGetCapabilities(h.engine, byref(out)))
        results["close"] = error(lib, lib.OgaRequestClose(req))
        opts = P()
        results["options"] = error(lib, lib.OgaCreateRequestOptions(byref(opts)))
        lib.OgaDestroyRequestOptions(opts)

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert results.pop("options") is None
    assert results == {k: OWNER for k in results}
    assert h.begin(req, [5, 9, 13], max_gen=1) == 1
    events = h.drain(buf)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=1)
    assert [e for _, e in events] == expected_turn_events(1, 3, toks, reason)
    lib.OgaDestroyRequest(req)
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()


def test_static_batching_is_rejected(lib):
    model = P()
    ok(lib, lib.OgaExtCreateTestModel(config(engine=None), byref(model)))
    engine = P()
    msg = error(lib, lib.OgaCreateEngine(model, byref(engine)))
    assert msg, "static batching is not supported yet: engine creation must fail"
    assert engine.value is None
    lib.OgaDestroyModel(model)


def test_string_arrays_and_sequences(lib):
    arr = (c_char_p * 2)(b"ab", b"cd")
    sa = P()
    ok(lib, lib.OgaCreateStringArrayFromStrings(arr, 2, byref(sa)))
    ok(lib, lib.OgaStringArrayAddString(sa, b"ef"))
    n = c_size_t()
    ok(lib, lib.OgaStringArrayGetCount(sa, byref(n)))
    assert n.value == 3
    s = c_char_p()
    ok(lib, lib.OgaStringArrayGetString(sa, 2, byref(s)))
    assert s.value == b"ef"
    lib.OgaDestroyStringArray(sa)
    seq = P()
    ok(lib, lib.OgaCreateSequences(byref(seq)))
    toks = (c_int32 * 3)(4, 5, 6)
    ok(lib, lib.OgaAppendTokenSequence(toks, 3, seq))
    assert lib.OgaSequencesCount(seq) == 1
    assert lib.OgaSequencesGetSequenceCount(seq, 0) == 3
    assert lib.OgaSequencesGetSequenceCount(seq, 1) == 0
    data = lib.OgaSequencesGetSequenceData(seq, 0)
    assert [data[i] for i in range(3)] == [4, 5, 6]
    assert not lib.OgaSequencesGetSequenceData(seq, 1)
    lib.OgaDestroySequences(seq)


def test_draft_tokens_rejected_in_c(lib):
    h = Handles(lib)
    req = h.request()
    h.begin(req, [5, 9, 13], max_gen=3)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    seq = P()
    ok(lib, lib.OgaCreateSequences(byref(seq)))
    toks = (c_int32 * 2)(4, 5)
    ok(lib, lib.OgaAppendTokenSequence(toks, 2, seq))
    assert error(lib, lib.OgaRequestSetDraftTokens(req, seq)) == \
        "This engine does not support speculative draft verification."
    assert error(lib, lib.OgaRequestSetDraftTokens(req, None)) == "tokens must not be null."
    lib.OgaDestroySequences(seq)
    lib.OgaDestroyRequest(req)
    lib.OgaDestroyEngineEventBuffer(buf)
    h.destroy()


def test_library_path_matches(lib):
    assert lib.OgaExtLibraryPath().decode() == og.library_path()
