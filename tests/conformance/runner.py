"""Executes a conformance scenario (scenario.py) and returns its recorded stream.

Two backends:
- `PythonRunner(module)`: the Engine API of `onnxruntime_genai` (0.18) or `oga`, through Python.
- `CtypesRunner(impl)`: the same actions mapped to the C ABI through ctypes, against
  `libonnxruntime-genai.so` from the 0.18 wheel or oga's library (`oga.library_path()`; `oga` is
  imported first because the package registers the ONNX Runtime model loader OgaCreateModel uses).

`run_scenario(scenario, backend, impl, model_dirs)` returns a list of `(label, value)` records,
one per action (see scenario.py for the shapes).

oga runs every dynamic-batching directory with engine.dynamic_batching.preemption "none": 0.18 has
no preemption, and the suite compares 0.18's scheduling (its CapacityBlocked events included).
oga's default, recompute preemption, is a deliberate difference (README) tested by
tests/test_preemption.py.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import threading
from ctypes import POINTER, byref, c_bool, c_char_p, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

from capi import SIGNATURES

P = c_void_p
RES = c_void_p

# The 0.18 C entry points the runner uses (their signatures are declared once, in tests/capi.py).
RUNNER_FUNCTIONS = (
    "OgaResultGetError",
    "OgaDestroyResult",
    "OgaCreateModel",
    "OgaDestroyModel",
    "OgaCreateConfig",
    "OgaDestroyConfig",
    "OgaConfigOverlay",
    "OgaCreateModelFromConfig",
    "OgaCreateEngine",
    "OgaDestroyEngine",
    "OgaEngineHasPendingRequests",
    "OgaEngineGetCapabilities",
    "OgaEngineCapabilitiesGetConfiguredMaxBatchSize",
    "OgaEngineCapabilitiesGetMaxScheduledTokens",
    "OgaEngineCapabilitiesGetMaxRequestLength",
    "OgaDestroyEngineCapabilities",
    "OgaCreateRequestOptions",
    "OgaDestroyRequestOptions",
    "OgaRequestOptionsSetMaxSessionTokens",
    "OgaEngineCreateRequest",
    "OgaRequestBeginTurn",
    "OgaRequestCancelTurn",
    "OgaRequestRewindToStartOfTurn",
    "OgaRequestClose",
    "OgaDestroyRequest",
    "OgaRequestCreateTurnOptions",
    "OgaDestroyTurnOptions",
    "OgaTurnOptionsSetMaxGeneratedTokens",
    "OgaTurnOptionsSetMinGeneratedTokens",
    "OgaTurnOptionsSetDoSample",
    "OgaTurnOptionsSetTemperature",
    "OgaTurnOptionsSetTopP",
    "OgaTurnOptionsSetTopK",
    "OgaTurnOptionsSetRepetitionPenalty",
    "OgaTurnOptionsSetNoRepeatNgramSize",
    "OgaTurnOptionsSetSeed",
    "OgaTurnOptionsClearSeed",
    "OgaTurnOptionsClearGuidance",
    "OgaTurnOptionsReset",
    "OgaTurnOptionsSetStopStrings",
    "OgaTurnOptionsSetGuidance",
    "OgaCreateStringArray",
    "OgaStringArrayAddString",
    "OgaDestroyStringArray",
    "OgaCreateEngineEventBuffer",
    "OgaDestroyEngineEventBuffer",
    "OgaEngineRun",
    "OgaEngineEventBufferGetCount",
    "OgaEngineEventBufferGet",
    "OgaEngineEventGetFlags",
    "OgaEngineEventGetRequest",
    "OgaEngineEventGetTurnId",
    "OgaEngineEventGetToken",
    "OgaEngineEventGetFinishReason",
    "OgaEngineEventGetMatchedStopStringIndex",
    "OgaEngineEventGetErrorCode",
    "OgaEngineEventGetUsage",
    "OgaTurnUsageGetPromptTokens",
    "OgaTurnUsageGetGeneratedTokens",
    "OgaTurnUsageGetCachedPromptTokens",
    "OgaEngineMaxDraftTokensPerProposal",
    "OgaRequestSetDraftTokens",
    "OgaCreateSequences",
    "OgaAppendTokenSequence",
    "OgaDestroySequences",
    "OgaEngineGetSpeculativeStats",
    "OgaDestroySpeculativeStats",
    "OgaSpeculativeStatsGetCount",
)

# Turn-option setter name -> (C function, Python method)
SETTERS = {
    "max_generated_tokens": "OgaTurnOptionsSetMaxGeneratedTokens",
    "min_generated_tokens": "OgaTurnOptionsSetMinGeneratedTokens",
    "do_sample": "OgaTurnOptionsSetDoSample",
    "temperature": "OgaTurnOptionsSetTemperature",
    "top_p": "OgaTurnOptionsSetTopP",
    "top_k": "OgaTurnOptionsSetTopK",
    "repetition_penalty": "OgaTurnOptionsSetRepetitionPenalty",
    "no_repeat_ngram_size": "OgaTurnOptionsSetNoRepeatNgramSize",
    "seed": "OgaTurnOptionsSetSeed",
    "clear_seed": "OgaTurnOptionsClearSeed",
    "clear_guidance": "OgaTurnOptionsClearGuidance",
    "reset": "OgaTurnOptionsReset",
    "stop_strings": "OgaTurnOptionsSetStopStrings",  # value: a list of str (C: an OgaStringArray of UTF-8)
    "guidance": "OgaTurnOptionsSetGuidance",  # value: (type, data)
}
NO_VALUE = ("clear_seed", "clear_guidance", "reset")

OUT_TYPES = {"c_uint64": c_uint64, "c_bool": c_bool, "c_uint32": c_uint32, "c_int32": c_int32,
             "c_size_t": c_size_t, "c_void_p": c_void_p}
SENTINELS = {"c_uint64": 77, "c_bool": True, "c_uint32": 77, "c_int32": 77, "c_size_t": 77, "c_void_p": 0x77}


def ort_genai_library_path() -> str:
    import onnxruntime_genai

    return os.path.join(os.path.dirname(onnxruntime_genai.__file__), "libonnxruntime-genai.so")


_LIBS = {}


def load_library(impl: str):
    """The C library of `impl` ("0.18" or "oga") with the runner's signatures declared."""
    lib = _LIBS.get(impl)
    if lib is None:
        if impl == "oga":
            import oga

            path = oga.library_path()
        else:
            import onnxruntime_genai  # noqa: F401  (loads ONNX Runtime the way the wheel does)

            path = ort_genai_library_path()
        lib = ctypes.CDLL(path)
        for name in RUNNER_FUNCTIONS:
            restype, argtypes = SIGNATURES[name]
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _LIBS[impl] = lib
    return lib


def python_module(impl: str):
    if impl == "oga":
        import oga

        return oga
    import onnxruntime_genai

    return onnxruntime_genai


class Raised(Exception):
    """A C call returned an OgaResult."""


def _message(text: str) -> str:
    """An error message as recorded: a Rust panic backtrace (llguidance reports panics with the
    caller's whole stack, which differs between the Python and the C caller) is elided."""
    return re.sub(r"<backtrace>.*?</backtrace>", "<backtrace>...</backtrace>", text, flags=re.S)


def _exc(e: BaseException):
    if isinstance(e, Raised):
        return ("raise", "OgaResult", _message(str(e)))
    # oga's typed errors are RuntimeErrors (what 0.18 raises), recorded as such; their kinds are
    # tested in tests/test_errors.py
    name = "RuntimeError" if type(e).__name__ == "OgaError" and isinstance(e, RuntimeError) else type(e).__name__
    return ("raise", name, _message(str(e)))


PREEMPTION_NONE = '{"engine": {"dynamic_batching": {"preemption": "none"}}}'


def oga_overlays(model_dir, overlay):
    """The overlays oga's side applies: the scenario's, then 0.18's no-preemption scheduling on a
    dynamic-batching directory (an overlay on a static one would turn dynamic batching on)."""
    try:
        with open(os.path.join(model_dir, "genai_config.json")) as f:
            dynamic = bool(json.load(f).get("engine", {}).get("dynamic_batching"))
    except (OSError, ValueError, AttributeError):
        dynamic = False  # a scenario's broken directory: created exactly as 0.18 sees it
    return [o for o in (overlay, PREEMPTION_NONE if dynamic else None) if o]


# ---------------------------------------------------------------------------------------------
class _Base:
    """State and the action dispatch shared by both backends."""

    backend = ""

    def __init__(self, impl: str, model_dir: str, overlay: str | None):
        self.impl = impl
        self.model_dir = model_dir
        self.overlay = overlay
        self.engines = {}
        self.reqs = {}
        self.opts = {}
        self.bufs = {}
        self.models = {}
        self.auto_bufs = {}
        self.released = {}
        self.views = {}

    # -- dispatch ---------------------------------------------------------------------------
    def do(self, action):
        op = action["op"]
        try:
            if op == "only":
                if action["impl"] != self.impl:
                    return ("skipped", action["why"])
                return self.do(action["action"])
            if op == "off_thread":
                box = {}
                t = threading.Thread(target=lambda: box.setdefault("r", self.do(action["action"])))
                t.start()
                t.join()
                return ("off_thread", box.get("r"))
            return getattr(self, "op_" + op)(action)
        except Exception as e:  # noqa: BLE001 -- every raising action is recorded
            return _exc(e)

    def label_of_request(self, key):
        for name, h in self.reqs.items():
            if self._key(h) == key:
                return name
        for name, k in self.released.items():
            if k == key:
                return name + "(released)"
        return None if key is None else "<unknown>"

    def op_drain(self, a):
        runs = []
        for _ in range(a["limit"]):
            try:
                if not self._pending(a["engine"]):
                    return runs
            except Exception as e:  # noqa: BLE001
                runs.append(("pending",) + _exc(e))
                return runs
            rec = self._run_record(a)
            runs.append(rec)
            if isinstance(rec, tuple) and rec and rec[0] == "raise":
                return runs
        runs.append("limit reached")
        return runs

    def op_run(self, a):
        recs = [self._run_record(a) for _ in range(a["times"])]
        return recs[0] if a["times"] == 1 else recs

    def _run_record(self, a):
        try:
            return {"events": self._run(a)}
        except Exception as e:  # noqa: BLE001
            return _exc(e)

    def op_pending(self, a):
        return self._pending(a["engine"])

    def _buffer_for(self, a):
        if a.get("buf"):
            return self.bufs[a["buf"]]
        key = (a["engine"], a["capacity"])
        if key not in self.auto_bufs:
            self.auto_bufs[key] = self._create_buffer(a["engine"], a["capacity"])
        return self.auto_bufs[key]

    def op_buffer(self, a):
        self.bufs[a["buf"]] = self._create_buffer(a["engine"], a["capacity"])

    def op_engine(self, a):
        self.engines[a["engine"]] = self._create_engine(self._default_model() if a["model"] is None
                                                        else self.models[a["model"]])

    def op_model(self, a):
        self.models[a["name"]] = self._create_model(a["overlay"])

    def op_engine_from(self, a):
        self.engines[a["engine"]] = self._create_engine(self.models[a["model_name"]])


# ---------------------------------------------------------------------------------------------
class PythonRunner(_Base):
    backend = "python"
    _model_cache = {}

    def __init__(self, impl, model_dir, overlay):
        super().__init__(impl, model_dir, overlay)
        self.og = python_module(impl)

    def _key(self, h):
        return id(h)

    def _create_model(self, overlay):
        og = self.og
        overlays = oga_overlays(self.model_dir, overlay) if self.impl == "oga" else [o for o in (overlay,) if o]
        if not overlays:
            return og.Model(self.model_dir)
        config = og.Config(self.model_dir)
        for o in overlays:
            config.overlay(o)
        return og.Model(config)

    def _default_model(self):
        key = (self.impl, self.model_dir, self.overlay)
        m = PythonRunner._model_cache.get(key)
        if m is None:
            m = PythonRunner._model_cache[key] = self._create_model(self.overlay)
        return m

    def _create_engine(self, model):
        return self.og.Engine(model)

    def _create_buffer(self, engine, capacity):
        return self.engines[engine].create_event_buffer(capacity)

    def _pending(self, engine):
        return self.engines[engine].has_pending_requests()

    def _run(self, a):
        buf = self._buffer_for(a)
        result = self.engines[a["engine"]].run(buf)
        evs = []
        for ev in result:
            u = ev.usage
            evs.append((int(ev.flags), self.label_of_request(None if ev.request is None else id(ev.request)),
                        ev.turn_id, ev.token, int(ev.finish_reason), ev.matched_stop_string_index,
                        int(ev.error_code), (u.prompt_tokens, u.generated_tokens, u.cached_prompt_tokens)))
        if result is not buf:
            evs.append(("returned", type(result).__name__))
        return evs

    def op_create(self, a):
        og = self.og
        if a["options"]:
            o = og.RequestOptions()
            if a["max_session"] is not None:
                o.set_max_session_tokens(a["max_session"])
            r = self.engines[a["engine"]].create_request(options=o)
        else:
            r = self.engines[a["engine"]].create_request()
        self.reqs[a["req"]] = r

    def _set(self, o, name, value):
        if name in NO_VALUE:
            getattr(o, name)()
        elif name == "guidance":
            o.set_guidance(*value)
        else:
            getattr(o, "set_" + name)(value)

    def op_turn_options(self, a):
        o = self.og.TurnOptions(self.reqs[a["req"]])
        self.opts[a["opts"]] = o
        for name, value in a["setters"].items():
            self._set(o, name, value)

    def op_set_option(self, a):
        self._set(self.opts[a["opts"]], a["name"], a["value"])

    def op_begin(self, a):
        r = self.reqs[a["req"]]
        if a["opts"] is not None:
            return r.begin_turn(a["tokens"], self.opts[a["opts"]])
        if a["max_gen"] is None and a["min_gen"] is None:
            return r.begin_turn(a["tokens"])
        o = self.og.TurnOptions(r)
        if a["max_gen"] is not None:
            o.set_max_generated_tokens(a["max_gen"])
        if a["min_gen"] is not None:
            o.set_min_generated_tokens(a["min_gen"])
        return r.begin_turn(a["tokens"], o)

    def op_cancel(self, a):
        return self.reqs[a["req"]].cancel_turn(a["turn_id"])

    def op_rewind(self, a):
        return self.reqs[a["req"]].rewind_to_start_of_turn(a["turn_id"])

    def op_close(self, a):
        return self.reqs[a["req"]].close()

    def op_release(self, a):
        r = self.reqs.pop(a["req"])
        self.released[a["req"]] = id(r)
        del r
        gc.collect()

    def op_release_options(self, a):
        del self.opts[a["opts"]]
        gc.collect()

    def op_release_buffer(self, a):
        del self.bufs[a["buf"]]
        gc.collect()

    def op_destroy_engine(self, a):
        del self.engines[a["engine"]]
        for key in [k for k in self.auto_bufs if k[0] == a["engine"]]:
            del self.auto_bufs[key]
        gc.collect()

    def op_drafts(self, a):
        return self.reqs[a["req"]].set_draft_tokens(a["tokens"])

    def op_max_drafts(self, a):
        return self.engines[a["engine"]].max_draft_tokens_per_proposal()

    def op_spec_stats(self, a):
        stats = self.engines[a["engine"]].get_speculative_stats()
        return {k: stats[k] for k in a["keys"]}

    def op_capabilities(self, a):
        c = self.engines[a["engine"]].get_capabilities()
        return (c.configured_max_batch_size, c.max_scheduled_tokens, c.max_request_length)

    def _resolve(self, v):
        if isinstance(v, tuple) and v and v[0] == "$ref":
            kind, name = v[1], v[2]
            if kind == "event":
                return self.bufs[name[0]][name[1]]
            if kind == "view":
                return self.views[name]
            if kind == "model" and name == "$default":
                return self._default_model()
            return {"req": self.reqs, "opts": self.opts, "buf": self.bufs, "engine": self.engines,
                    "model": self.models}[kind][name]
        if isinstance(v, tuple) and v and v[0] == "$null":
            return None
        return v

    def op_py(self, a):
        try:
            return self._py(a)
        except Exception as e:  # noqa: BLE001
            if a.get("message", True):
                raise
            return ("raise", type(e).__name__)

    def _py(self, a):
        target = self.og if a["target"] == "module" else self._resolve(a["target"])
        args = [self._resolve(x) for x in a["args"]]
        kwargs = {k: self._resolve(v) for k, v in a["kwargs"].items()}
        method = a["method"]
        if method.startswith("."):
            result = getattr(target, method[1:])
        else:
            result = getattr(target, method)(*args, **kwargs)
        if result is None or isinstance(result, (bool, int, str, float)):
            return result
        if hasattr(result, "name") and hasattr(result, "__int__"):  # pybind / Cython enums
            return int(result)
        if a.get("store"):
            self.views[a["store"]] = result
        if any(result is x for x in args) or result is target:
            return "$same"
        for name, r in self.reqs.items():
            if result is r:
                return "$req:" + name
        return "<" + self._public_type(result) + ">"

    PUBLIC_TYPES = ("Engine", "Request", "RequestOptions", "TurnOptions", "EngineEventBuffer", "EngineEvent",
                    "TurnUsage", "EngineCapabilities", "GeneratorParams", "Model", "Config")

    def _public_type(self, obj):
        """The module's public name of obj's type (oga's classes are OgaX with 0.18 aliases)."""
        for name in self.PUBLIC_TYPES:
            cls = getattr(self.og, name, None)
            if isinstance(cls, type) and isinstance(obj, cls):
                return name
        if isinstance(obj, list):
            return "list"
        return "other:" + type(obj).__name__

    def op_capi(self, a):
        return ("skipped", "C-only action")

    def close_all(self):
        self.views.clear()
        self.opts.clear()
        self.reqs.clear()
        self.bufs.clear()
        self.auto_bufs.clear()
        self.engines.clear()
        self.models.clear()
        gc.collect()


# ---------------------------------------------------------------------------------------------
class CtypesRunner(_Base):
    backend = "ctypes"
    _model_cache = {}

    def __init__(self, impl, model_dir, overlay):
        super().__init__(impl, model_dir, overlay)
        self.lib = load_library(impl)

    def _key(self, h):
        return h.value

    def check(self, res):
        if res:
            msg = self.lib.OgaResultGetError(res)
            self.lib.OgaDestroyResult(res)
            raise Raised(msg.decode() if msg is not None else "<null message>")

    def _create_model(self, overlay):
        lib = self.lib
        m = P()
        overlays = oga_overlays(self.model_dir, overlay) if self.impl == "oga" else [o for o in (overlay,) if o]
        if not overlays:
            self.check(lib.OgaCreateModel(self.model_dir.encode(), byref(m)))
            return m
        cfg = P()
        self.check(lib.OgaCreateConfig(self.model_dir.encode(), byref(cfg)))
        try:
            for o in overlays:
                self.check(lib.OgaConfigOverlay(cfg, o.encode()))
            self.check(lib.OgaCreateModelFromConfig(cfg, byref(m)))
        finally:
            lib.OgaDestroyConfig(cfg)
        return m

    def _default_model(self):
        key = (self.impl, self.model_dir, self.overlay)
        m = CtypesRunner._model_cache.get(key)
        if m is None:
            m = CtypesRunner._model_cache[key] = self._create_model(self.overlay)
        return m

    def _create_engine(self, model):
        e = P()
        self.check(self.lib.OgaCreateEngine(model, byref(e)))
        return e

    def _create_buffer(self, engine, capacity):
        b = P()
        self.check(self.lib.OgaCreateEngineEventBuffer(self.engines[engine], capacity, byref(b)))
        return b

    def _pending(self, engine):
        out = c_bool()
        self.check(self.lib.OgaEngineHasPendingRequests(self.engines[engine], byref(out)))
        return out.value

    def read_event(self, ev):
        lib = self.lib
        flags, reason, code = c_uint32(), c_uint32(), c_uint32()
        tid, token, stop = c_uint64(), c_int32(), c_int32()
        req, usage = P(), P()
        self.check(lib.OgaEngineEventGetFlags(ev, byref(flags)))
        self.check(lib.OgaEngineEventGetRequest(ev, byref(req)))
        self.check(lib.OgaEngineEventGetTurnId(ev, byref(tid)))
        self.check(lib.OgaEngineEventGetToken(ev, byref(token)))
        self.check(lib.OgaEngineEventGetFinishReason(ev, byref(reason)))
        self.check(lib.OgaEngineEventGetMatchedStopStringIndex(ev, byref(stop)))
        self.check(lib.OgaEngineEventGetErrorCode(ev, byref(code)))
        self.check(lib.OgaEngineEventGetUsage(ev, byref(usage)))
        u = []
        for getter in ("OgaTurnUsageGetPromptTokens", "OgaTurnUsageGetGeneratedTokens",
                       "OgaTurnUsageGetCachedPromptTokens"):
            v = c_uint64()
            self.check(getattr(lib, getter)(usage, byref(v)))
            u.append(v.value)
        return (flags.value, self.label_of_request(req.value), tid.value, token.value, reason.value, stop.value,
                code.value, tuple(u))

    def _run(self, a):
        lib = self.lib
        buf = self._buffer_for(a)
        self.check(lib.OgaEngineRun(self.engines[a["engine"]], buf))
        n = lib.OgaEngineEventBufferGetCount(buf)
        evs = [self.read_event(lib.OgaEngineEventBufferGet(buf, i)) for i in range(n)]
        if lib.OgaEngineEventBufferGet(buf, n) is not None:
            evs.append(("Get(count) is not NULL",))
        return evs

    def op_create(self, a):
        lib = self.lib
        o = P()
        if a["options"]:
            self.check(lib.OgaCreateRequestOptions(byref(o)))
        try:
            if a["max_session"] is not None:
                self.check(lib.OgaRequestOptionsSetMaxSessionTokens(o, a["max_session"]))
            r = P()
            self.check(lib.OgaEngineCreateRequest(self.engines[a["engine"]], o, byref(r)))
        finally:
            if o:
                lib.OgaDestroyRequestOptions(o)
        self.reqs[a["req"]] = r

    def _set(self, o, name, value):
        fn = getattr(self.lib, SETTERS[name])
        if name == "guidance":
            self.check(fn(o, value[0].encode(), value[1].encode()))
        elif name == "stop_strings":
            arr = P()
            self.check(self.lib.OgaCreateStringArray(byref(arr)))
            try:
                for text in value:
                    self.check(self.lib.OgaStringArrayAddString(arr, text.encode()))
                self.check(fn(o, arr))
            finally:
                self.lib.OgaDestroyStringArray(arr)
        else:
            self.check(fn(o) if name in NO_VALUE else fn(o, value))

    def op_turn_options(self, a):
        o = P()
        self.check(self.lib.OgaRequestCreateTurnOptions(self.reqs[a["req"]], byref(o)))
        self.opts[a["opts"]] = o
        for name, value in a["setters"].items():
            self._set(o, name, value)

    def op_set_option(self, a):
        self._set(self.opts[a["opts"]], a["name"], a["value"])

    def op_begin(self, a):
        lib = self.lib
        r = self.reqs[a["req"]]
        own = None
        if a["opts"] is not None:
            o = self.opts[a["opts"]]
        elif a["max_gen"] is None and a["min_gen"] is None:
            o = None
        else:
            own = o = P()
            self.check(lib.OgaRequestCreateTurnOptions(r, byref(o)))
        try:
            if own is not None:
                if a["max_gen"] is not None:
                    self._set(o, "max_generated_tokens", a["max_gen"])
                if a["min_gen"] is not None:
                    self._set(o, "min_generated_tokens", a["min_gen"])
            toks = a["tokens"]
            arr = (c_int32 * max(1, len(toks)))(*toks)
            tid = c_uint64()
            self.check(lib.OgaRequestBeginTurn(r, o, arr, len(toks), byref(tid)))
            return tid.value
        finally:
            if own is not None:
                lib.OgaDestroyTurnOptions(own)

    def op_cancel(self, a):
        out = c_bool()
        self.check(self.lib.OgaRequestCancelTurn(self.reqs[a["req"]], a["turn_id"], byref(out)))
        return out.value

    def op_rewind(self, a):
        self.check(self.lib.OgaRequestRewindToStartOfTurn(self.reqs[a["req"]], a["turn_id"]))

    def op_close(self, a):
        self.check(self.lib.OgaRequestClose(self.reqs[a["req"]]))

    def op_release(self, a):
        r = self.reqs.pop(a["req"])
        self.released[a["req"]] = r.value
        self.lib.OgaDestroyRequest(r)

    def op_release_options(self, a):
        self.lib.OgaDestroyTurnOptions(self.opts.pop(a["opts"]))

    def op_release_buffer(self, a):
        self.lib.OgaDestroyEngineEventBuffer(self.bufs.pop(a["buf"]))

    def op_destroy_engine(self, a):
        self.lib.OgaDestroyEngine(self.engines.pop(a["engine"]))
        for key in [k for k in self.auto_bufs if k[0] == a["engine"]]:
            self.lib.OgaDestroyEngineEventBuffer(self.auto_bufs.pop(key))

    def op_drafts(self, a):
        lib = self.lib
        seqs = P()
        self.check(lib.OgaCreateSequences(byref(seqs)))
        try:
            toks = a["tokens"]
            arr = (c_int32 * max(1, len(toks)))(*toks)
            self.check(lib.OgaAppendTokenSequence(arr, len(toks), seqs))
            self.check(lib.OgaRequestSetDraftTokens(self.reqs[a["req"]], seqs))
        finally:
            lib.OgaDestroySequences(seqs)

    def op_max_drafts(self, a):
        out = c_size_t()
        self.check(self.lib.OgaEngineMaxDraftTokensPerProposal(self.engines[a["engine"]], byref(out)))
        return out.value

    def op_spec_stats(self, a):
        lib = self.lib
        stats = P()
        self.check(lib.OgaEngineGetSpeculativeStats(self.engines[a["engine"]], byref(stats)))
        try:
            values = {}
            for k in a["keys"]:
                v = c_uint64()
                self.check(lib.OgaSpeculativeStatsGetCount(stats, k.encode(), byref(v)))
                values[k] = v.value
            return values
        finally:
            lib.OgaDestroySpeculativeStats(stats)

    def op_capabilities(self, a):
        lib = self.lib
        c = P()
        self.check(lib.OgaEngineGetCapabilities(self.engines[a["engine"]], byref(c)))
        v = (lib.OgaEngineCapabilitiesGetConfiguredMaxBatchSize(c), lib.OgaEngineCapabilitiesGetMaxScheduledTokens(c),
             lib.OgaEngineCapabilitiesGetMaxRequestLength(c))
        lib.OgaDestroyEngineCapabilities(c)
        return v

    def _resolve(self, v, outs, keep):
        if isinstance(v, tuple) and v:
            tag = v[0]
            if tag == "$null":
                return None
            if tag == "$ref":
                kind, name = v[1], v[2]
                if kind in ("event", "usage"):
                    ev = self.lib.OgaEngineEventBufferGet(self.bufs[name[0]], name[1])
                    if kind == "event":
                        return ev
                    u = P()
                    self.check(self.lib.OgaEngineEventGetUsage(ev, byref(u)))
                    return u
                return {"req": self.reqs, "opts": self.opts, "buf": self.bufs, "engine": self.engines,
                        "model": self.models}[kind][name]
            if tag == "$out":
                o = OUT_TYPES[v[1]](SENTINELS[v[1]])
                outs.append((v[1], o))
                return byref(o)
            if tag == "$ids":
                arr = (c_int32 * max(1, len(v[1])))(*v[1])
                keep.append(arr)
                return arr
        return v

    def op_capi(self, a):
        outs, keep = [], []
        args = [self._resolve(x, outs, keep) for x in a["args"]]
        fn = getattr(self.lib, a["fn"])
        res = fn(*args)
        err = None
        if fn.restype is RES:
            if res:
                msg = self.lib.OgaResultGetError(res)
                self.lib.OgaDestroyResult(res)
                err = _message(msg.decode()) if msg is not None else "<null message>"
        elif fn.restype is P:
            err = ("returned", "null" if res is None else "nonnull")
        elif fn.restype is not None:
            err = ("returned", res)
        values = []
        for kind, o in outs:
            if kind == "c_void_p":
                values.append("null" if not o.value else ("sentinel" if o.value == 0x77 else "nonnull"))
            else:
                values.append(o.value)
        return (err, values) if a.get("outs", True) else err

    def op_py(self, a):
        return ("skipped", "Python-only action")

    def close_all(self):
        lib = self.lib
        for o in self.opts.values():
            lib.OgaDestroyTurnOptions(o)
        for r in self.reqs.values():
            if r:
                lib.OgaDestroyRequest(r)
        for b in list(self.bufs.values()) + list(self.auto_bufs.values()):
            lib.OgaDestroyEngineEventBuffer(b)
        for e in self.engines.values():
            if e:
                lib.OgaDestroyEngine(e)
        for m in self.models.values():
            if m:
                lib.OgaDestroyModel(m)
        self.opts.clear()
        self.reqs.clear()
        self.bufs.clear()
        self.auto_bufs.clear()
        self.engines.clear()
        self.models.clear()


RUNNERS = {"python": PythonRunner, "ctypes": CtypesRunner}


def action_label(i: int, action) -> str:
    if "label" in action:
        return action["label"]
    op = action["op"]
    detail = ""
    inner = action
    while inner["op"] in ("off_thread", "only"):
        inner = inner["action"]
        op = op + ">" + inner["op"]
    for key in ("req", "fn", "method", "engine", "capacity", "turn_id"):
        if key in inner and inner[key] is not None and not (key == "engine" and inner[key] == "e"):
            detail += f" {key}={inner[key]}"
    return f"#{i} {op}{detail}"


def run_scenario(scenario, backend: str, impl: str, model_dir: str, overlay: str | None = None):
    """Executes `scenario` and returns its records [(label, value), ...]."""
    runner = RUNNERS[backend](impl, model_dir, overlay)
    records = []
    try:
        first = runner.do({"op": "engine", "engine": "e", "model": None})
        if first is not None:
            records.append(("#engine", first))
            return records
        for i, action in enumerate(scenario.actions):
            records.append((action_label(i, action), runner.do(action)))
    finally:
        runner.close_all()
    return records


def dumps(records) -> str:
    return "\n".join(f"{label}: {json.dumps(value, default=repr)}" for label, value in records)
