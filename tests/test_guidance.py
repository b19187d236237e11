"""Whole-turn guidance (seed "Constrained decoding and tool calling"): json_schema, regex and
lark_grammar turns run by llguidance.

The oracle is independent of llguidance: the test executor's greedy scores (tests/helpers.py) masked
to the tokens that keep the turn's text a viable prefix of the regular language, decided by the
`regex` package's partial matching, with EOS allowed exactly when the text is a full match.
"""
import json
import os
import subprocess
import sys

import pytest
import regex

import oga as og
import oga.testing as ogt
from helpers import (
    E_UNSERVICEABLE,
    R_EOS,
    R_FAILED,
    R_MAX_GEN,
    R_STOP,
    OracleSequence,
    drive,
    key,
    scores,
    turn_options,
)

VOCAB = 64
EOS = 1
SPECIAL = (0, 2, 3)
PIECES = ["a", "b", "ab", "ba", "c", "abc", "x", "1", "2", "12", " ", "{", "}", ":", '"', ","]
TOKENS = [f"<special{t}>" if t in SPECIAL or t == EOS else PIECES[t % len(PIECES)] for t in range(VOCAB)]


@pytest.fixture
def model():
    m = ogt.create_test_model(vocab_size=VOCAB)
    ogt.set_token_table(m, TOKENS, special=SPECIAL + (EOS,))
    return m


@pytest.fixture
def engine(model):
    return og.Engine(model)


def allowed(pattern, text):
    """Token ids the grammar allows after `text` (EOS when `text` is a full match)."""
    out = []
    for t in range(VOCAB):
        if t == EOS:
            if regex.fullmatch(pattern, text):
                out.append(t)
        elif t not in SPECIAL and regex.fullmatch(pattern, text + TOKENS[t], partial=True):
            out.append(t)
    return out


def guided_oracle(sequence, prompt, pattern, max_gen, min_gen=0):
    """Greedy tokens of a regex-guided turn: (tokens, finish reason)."""
    sequence.extend(prompt)
    text, out = "", []
    while True:
        candidates = allowed(pattern, text)
        assert candidates, "the oracle's grammar allows nothing"
        s = scores(sequence.state, VOCAB)
        if len(out) < min_gen and len(candidates) > 1:
            candidates = [t for t in candidates if t != EOS]
        token = max(candidates, key=lambda t: (s[t], -t))
        if token == EOS:
            return out, R_EOS
        sequence.append(token)
        out.append(token)
        text += TOKENS[token]
        if len(out) >= max_gen:
            return out, R_MAX_GEN


def guided(request, kind, data, max_gen=16):
    t = turn_options(request, max_gen=max_gen)
    t.set_guidance(kind, data)
    return t


PATTERNS = [r"(ab|c)+x", r"1(2|12)*", r"[abc]{2,5}", r"\{\"a\":(1|2|12)\}"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_turns_follow_the_oracle(engine, pattern):
    prompts = [[5 + i, 9, 13 + 2 * i] for i in range(8)]
    requests = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, guided(r, "regex", pattern))
        requests.append(r)
    evs = drive(engine)
    for r, p in zip(requests, prompts):
        got = [e for e in evs if e.request is r]
        tokens, reason = guided_oracle(OracleSequence(VOCAB), p, pattern, 16)
        assert [e.token for e in got if e.flags & 1] == tokens
        assert got[-1].finish_reason == reason
        if reason == R_EOS:
            assert regex.fullmatch(pattern, "".join(TOKENS[t] for t in tokens))
        else:
            assert regex.fullmatch(pattern, "".join(TOKENS[t] for t in tokens), partial=True)
    ogt.check_invariants(engine)


def test_unguided_rows_in_the_same_steps_are_untouched(engine):
    plain = [[7, 8, 9], [20, 21], [33]]
    guided_prompts = [[5, 9, 13], [6, 10]]
    requests = []
    for p in plain:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=12))
        requests.append((r, p, None))
    for p in guided_prompts:
        r = engine.create_request()
        r.begin_turn(p, guided(r, "regex", PATTERNS[0], 12))
        requests.append((r, p, PATTERNS[0]))
    evs = drive(engine)
    for r, p, pattern in requests:
        got = [e.token for e in evs if e.request is r and e.flags & 1]
        if pattern is None:
            assert got == OracleSequence(VOCAB).turn(p, max_gen=12)[0]
        else:
            assert got == guided_oracle(OracleSequence(VOCAB), p, pattern, 12)[0]


def test_lark_grammar(engine):
    grammar = 'start: "{" pair ("," pair)* "}"\npair: "\\"" KEY "\\":" NUM\nKEY: /[abc]+/\nNUM: /[12]+/\n'
    r = engine.create_request()
    r.begin_turn([5, 9, 13], guided(r, "lark_grammar", grammar, 40))
    evs = drive(engine)
    text = "".join(TOKENS[e.token] for e in evs if e.flags & 1)
    assert evs[-1].finish_reason in (R_EOS, R_MAX_GEN)
    pattern = r'\{"[abc]+":[12]+(,"[abc]+":[12]+)*\}'
    assert regex.fullmatch(pattern, text, partial=evs[-1].finish_reason == R_MAX_GEN), text


def test_json_schema_on_a_vocabulary_that_can_spell_it(engine):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    r = engine.create_request()
    r.begin_turn([5, 9, 13], guided(r, "json_schema", json.dumps(schema), 40))
    evs = drive(engine)
    text = "".join(TOKENS[e.token] for e in evs if e.flags & 1)
    assert evs[-1].finish_reason == R_EOS, text
    value = json.loads(text)
    assert set(value) == {"a"} and isinstance(value["a"], int)


@pytest.mark.parametrize("kind,data,reason", [
    ("regex", "(ab", "regex"),
    ("json_schema", '{"type": "object"', "json"),
    ("json_schema", '{"type": "no-such-type"}', "type"),
    ("lark_grammar", "start: missing_rule", "missing_rule"),
])
def test_invalid_grammar_is_refused_at_begin_turn_without_mutation(engine, kind, data, reason):
    r = engine.create_request()
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([5, 9, 13], guided(r, kind, data))
    message = str(info.value)
    assert message.startswith(f"Invalid {kind} guidance: ") and reason.lower() in message.lower()
    assert "\n" not in message
    assert not engine.has_pending_requests()
    assert ogt.engine_counters(engine)["waiting_requests"] == 0
    assert r.begin_turn([5, 9, 13], turn_options(r, max_gen=3)) == 1  # no turn id consumed
    evs = drive(engine)
    assert [e.token for e in evs] == OracleSequence(VOCAB).turn([5, 9, 13], max_gen=3)[0]


def test_guidance_is_turn_scoped(engine):
    pattern = PATTERNS[1]
    r = engine.create_request()
    oracle = OracleSequence(VOCAB)
    r.begin_turn([5, 9, 13], guided(r, "regex", pattern, 6))
    evs = drive(engine)
    assert [e.token for e in evs if e.flags & 1] == guided_oracle(oracle, [5, 9, 13], pattern, 6)[0]
    # The next turn sets no guidance: plain greedy decoding, from the request's own sequence.
    r.begin_turn([7], turn_options(r, max_gen=6))
    evs = drive(engine)
    assert [e.token for e in evs if e.flags & 1] == oracle.turn([7], max_gen=6)[0]
    # A third guided turn starts its grammar afresh (not where turn 1 left off).
    r.begin_turn([8], guided(r, "regex", pattern, 6))
    evs = drive(engine)
    assert [e.token for e in evs if e.flags & 1] == guided_oracle(oracle, [8], pattern, 6)[0]


def test_grammar_mask_comes_before_the_eos_floor(engine):
    """min_generated_tokens masks EOS, but when the grammar allows only EOS the grammar wins: the
    row falls back to the best token the grammar allows."""
    r = engine.create_request()
    t = guided(r, "regex", "abc", 8)
    t.set_min_generated_tokens(5)
    r.begin_turn([5, 9, 13], t)
    evs = drive(engine)
    text = "".join(TOKENS[e.token] for e in evs if e.flags & 1)
    assert text == "abc" and evs[-1].finish_reason == R_EOS
    # Where the grammar leaves a choice, the floor holds: the turn goes on past an accepting state.
    r2 = engine.create_request()
    t2 = guided(r2, "regex", "c+", 8)
    t2.set_min_generated_tokens(5)
    r2.begin_turn([5, 9, 13], t2)
    evs = drive(engine)
    tokens = [e.token for e in evs if e.flags & 1]
    assert len(tokens) >= 5
    assert tokens == guided_oracle(OracleSequence(VOCAB), [5, 9, 13], "c+", 8, min_gen=5)[0]


def test_sampled_guided_turns_stay_in_the_grammar_and_reproduce(engine):
    pattern = r"(ab|c|12|1)+x"
    runs = []
    for _ in range(2):
        r = engine.create_request()
        t = guided(r, "regex", pattern, 20)
        t.set_do_sample(True)
        t.set_temperature(1.5)
        t.set_top_k(0)
        t.set_top_p(1.0)
        t.set_seed(77)
        r.begin_turn([5, 9, 13], t)
        evs = drive(engine)
        runs.append([e.token for e in evs if e.flags & 1])
        text = "".join(TOKENS[t] for t in runs[-1])
        assert regex.fullmatch(pattern, text, partial=evs[-1].finish_reason != R_EOS), text
    assert runs[0] == runs[1]


def test_stop_strings_and_guidance_combine(engine):
    pattern = r"(ab|c|1|2)+x"
    prompt = next(p for p in ([a, 9, 13] for a in range(4, VOCAB))
                  if len(guided_oracle(OracleSequence(VOCAB), p, pattern, 16)[0]) >= 6)
    tokens, _ = guided_oracle(OracleSequence(VOCAB), prompt, pattern, 16)
    text = "".join(TOKENS[t] for t in tokens)
    stop = text[3:5]
    at = next(i for i in range(len(tokens)) if stop in "".join(TOKENS[t] for t in tokens[:i + 1]))
    r = engine.create_request()
    t = guided(r, "regex", pattern, 16)
    t.set_stop_strings([stop])
    r.begin_turn(prompt, t)
    evs = drive(engine)
    assert [e.token for e in evs] == tokens[:at + 1]
    assert (evs[-1].finish_reason, evs[-1].stop_index) == (R_STOP, 0)


FAULTS = [dict(phase="execute", kind="retryable"), dict(phase="execute", kind="capacity"), dict(phase="sample")]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f"{f['phase']}-{f.get('kind', '')}")
@pytest.mark.parametrize("skip", [0, 2, 5])
def test_a_rolled_back_step_leaves_the_grammar_cursor_where_it_was(fault, skip):
    def run(with_fault):
        model = ogt.create_test_model(vocab_size=VOCAB)
        ogt.set_token_table(model, TOKENS, special=SPECIAL + (EOS,))
        if with_fault:
            ogt.inject_fault(model, skip=skip, count=2, **fault)
        engine = og.Engine(model)
        requests = []
        for i, pattern in enumerate(PATTERNS):
            r = engine.create_request()
            r.begin_turn([5 + i, 9, 13], guided(r, "regex", pattern, 12))
            requests.append(r)
        evs = drive(engine)
        return [[key(e) for e in evs if e.request is r] for r in requests], ogt.engine_counters(engine)

    clean, _ = run(False)
    faulted, counters = run(True)
    assert faulted == clean
    assert counters["rolled_back_steps"] == 2


def test_a_grammar_no_token_can_start_is_refused_at_begin_turn(engine):
    r = engine.create_request()
    with pytest.raises(RuntimeError, match=r"^Invalid regex guidance: no token of the model's vocabulary can start "
                                           r"it\.$"):
        r.begin_turn([5, 9, 13], guided(r, "regex", "z+"))
    assert r.begin_turn([5, 9, 13], turn_options(r, max_gen=2)) == 1


def test_a_grammar_the_vocabulary_cannot_finish_fails_only_that_turn(engine):
    # "a" starts "az", but no token spells "z": after "a" the grammar allows nothing.
    other = engine.create_request()
    other.begin_turn([7, 8, 9], turn_options(other, max_gen=10))
    r = engine.create_request()
    r.begin_turn([5, 9, 13], guided(r, "regex", "az"))
    evs = drive(engine)
    mine = [(e.flags, e.token, e.finish_reason, e.error_code) for e in evs if e.request is r]
    assert [(f, TOKENS[t] if t is not None else None, reason, code) for f, t, reason, code in mine] == \
        [(1, "a", 0, 0), (2 | 8, None, R_FAILED, E_UNSERVICEABLE)]
    assert [e.token for e in evs if e.request is other and e.flags & 1] == \
        OracleSequence(VOCAB).turn([7, 8, 9], max_gen=10)[0]
    counters = ogt.engine_counters(engine)
    assert counters["resident_requests"] == 1  # the failed turn's cache went back to the pool
    with pytest.raises(RuntimeError, match="Cannot continue a Request whose current turn failed."):
        r.begin_turn([5], turn_options(r, max_gen=2))
    ogt.check_invariants(engine)
    # The engine stays healthy.
    r2 = engine.create_request()
    r2.begin_turn([5, 9, 13], guided(r2, "regex", PATTERNS[0], 6))
    drive(engine)


def test_missing_llguidance_is_a_clear_begin_turn_error():
    code = (
        "import oga as og, oga.testing as ogt\n"
        "m = ogt.create_test_model(vocab_size=64)\n"
        "ogt.set_token_table(m, ['a'] * 64)\n"
        "e = og.Engine(m)\n"
        "r = e.create_request()\n"
        "t = og.TurnOptions(r)\n"
        "t.set_guidance('regex', 'a+')\n"
        "try:\n"
        "    r.begin_turn([5], t)\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
        "print(r.begin_turn([5]))\n"
    )
    env = dict(os.environ, OGA_LLGUIDANCE_LIBRARY="/nonexistent/libllguidance.so")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith("Failed to load the llguidance library /nonexistent/libllguidance.so: ")
    assert lines[1] == "1"
