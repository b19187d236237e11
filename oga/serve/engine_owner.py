"""The engine's owner thread and the bridge between it and the server's event loop.

An og.Engine belongs to the thread that created it: every engine, request and turn-option call
must come from that thread. EngineOwner starts one thread that loads the model, creates the engine
and then loops:

1. take the commands handlers sent through a thread-safe queue (begin a turn, cancel a turn,
   cancel everything, stop); when the engine has nothing to run it sleeps on that queue;
2. run one engine step and copy what each event says out of the borrowed event views;
3. post everything the step produced to each handler's event loop in one call
   (loop.call_soon_threadsafe), where it lands on the turn's own asyncio.Queue.

Posting never blocks and nothing waits for a client: a slow reader only lets its own queue grow
(bounded by its turn's max_tokens). Handlers never touch engine objects; a Turn carries copied
inputs in and copied values out.
"""
import asyncio
import dataclasses
import enum
import queue
import threading
import time
import typing

import numpy as np


class ServiceUnavailable(Exception):
    """The owner cannot take the turn now (shutting down, or the engine failed): HTTP 503."""


@dataclasses.dataclass(frozen=True)
class TurnSpec:
    """What a handler asks the engine to run: prompt token ids, the generated-token limit and the
    og.TurnOptions settings, as {setter name without "set_": tuple of arguments}."""
    prompt: np.ndarray
    max_tokens: int
    policy: dict = dataclasses.field(default_factory=dict)


# ---- what a turn's queue receives (values only: no engine object crosses threads) -----------------

class Begun(typing.NamedTuple):
    """begin_turn accepted the turn."""


class Rejected(typing.NamedTuple):
    """The turn never began: begin_turn refused it (a bad option: HTTP 400) or the owner cannot take
    turns (unavailable: HTTP 503)."""
    message: str
    unavailable: bool


class Token(typing.NamedTuple):
    token: int
    at: float        # time.perf_counter() when the owner received the step's events


class Finished(typing.NamedTuple):
    reason: int                    # og.FinishReason value
    stop_string_index: int         # which stop string matched (reason STOP_STRING), else -1
    prompt_tokens: int
    generated_tokens: int
    error: str                     # the engine's error code name for a failed turn, else ""
    at: float


class EngineStats(typing.NamedTuple):
    """The engine's counters after the owner's latest step (oga.introspection.engine_counters, the
    OgaExtEngineGetCounters introspection call of the public C API)."""
    total_blocks: int = 0
    free_blocks: int = 0
    resident_requests: int = 0
    waiting_requests: int = 0
    preemptions: int = 0
    steps: int = 0


class Turn:
    """One turn as its handler sees it. Created on the handler's event loop by EngineOwner.submit;
    its events arrive, in order, on `events`. `request` and `turn_id` belong to the owner thread."""
    __slots__ = ("spec", "loop", "events", "submitted_at", "request", "turn_id", "generated")

    def __init__(self, spec: TurnSpec, loop: asyncio.AbstractEventLoop):
        self.spec = spec
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.submitted_at = time.perf_counter()
        self.request = None
        self.turn_id = 0
        self.generated = 0


class _Command(enum.Enum):
    BEGIN = 1
    CANCEL = 2
    CANCEL_ALL = 3
    STOP = 4


def _deliver(items):
    """Runs on a handler's event loop: hands each item to its turn's queue."""
    for turn, item in items:
        turn.events.put_nowait(item)


class EngineOwner:
    """Owns one og.Engine on one thread. `load` runs on that thread and returns (og.Model,
    og.Tokenizer); `stats_interval_s` bounds how stale EngineStats may get while steps run."""

    def __init__(self, load: typing.Callable, *, stats_interval_s: float = 0.05, name: str = "oga-engine-owner"):
        self._load = load
        self._stats_interval_s = stats_interval_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._failure = ""                      # set by the owner when the engine stops being usable
        # Set (under _closing) by stop() or by an owner thread that ends: no BEGIN is queued after it,
        # so every queued turn is answered (begun, or rejected by the owner's last drain).
        self._closed = False
        self._closing = threading.Lock()
        self.tokenizer = None
        self.max_request_length = 0
        self.max_batch_size = 0
        self.stats = EngineStats()              # replaced (never mutated) by the owner thread
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # ---- life cycle (any thread) ---------------------------------------------------------------

    def start(self, timeout: float | None = None):
        """Starts the owner thread and waits until the engine exists; re-raises a load failure."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the engine owner did not start in time")
        if self._startup_error is not None:
            raise self._startup_error

    def stop(self, timeout: float | None = None):
        """Cancels whatever is still running, ends the owner thread and waits for it."""
        with self._closing:
            self._closed = True
            self._commands.put((_Command.STOP, None))
        self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and not self._failure and self._startup_error is None

    @property
    def failure(self) -> str:
        return self._failure

    # ---- commands (the handler's event loop) ---------------------------------------------------

    def submit(self, spec: TurnSpec) -> Turn:
        """Queues `spec` for the owner; its first event is Begun or Rejected."""
        turn = Turn(spec, asyncio.get_running_loop())
        with self._closing:
            if self._closed or self._failure:
                raise ServiceUnavailable(self._failure or "the server is shutting down")
            self._commands.put((_Command.BEGIN, turn))
        return turn

    def cancel(self, turn: Turn):
        """Cancels the turn and closes its request (its batch row and KV blocks come back at once).
        Idempotent; a turn that already finished is left alone. Posts Finished(CANCELLED)."""
        self._commands.put((_Command.CANCEL, turn))

    def cancel_all(self):
        """Cancels every live turn (the end of a graceful shutdown's deadline)."""
        self._commands.put((_Command.CANCEL_ALL, None))

    # ---- the owner thread ----------------------------------------------------------------------

    def _main(self):
        try:
            import oga as og

            model, self.tokenizer = self._load()
            engine = og.Engine(model)
            capabilities = engine.get_capabilities()
            self.max_request_length = capabilities.max_request_length
            self.max_batch_size = capabilities.configured_max_batch_size
        except BaseException as e:  # noqa: B036 - handed to start()'s caller, who re-raises it
            self._startup_error = e
            self._ready.set()
            return
        self._ready.set()
        loop = _OwnerLoop(self, og, engine)
        try:
            loop.run()
        except BaseException as e:  # noqa: B036 - recorded for /health, then the thread ends with it
            self._failure = f"the engine owner thread stopped: {type(e).__name__}: {e}"
            raise
        finally:
            # Whatever ended the loop, every live or queued turn gets its answer.
            if self._failure:
                loop.fail_all(self._failure)
            else:
                loop.end_all("cancelled: the server is shutting down")
            with self._closing:
                self._closed = True
            loop.reject_queued()
            loop.flush()
            del loop, engine  # the engine is destroyed on its own thread


class _OwnerLoop:
    """The owner thread's state: live requests and what is to be posted after the current step."""

    def __init__(self, owner: EngineOwner, og, engine):
        self.owner = owner
        self.og = og
        self.engine = engine
        self.buffer = engine.create_event_buffer(max(64, 2 * owner.max_batch_size))
        self.live: dict = {}                  # og.Request -> Turn
        self.outbox: dict = {}                # event loop -> [(Turn, item)]
        self.stats_at = 0.0
        self.steps = 0
        self.flag_token = og.EngineEventFlags.TOKEN
        self.flag_finished = og.EngineEventFlags.TURN_FINISHED
        self.flag_failed = og.EngineEventFlags.FAILED
        self.cancelled = int(og.FinishReason.CANCELLED)
        self.failed = int(og.FinishReason.FAILED)
        self.engine_failures = (og.EngineErrorCode.ENGINE_CONTRACT_FAILURE, og.EngineErrorCode.ENGINE_EXECUTION_FAILURE)

    def run(self):
        """Serves commands and steps until STOP."""
        from oga.introspection import engine_counters

        self.counters = engine_counters
        self._refresh_stats()
        while True:
            idle = not self.live or not self.engine.has_pending_requests()
            if not self._take_commands(block=idle):
                return
            if self.live and not self.owner._failure:
                self._step()
            self.flush()

    # ---- commands --------------------------------------------------------------------------------

    def _take_commands(self, block: bool) -> bool:
        """Processes queued commands (waiting for one when `block`); False once STOP arrived."""
        commands = self.owner._commands
        try:
            command, turn = commands.get() if block else commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if command is _Command.BEGIN:
                self._begin(turn)
            elif command is _Command.CANCEL:
                self._cancel(turn, "cancelled")
            elif command is _Command.CANCEL_ALL:
                self.end_all("cancelled: the server is shutting down")
            else:
                return False
            try:
                command, turn = commands.get_nowait()
            except queue.Empty:
                self._refresh_stats()
                return True

    def reject_queued(self):
        """Answers the turns still queued once no more can be queued (the owner is ending)."""
        commands = self.owner._commands
        why = self.owner._failure or "the server is shutting down"
        while True:
            try:
                command, turn = commands.get_nowait()
            except queue.Empty:
                return
            if command is _Command.BEGIN:
                self._post(turn, Rejected(why, unavailable=True))

    def _begin(self, turn: Turn):
        if self.owner._failure:
            self._post(turn, Rejected(self.owner._failure, unavailable=True))
            return
        spec = turn.spec
        request = self.engine.create_request()
        try:
            options = self.og.TurnOptions(request)
            options.set_max_generated_tokens(spec.max_tokens)
            for name, arguments in spec.policy.items():
                getattr(options, "set_" + name)(*arguments)
            turn.turn_id = request.begin_turn(spec.prompt, options)
        except (RuntimeError, ValueError, TypeError, OverflowError) as e:
            request.close()
            self._post(turn, Rejected(str(e), unavailable=False))
            return
        turn.request = request
        self.live[request] = turn
        self._post(turn, Begun())

    def _cancel(self, turn: Turn, why: str):
        request = turn.request
        if request is None or self.live.pop(request, None) is None:
            return  # never begun, or already finished
        request.cancel_turn(turn.turn_id)
        request.close()
        self._post(turn, Finished(self.cancelled, -1, int(turn.spec.prompt.size), turn.generated, why,
                                  time.perf_counter()))

    def end_all(self, why: str):
        for turn in list(self.live.values()):
            self._cancel(turn, why)

    # ---- steps -----------------------------------------------------------------------------------

    def _step(self):
        try:
            events = self.engine.run(self.buffer)
        except RuntimeError as e:
            self._fail(f"the engine failed: {e}")
            return
        now = time.perf_counter()
        self.steps += 1
        finished = []
        engine_failure = ""
        for event in events:
            request = event.request
            flags = event.flags
            if request is None:
                # Engine-level events: CAPACITY_BLOCKED and RETRYABLE steps run again later; a
                # FAILED one means the engine is no longer usable.
                if flags & self.flag_failed:
                    self._fail(f"the engine failed ({event.error_code.name})")
                    return
                continue
            turn = self.live.get(request)
            if turn is None:
                continue
            if flags & self.flag_token:
                turn.generated += 1
                self._post(turn, Token(event.token, now))
            if flags & self.flag_finished:
                usage = event.usage
                reason = int(event.finish_reason)
                error = event.error_code.name if flags & self.flag_failed else ""
                if error and event.error_code in self.engine_failures:
                    engine_failure = error
                stop_string = event.matched_stop_string_index
                self._post(turn, Finished(reason, -1 if stop_string is None else stop_string, usage.prompt_tokens,
                                          usage.generated_tokens, error, now))
                finished.append(request)
        for request in finished:
            # A finished request stays resident (for a continuation turn) until it is closed;
            # closing frees its row and KV blocks for the next waiting turn.
            del self.live[request]
            request.close()
        if engine_failure:
            # The executor failed the engine itself (not one request): every running turn ended
            # with it, and the engine refuses further work.
            self._fail(f"the engine failed ({engine_failure})")
            return
        if finished or now - self.stats_at >= self.owner._stats_interval_s:
            self._refresh_stats(now)

    def _fail(self, message: str):
        self.owner._failure = message
        self.fail_all(message)

    def fail_all(self, message: str):
        """Ends every live turn as failed (the engine can no longer run them)."""
        for request, turn in list(self.live.items()):
            self._post(turn, Finished(self.failed, -1, int(turn.spec.prompt.size), turn.generated, message,
                                      time.perf_counter()))
            request.close()
        self.live.clear()

    def _refresh_stats(self, now: float | None = None):
        self.stats_at = time.perf_counter() if now is None else now
        try:
            c = self.counters(self.engine)
        except RuntimeError:
            return  # a failed engine keeps its last figures
        self.owner.stats = EngineStats(c["total_blocks"], c["free_blocks"], c["resident_requests"],
                                       c["waiting_requests"], c["preemptions"], self.steps)

    # ---- posting ---------------------------------------------------------------------------------

    def _post(self, turn: Turn, item):
        self.outbox.setdefault(turn.loop, []).append((turn, item))

    def flush(self):
        if not self.outbox:
            return
        outbox, self.outbox = self.outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                pass  # that event loop is closed: its clients are gone
