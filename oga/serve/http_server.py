"""One `oga serve` process: the FastAPI application on uvicorn, with a graceful shutdown.

SIGTERM (or Ctrl-C) does not stop the server at once: new requests are answered 503 with
Retry-After and /health reports "draining" while in-flight turns get `shutdown_timeout_s` to
finish; what still runs then is cancelled (a stream ends with an error event, a waiting client gets
503), uvicorn closes its connections, the owner thread stops, and the process exits 0. A second
signal skips the wait: everything is cancelled at once.
"""
import asyncio
import sys

import uvicorn

from .app import create_app, start_engine_owner
from .settings import ServeSettings


class _DrainingServer(uvicorn.Server):
    """uvicorn's server whose exit signals start the application's drain. Signals are not recorded
    as uvicorn's own handler records them, so uvicorn does not raise them again once it has shut
    down: a drained server exits 0."""

    def __init__(self, config: uvicorn.Config, server):
        super().__init__(config)
        self._server = server
        self._loop = None
        self._signals = 0

    async def startup(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"oga serve: {self._server.settings.model_name} on http://{host}:{port}", file=sys.stderr,
                  flush=True)

    def handle_exit(self, sig, frame):
        self._signals += 1
        if self._loop is None:          # before the loop runs: nothing to drain
            self.should_exit = True
            return
        if self._signals == 1:
            self._loop.call_soon_threadsafe(self._start_drain)
        else:
            self._loop.call_soon_threadsafe(self._cancel_now)

    def _start_drain(self):
        print("oga serve: shutting down (finishing in-flight requests; signal again to cancel them)",
              file=sys.stderr, flush=True)
        asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self):
        await self._server.drain()
        self.should_exit = True

    def _cancel_now(self):
        if self._server.owner is not None:
            self._server.owner.cancel_all()
        self._server.draining = True


def serve_http(settings: ServeSettings, host: str, port: int, log_level: str = "info") -> int:
    """Loads the model, serves until SIGTERM / Ctrl-C has drained the server; returns the exit code.
    A model that cannot be loaded raises RuntimeError before anything listens."""
    owner = start_engine_owner(settings)
    app = create_app(settings, owner=owner)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=5, timeout_keep_alive=5)
    server = _DrainingServer(config, app.state.server)
    try:
        server.run()
    finally:
        if owner.healthy:   # uvicorn never started the application (e.g. the port is taken)
            owner.stop()
    return 0 if server.started else 1
