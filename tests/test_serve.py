"""`oga serve` under load, its metrics, admission limit and graceful shutdown, on a tiny random model.

Every server here is a child process on 127.0.0.1 (tests/serve_process.py) driven by the `openai`
client; every load is a fixed number of requests with a time bound. Turns ask for an exact number
of tokens (min_tokens = max_tokens: the random model would otherwise stop at a random EOS), so token
counts are known in advance.
"""
import asyncio
import json
import signal
import statistics
import time

import openai
import pytest

from model_dirs import VOCAB_SIZE, serve_model_dir
from serve_process import ServeProcess, metric

MODEL = "serve-model"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return serve_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-load") / "server.log"
    with ServeProcess(["--model", model_dir], log_path=log) as process:
        yield process
        assert process.stop() == 0, process.output()


def _client(server, timeout=60.0):
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="not-needed", max_retries=0, timeout=timeout)


def _exact(n):
    """Completion arguments for exactly n generated tokens."""
    return dict(max_tokens=n, extra_body={"min_tokens": n})


async def _timed_stream(client, prompt, tokens):
    """Streams one completion; returns (ttft, [gaps between text chunks], finish_reason, usage)."""
    started = time.perf_counter()
    stream = await client.completions.create(model=MODEL, prompt=prompt, stream=True,
                                             stream_options={"include_usage": True}, **_exact(tokens))
    arrivals, finish_reason, usage = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.text:
                arrivals.append(time.perf_counter())
            finish_reason = choice.finish_reason or finish_reason
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return arrivals[0] - started, gaps, finish_reason, usage


def _percentiles(values):
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_64_concurrent_streams_finish_and_metrics_count_them(server):
    streams, tokens = 64, 32
    before = server.metrics()

    async def bad_request(client, i):
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model=MODEL, prompt=f"bad {i}", max_tokens=-i - 1)

    async def load():
        async with _client(server) as client:
            runs = [_timed_stream(client, f"prompt {i} " + "word " * (i % 9), tokens) for i in range(streams)]
            bad = [bad_request(client, i) for i in range(8)]   # refused beside the streams, changing nothing
            results = await asyncio.gather(*runs, *bad)
            return results[:streams]

    started = time.perf_counter()
    results = asyncio.run(asyncio.wait_for(load(), 180))
    wall = time.perf_counter() - started
    assert all(r[2] == "length" and r[3].completion_tokens == tokens for r in results)
    ttft = [r[0] for r in results]
    gaps = [g for r in results for g in r[1]]
    ttft_p50, ttft_p99 = _percentiles(ttft)
    itl_p50, itl_p99 = _percentiles(gaps)
    print(f"\n{streams} concurrent streams x {tokens} tokens in {wall:.2f} s "
          f"({streams * tokens / wall:.0f} tokens/s): TTFT p50 {ttft_p50 * 1e3:.1f} ms, p99 {ttft_p99 * 1e3:.1f} ms; "
          f"inter-token p50 {itl_p50 * 1e3:.2f} ms, p99 {itl_p99 * 1e3:.2f} ms")

    after = server.metrics()

    def grew(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("oga_requests_total", route="completion", outcome="length") == streams
    assert grew("oga_requests_total", route="completion", outcome="rejected") == 8
    assert grew("oga_generation_tokens_total") == streams * tokens
    assert grew("oga_prompt_tokens_total") == sum(r[3].prompt_tokens for r in results)
    assert grew("oga_time_to_first_token_seconds_count") == streams
    assert grew("oga_inter_token_latency_seconds_count") == streams * (tokens - 1)
    assert metric(after, "oga_requests_running") == metric(after, "oga_requests_waiting") == 0
    assert metric(after, "oga_kv_blocks_in_use") == 0 and metric(after, "oga_kv_blocks_total") > 0
    assert grew("oga_engine_steps_total") >= tokens
    assert grew("oga_time_to_first_token_seconds_bucket", le="+Inf") == streams
    # The server times each request from its arrival to the engine's token, inside the client's own
    # span from sending to reading that token.
    assert 0 < grew("oga_time_to_first_token_seconds_sum") <= sum(ttft)


def test_dropped_streams_free_their_capacity(server):
    rows, long_turn = 16, 4000          # the model's 16 rows, each asked for a 4000-token turn
    before = server.metrics()

    async def start_and_drop(client, i):
        stream = await client.completions.create(model=MODEL, prompt=f"drop {i}", stream=True, **_exact(long_turn))
        received = 0
        async for chunk in stream:
            received += sum(1 for c in chunk.choices if c.text)
            if received >= 3:
                break
        await stream.close()            # the connection goes away mid-turn

    async def drop_all():
        async with _client(server) as client:
            await asyncio.gather(*(start_and_drop(client, i) for i in range(rows)))

    asyncio.run(asyncio.wait_for(drop_all(), 60))
    deadline = time.monotonic() + 20
    while True:
        now = server.metrics()
        cancelled = metric(now, "oga_requests_total", route="completion", outcome="cancelled") - \
            metric(before, "oga_requests_total", route="completion", outcome="cancelled")
        if cancelled == rows and metric(now, "oga_kv_blocks_in_use") == 0 and metric(now, "oga_requests_running") == 0:
            break
        assert time.monotonic() < deadline, ("capacity did not come back", cancelled, now)
        time.sleep(0.05)
    # The dropped turns stopped early (far fewer tokens than their 16 x 4000), and for good.
    generated = metric(now, "oga_generation_tokens_total") - metric(before, "oga_generation_tokens_total")
    assert generated < rows * long_turn / 2
    settled = server.metrics()
    time.sleep(0.3)
    assert metric(server.metrics(), "oga_generation_tokens_total") == metric(settled, "oga_generation_tokens_total")

    # Every row is free again: a full batch of new streams runs at once.
    async def refill():
        async with _client(server) as client:
            return await asyncio.gather(*(_timed_stream(client, f"again {i}", 8) for i in range(rows)))

    assert all(r[2] == "length" for r in asyncio.run(asyncio.wait_for(refill(), 60)))


def test_metrics_are_prometheus_text(server):
    status, headers, body = server.get("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    from prometheus_client.parser import text_string_to_metric_families

    # (prometheus_client also exposes each counter's and histogram's creation time as <name>_created)
    families = {f.name: f.type for f in text_string_to_metric_families(body.decode())
                if not f.name.endswith("_created")}
    assert families == {
        "oga_requests": "counter", "oga_prompt_tokens": "counter", "oga_generation_tokens": "counter",
        "oga_time_to_first_token_seconds": "histogram", "oga_inter_token_latency_seconds": "histogram",
        "oga_requests_running": "gauge", "oga_requests_waiting": "gauge", "oga_kv_blocks_in_use": "gauge",
        "oga_kv_blocks_total": "gauge", "oga_engine_resident_requests": "gauge",
        "oga_engine_waiting_requests": "gauge", "oga_preemptions": "counter", "oga_engine_steps": "counter"}


def test_health_models_and_unknown_routes(server):
    status, headers, body = server.get("/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    assert headers["x-oga-pid"] == str(server.pid)
    status, _, body = server.get("/v1/models")
    assert json.loads(body)["data"][0]["id"] == MODEL
    status, _, body = server.get("/v1/nothing-here")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


def test_completions_default_to_16_tokens(server):
    async def ask():
        async with _client(server) as client:
            return await client.completions.create(model=MODEL, prompt="default", extra_body={"min_tokens": 16})

    response = asyncio.run(asyncio.wait_for(ask(), 60))
    assert response.usage.completion_tokens == 16 and response.choices[0].finish_reason == "length"


def _post_raw(server, path, body: bytes, timeout=30.0):
    """(status, headers, body bytes) of a POST with `body` sent as is (JSON escapes included)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(server.base_url + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


CHAT_HI = '"messages": [{"role": "user", "content": "Hi"}]'
# JSON bodies whose \ud800 / \udfff escapes decode to lone UTF-16 surrogates wherever a client's text
# can go, error messages that echo it included.
SURROGATE_BODIES = [
    ("/v1/chat/completions", '{"model": "\\ud800", %s}' % CHAT_HI),
    ("/v1/chat/completions", '{"model": "%s", "\\ud800": 1, %s}' % (MODEL, CHAT_HI)),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "Hi", "\\udfff": 1}]}' % MODEL),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "Hi \\ud800"}]}' % MODEL),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "\\ud800", "content": "Hi"}]}' % MODEL),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": [{"type": "\\ud800"}]}]}'
     % MODEL),
    ("/v1/chat/completions", '{"model": "%s", %s, "stop": ["\\ud800"]}' % (MODEL, CHAT_HI)),
    ("/v1/chat/completions", '{"model": "%s", %s, "response_format": {"type": "\\ud800"}}' % (MODEL, CHAT_HI)),
    ("/v1/chat/completions", '{"model": "%s", %s, "response_format": {"type": "json_schema", "json_schema": '
     '{"name": "\\ud800", "schema": {"type": "object", "properties": {"\\ud800": {"type": "string"}}}}}}'
     % (MODEL, CHAT_HI)),
    ("/v1/chat/completions", '{"model": "%s", %s, "stream": true, "stream_options": {"\\ud800": 1}}' % (MODEL, CHAT_HI)),
    ("/v1/completions", '{"model": "\\ud800", "prompt": "Hi"}'),
    ("/v1/completions", '{"model": "%s", "prompt": "\\ud800"}' % MODEL),
    ("/v1/completions", '{"model": "%s", "prompt": "Hi", "\\ud800\\udfff": null}' % MODEL),
]


@pytest.mark.parametrize("path, body", SURROGATE_BODIES)
def test_lone_surrogates_are_answered_4xx_with_an_escaped_error(server, path, body):
    status, headers, raw = _post_raw(server, path, body.encode("ascii"))
    assert status in (400, 404), (status, raw)
    assert headers["content-type"] == "application/json"
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def _text_of(response):
    return response.choices[0].text


def test_standard_openai_fields_that_ask_for_nothing_more_are_accepted(server):
    """The `user` field and the other account-side or hint fields of OpenAI's schema, at any value,
    change nothing in a greedy answer; a top_k beyond the vocabulary is the whole vocabulary."""
    messages = [{"role": "user", "content": "Hello"}]

    async def ask():
        async with _client(server) as client:
            plain = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
            decorated = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, temperature=0, user="user-1234",
                safety_identifier="hash", metadata={"team": "a"}, prompt_cache_key="k", prompt_cache_retention="24h",
                service_tier="auto", parallel_tool_calls=False, store=False, n=1, reasoning_effort="none",
                verbosity="medium", prediction={"type": "content", "content": "Hello"})
            completion = await client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0,
                                                         user="user-1234")
            plain_completion = await client.completions.create(model=MODEL, prompt="Hello", max_tokens=8,
                                                               temperature=0)
            whole = await client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, seed=3,
                                                    extra_body={"top_k": VOCAB_SIZE})
            beyond = [await client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, seed=3,
                                                      extra_body={"top_k": top_k})
                      for top_k in (VOCAB_SIZE + 1, 2 ** 31, 10 ** 30)]
            return plain, decorated, completion, plain_completion, whole, beyond

    plain, decorated, completion, plain_completion, whole, beyond = asyncio.run(asyncio.wait_for(ask(), 60))
    assert decorated.choices[0].message.content == plain.choices[0].message.content
    assert _text_of(completion) == _text_of(plain_completion)
    assert [_text_of(b) for b in beyond] == [_text_of(whole)] * 3


def test_a_stop_string_holding_nul_ends_the_answer_before_it(server):
    """The engine takes stop strings as C strings; one with a NUL character is matched by the server,
    which ends the turn there as the engine would (same text streamed or not, finish_reason stop,
    the usage of the tokens up to it). The random model writes a NUL now and then: the first of 32
    seeds that does is the case."""
    def ask(client, seed, **extra):
        return client.completions.create(model=MODEL, prompt="hello", max_tokens=64, temperature=2.0, seed=seed,
                                         **extra)

    async def run():
        async with _client(server) as client:
            for seed in range(32):
                text = _text_of(await ask(client, seed))
                at = text.find("\0")
                if at > 0:
                    break
            else:
                raise AssertionError("no answer of 32 seeds holds a NUL character")
            stop = text[at - 1:at + 1]
            stopped = await ask(client, seed, stop=[stop, "never \0 written"])
            chunks = [c async for c in await ask(client, seed, stop=[stop], stream=True,
                                                  stream_options={"include_usage": True})]
            full = await ask(client, seed)
            return text, stop, stopped, chunks, full

    text, stop, stopped, chunks, full = asyncio.run(asyncio.wait_for(run(), 120))
    assert _text_of(stopped) == text[:text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    assert 1 <= stopped.usage.completion_tokens < full.usage.completion_tokens
    assert "".join(c.choices[0].text for c in chunks if c.choices) == _text_of(stopped)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage == stopped.usage


def test_a_client_that_drops_mid_upload_costs_one_log_line(server):
    """starlette's ClientDisconnect while the body is read: one line in the log, no traceback, and
    the server carries on."""
    import socket

    before = server.output()
    before_cancelled = metric(server.metrics(), "oga_requests_total", route="chat", outcome="cancelled")
    host, port = server.base_url.rsplit("/", 1)[1].split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 1000\r\n\r\n{\"model\": \"serve")
            time.sleep(0.2)
    deadline = time.monotonic() + 10
    while metric(server.metrics(), "oga_requests_total", route="chat", outcome="cancelled") < before_cancelled + 3:
        assert time.monotonic() < deadline, server.output()[len(before):]
        time.sleep(0.05)
    logged = server.output()[len(before):]
    assert "Traceback" not in logged, logged
    lines = [line for line in logged.splitlines() if line.strip()]
    assert lines == ["oga serve: the client of POST /v1/chat/completions went away before its request body was "
                     "complete"] * 3, logged
    status, _, body = server.get("/health")
    assert status == 200


def test_full_waiting_queue_answers_503_with_retry_after(model_dir, tmp_path):
    args = ["--model", model_dir, "--max-batch-size", "1", "--max-waiting", "1"]
    with ServeProcess(args, log_path=tmp_path / "server.log") as server:

        async def scenario():
            async with _client(server) as client:
                running = await client.completions.create(model=MODEL, prompt="first", stream=True, **_exact(4000))
                first = await running.__anext__()       # generating: it holds the only row
                assert first.choices
                waiting = asyncio.ensure_future(_timed_stream(client, "second", 4))
                while metric(server.metrics(), "oga_requests_waiting") < 1:   # the second waits for the row
                    await asyncio.sleep(0.01)
                with pytest.raises(openai.InternalServerError) as e:
                    await client.completions.create(model=MODEL, prompt="third", max_tokens=4)
                assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
                assert e.value.code == "service_unavailable"
                await running.close()                   # the row frees; the waiting request runs
                return await waiting

        assert asyncio.run(asyncio.wait_for(scenario(), 60))[2] == "length"
        assert metric(server.metrics(), "oga_requests_total", route="completion", outcome="unavailable") == 1
        assert server.stop() == 0


def test_sigterm_finishes_in_flight_streams_then_exits_0(model_dir, tmp_path):
    with ServeProcess(["--model", model_dir, "--shutdown-timeout", "60"], log_path=tmp_path / "server.log") as server:

        async def scenario():
            async with _client(server) as client:
                stream = await client.completions.create(model=MODEL, prompt="long", stream=True,
                                                         stream_options={"include_usage": True}, **_exact(3000))
                await stream.__anext__()
                server.signal(signal.SIGTERM)
                # Draining: new requests are refused, the running stream goes on to its end.
                deadline = time.monotonic() + 10
                while True:
                    try:
                        await client.completions.create(model=MODEL, prompt="late", max_tokens=2)
                    except openai.InternalServerError as e:
                        assert e.status_code == 503 and "shutting down" in e.message
                        break
                    assert time.monotonic() < deadline, "the server kept admitting requests after SIGTERM"
                    await asyncio.sleep(0.02)
                usage = finish = None
                async for chunk in stream:
                    usage = chunk.usage or usage
                    finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
                return finish, usage

        finish, usage = asyncio.run(asyncio.wait_for(scenario(), 90))
        assert finish == "length" and usage.completion_tokens == 3000
        assert server.process.wait(30) == 0, server.output()


def test_sigterm_deadline_cancels_what_still_runs(model_dir, tmp_path):
    args = ["--model", model_dir, "--shutdown-timeout", "0.5", "--max-batch-size", "1"]
    with ServeProcess(args, log_path=tmp_path / "server.log") as server:

        async def scenario():
            async with _client(server) as client:
                stream = await client.completions.create(model=MODEL, prompt="endless", stream=True,
                                                         **_exact(4000))
                await stream.__anext__()
                server.signal(signal.SIGTERM)
                with pytest.raises(openai.APIError) as e:   # the stream ends with an error event
                    async for _ in stream:
                        pass
                return e.value

        error = asyncio.run(asyncio.wait_for(scenario(), 60))
        assert "shutting down" in str(error)
        assert server.process.wait(30) == 0, server.output()
