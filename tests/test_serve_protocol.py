"""oga.serve.openai_protocol (request validation, OpenAI errors, stream chunks) and
oga.serve.turn_text (the answer's text with stop strings cut as OpenAI cuts them)."""
import json

import pytest

from oga.serve.openai_protocol import (
    ChunkWriter,
    OpenAIError,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from oga.serve.turn_text import TurnText

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat_request({"model": "m", "messages": MESSAGES, **fields})


def completion(**fields):
    return parse_completion_request({"model": "m", "prompt": "hi", **fields})


def refused(parse, **fields):
    with pytest.raises(OpenAIError) as e:
        parse(**fields)
    assert e.value.status == 400 and e.value.body()["error"]["type"] == "invalid_request_error"
    return e.value


def test_a_minimal_chat_request():
    request = chat()
    assert (request.kind, request.model, request.messages) == ("chat", "m", MESSAGES)
    assert request.max_tokens is None and request.policy == {} and not request.stream


def test_sampling_fields_become_turn_options():
    assert chat(temperature=0).policy == {"do_sample": (False,)}
    assert chat(temperature=0.7, top_p=0.9, seed=5).policy == {
        "do_sample": (True,), "temperature": (0.7,), "top_p": (0.9,), "seed": (5,)}
    assert chat(top_p=0.5).policy == {"do_sample": (True,), "top_p": (0.5,)}
    # top_k 1 is greedy, as temperature 0 is: the other sampling fields cannot apply
    assert chat(temperature=0.7, top_k=1).policy == {"do_sample": (False,)}
    assert chat(top_p=0.5, top_k=1).policy == {"do_sample": (False,)}
    assert chat(top_k=40, repetition_penalty=1.1).policy == {
        "do_sample": (True,), "top_k": (40,), "repetition_penalty": (1.1,)}
    request = chat(max_tokens=8, min_tokens=8, stop=["x", "y", "x"])
    assert request.policy == {"min_generated_tokens": (8,), "stop_strings": (["x", "y"],)}
    assert request.stop == ["x", "y"] and request.max_tokens == 8
    assert chat(max_completion_tokens=3).max_tokens == 3
    assert chat(stop="end").stop == ["end"]


def test_response_formats_become_guidance():
    assert chat(response_format={"type": "text"}).policy == {}
    assert chat(response_format={"type": "json_object"}).policy["guidance"] == ("json_schema", '{"type": "object"}')
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema,
                                                                              "strict": True}})
    assert request.policy["guidance"][0] == "json_schema" and json.loads(request.policy["guidance"][1]) == schema


@pytest.mark.parametrize("fields, param", [
    (dict(n=2), "n"), (dict(n=True), "n"), (dict(logprobs=True), "logprobs"), (dict(top_logprobs=2), "top_logprobs"),
    (dict(presence_penalty=0.5), "presence_penalty"), (dict(frequency_penalty=1), "frequency_penalty"),
    (dict(logit_bias={"5": 10}), "logit_bias"), (dict(tools=[{"type": "function"}]), "tools"),
    (dict(user="u"), "user"), (dict(store=True), "store"), (dict(frobnicate=1), "frobnicate"),
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=-1), "max_tokens"), (dict(max_tokens=True), "max_tokens"),
    (dict(max_tokens="5"), "max_tokens"), (dict(max_tokens=4, max_completion_tokens=4), "max_tokens"),
    (dict(temperature=2.5), "temperature"), (dict(temperature="hot"), "temperature"), (dict(top_p=0), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(seed=-1), "seed"), (dict(seed=2 ** 64), "seed"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"), (dict(stop=[""]), "stop"), (dict(stop=[1]), "stop"),
    (dict(stream="yes"), "stream"), (dict(stream_options={"include_usage": True}), "stream_options"),
    (dict(stream=True, stream_options={"other": 1}), "stream_options"),
    (dict(max_tokens=2, min_tokens=3), "min_tokens"), (dict(response_format={"type": "xml"}), "response_format"),
    (dict(response_format={"type": "json_schema"}), "response_format"),
    (dict(messages=[]), "messages"), (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), "messages[0].content[0]"),
    (dict(messages=[{"role": "user", "content": "x", "tool_calls": []}]), "messages[0].tool_calls"),
    (dict(messages=[{"role": "user", "content": "x", "name": "bob"}]), "messages[0].name"),
    (dict(model=""), "model"),
])
def test_chat_fields_refused_with_their_name(fields, param):
    assert refused(chat, **fields).param == param


def test_fields_at_the_values_oga_honours_anyway_are_accepted():
    request = chat(n=1, logprobs=False, presence_penalty=0, frequency_penalty=0, logit_bias={}, tools=[],
                   store=False, user=None, stream=True, stream_options={"include_usage": True})
    assert request.stream and request.include_usage
    # JSON has one number type: clients that send float defaults mean the same values
    assert chat(n=1.0, presence_penalty=0.0, frequency_penalty=-0.0).kind == "chat"
    for bad in (dict(n=True), dict(logprobs=0), dict(presence_penalty=0.5), dict(presence_penalty=False)):
        refused(chat, **bad)
    assert chat(messages=[{"role": "developer", "content": [{"type": "text", "text": "be "},
                                                            {"type": "text", "text": "brief"}]},
                          {"role": "user", "content": "hi"}]).messages[0] == {"role": "system", "content": "be brief"}


def test_completion_prompts():
    assert completion().prompt_text == "hi"
    assert completion(prompt=["hi"]).prompt_text == "hi"
    assert completion(prompt=[1, 2, 3]).prompt_tokens == [1, 2, 3]
    assert completion(prompt=[[1, 2]]).prompt_tokens == [1, 2]
    assert completion().max_tokens is None            # OpenAI's default of 16 is applied against the context
    assert refused(completion, prompt=["a", "b"]).code == "unsupported_parameter"
    for bad in (dict(prompt=[]), dict(prompt=None), dict(prompt=[1, "a"]), dict(echo=True), dict(best_of=2),
                dict(suffix="x"), dict(logprobs=1), dict(messages=MESSAGES)):
        refused(completion, **bad)
    assert completion(echo=False, best_of=1, logprobs=None).kind == "completion"


def test_bodies_must_be_json_objects():
    assert parse_json_body(b'{"a": 1}') == {"a": 1}
    deep = b"[" * 50000 + b"]" * 50000                      # past the parser's recursion limit
    huge = b'{"max_tokens": ' + b"9" * 5000 + b"}"           # past Python's integer-digit limit
    for body in (b"{not json", b"[1, 2]", b"\xff\xfe", b"", deep, huge):
        with pytest.raises(OpenAIError) as e:
            parse_json_body(body)
        assert e.value.status == 400


def test_chunks_are_openai_server_sent_events():
    writer = ChunkWriter("chat", "chatcmpl-1", "m")
    events = [writer.opening(), writer.text("Hel"), writer.finish("stop"), writer.usage(3, 1)]
    decoded = [json.loads(e.removeprefix(b"data: ").removesuffix(b"\n\n")) for e in events]
    assert [d["object"] for d in decoded] == ["chat.completion.chunk"] * 4
    assert decoded[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert decoded[1]["choices"][0]["delta"] == {"content": "Hel"}
    assert decoded[2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert decoded[3]["choices"] == [] and decoded[3]["usage"] == {"prompt_tokens": 3, "completion_tokens": 1,
                                                                   "total_tokens": 4}
    assert ChunkWriter("completion", "cmpl-1", "m").opening() == b""
    assert writer.DONE == b"data: [DONE]\n\n"


class _PieceTokenizer:
    """Token i decodes to PIECES[i]."""
    PIECES = ["Hello", " wor", "ld", "!", " E", "ND", " more", "\n", "\n", "x"]

    def create_stream(self):
        pieces = self.PIECES

        class Stream:
            def decode(self, token):
                return pieces[token]

        return Stream()


def _run(tokens, stops, stop_index=-1):
    """(pieces released while streaming, the rest at the finish)."""
    text = TurnText(_PieceTokenizer(), stops)
    streamed = [text.add(t) for t in tokens]
    return streamed, text.finish(stop_index)


def test_text_without_stop_strings_is_released_as_it_comes():
    streamed, rest = _run([0, 1, 2, 3], [])
    assert streamed == ["Hello", " wor", "ld", "!"] and rest == ""


def test_a_stop_string_is_held_back_while_it_may_start_and_cut_when_it_ends_the_turn():
    # " END" arrives as " E" + "ND": " E" is held until "ND" completes the stop, then cut.
    streamed, rest = _run([0, 4, 5], ["never", " END"], stop_index=1)
    assert streamed == ["Hello", "", ""] and rest == ""
    # A held-back start that does not become a stop string is released with the next piece.
    streamed, rest = _run([0, 4, 6], [" END"])
    assert "".join(streamed) == "Hello E more" and streamed[1] == "" and rest == ""
    # A turn that ends another way (EOS, length) releases what was held back.
    streamed, rest = _run([0, 4], [" END"])
    assert streamed == ["Hello", ""] and rest == " E"


def test_the_text_before_a_stop_string_inside_one_piece_is_kept():
    streamed, rest = _run([0, 7, 8, 9], ["\n\n"], stop_index=0)
    assert "".join(streamed) + rest == "Hello"
