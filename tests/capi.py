"""ctypes declarations of the oga C API and small helpers shared by the C-level tests."""

import ctypes
import json
from ctypes import POINTER, byref, c_bool, c_char_p, c_double, c_float, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

import pytest

import oga as og

P = c_void_p
RES = c_void_p  # OgaResult*

SIGNATURES = {
    "OgaResultGetError": (c_char_p, [P]),
    "OgaDestroyResult": (None, [P]),
    "OgaCreateModel": (RES, [c_char_p, POINTER(P)]),
    "OgaDestroyModel": (None, [P]),
    "OgaCreateConfig": (RES, [c_char_p, POINTER(P)]),
    "OgaDestroyConfig": (None, [P]),
    "OgaConfigOverlay": (RES, [P, c_char_p]),
    "OgaConfigClearProviders": (RES, [P]),
    "OgaConfigAppendProvider": (RES, [P, c_char_p]),
    "OgaConfigSetProviderOption": (RES, [P, c_char_p, c_char_p, c_char_p]),
    "OgaCreateModelFromConfig": (RES, [P, POINTER(P)]),
    "OgaCreateGeneratorParams": (RES, [P, POINTER(P)]),
    "OgaDestroyGeneratorParams": (None, [P]),
    "OgaGeneratorParamsSetSearchNumber": (RES, [P, c_char_p, c_double]),
    "OgaGeneratorParamsSetSearchBool": (RES, [P, c_char_p, c_bool]),
    "OgaGeneratorParamsGetSearchNumber": (RES, [P, c_char_p, POINTER(c_double)]),
    "OgaGeneratorParamsGetSearchBool": (RES, [P, c_char_p, POINTER(c_bool)]),
    "OgaGeneratorParamsSetGuidance": (RES, [P, c_char_p, c_char_p, c_bool]),
    "OgaGeneratorParamsSetSpeculativeNumber": (RES, [P, c_char_p, c_double]),
    "OgaGeneratorParamsGetSpeculativeNumber": (RES, [P, c_char_p, POINTER(c_double)]),
    "OgaGeneratorParamsSetSpeculativeBool": (RES, [P, c_char_p, c_bool]),
    "OgaGeneratorParamsGetSpeculativeBool": (RES, [P, c_char_p, POINTER(c_bool)]),
    "OgaGenerator_SetInputs": (RES, [P, P]),
    "OgaGenerator_SetModelInput": (RES, [P, c_char_p, P]),
    "OgaGenerator_GetInput": (RES, [P, c_char_p, POINTER(P)]),
    "OgaGenerator_GetOutput": (RES, [P, c_char_p, POINTER(P)]),
    "OgaGenerator_SetHiddenStates": (RES, [P, P]),
    "OgaGenerator_SnapshotState": (RES, [P]),
    "OgaCreateGenerator": (RES, [P, P, POINTER(P)]),
    "OgaDestroyGenerator": (None, [P]),
    "OgaGenerator_IsDone": (c_bool, [P]),
    "OgaGenerator_IsSessionTerminated": (c_bool, [P]),
    "OgaGenerator_SetRuntimeOption": (RES, [P, c_char_p, c_char_p]),
    "OgaGenerator_AppendTokens": (RES, [P, POINTER(c_int32), c_size_t]),
    "OgaGenerator_AppendTokenSequences": (RES, [P, P]),
    "OgaGenerator_GenerateNextToken": (RES, [P]),
    "OgaGenerator_GetNextTokens": (RES, [P, POINTER(POINTER(c_int32)), POINTER(c_size_t)]),
    "OgaGenerator_RewindTo": (RES, [P, c_size_t]),
    "OgaGenerator_TokenCount": (c_size_t, [P]),
    "OgaGenerator_GetSequenceCount": (c_size_t, [P, c_size_t]),
    "OgaGenerator_GetSequenceData": (POINTER(c_int32), [P, c_size_t]),
    "OgaGenerator_GetLogits": (RES, [P, POINTER(P)]),
    "OgaGenerator_SetLogits": (RES, [P, P]),
    "OgaGenerator_GetSpeculativeStats": (RES, [P, POINTER(P)]),
    "OgaCreateTensorFromBuffer": (RES, [c_void_p, POINTER(ctypes.c_int64), c_size_t, c_int32, POINTER(P)]),
    "OgaTensorGetType": (RES, [P, POINTER(c_int32)]),
    "OgaTensorGetShapeRank": (RES, [P, POINTER(c_size_t)]),
    "OgaTensorGetShape": (RES, [P, POINTER(ctypes.c_int64), c_size_t]),
    "OgaTensorGetData": (RES, [P, POINTER(c_void_p)]),
    "OgaDestroyTensor": (None, [P]),
    "OgaCreateRequest": (RES, [P, POINTER(P)]),
    "OgaRequestAddTokens": (RES, [P, P]),
    "OgaRequestContinue": (RES, [P, P]),
    "OgaRequestHasUnseenTokens": (RES, [P, POINTER(c_bool)]),
    "OgaRequestGetUnseenToken": (RES, [P, POINTER(c_int32)]),
    "OgaRequestIsDone": (RES, [P, POINTER(c_bool)]),
    "OgaRequestIsTurnComplete": (RES, [P, POINTER(c_bool)]),
    "OgaRequestSetOpaqueData": (RES, [P, c_void_p]),
    "OgaRequestGetOpaqueData": (RES, [P, POINTER(c_void_p)]),
    "OgaEngineAddRequest": (RES, [P, P]),
    "OgaEngineRemoveRequest": (RES, [P, P]),
    "OgaEngineStep": (RES, [P, POINTER(P)]),
    "OgaCreateEngine": (RES, [P, POINTER(P)]),
    "OgaDestroyEngine": (None, [P]),
    "OgaEngineHasPendingRequests": (RES, [P, POINTER(c_bool)]),
    "OgaEngineMaxDraftTokensPerProposal": (RES, [P, POINTER(c_size_t)]),
    "OgaEngineGetCapabilities": (RES, [P, POINTER(P)]),
    "OgaEngineCapabilitiesGetConfiguredMaxBatchSize": (c_size_t, [P]),
    "OgaEngineCapabilitiesGetMaxScheduledTokens": (c_size_t, [P]),
    "OgaEngineCapabilitiesGetMaxRequestLength": (c_uint64, [P]),
    "OgaDestroyEngineCapabilities": (None, [P]),
    "OgaEngineGetSpeculativeStats": (RES, [P, POINTER(P)]),
    "OgaDestroySpeculativeStats": (None, [P]),
    "OgaSpeculativeStatsGetCount": (RES, [P, c_char_p, POINTER(c_uint64)]),
    "OgaSpeculativeStatsGetNumber": (RES, [P, c_char_p, POINTER(c_double)]),
    "OgaSpeculativeStatsGetBool": (RES, [P, c_char_p, POINTER(c_bool)]),
    "OgaSpeculativeStatsGetAcceptanceLengthHistogramSize": (RES, [P, POINTER(c_size_t)]),
    "OgaSpeculativeStatsGetAcceptanceLengthCount": (RES, [P, c_size_t, POINTER(c_uint64)]),
    "OgaCreateRequestOptions": (RES, [POINTER(P)]),
    "OgaDestroyRequestOptions": (None, [P]),
    "OgaRequestOptionsSetMaxSessionTokens": (RES, [P, c_uint64]),
    "OgaEngineCreateRequest": (RES, [P, P, POINTER(P)]),
    "OgaRequestBeginTurn": (RES, [P, P, POINTER(c_int32), c_uint64, POINTER(c_uint64)]),
    "OgaRequestCancelTurn": (RES, [P, c_uint64, POINTER(c_bool)]),
    "OgaRequestRewindToStartOfTurn": (RES, [P, c_uint64]),
    "OgaRequestClose": (RES, [P]),
    "OgaRequestSetDraftTokens": (RES, [P, P]),
    "OgaDestroyRequest": (None, [P]),
    "OgaRequestCreateTurnOptions": (RES, [P, POINTER(P)]),
    "OgaDestroyTurnOptions": (None, [P]),
    "OgaTurnOptionsSetMaxGeneratedTokens": (RES, [P, c_uint64]),
    "OgaTurnOptionsSetMinGeneratedTokens": (RES, [P, c_uint64]),
    "OgaTurnOptionsSetDoSample": (RES, [P, c_bool]),
    "OgaTurnOptionsSetTemperature": (RES, [P, c_float]),
    "OgaTurnOptionsSetTopP": (RES, [P, c_float]),
    "OgaTurnOptionsSetTopK": (RES, [P, c_int32]),
    "OgaTurnOptionsSetRepetitionPenalty": (RES, [P, c_float]),
    "OgaTurnOptionsSetNoRepeatNgramSize": (RES, [P, c_int32]),
    "OgaTurnOptionsSetSeed": (RES, [P, c_uint64]),
    "OgaTurnOptionsClearSeed": (RES, [P]),
    "OgaTurnOptionsSetStopStrings": (RES, [P, P]),
    "OgaTurnOptionsSetGuidance": (RES, [P, c_char_p, c_char_p]),
    "OgaTurnOptionsSetDelimitedGuidance": (RES, [P, c_int32, c_int32, c_char_p]),
    "OgaTurnOptionsClearGuidance": (RES, [P]),
    "OgaTurnOptionsReset": (RES, [P]),
    "OgaCreateEngineEventBuffer": (RES, [P, c_size_t, POINTER(P)]),
    "OgaDestroyEngineEventBuffer": (None, [P]),
    "OgaEngineRun": (RES, [P, P]),
    "OgaEngineEventBufferGetCount": (c_size_t, [P]),
    "OgaEngineEventBufferGet": (P, [P, c_size_t]),
    "OgaEngineEventGetFlags": (RES, [P, POINTER(c_uint32)]),
    "OgaEngineEventGetRequest": (RES, [P, POINTER(P)]),
    "OgaEngineEventGetTurnId": (RES, [P, POINTER(c_uint64)]),
    "OgaEngineEventGetToken": (RES, [P, POINTER(c_int32)]),
    "OgaEngineEventGetFinishReason": (RES, [P, POINTER(c_uint32)]),
    "OgaEngineEventGetMatchedStopStringIndex": (RES, [P, POINTER(c_int32)]),
    "OgaEngineEventGetErrorCode": (RES, [P, POINTER(c_uint32)]),
    "OgaEngineEventGetUsage": (RES, [P, POINTER(P)]),
    "OgaTurnUsageGetPromptTokens": (RES, [P, POINTER(c_uint64)]),
    "OgaTurnUsageGetGeneratedTokens": (RES, [P, POINTER(c_uint64)]),
    "OgaTurnUsageGetCachedPromptTokens": (RES, [P, POINTER(c_uint64)]),
    "OgaCreateStringArray": (RES, [POINTER(P)]),
    "OgaCreateStringArrayFromStrings": (RES, [POINTER(c_char_p), c_size_t, POINTER(P)]),
    "OgaStringArrayAddString": (RES, [P, c_char_p]),
    "OgaStringArrayGetCount": (RES, [P, POINTER(c_size_t)]),
    "OgaStringArrayGetString": (RES, [P, c_size_t, POINTER(c_char_p)]),
    "OgaDestroyStringArray": (None, [P]),
    "OgaCreateSequences": (RES, [POINTER(P)]),
    "OgaAppendTokenSequence": (RES, [POINTER(c_int32), c_size_t, P]),
    "OgaSequencesCount": (c_size_t, [P]),
    "OgaSequencesGetSequenceCount": (c_size_t, [P, c_size_t]),
    "OgaSequencesGetSequenceData": (POINTER(c_int32), [P, c_size_t]),
    "OgaDestroySequences": (None, [P]),
    "OgaExtCreateTestModel": (RES, [c_char_p, POINTER(P)]),
    "OgaExtCreateModelWithExecutor": (RES, [c_char_p, P, POINTER(P)]),
    "OgaExtTestModelInjectFault": (RES, [P, c_uint32, c_uint32, c_uint64, c_uint64]),
    "OgaExtEngineEventBufferGetGeneration": (c_uint64, [P]),
    "OgaExtEngineEventBufferGetCapacity": (c_size_t, [P]),
    "OgaExtLibraryPath": (c_char_p, []),
    "OgaExtConfigGetJson": (RES, [P, POINTER(c_char_p)]),
    "OgaExtSetModelLoader": (None, [c_void_p]),
    "OgaExtEngineCheckInvariants": (RES, [P]),
    "OgaExtRequestSetLastTurnIdForTesting": (RES, [P, c_uint64]),
    "OgaExtResultGetErrorKind": (c_uint32, [P]),
    "OgaExtConfigGetDecoderNames": (RES, [P, POINTER(P)]),
    "OgaExtEngineCreateRequestWithParams": (RES, [P, P, P, POINTER(P)]),
    "OgaExtEngineGetCounters": (RES, [P, P]),
    "OgaExtEngineGetLastStepInputs": (RES, [P, P]),
    "OgaExtEngineRequeueEvents": (RES, [P, P]),
    "OgaExtEngineSetFixedStateFallbackOnly": (RES, [P, c_int32]),
    "OgaExtGeneratorIsDone": (RES, [P, POINTER(c_bool)]),
    "OgaExtGeneratorParamsSetSearchOptions": (RES, [P, c_size_t, POINTER(c_char_p), POINTER(c_double),
                                                    POINTER(c_int32)]),
    "OgaExtModelSetTokenTable": (RES, [P, P]),
    "OgaExtPhilox4x32_10": (None, [c_uint64, c_uint64, POINTER(c_uint32)]),
    "OgaExtRequestGetFixedStateRow": (RES, [P, c_size_t, POINTER(c_void_p), POINTER(c_size_t)]),
    "OgaExtRequestGetFixedStateSlot": (RES, [P, P]),
    "OgaExtRequestGetUserData": (c_void_p, [P]),
    "OgaExtRequestSetUserData": (None, [P, c_void_p]),
    "OgaExtSetGuidanceLibrary": (RES, [c_char_p]),
    "OgaExtSetTokenTableLoader": (None, [c_void_p]),
    "OgaExtSetTokenizeFunction": (None, [c_void_p]),
}

DESTROYS = [name for name in SIGNATURES if name.startswith("OgaDestroy")]

OWNER = "Engine operations must be called from the Engine owner thread."


_LIB = None


def load():
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(og.library_path())
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _LIB = lib
    return _LIB


@pytest.fixture(scope="module")
def lib():
    return load()


def error(lib, res):
    if not res:
        return None
    msg = lib.OgaResultGetError(res)
    assert msg is not None
    lib.OgaDestroyResult(res)
    return msg.decode()


def ok(lib, res):
    msg = error(lib, res)
    assert msg is None, msg


def config(**overrides):
    cfg = {
        "model": {"type": "oga_test", "vocab_size": 64, "context_length": 128, "eos_token_id": 1,
                  "bos_token_id": 0, "pad_token_id": 0, "decoder": {}},
        "search": {"max_length": 128, "do_sample": False},
        "engine": {"dynamic_batching": {"block_size": 4, "num_blocks": 128, "max_batch_size": 8}},
        "test_model": {"per_token_logits": False, "max_block_table_columns": 0},
    }
    for k, v in overrides.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return json.dumps(cfg).encode()


class Handles:
    def __init__(self, lib, model=None):
        """Creates an engine. Without `model`, on a fresh default test model whose handle is
        released right away (the engine keeps the model alive); a given model handle stays the
        caller's."""
        self.lib = lib
        own = model is None
        if own:
            model = P()
            ok(lib, lib.OgaExtCreateTestModel(config(), byref(model)))
        engine = P()
        ok(lib, lib.OgaCreateEngine(model, byref(engine)))
        if own:
            lib.OgaDestroyModel(model)
        self.engine = engine

    def request(self, max_session=0):
        lib = self.lib
        opts = P()
        ok(lib, lib.OgaCreateRequestOptions(byref(opts)))
        ok(lib, lib.OgaRequestOptionsSetMaxSessionTokens(opts, max_session))
        req = P()
        ok(lib, lib.OgaEngineCreateRequest(self.engine, opts, byref(req)))
        lib.OgaDestroyRequestOptions(opts)
        return req

    def begin(self, req, tokens, max_gen=0):
        lib = self.lib
        t = P()
        ok(lib, lib.OgaRequestCreateTurnOptions(req, byref(t)))
        ok(lib, lib.OgaTurnOptionsSetMaxGeneratedTokens(t, max_gen))
        arr = (c_int32 * len(tokens))(*tokens)
        tid = c_uint64()
        res = lib.OgaRequestBeginTurn(req, t, arr, len(tokens), byref(tid))
        lib.OgaDestroyTurnOptions(t)
        ok(lib, res)
        return tid.value

    def pending(self):
        out = c_bool()
        ok(self.lib, self.lib.OgaEngineHasPendingRequests(self.engine, byref(out)))
        return out.value

    def read_event(self, ev):
        lib = self.lib
        flags, reason, code = c_uint32(), c_uint32(), c_uint32()
        tid, token, stop = c_uint64(), c_int32(), c_int32()
        req, usage = P(), P()
        ok(lib, lib.OgaEngineEventGetFlags(ev, byref(flags)))
        ok(lib, lib.OgaEngineEventGetRequest(ev, byref(req)))
        ok(lib, lib.OgaEngineEventGetTurnId(ev, byref(tid)))
        ok(lib, lib.OgaEngineEventGetToken(ev, byref(token)))
        ok(lib, lib.OgaEngineEventGetFinishReason(ev, byref(reason)))
        ok(lib, lib.OgaEngineEventGetMatchedStopStringIndex(ev, byref(stop)))
        ok(lib, lib.OgaEngineEventGetErrorCode(ev, byref(code)))
        ok(lib, lib.OgaEngineEventGetUsage(ev, byref(usage)))
        assert usage.value is not None
        u = []
        for getter in ("OgaTurnUsageGetPromptTokens", "OgaTurnUsageGetGeneratedTokens",
                       "OgaTurnUsageGetCachedPromptTokens"):
            v = c_uint64()
            ok(lib, getattr(lib, getter)(usage, byref(v)))
            u.append(v.value)
        tok = token.value if flags.value & 1 else None
        assert stop.value == -1
        return req.value, (flags.value, tid.value, tok, reason.value, code.value, tuple(u))

    def drain(self, buf):
        lib = self.lib
        events = []
        while self.pending():
            ok(lib, lib.OgaEngineRun(self.engine, buf))
            ok(lib, lib.OgaExtEngineCheckInvariants(self.engine))
            n = lib.OgaEngineEventBufferGetCount(buf)
            for i in range(n):
                ev = lib.OgaEngineEventBufferGet(buf, i)
                assert ev is not None
                events.append(self.read_event(ev))
            assert lib.OgaEngineEventBufferGet(buf, n) is None
        return events

    def destroy(self):
        self.lib.OgaDestroyEngine(self.engine)


