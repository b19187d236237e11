"""The OpenAI-compatible HTTP face of one engine: a FastAPI application.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models (and /v1/models/{id}),
GET /health, GET /metrics. Each generation request is validated (openai_protocol), tokenized here,
and handed to the engine's owner thread as a TurnSpec; its tokens come back on the turn's asyncio
queue and leave as one JSON body or as server-sent events. A client that goes away mid-turn has its
turn cancelled and its request closed. Every response carries the replica's id (x-oga-replica) and
process id (x-oga-pid), so a client behind Ray Serve can tell which replica answered.

`create_app(settings)` loads the model when the application starts (ASGI lifespan), as a Ray Serve
replica does; `oga serve` starts the EngineOwner itself first, so a bad model fails the command
before anything listens, and passes it in. Shutdown (`Server.drain`, then the lifespan's end) stops
admitting requests (503), gives in-flight turns `shutdown_timeout_s` to finish, cancels the rest and
stops the owner thread.
"""
import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import time

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import oga as og
from oga.tokenizer import encode_rendered_chat

from .engine_owner import Begun, EngineOwner, EngineStats, Finished, Rejected, ServiceUnavailable, Token, TurnSpec
from .metrics import ServeMetrics
from .openai_protocol import (
    ChunkWriter,
    OpenAIError,
    bad_request,
    new_id,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
    response_body,
    unicode_text,
)
from .settings import ServeSettings
from .turn_text import TurnText

logger = logging.getLogger("oga.serve")

_FINISH_STOP = (int(og.FinishReason.EOS), int(og.FinishReason.STOP_STRING))
_FINISH_LENGTH = (int(og.FinishReason.MAX_GENERATED_TOKENS), int(og.FinishReason.MAX_SESSION_TOKENS))
_FINISH_STOP_STRING = int(og.FinishReason.STOP_STRING)
_FINISH_CANCELLED = int(og.FinishReason.CANCELLED)


def load_model_and_tokenizer(settings: ServeSettings):
    """Runs on the owner thread: the model (with the max_batch_size overlay) and its tokenizer."""
    from oga.model_loading import CommandError, load_model

    try:
        model = load_model(settings.model_dir, settings.max_batch_size)
    except CommandError as e:
        raise RuntimeError(str(e)) from None
    return model, og.Tokenizer(model)


def start_engine_owner(settings: ServeSettings) -> EngineOwner:
    owner = EngineOwner(lambda: load_model_and_tokenizer(settings))
    owner.start()
    return owner



class _TurnProgress:
    """Keeps one turn's share of the metrics and of the server's waiting / in-flight counts right,
    whichever way the turn ends (end() is idempotent)."""
    __slots__ = ("server", "route", "arrived", "last_token_at", "ended")

    def __init__(self, server, route, arrived):
        self.server = server
        self.route = route
        self.arrived = arrived
        self.last_token_at = None
        self.ended = False
        server.waiting += 1
        server.in_flight += 1
        server.metrics.waiting.inc()
        server.idle.clear()

    def token(self, at):
        metrics = self.server.metrics
        if self.last_token_at is None:
            self.server.waiting -= 1
            metrics.waiting.dec()
            metrics.running.inc()
            metrics.time_to_first_token.observe(at - self.arrived)
        else:
            metrics.inter_token_latency.observe(at - self.last_token_at)
        self.last_token_at = at
        metrics.generation_tokens.inc()

    def end(self, outcome):
        if self.ended:
            return
        self.ended = True
        server, metrics = self.server, self.server.metrics
        if self.last_token_at is None:
            server.waiting -= 1
            metrics.waiting.dec()
        else:
            metrics.running.dec()
        metrics.requests.labels(self.route, outcome).inc()
        server.in_flight -= 1
        if server.in_flight == 0:
            server.idle.set()


class _EventStreamResponse(StreamingResponse):
    """Server-sent events that end the moment the client disconnects, whatever the ASGI version
    (Starlette otherwise notices a disconnect only at the next write, and a turn still waiting for
    its first token would hold its place until then). `abandon` runs when the response ends, however
    it ends (it cancels the turn unless the turn finished), even if the body never started."""

    def __init__(self, content, abandon, **kwargs):
        super().__init__(content, **kwargs)
        self._abandon = abandon

    async def __call__(self, scope, receive, send):
        async def stream():
            with contextlib.suppress(OSError):   # the client went away mid-write
                await self.stream_response(send)

        tasks = (asyncio.ensure_future(stream()), asyncio.ensure_future(self.listen_for_disconnect(receive)))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.body_iterator.aclose()
            self._abandon()
        streaming = tasks[0]
        if not streaming.cancelled() and streaming.exception() is not None:
            raise streaming.exception()   # the stream's own failure (not a disconnect) reaches the server


class Server:
    """The state behind the routes: the owner, the metrics and the admission counts."""

    def __init__(self, settings: ServeSettings, owner: EngineOwner | None, replica_id: str):
        self.settings = settings
        self.owner = owner
        self.replica_id = replica_id
        self.metrics = ServeMetrics(lambda: self.owner.stats if self.owner is not None else EngineStats())
        self.created = int(time.time())
        self.waiting = 0          # accepted turns without a first token (the 503 limit)
        self.in_flight = 0        # accepted turns not ended
        self.draining = False
        self.idle = asyncio.Event()
        self.idle.set()

    # ---- life cycle ----------------------------------------------------------------------------

    async def start(self):
        if self.owner is None:
            loop = asyncio.get_running_loop()
            self.owner = await loop.run_in_executor(None, start_engine_owner, self.settings)

    async def drain(self, timeout_s: float | None = None):
        """Stops admitting; waits up to the deadline for in-flight turns, then cancels the rest."""
        timeout_s = self.settings.shutdown_timeout_s if timeout_s is None else timeout_s
        self.draining = True
        if self.in_flight:
            logger.info("oga serve: draining %d in-flight requests (at most %.0f s)", self.in_flight, timeout_s)
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
        except asyncio.TimeoutError:   # (TimeoutError itself from Python 3.11 on)
            logger.warning("oga serve: cancelling %d requests still running after %.0f s", self.in_flight, timeout_s)
            if self.owner is not None:
                self.owner.cancel_all()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.idle.wait(), 10.0)

    async def stop(self):
        await self.drain()
        if self.owner is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.owner.stop)

    @property
    def healthy(self) -> bool:
        return self.owner is not None and self.owner.healthy

    # ---- admission -----------------------------------------------------------------------------

    def _unavailable(self, message: str) -> OpenAIError:
        return OpenAIError(503, message, type="server_error", code="service_unavailable",
                           headers={"Retry-After": str(self.settings.retry_after_s)})

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        too_large = OpenAIError(413, f"The request body exceeds {limit} bytes.", code="request_too_large")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    def _turn_spec(self, generation) -> TurnSpec:
        tokenizer = self.owner.tokenizer
        if generation.kind == "chat":
            if not tokenizer.chat_template:
                raise bad_request(f"The model {self.settings.model_name} has no chat template; use /v1/completions.",
                                  "messages")
            try:
                text = tokenizer.apply_chat_template(json.dumps(generation.messages), add_generation_prompt=True)
            except RuntimeError as e:
                raise bad_request(f"The chat template cannot render these messages: {e}", "messages") from None
            prompt = encode_rendered_chat(tokenizer, unicode_text(text, "messages"))
        elif generation.prompt_text is not None:
            prompt = tokenizer.encode(unicode_text(generation.prompt_text, "prompt"))
        else:
            if not all(0 <= t < 2 ** 31 for t in generation.prompt_tokens):
                raise bad_request("Invalid 'prompt': token ids must be in [0, 2**31).", "prompt")
            prompt = np.asarray(generation.prompt_tokens, dtype=np.int32)
        if prompt.size == 0:
            raise bad_request("The prompt is empty (it encodes to no tokens).", "prompt")
        limit = self.owner.max_request_length
        room = limit - int(prompt.size)
        if room < 1 or (generation.max_tokens is not None and generation.max_tokens > room):
            asked = f" ({prompt.size} in the prompt, {generation.max_tokens} to generate)" \
                if generation.max_tokens is not None else f" ({prompt.size} in the prompt)"
            raise bad_request(f"This model's maximum context length is {limit} tokens, but the request needs "
                              f"{int(prompt.size) + (generation.max_tokens or 0)}{asked}.",
                              "messages" if generation.kind == "chat" else "prompt", "context_length_exceeded")
        if generation.max_tokens is not None:
            max_tokens = generation.max_tokens
        elif generation.kind == "completion":
            max_tokens = min(16, room)          # OpenAI's completions default
        else:
            max_tokens = room
        if generation.min_tokens > max_tokens:
            raise bad_request(f"'min_tokens' ({generation.min_tokens}) exceeds the {max_tokens} tokens this "
                              "request may generate.", "min_tokens")
        policy = generation.policy
        if "top_k" in policy and policy["top_k"][0] > self.vocab_size:
            # Beyond the vocabulary top_k keeps every token, which top_k = vocab_size says (the engine
            # refuses a larger one).
            policy = {**policy, "top_k": (self.vocab_size,)}
        return TurnSpec(prompt, max_tokens, policy)

    @functools.cached_property
    def vocab_size(self) -> int:
        """The model's vocabulary size (model.vocab_size, as the engine reads it)."""
        from oga.introspection import decoder_names

        return int(decoder_names(self.settings.model_dir)["vocab_size"])

    async def generate(self, request: Request, route: str):
        arrived = time.perf_counter()
        try:
            if self.draining:
                raise self._unavailable("The server is shutting down.")
            if not self.healthy:
                raise self._unavailable(f"The engine is not available: {self.owner.failure if self.owner else ''}")
            try:
                body = await self._read_body(request)
            except ClientDisconnect:
                # Nobody to answer: one line, not a traceback per dropped upload.
                logger.warning("oga serve: the client of %s %s went away before its request body was complete",
                               request.method, request.url.path)
                self.metrics.requests.labels(route, "cancelled").inc()
                return Response(status_code=499)
            document = parse_json_body(body)
            generation = (parse_chat_request if route == "chat" else parse_completion_request)(document)
            if generation.model != self.settings.model_name:
                raise OpenAIError(404, f"The model '{generation.model}' does not exist; this server serves "
                                  f"'{self.settings.model_name}'.", param="model", code="model_not_found")
            spec = self._turn_spec(generation)
            if self.waiting >= self.settings.max_waiting:
                raise self._unavailable(f"The server is at capacity ({self.waiting} requests waiting); retry later.")
            try:
                turn = self.owner.submit(spec)
            except ServiceUnavailable as e:
                raise self._unavailable(str(e)) from None
        except OpenAIError as e:
            self.metrics.requests.labels(route, "unavailable" if e.status == 503 else "rejected").inc()
            raise
        progress = _TurnProgress(self, route, arrived)
        try:
            first = await turn.events.get()
        except BaseException:
            self.owner.cancel(turn)
            progress.end("cancelled")
            raise
        if isinstance(first, Rejected):
            progress.end("unavailable" if first.unavailable else "rejected")
            if first.unavailable:
                raise self._unavailable(first.message)
            raise bad_request(first.message)
        if not isinstance(first, Begun):   # the owner answers a begin with Begun or Rejected only
            self.owner.cancel(turn)
            progress.end("failed")
            raise RuntimeError(f"unexpected first event of a turn: {first!r}")
        self.metrics.prompt_tokens.inc(int(spec.prompt.size))
        text = TurnText(self.owner.tokenizer, generation.stop, generation.engine_stops)
        response_id = new_id(generation.kind)
        if generation.stream:
            writer = ChunkWriter(generation.kind, response_id, self.settings.model_name)
            events = self._stream(turn, progress, text, writer, generation.include_usage)
            return _EventStreamResponse(events, lambda: self._abandon(turn, progress), media_type="text/event-stream",
                                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._complete(request, turn, progress, text, generation, response_id)

    # ---- turns -----------------------------------------------------------------------------------

    def _abandon(self, turn, progress):
        """The client went away (or its response was cancelled) before the turn ended."""
        if not progress.ended:
            self.owner.cancel(turn)
            progress.end("cancelled")

    async def _stream(self, turn, progress, text, writer, include_usage):
        try:
            opening = writer.opening()
            if opening:
                yield opening
            while True:
                item = await turn.events.get()
                if type(item) is Token:
                    progress.token(item.at)
                    piece = text.add(item.token)
                    if piece:
                        yield writer.text(piece)
                    item = self._server_stop(turn, text)
                    if item is None:
                        continue
                piece = text.finish(item.stop_string_index if item.reason == _FINISH_STOP_STRING else -1)
                if piece:
                    yield writer.text(piece)
                outcome, finish_reason = _outcome(item)
                if finish_reason is None:
                    progress.end(outcome)
                    yield writer.error(self._turn_error(item))
                    return
                yield writer.finish(finish_reason)
                if include_usage:
                    yield writer.usage(item.prompt_tokens, item.generated_tokens)
                yield writer.DONE
                progress.end(outcome)
                return
        finally:
            self._abandon(turn, progress)

    async def _complete(self, request, turn, progress, text, generation, response_id):
        async def collect():
            pieces = []
            while True:
                item = await turn.events.get()
                if type(item) is Token:
                    progress.token(item.at)
                    pieces.append(text.add(item.token))
                    item = self._server_stop(turn, text)
                    if item is None:
                        continue
                pieces.append(text.finish(item.stop_string_index if item.reason == _FINISH_STOP_STRING else -1))
                return "".join(pieces), item

        async def disconnected():
            try:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
            except Exception:  # this server cannot watch the connection: the turn alone decides
                await asyncio.Event().wait()

        collecting = asyncio.ensure_future(collect())
        watching = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait((collecting, watching), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not collecting.done():   # the client went away (or this handler was cancelled)
                collecting.cancel()
                self._abandon(turn, progress)
        if not collecting.done() or collecting.cancelled():
            return Response(status_code=499)   # nobody is listening
        answer, finished = collecting.result()
        outcome, finish_reason = _outcome(finished)
        progress.end(outcome)
        if finish_reason is None:
            raise self._turn_error(finished)
        return JSONResponse(response_body(generation.kind, response_id, int(time.time()), self.settings.model_name,
                                          answer, finish_reason, finished.prompt_tokens, finished.generated_tokens))

    def _server_stop(self, turn, text):
        """When the text now holds a stop string the server matches (one the engine cannot take), the
        turn ends here: its request is cancelled (the engine's later events go unread) and the answer
        finishes on that stop string as an engine-matched one would. Else None."""
        index = text.server_stop()
        if index < 0:
            return None
        self.owner.cancel(turn)
        return Finished(_FINISH_STOP_STRING, index, int(turn.spec.prompt.size), text.tokens,
                        "", time.perf_counter())

    def _turn_error(self, finished: Finished) -> OpenAIError:
        if finished.reason == _FINISH_CANCELLED:
            return self._unavailable(f"The request was {finished.error}.")
        return OpenAIError(500, f"The engine failed the request: {finished.error}", type="server_error",
                           code="engine_error")


def _outcome(finished: Finished):
    """(metrics outcome, OpenAI finish_reason or None when the turn did not finish normally)."""
    if finished.reason in _FINISH_STOP:
        return "stop", "stop"
    if finished.reason in _FINISH_LENGTH:
        return "length", "length"
    if finished.reason == _FINISH_CANCELLED:
        return "cancelled", None
    return "failed", None


class _ReplicaHeaders:
    """ASGI middleware: every HTTP response names the replica and process that answered."""

    def __init__(self, app, replica_id: str):
        self.app = app
        self.headers = [(b"x-oga-replica", replica_id.encode("latin-1")),
                        (b"x-oga-pid", str(os.getpid()).encode("latin-1"))]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + self.headers}
            await send(message)

        return await self.app(scope, receive, send_with_headers)


def _error_response(error: OpenAIError) -> Response:
    # ASCII JSON: a message may echo the client's text, and JSON's \ud800 escapes decode to lone
    # surrogates, which UTF-8 cannot encode (JSONResponse's UTF-8 rendering would fail: a 500).
    return Response(json.dumps(error.body()), status_code=error.status, headers=error.headers,
                    media_type="application/json")


def default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def create_app(settings: ServeSettings, *, owner: EngineOwner | None = None, replica_id: str | None = None) -> FastAPI:
    """The FastAPI application serving `settings.model_dir`. `owner`: an EngineOwner already started
    on that model (else the application starts one when it starts). The application stops the owner
    when it shuts down. `app.state.server` is the Server behind the routes."""
    server = Server(settings, owner, replica_id or default_replica_id())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = FastAPI(title="oga serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_middleware(_ReplicaHeaders, replica_id=server.replica_id)

    @app.exception_handler(OpenAIError)
    async def openai_error(request, error: OpenAIError):
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error: StarletteHTTPException):
        kind = "not_found" if error.status_code == 404 else "method_not_allowed" if error.status_code == 405 else None
        return _error_response(OpenAIError(error.status_code, f"{request.method} {request.url.path}: {error.detail}",
                                           code=kind, headers=dict(error.headers or {})))

    @app.exception_handler(Exception)
    async def unexpected_error(request, error: Exception):
        logger.exception("oga serve: unexpected error in %s %s", request.method, request.url.path)
        return _error_response(OpenAIError(500, f"Internal error: {type(error).__name__}: {error}",
                                           type="server_error"))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.generate(request, "completion")

    def model_card():
        return {"id": settings.model_name, "object": "model", "created": server.created, "owned_by": "oga"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != settings.model_name:
            raise OpenAIError(404, f"The model '{model_id}' does not exist.", param="model", code="model_not_found")
        return model_card()

    @app.get("/health")
    async def health():
        if server.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not server.healthy:
            failure = server.owner.failure if server.owner is not None else "starting"
            return JSONResponse({"status": "unhealthy", "reason": failure}, status_code=503)
        return {"status": "ok", "model": settings.model_name, "replica": server.replica_id}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type=server.metrics.content_type)

    return app
