"""`oga serve` end to end with the real `openai` client, on SmolLM2-135M-Instruct.

The server runs as `python -m oga serve` without --model: the session's SmolLM2 build is placed where
the command caches its default model (as in test_cli.py), so real text flows through the default
path. Greedy answers are checked against the same model run in-process by `oga generate`'s engine
loop (oga.cli.generate), streamed answers against non-streamed ones, usage against the tokenizer,
and errors against the openai exception classes.
"""
import io
import json
import time
import urllib.error
import urllib.request

import openai
import pytest

import oga as og
from model_dirs import oga_cache_dir, smollm2_model_dir
from oga import cli
from serve_process import ServeProcess

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_int4_dir):
    smollm2_model_dir(tmp_path_factory, smollm2_int4_dir)
    log = tmp_path_factory.mktemp("serve-openai") / "server.log"
    with ServeProcess([], log_path=log, env={"OGA_CACHE_DIR": oga_cache_dir(tmp_path_factory)}) as process:
        yield process
        assert process.stop() == 0, process.output()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="not-needed", max_retries=0, timeout=120.0)


@pytest.fixture(scope="module")
def tokenizer(smollm2_int4_dir):
    return og.Tokenizer(og.Model(smollm2_int4_dir))


@pytest.fixture(scope="module")
def in_process(smollm2_int4_dir, tokenizer):
    """Greedy answers of the same model run in this process by oga.cli.generate."""
    model = og.Model(smollm2_int4_dir)

    def answer(prompt, max_new_tokens, chat_template=True):
        summary = cli.generate(model, tokenizer, [prompt], max_new_tokens=max_new_tokens, chat_template=chat_template,
                               stream=False, stdout=io.StringIO(), stderr=io.StringIO(),
                               turn_policy={"do_sample": False})
        return summary.results[0]

    return answer


def _chat_prompt_tokens(tokenizer, messages):
    return len(tokenizer.encode(tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)))


def _streamed(chunks, kind="chat"):
    """(text, finish_reason, usage or None) of a list of streamed chunks."""
    text, finish_reason, usage = "", None, None
    for chunk in chunks:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for choice in chunk.choices:
            text += (choice.delta.content or "") if kind == "chat" else choice.text
            finish_reason = choice.finish_reason or finish_reason
    return text, finish_reason, usage


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "oga"


def test_chat_greedy_streamed_equals_non_streamed(client, tokenizer, in_process):
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24)
    choice = response.choices[0]
    assert response.object == "chat.completion" and choice.message.role == "assistant"
    assert "Tokyo" in choice.message.content
    expected = in_process(QUESTION[0]["content"], 24)
    assert choice.message.content == expected.text
    assert response.usage.prompt_tokens == _chat_prompt_tokens(tokenizer, QUESTION) == expected.prompt_tokens
    assert response.usage.completion_tokens == expected.generated_tokens
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    assert choice.finish_reason == ("length" if expected.finish_reason == "MAX_GENERATED_TOKENS" else "stop")

    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id for c in chunks)
    text, finish_reason, usage = _streamed(chunks)
    assert (text, finish_reason) == (choice.message.content, choice.finish_reason)
    assert (usage.prompt_tokens, usage.completion_tokens) == (response.usage.prompt_tokens,
                                                              response.usage.completion_tokens)


def test_completions_text_and_token_prompts(client, tokenizer, in_process):
    prompt = "The capital of France is"
    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    choice = response.choices[0]
    assert response.object == "text_completion"
    expected = in_process(prompt, 8, chat_template=False)
    assert choice.text == expected.text and "Paris" in choice.text
    assert choice.finish_reason == "length"
    assert response.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert response.usage.completion_tokens == 8

    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True))
    assert _streamed(chunks, "completion")[:2] == (choice.text, "length")

    as_tokens = client.completions.create(model=MODEL, prompt=[int(t) for t in tokenizer.encode(prompt)],
                                          max_tokens=8, temperature=0)
    assert as_tokens.choices[0].text == choice.text


def test_max_tokens_ends_with_length(client):
    for limit in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        response = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, **limit)
        assert response.choices[0].finish_reason == "length"
        assert response.usage.completion_tokens == 3


def test_stop_sequences_end_the_answer_before_them(client):
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                          max_tokens=24).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 3]
    expected = full[:full.find(stop)]
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24,
                                              stop=["never in this answer", stop])
    assert response.choices[0].message.content == expected
    assert response.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24,
                                                 stop=stop, stream=True))
    assert _streamed(chunks)[:2] == (expected, "stop")


def test_json_schema_response_format_gives_valid_json(client):
    schema = {"type": "object",
              "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                             "population": {"type": "integer"}},
              "required": ["city", "country", "population"], "additionalProperties": False}
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris as a JSON object."}], temperature=0,
        max_tokens=80, response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema,
                                                                                 "strict": True}})
    value = json.loads(response.choices[0].message.content)
    assert set(value) == {"city", "country", "population"} and isinstance(value["population"], int)
    assert response.choices[0].finish_reason == "stop"


def test_errors_are_openai_exceptions(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    assert e.value.code == "model_not_found"
    bad = [dict(n=2), dict(max_tokens=-1), dict(max_tokens=0), dict(logprobs=True), dict(temperature=3),
           dict(extra_body={"frobnicate": 1}), dict(max_tokens=5000), dict(stop=["a", "b", "c", "d", "e"]),
           dict(messages=QUESTION * 400),   # past the 1024-token context of this build
           dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})]
    for fields in bad:
        arguments = dict(model=MODEL, messages=QUESTION, max_tokens=4) | fields
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**arguments)
        assert e.value.status_code == 400 and e.value.body["message"], fields
    assert "context length" in str(client_error(client, messages=QUESTION * 400))
    assert "Invalid json_schema guidance" in str(client_error(
        client, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}))
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[10 ** 6], max_tokens=2)   # not a token of the vocabulary
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=MODEL, prompt="x" * (1 << 20), max_tokens=2)
    assert e.value.status_code == 413

    request = urllib.request.Request(server.base_url + "/v1/chat/completions", data=b"{not json", method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=30)
    assert e.value.code == 400
    assert json.loads(e.value.read())["error"]["type"] == "invalid_request_error"
    # A lone surrogate (JSON "\ud800") is no text a tokenizer can encode: 400, not 500.
    for route, body in (("/v1/completions", {"model": MODEL, "prompt": "\ud800abc", "max_tokens": 2}),
                        ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                                                  "messages": [{"role": "user", "content": "\ud800"}]})):
        request = urllib.request.Request(server.base_url + route, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=30)
        assert e.value.code == 400, route
        assert "surrogate" in json.loads(e.value.read())["error"]["message"]
    # Nothing above changed the server: a request still gets its answer, created now (not at start-up).
    before = int(time.time())
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=4)
    assert answer.usage.completion_tokens == 4
    assert before <= answer.created <= int(time.time())


def client_error(client, **fields):
    try:
        client.chat.completions.create(**(dict(model=MODEL, messages=QUESTION, max_tokens=4) | fields))
    except openai.BadRequestError as e:
        return e
    raise AssertionError(f"{fields} was accepted")
