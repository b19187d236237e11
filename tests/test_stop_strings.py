"""Stop strings (docs/onnxruntime-genai-0.18-dynamic-engine.md, "Stop strings and guidance"): decoded
UTF-8 matching on a turn's generated text.

The test model's tokens come from the greedy oracle (tests/helpers.py); their text comes from a token
table set with oga.testing.set_token_table. The table mixes ASCII, UTF-8 characters split across
tokens, bytes that never form a character and special tokens, and an independent Python matcher
(codecs' incremental UTF-8 decoder with errors="replace", plain str search) says where each turn
must stop.
"""
import codecs
import random

import pytest

import oga as og
import oga.testing as ogt
import collections

from helpers import R_EOS, R_MAX_GEN, R_MAX_SESSION, R_STOP, OracleSequence, drive, key, turn_options

VOCAB = 64
SPECIAL = (0, 2, 3)  # 1 is EOS, which never reaches the matcher
# Pieces a token may stand for: ASCII, a 2-byte character split in two (C3 | A9 = "é"), a 3-byte one
# split 2+1 (E2 82 | AC = "€"), a 4-byte one split 2+2 (F0 9F | 98 80 = U+1F600), whole characters,
# and bytes that can never form a character (FF, a lone continuation byte).
PIECES = [b"a", b"bc", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"\xf0\x9f", b"\x98\x80", b"d e", b" ",
          b"\xff", "é".encode(), b"xyz", b"\x80", "€!".encode(), b"ab"]


def table():
    tokens = []
    for t in range(VOCAB):
        tokens.append(f"<special{t}>".encode() if t in SPECIAL or t == 1 else PIECES[t % len(PIECES)])
    return tokens


TOKENS = table()
# One distinct character per token id: a turn's text says exactly which token each byte came from.
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
LETTERS = [f"<special{t}>".encode() if t in SPECIAL or t == 1 else ALPHABET[t].encode() for t in range(VOCAB)]


def reference_stop(generated, stops, tokens=TOKENS):
    """(index of the generated token that completes a match, stop index) or None: earliest-ending
    match, then longest, then lowest index."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = b""
    for i, token in enumerate(generated):
        if token in SPECIAL:
            continue
        piece = decoder.decode(tokens[token]).encode("utf-8")
        before, text = len(text), text + piece
        for end in range(before + 1, len(text) + 1):
            best = None
            for index, s in enumerate(stops):
                b = s.encode("utf-8")
                if len(b) <= end and text[end - len(b):end] == b and (best is None or len(b) > len(stops[best].encode())):
                    best = index
            if best is not None:
                return i, best
    return None


def text_of(generated, tokens=TOKENS):
    return b"".join(tokens[t] for t in generated if t not in SPECIAL).decode("utf-8", "replace")


@pytest.fixture
def model():
    m = ogt.create_test_model(vocab_size=VOCAB)
    ogt.set_token_table(m, TOKENS, special=SPECIAL + (1,))
    return m


@pytest.fixture
def engine(model):
    return og.Engine(model)


def session_options(max_session_tokens):
    options = og.RequestOptions()
    options.set_max_session_tokens(max_session_tokens)
    return options


def stop_options(request, stops, max_gen=0):
    t = turn_options(request, max_gen=max_gen)
    t.set_stop_strings(stops)
    return t


def expected_events(turn_id, prompt_len, generated, stop_at, stop_index, reason_without_stop):
    """Token events for `generated`, cut at the stop match when there is one."""
    if stop_at is not None:
        generated, reason, index = generated[:stop_at + 1], R_STOP, stop_index
    else:
        reason, index = reason_without_stop, None
    events = []
    separate_end = reason == R_EOS  # EOS is not emitted: the turn ends in its own event
    for i, token in enumerate(generated):
        last = i == len(generated) - 1 and not separate_end
        events.append((1 | (2 if last else 0), turn_id, token, reason if last else 0, 0,
                       (prompt_len, len(generated), 0) if last else (0, 0, 0), index if last else None))
    if separate_end:
        events.append((2, turn_id, None, R_EOS, 0, (prompt_len, len(generated), 0), None))
    return events


def per_request(events):
    out = collections.defaultdict(list)
    for e in events:
        out[e.request].append(e)
    return out


def event_tuples(evs):
    return [(e.flags, e.turn_id, e.token, e.finish_reason, e.error_code, e.usage, e.stop_index) for e in evs]


def test_random_stop_strings_match_the_reference_decoder(engine):
    """300 turns, eight at a time, with stop strings cut from the turn's own text (so they match, often
    across token boundaries and inside split characters) and strings that never match."""
    rng = random.Random(1234)
    cases = []
    for _ in range(300):
        prompt = [rng.randrange(4, VOCAB) for _ in range(rng.randrange(1, 6))]
        generated, reason = OracleSequence(VOCAB).turn(prompt, max_gen=24)
        text = text_of(generated)
        stops = []
        for _ in range(rng.randrange(1, 5)):
            if text and rng.random() < 0.8:
                start = rng.randrange(len(text))
                stops.append(text[start:start + rng.randrange(1, 6)])
            else:
                stops.append(rng.choice(["qq", "zzz", "\u00e9\u00e9\u00e9", "never"]))
        cases.append((prompt, generated, reason, stops))
    matched = 0
    for batch in range(0, len(cases), 8):
        requests = []
        for prompt, generated, reason, stops in cases[batch:batch + 8]:
            r = engine.create_request()
            r.begin_turn(prompt, stop_options(r, stops, max_gen=24))
            requests.append(r)
        by_request = per_request(drive(engine))
        for r, (prompt, generated, reason, stops) in zip(requests, cases[batch:batch + 8]):
            expected = reference_stop(generated, stops)
            stop_at, index = expected if expected else (None, None)
            matched += expected is not None
            assert event_tuples(by_request[r]) == expected_events(1, len(prompt), generated, stop_at, index, reason), \
                (prompt, stops, text_of(generated))
            r.close()
    assert matched > 150  # most cases really stop early
    ogt.check_invariants(engine)


@pytest.fixture
def letters():
    """An engine over the LETTERS table."""
    m = ogt.create_test_model(vocab_size=VOCAB)
    ogt.set_token_table(m, LETTERS, special=SPECIAL + (1,))
    return og.Engine(m)


def _turn_with_text(min_tokens=12):
    """A prompt whose greedy continuation has `min_tokens` tokens, none special, none repeated."""
    rng = random.Random(7)
    while True:
        prompt = [rng.randrange(4, VOCAB) for _ in range(3)]
        generated, reason = OracleSequence(VOCAB).turn(prompt, max_gen=min_tokens)
        if len(generated) == min_tokens and not set(generated) & set(SPECIAL) and len(set(generated)) == min_tokens:
            return prompt, generated


def letters_of(generated):
    return text_of(generated, LETTERS)


def run_one(engine, prompt, stops, max_gen=0):
    r = engine.create_request()
    r.begin_turn(prompt, stop_options(r, stops, max_gen))
    evs = drive(engine)
    r.close()
    return evs


def test_tie_breaks_earliest_end_then_longest_then_lowest_index(letters):
    prompt, generated = _turn_with_text()
    text = letters_of(generated)  # one distinct character per token
    # Token 5 completes "XYZ" (its last three characters); the other candidates end there too, or later.
    xyz = text[3:6]
    stops = [text[4:8], xyz[-1], xyz, xyz, xyz[-2:]]
    assert reference_stop(generated, stops, tokens=LETTERS) == (5, 2)
    evs = run_one(letters, prompt, stops, max_gen=12)
    assert [e.token for e in evs] == generated[:6]
    assert evs[-1].finish_reason == R_STOP and evs[-1].stop_index == 2  # longest, then the lower duplicate
    # An earlier-ending match beats a longer one that ends later.
    stops = [text[1:6], text[2:4]]
    evs = run_one(letters, prompt, stops, max_gen=12)
    assert len(evs) == 4 and evs[-1].stop_index == 1


def test_the_token_completing_the_match_is_emitted_and_counted(letters):
    prompt, generated = _turn_with_text()
    stop = letters_of(generated[3:5])  # spans two tokens
    at, index = reference_stop(generated, [stop], tokens=LETTERS)
    evs = run_one(letters, prompt, [stop], max_gen=12)
    assert [e.token for e in evs] == generated[:at + 1]
    last = evs[-1]
    assert last.flags == 3 and last.finish_reason == R_STOP and last.stop_index == 0
    assert last.usage == (len(prompt), at + 1, 0)


def test_stop_string_wins_over_both_limits_on_the_same_token(letters):
    prompt, generated = _turn_with_text()
    stop = letters_of(generated[5:7])
    at, _ = reference_stop(generated, [stop], tokens=LETTERS)
    assert at == 6
    # The max_generated_tokens limit lands on the matching token.
    evs = run_one(letters, prompt, [stop], max_gen=at + 1)
    assert (evs[-1].finish_reason, evs[-1].stop_index, len(evs)) == (R_STOP, 0, at + 1)
    # So does the session limit.
    r = letters.create_request(options=session_options(len(prompt) + at + 1))
    r.begin_turn(prompt, stop_options(r, [stop]))
    evs = drive(letters)
    assert (evs[-1].finish_reason, evs[-1].stop_index, len(evs)) == (R_STOP, 0, at + 1)
    # Without the stop string the limits end the turn on that same token.
    r2 = letters.create_request(options=session_options(len(prompt) + at + 1))
    r2.begin_turn(prompt)
    evs = drive(letters)
    assert (evs[-1].finish_reason, evs[-1].stop_index, len(evs)) == (R_MAX_SESSION, None, at + 1)
    evs = run_one(letters, prompt, ["never"], max_gen=at + 1)
    assert (evs[-1].finish_reason, evs[-1].stop_index, len(evs)) == (R_MAX_GEN, None, at + 1)


def test_only_this_turns_generated_text_is_matched(letters):
    prompt, generated = _turn_with_text()
    r = letters.create_request()
    # Turn 1: the prompt's own text is not fed to the detokenizer, so it cannot match there.
    prompt_text = letters_of(prompt)
    assert reference_stop(generated[:6], [prompt_text], tokens=LETTERS) is None
    r.begin_turn(prompt, stop_options(r, [prompt_text], max_gen=6))
    evs = drive(letters)
    assert [e.token for e in evs] == generated[:6] and evs[-1].finish_reason == R_MAX_GEN
    # Turn 2 with a string that spans the end of turn 1 and the start of turn 2: a fresh
    # detokenizer per turn, so it can only match inside turn 2's own text.
    oracle = OracleSequence(VOCAB)
    oracle.turn(prompt, max_gen=6)
    cont = [generated[0]]
    turn2, _ = oracle.turn(cont, max_gen=8)
    spanning = letters_of(generated[4:6]) + letters_of(turn2[:1])
    expected = reference_stop(turn2, [spanning], tokens=LETTERS)
    r.begin_turn(cont, stop_options(r, [spanning], max_gen=8))
    evs = drive(letters)
    assert [e.token for e in evs] == turn2[:expected[0] + 1 if expected else len(turn2)]
    assert expected is None or expected[0] > 0
    # Turn 3 sets no stop strings: the previous turn's are not inherited.
    turn3, reason3 = oracle.turn(cont, max_gen=4)
    r.begin_turn(cont, turn_options(r, max_gen=4))
    evs = drive(letters)
    assert [e.token for e in evs] == turn3 and evs[-1].finish_reason == reason3
    ogt.check_invariants(letters)


def test_special_tokens_are_skipped_and_bytes_that_never_form_a_character_read_as_u_fffd(engine):
    rng = random.Random(99)
    found_special = found_invalid = 0
    for _ in range(400):
        prompt = [rng.randrange(4, VOCAB) for _ in range(3)]
        generated, _ = OracleSequence(VOCAB).turn(prompt, max_gen=16)
        pieces = [TOKENS[t] for t in generated]
        text = text_of(generated)
        if "\ufffd" in text and not found_invalid:
            at = text.index("\ufffd")
            stop = text[max(0, at - 1):at + 1]
            found_invalid += 1
        elif any(t in SPECIAL for t in generated[1:-1]) and not found_special:
            i = next(i for i, t in enumerate(generated[1:-1], 1) if t in SPECIAL)
            stop = (text_of(generated[:i])[-1:] + text_of(generated[i + 1:])[:1])
            if len(stop) < 2:
                continue
            found_special += 1
        else:
            continue
        expected = reference_stop(generated, [stop])
        assert expected is not None, (pieces, stop)
        evs = run_one(engine, prompt, [stop], max_gen=16)
        assert [e.token for e in evs] == generated[:expected[0] + 1]
        assert evs[-1].finish_reason == R_STOP
        if found_special and found_invalid:
            break
    assert found_special and found_invalid


def test_a_turns_first_space_is_kept():
    """Each token reads as in the middle of a text, as 0.18's detokenizer reads a turn: a leading
    space of the turn's first token is part of the text (SentencePiece decoders drop it only at the
    start of a whole decode)."""
    spaced = [b" " + piece if t not in SPECIAL and t != 1 else piece for t, piece in enumerate(LETTERS)]
    model = ogt.create_test_model(vocab_size=VOCAB)
    ogt.set_token_table(model, spaced, special=SPECIAL + (1,))
    prompt, generated = _turn_with_text()
    evs = run_one(og.Engine(model), prompt, [spaced[generated[0]].decode()], max_gen=12)
    assert (len(evs), evs[-1].finish_reason, evs[-1].stop_index) == (1, R_STOP, 0)


FAULTS = [
    dict(phase="execute", kind="retryable"),
    dict(phase="execute", kind="capacity"),
    dict(phase="sample"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f"{f['phase']}-{f.get('kind', '')}")
@pytest.mark.parametrize("skip", [0, 3, 5, 7])
def test_a_rolled_back_step_replays_identical_matches(fault, skip):
    """A step that fails after selecting (and peeking the matcher for) its tokens is rolled back;
    the retry stops on the same token with the same index as a run without the fault."""
    rng = random.Random(5)
    jobs = []
    for _ in range(6):
        prompt = [rng.randrange(4, VOCAB) for _ in range(3)]
        generated, _ = OracleSequence(VOCAB).turn(prompt, max_gen=12)
        text = text_of(generated)
        start = rng.randrange(max(1, len(text) - 3))
        jobs.append((prompt, [text[start:start + 3], "zz"]))

    def run(with_fault):
        model = ogt.create_test_model(vocab_size=VOCAB)
        ogt.set_token_table(model, TOKENS, special=SPECIAL + (1,))
        if with_fault:
            ogt.inject_fault(model, skip=skip, count=2, **fault)
        engine = og.Engine(model)
        requests = []
        for prompt, stops in jobs:
            r = engine.create_request()
            r.begin_turn(prompt, stop_options(r, stops, max_gen=12))
            requests.append(r)
        evs = drive(engine)
        by_request = per_request(evs)
        return [[key(e) + (e.stop_index,) for e in by_request[r]] for r in requests], ogt.engine_counters(engine)

    clean, _ = run(False)
    faulted, counters = run(True)
    assert faulted == clean
    assert counters["rolled_back_steps"] == 2
    assert any(events[-1][3] == R_STOP for events in clean)


def test_cancel_and_close_of_stop_enabled_turns(letters):
    prompt, generated = _turn_with_text()
    r = letters.create_request()
    tid = r.begin_turn(prompt, stop_options(r, ["never"], max_gen=12))
    buf = letters.create_event_buffer(64)
    letters.run(buf)
    assert r.cancel_turn(tid)
    evs = drive(letters)
    assert evs[-1].finish_reason == 5 and evs[-1].stop_index is None  # Cancelled, index -1
    # The next turn starts a fresh matcher; close mid-turn releases it with the request.
    tid2 = r.begin_turn([generated[0]], stop_options(r, ["never"], max_gen=12))
    letters.run(buf)
    r.close()
    drive(letters)
    ogt.check_invariants(letters)
    assert ogt.engine_counters(letters)["bound_requests"] == 0
    assert tid2 == tid + 1


def test_stop_string_list_is_copied_at_begin_turn(letters):
    prompt, generated = _turn_with_text()
    stop = letters_of(generated[2:4])
    at, _ = reference_stop(generated, [stop], tokens=LETTERS)
    r = letters.create_request()
    t = stop_options(r, [stop], max_gen=12)
    r.begin_turn(prompt, t)
    t.set_stop_strings(["never"])  # changing the options afterwards does not reach the queued turn
    evs = drive(letters)
    assert len(evs) == at + 1 and evs[-1].finish_reason == R_STOP
