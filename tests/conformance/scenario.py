"""Conformance scenarios as data.

A `Scenario` names a model configuration (a key of `MODEL_CONFIGS`, built by the suite itself), a
list of `Action`s (plain dicts built by the constructors below) and, optionally, the deliberate
differences oga declares for it. `runner.py` executes the actions against `onnxruntime_genai` 0.18
or against `oga`, through Python or through the C ABI (ctypes), and records one entry per action:
`(label, value)`. An action that raises records `("raise", exception type name, message)` (through
ctypes: `("raise", "OgaResult", message)`) instead of failing the scenario.

Handles are referred to by name: requests (`req`), turn options (`opts`), event buffers (`buf`),
engines (`engine`, default "e", created from the scenario's model before the first action).
Generic Python calls (`py`) and C calls (`capi`) take symbolic arguments (see `ref`, `out`, `ids`).

Recorded event shape (both backends):
    (flags, request label, turn_id, token, finish_reason, matched_stop_string_index, error_code,
     (prompt_tokens, generated_tokens, cached_prompt_tokens))
Python records the properties as the binding returns them (`token` None without TOKEN, the stop
index None unless STOP_STRING); ctypes records the raw C outputs (0 / -1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# ---------------------------------------------------------------------------------------------
# Model configurations (test_conformance.py builds each once per session)
# ---------------------------------------------------------------------------------------------
# Every configuration is a 2-layer hidden-64 random llama (vocab 97, EOS 2, context 64, seed 3)
# built by oga.models.build for CPU (standard-op paged attention). `overlay` is applied with
# og.Config.overlay / OgaConfigOverlay before the model is created (empty: og.Model(dir)).
# `tokenizer` adds tokenizer files (tokenizer_fixture.py): "full" (tokenizer.json and
# tokenizer_config.json), "json_only", "invalid_utf8" (full, some token texts replaced), "spm".
MODEL_CONFIGS: Dict[str, dict] = {
    # block 4, plenty of blocks: max_request_length = min(64, 64*4+1) = 64
    "base": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=64),
    # 5 blocks of 4 -> max_request_length 21; two 12-token prompts cannot be resident together
    "tight": dict(block_size=4, num_blocks=5, max_batch_size=4, max_scheduled_tokens=64),
    # residency pressure: at most two committed residents
    "batch2": dict(block_size=4, num_blocks=64, max_batch_size=2, max_scheduled_tokens=64),
    # chunked prefill: two query tokens per model run
    "chunk": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=2),
    # search.max_length 20 < max_request_length 64 (session default vs explicit cap)
    "maxlen20": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=64,
                     overlay='{"search": {"max_length": 20}}'),
    # "base" plus tokenizer.json and tokenizer_config.json (tokenizer_fixture.py): stop strings and
    # guidance need the tokenizer, and 0.18 loads it only when both files are there
    "tok": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=64, tokenizer="full"),
    # "base" plus tokenizer.json only
    "tok_json_only": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=64,
                          tokenizer="json_only"),
    # "tok" with tokens whose bytes never form a character (tokenizer_fixture.INVALID_UTF8)
    "tok_invalid_utf8": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=64,
                             tokenizer="invalid_utf8"),
    # "tok" in the SentencePiece layout of Llama 2's tokenizer.json (tokenizer_fixture.write_spm_tokenizer)
    "tok_spm": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=64, tokenizer="spm"),
    # "chunk" with engine.dynamic_batching.prefix_caching false: 0.18 caches prefixes unless told not
    # to (oga has no prefix cache); `same_as` reuses that configuration's directory
    "chunk_noprefix": dict(same_as="chunk", overlay='{"engine": {"dynamic_batching": {"prefix_caching": false}}}'),
    # "base" whose decoder returns one logits row per packed token (oga.models.build
    # per_token_logits=True): both 0.18 and oga verify caller-supplied drafts on it
    # (max_draft_tokens_per_proposal() == 7); the tokenizer lets a guided turn reach the drafts check
    "drafts": dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=64, per_token_logits=True,
                   tokenizer="full"),
}

MODEL_SEED = 3


def model_spec():
    from oga.models.random_weights import tiny_spec

    # 2 layers, hidden 64, GQA 4/2, untied embeddings (tied random embeddings only repeat the last token)
    return tiny_spec(vocab_size=97, context_length=64)


def build_model_dirs(root) -> Dict[str, Tuple[str, Optional[str]]]:
    """{configuration name: (directory, overlay or None)}; builds the missing directories under root."""
    import os

    from oga.models import build

    dirs = {}
    for name, cfg in MODEL_CONFIGS.items():
        cfg = dict(cfg)
        overlay = cfg.pop("overlay", None)
        tokenizer = cfg.pop("tokenizer", None)
        if "same_as" in cfg:
            dirs[name] = (dirs[cfg["same_as"]][0], overlay)
            continue
        path = os.path.join(str(root), name)
        if not os.path.exists(os.path.join(path, "genai_config.json")):
            build(None, path, random_spec=model_spec(), seed=MODEL_SEED, context_length=64, graph="standard", **cfg)
        if tokenizer is not None and not os.path.exists(os.path.join(path, "tokenizer.json")):
            from tokenizer_fixture import INVALID_UTF8, write_tokenizer

            write_tokenizer(path, with_config=tokenizer != "json_only",
                            overrides=INVALID_UTF8 if tokenizer == "invalid_utf8" else None,
                            style="spm" if tokenizer == "spm" else "byte_level")
        dirs[name] = (path, overlay)
    dirs.update(build_ring_model_dirs(root))
    dirs.update(build_hybrid_model_dirs(root))
    # The static path runs OGA's own CPU build (contiguous GroupQueryAttention caches), made by
    # onnxruntime-genai's builder from a fixed random Llama checkpoint (tests/static_models.py).
    from static_models import build_tiny_llama

    path = os.path.join(str(root), "static")
    if not os.path.exists(os.path.join(path, ".complete")):
        build_tiny_llama(path, max_length=64)
        open(os.path.join(path, ".complete"), "w").close()
    dirs["static"] = (path, None)
    return dirs


# ---------------------------------------------------------------------------------------------
# Sliding-window ring models (seed "Sliding-window paged layers")
# ---------------------------------------------------------------------------------------------
# 3-layer variants of the suite's model (vocab 97, EOS 2, context 64, seed 3) whose layers 0 and 2
# keep their K/V in a sliding-window ring (`DecoderSpec.sliding_window_layers`, layer 1 keeps the
# whole sequence), block size 4, search.chunk_size C: each request gets R = ceil((C + W - 1) / 4)
# ring blocks. "ring4": W 10, C 4 (R 4: 16 ring slots); "ring6": W 9, C 6 (R 4). A key with
# `same_as` reuses a directory with an overlay; `drop_chunk_size` copies the directory without
# search.chunk_size (the key absent, which an overlay cannot express).
RING_MODEL_CONFIGS: Dict[str, dict] = {
    "ring4": dict(window=10, layers=[0, 2], chunk_size=4, block_size=4, num_blocks=64, max_batch_size=4,
                  max_scheduled_tokens=64),
    "ring6": dict(window=9, layers=[0, 2], chunk_size=6, block_size=4, num_blocks=64, max_batch_size=4,
                  max_scheduled_tokens=64),
    # at most two residents: a third request waits for a ring to come free
    "ring4_batch2": dict(same_as="ring4", overlay='{"engine": {"dynamic_batching": {"max_batch_size": 2}}}'),
    # the global budget (3) below C (4): prefill steps carry 3 query tokens
    "ring4_budget3": dict(same_as="ring4", overlay='{"engine": {"dynamic_batching": {"max_scheduled_tokens": 3}}}'),
    # search.chunk_size absent
    "ring4_nochunk": dict(same_as="ring4", drop_chunk_size=True),
}


def ring_model_spec(window, layers):
    from oga.models.random_weights import tiny_spec

    return tiny_spec(vocab_size=97, context_length=64, num_layers=3, sliding_window=window,
                     sliding_window_layers=list(layers))


def build_ring_model_dirs(root) -> Dict[str, Tuple[str, Optional[str]]]:
    """{configuration name: (directory, overlay or None)} for RING_MODEL_CONFIGS; builds the missing ones."""
    import json
    import os
    import shutil

    from oga.models import build

    dirs = {}
    for name, cfg in RING_MODEL_CONFIGS.items():
        cfg = dict(cfg)
        overlay = cfg.pop("overlay", None)
        path = os.path.join(str(root), name)
        if cfg.pop("drop_chunk_size", False):
            source = dirs[cfg["same_as"]][0]
            if not os.path.exists(os.path.join(path, "genai_config.json")):
                shutil.copytree(source, path)
                with open(os.path.join(path, "genai_config.json"), encoding="utf-8") as f:
                    config = json.load(f)
                del config["search"]["chunk_size"]
                with open(os.path.join(path, "genai_config.json"), "w", encoding="utf-8") as f:
                    json.dump(config, f, indent=4)
            dirs[name] = (path, overlay)
            continue
        if "same_as" in cfg:
            dirs[name] = (dirs[cfg["same_as"]][0], overlay)
            continue
        if not os.path.exists(os.path.join(path, "genai_config.json")):
            spec = ring_model_spec(cfg.pop("window"), cfg.pop("layers"))
            build(None, path, random_spec=spec, seed=MODEL_SEED, context_length=64, graph="standard", **cfg)
        dirs[name] = (path, overlay)
    return dirs


# ---------------------------------------------------------------------------------------------
# Hybrid models (fixed_conv / fixed_recurrent state groups beside paged_kv)
# ---------------------------------------------------------------------------------------------
# Random decoders (vocab 97, EOS 2, hidden 64, seed 3) whose short-convolution ("conv", kernel 3) and
# linear-recurrent ("recurrent") layers keep one fixed-size state row per request beside the paged
# attention layers, block size 4, context 128, 96 blocks (three residents of 128 tokens).
# "hybrid_crca": conv, attention, recurrent, attention; 3 slots, 8 query tokens per step (a 40-token
# prompt prefills in five steps). "hybrid_mixed5": recurrent, conv, attention, conv, recurrent (one KV
# head, tied embeddings); 3 slots, 6 query tokens per step. Both set engine.dynamic_batching.prefix_caching
# false in genai_config.json, so that usage does not depend on earlier scenarios' prompts; `prefix_caching`
# None drops the key instead ("hybrid_crca_prefix": the same graph with the key absent: prefix caching up
# to fixed-state checkpoints). "hybrid_drafts": "hybrid_crca" built with per_token_logits but without
# per-token fixed-state outputs: both report 0 draft tokens per proposal; "hybrid_drafts_capture" has
# them (oga verifies drafts, 0.18 does not). "hybrid_crca_static": no engine.dynamic_batching. A key
# with `same_as` reuses a directory with an overlay; `copy_of` copies a directory and rewrites its
# genai_config.json.
HYBRID_MODEL_CONFIGS: Dict[str, dict] = {
    "hybrid_crca": dict(layer_types=["conv", "attention", "recurrent", "attention"], block_size=4, num_blocks=96,
                        max_batch_size=3, max_scheduled_tokens=8, prefix_caching=False),
    "hybrid_mixed5": dict(layer_types=["recurrent", "conv", "attention", "conv", "recurrent"], num_kv_heads=1,
                          tie_word_embeddings=True, block_size=4, num_blocks=96, max_batch_size=3,
                          max_scheduled_tokens=6, prefix_caching=False),
    # prefix caching absent: 0.18 adopts cached blocks up to a fixed-state checkpoint, oga caches nothing
    "hybrid_crca_prefix": dict(copy_of="hybrid_crca", prefix_caching=None),
    # at most two residents
    "hybrid_crca_batch2": dict(same_as="hybrid_crca",
                               overlay='{"engine": {"dynamic_batching": {"max_batch_size": 2}}}'),
    "hybrid_drafts": dict(layer_types=["conv", "attention", "recurrent", "attention"], block_size=4, num_blocks=96,
                          max_batch_size=3, max_scheduled_tokens=8, prefix_caching=False, per_token_logits=True,
                          state_capture=False),
    "hybrid_drafts_capture": dict(layer_types=["conv", "attention", "recurrent", "attention"], block_size=4,
                                  num_blocks=96, max_batch_size=3, max_scheduled_tokens=8, prefix_caching=False,
                                  per_token_logits=True),
    "hybrid_crca_static": dict(copy_of="hybrid_crca", prefix_caching=None, drop_dynamic_batching=True),
}


def hybrid_model_spec(layer_types, **overrides):
    from oga.models.random_weights import tiny_spec

    return tiny_spec(vocab_size=97, context_length=128, num_layers=len(layer_types), layer_types=list(layer_types),
                     conv_kernel=3, **overrides)


def _edit_genai_config(path, prefix_caching, drop_dynamic_batching=False):
    """Sets (or, for None, removes) engine.dynamic_batching.prefix_caching in path/genai_config.json, or
    removes engine.dynamic_batching."""
    import json
    import os

    config_path = os.path.join(path, "genai_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    batching = config["engine"]["dynamic_batching"]
    if drop_dynamic_batching:
        del config["engine"]["dynamic_batching"]
    elif prefix_caching is None:
        batching.pop("prefix_caching", None)
    else:
        batching["prefix_caching"] = prefix_caching
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=4)


def build_hybrid_model_dirs(root) -> Dict[str, Tuple[str, Optional[str]]]:
    """{configuration name: (directory, overlay or None)} for HYBRID_MODEL_CONFIGS; builds the missing ones."""
    import os
    import shutil

    from oga.models import build

    dirs = {}
    for name, cfg in HYBRID_MODEL_CONFIGS.items():
        cfg = dict(cfg)
        overlay = cfg.pop("overlay", None)
        path = os.path.join(str(root), name)
        if "same_as" in cfg:
            dirs[name] = (dirs[cfg["same_as"]][0], overlay)
            continue
        prefix_caching = cfg.pop("prefix_caching")
        if "copy_of" in cfg:
            if not os.path.exists(os.path.join(path, "genai_config.json")):
                shutil.copytree(dirs[cfg["copy_of"]][0], path)
                _edit_genai_config(path, prefix_caching, cfg.get("drop_dynamic_batching", False))
            dirs[name] = (path, overlay)
            continue
        if not os.path.exists(os.path.join(path, "genai_config.json")):
            overrides = {k: cfg.pop(k) for k in ("num_kv_heads", "tie_word_embeddings") if k in cfg}
            spec = hybrid_model_spec(cfg.pop("layer_types"), **overrides)
            build(None, path, random_spec=spec, seed=MODEL_SEED, context_length=128, graph="standard", **cfg)
            _edit_genai_config(path, prefix_caching)
        dirs[name] = (path, overlay)
    return dirs


# ---------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------
Action = dict


def _a(op: str, label: Optional[str] = None, **kw) -> Action:
    kw["op"] = op
    if label is not None:
        kw["label"] = label
    return kw


def create(req: str, max_session: Optional[int] = None, engine: str = "e", label=None, options=True) -> Action:
    """engine.create_request(options=RequestOptions(set_max_session_tokens(max_session)))."""
    return _a("create", label, req=req, max_session=max_session, engine=engine, options=options)


def turn_options(opts: str, req: str, label=None, **setters) -> Action:
    """opts = TurnOptions(req); then opts.set_<name>(value) for every setter given."""
    return _a("turn_options", label, opts=opts, req=req, setters=setters)


def set_option(opts: str, name: str, value=None, label=None) -> Action:
    """opts.set_<name>(value) (or opts.<name>() for reset / clear_seed / clear_guidance)."""
    return _a("set_option", label, opts=opts, name=name, value=value)


def begin(req: str, tokens: Sequence[int], opts: Optional[str] = None, max_gen: Optional[int] = None,
          min_gen: Optional[int] = None, label=None) -> Action:
    """req.begin_turn(tokens, options). With max_gen/min_gen a fresh TurnOptions for this call;
    with opts a named one; neither: no options (None)."""
    return _a("begin", label, req=req, tokens=list(tokens), opts=opts, max_gen=max_gen, min_gen=min_gen)


def buffer(buf: str, capacity: int, engine: str = "e", label=None) -> Action:
    return _a("buffer", label, buf=buf, capacity=capacity, engine=engine)


def run(capacity: Optional[int] = None, buf: Optional[str] = None, engine: str = "e", times: int = 1,
        label=None) -> Action:
    """`times` runs; each records its events. Without `buf`, the engine's buffer of `capacity`."""
    return _a("run", label, capacity=capacity, buf=buf, engine=engine, times=times)


def drain(capacity: int = 64, buf: Optional[str] = None, engine: str = "e", limit: int = 200, label=None) -> Action:
    """while has_pending_requests(): run. Records every run's events (and a raising call)."""
    return _a("drain", label, capacity=capacity, buf=buf, engine=engine, limit=limit)


def pending(engine: str = "e", label=None) -> Action:
    return _a("pending", label, engine=engine)


def cancel(req: str, turn_id: int, label=None) -> Action:
    return _a("cancel", label, req=req, turn_id=turn_id)


def rewind(req: str, turn_id: int, label=None) -> Action:
    """req.rewind_to_start_of_turn(turn_id) / OgaRequestRewindToStartOfTurn; records None or the raise."""
    return _a("rewind", label, req=req, turn_id=turn_id)


def close(req: str, label=None) -> Action:
    return _a("close", label, req=req)


def release(req: str, label=None) -> Action:
    """Drops the caller's last reference (Python: del + gc.collect(); C: OgaDestroyRequest)."""
    return _a("release", label, req=req)


def release_options(opts: str, label=None) -> Action:
    return _a("release_options", label, opts=opts)


def release_buffer(buf: str, label=None) -> Action:
    return _a("release_buffer", label, buf=buf)


def drafts(req: str, tokens: Sequence[int], label=None) -> Action:
    """req.set_draft_tokens(tokens) / OgaRequestSetDraftTokens with a one-sequence OgaSequences."""
    return _a("drafts", label, req=req, tokens=list(tokens))


def max_drafts(engine: str = "e", label=None) -> Action:
    """engine.max_draft_tokens_per_proposal() / OgaEngineMaxDraftTokensPerProposal."""
    return _a("max_drafts", label, engine=engine)


SPEC_KEYS = ("rounds", "draft_tokens_proposed", "draft_tokens_evaluated", "draft_tokens_accepted",
             "correction_tokens", "bonus_tokens", "tokens_emitted", "target_forward_passes",
             "target_verify_forward_passes", "full_accept_rounds", "partial_accept_rounds", "zero_accept_rounds")


def spec_stats(engine: str = "e", keys: Sequence[str] = SPEC_KEYS, label=None) -> Action:
    """{key: value} of get_speculative_stats() / OgaSpeculativeStatsGetCount for the count keys given."""
    return _a("spec_stats", label, engine=engine, keys=list(keys))


def engine(name: str, model: Optional[str] = None, label=None) -> Action:
    """Creates another engine (on the scenario's model configuration unless `model` is given)."""
    return _a("engine", label, engine=name, model=model)


def destroy_engine(name: str = "e", label=None) -> Action:
    return _a("destroy_engine", label, engine=name)


def capabilities(engine: str = "e", label=None) -> Action:
    return _a("capabilities", label, engine=engine)


def off_thread(action: Action, label=None) -> Action:
    """Runs `action` on a new thread (joined before the next action) and records its record."""
    return _a("off_thread", label, action=action)


def model(overlay: str, name: str = "m", label=None) -> Action:
    """Creates a model from the scenario's directory with a Config overlay; records only errors."""
    return _a("model", label, overlay=overlay, name=name)


def engine_from(name: str, model_name: str, label=None) -> Action:
    return _a("engine_from", label, engine=name, model_name=model_name)


# Generic calls. Arguments are literals or symbolic references:
def ref(kind: str, name: str = "e"):
    """A handle: kind in req, opts, buf, engine, model, event (name = (buf, index)), usage."""
    return ("$ref", kind, name)


NULL = ("$null",)


def out(ctype: str):
    """A C output parameter (c_uint64, c_bool, c_uint32, c_int32, c_size_t, c_void_p) initialised to
    a sentinel; its value after the call is recorded (pointers as 'null'/'nonnull')."""
    return ("$out", ctype)


def ids(values: Sequence[int]):
    """An int32 array argument (C)."""
    return ("$ids", list(values))


def capi(fn: str, *args, label=None, outs=True) -> Action:
    """One C call (ctypes backend only): records (error message or None, [outputs]); with
    outs=False only the error message (or direct return)."""
    return _a("capi", label, fn=fn, args=list(args), outs=outs)


def py(target, method: str, *args, label=None, store=None, message=True, **kwargs) -> Action:
    """One Python call (Python backend only): target is a ref or "module"; method ".name" reads an
    attribute. Records the result (ints/bools/None/str as is, enums as int, the target or an argument
    itself as '$same', other objects as their public type name); `store` keeps it as ref("view",
    store). message=False records only the exception type (binding-generated texts such as pybind's
    conversion errors, with object addresses, are not part of the contract)."""
    return _a("py", label, target=target, method=method, args=list(args), kwargs=kwargs, store=store,
              message=message)


def only(impl: str, action: Action, why: str) -> Action:
    """Runs `action` only against `impl` ("oga" or "0.18"); the other records ("skipped", why)."""
    return _a("only", action.get("label"), impl=impl, action=action, why=why)


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------
UNPINNED = object()


@dataclasses.dataclass(frozen=True)
class Difference:
    """A recorded item (the record of the action with this label) that may differ from 0.18.
    `readme` is the name of the bullet under "Deliberate differences" in README.md. Where only a
    part of the record differs, `same` projects the part that must still equal 0.18's (e.g. the
    events of the requests the difference does not concern); `oga` pins oga's own record (when
    `oga_part` is given, that projection of it), so oga's side of the difference is checked too."""
    readme: str
    why: str
    backends: Tuple[str, ...] = ("python", "ctypes")
    same: Optional[Callable[[Any], Any]] = None
    oga: Any = UNPINNED
    oga_part: Optional[Callable[[Any], Any]] = None


def streams(record):
    """A `same` projection of a run / drain record: each request's tokens and finish reasons, in
    order (what a caller reads, whatever the steps the events came in and their usage counts)."""
    out = {}
    for e in events_of([("", record)]):
        if isinstance(e, tuple) and len(e) > 4:
            tokens, reasons = out.setdefault(e[1], ([], []))
            if e[3] is not None and e[3] != 0 or e[0] & 1:
                tokens.append(e[3])
            if e[4]:
                reasons.append(e[4])
    return out


def events_except(*requests):
    """A `same` projection of a run / drain record: its events, flattened, without those of `requests`."""
    def project(record):
        return [e for e in events_of([("", record)]) if not (isinstance(e, tuple) and len(e) > 1 and e[1] in requests)]
    return project


@dataclasses.dataclass
class Scenario:
    name: str
    actions: List[Action]
    model: str = "base"
    backends: Tuple[str, ...] = ("python", "ctypes")
    differences: Dict[str, Difference] = dataclasses.field(default_factory=dict)
    # predicate on 0.18's stream (list of records): checks the scenario exercises what it claims
    expect: Optional[Callable[[list], bool]] = None
    # backend -> observed undeclared difference (test marked xfail(strict=True))
    xfail: Dict[str, str] = dataclasses.field(default_factory=dict)
    doc: str = ""


def events_of(records) -> list:
    """Every event of every run/drain record, flattened."""
    evs = []

    def walk(v):
        if isinstance(v, dict) and "events" in v:
            evs.extend(v["events"])
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
    for _, v in records:
        walk(v)
    return evs


def has_reason(reason: int):
    return lambda recs: any(e[4] == reason for e in events_of(recs))


def has_flag(flag: int, code: Optional[int] = None):
    return lambda recs: any(e[0] & flag and (code is None or e[6] == code) for e in events_of(recs))


def raises(substring: str):
    def pred(recs):
        return any(substring in repr(v) for _, v in recs)
    return pred


def all_of(*preds):
    return lambda recs: all(p(recs) for p in preds)
