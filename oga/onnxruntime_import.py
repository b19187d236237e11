"""onnxruntime's first import, done where a signal cannot cut it in half.

oga imports onnxruntime lazily, inside the first `og.Model(...)` (plain `import oga` and the test
model need no ONNX Runtime). A Python signal handler runs on the main thread at the next bytecode
boundary, and onnxruntime's pybind11 extension runs Python code while it registers its types: a
Ctrl-C landing there makes the extension's initialisation fail ("initialization failed", an
ImportError, instead of KeyboardInterrupt) with part of its types registered for good, so every
later import fails ('generic_type: type "GraphOptimizationLevel" is already registered!') and the
process can never load a model again.

Signal handlers never run on other threads, so the import runs on a helper thread, which no signal
handler can interrupt, while the caller waits in short sleeps (an interrupted sleep leaves no lock
half-taken). A Ctrl-C while it waits reaches the caller at once; the import carries on to its end in
the background, and the next call waits for it (or returns it, done). onnxruntime_genai 0.18 has no
such window: its extension links ONNX Runtime itself and imports no Python module while loading a
model.
"""
import sys
import threading
import time

_lock = threading.Lock()
_attempt = None        # the import in progress (an _Attempt), or None
_module = None         # onnxruntime, once imported


class _Attempt:
    """One import on a helper thread: `done` is set when it ends, `error` is what it raised."""

    def __init__(self):
        self.done = threading.Event()
        self.error = None


def import_onnxruntime():
    """The onnxruntime module (imported on a helper thread the first time); ImportError (or whatever
    else the import raised) when it cannot be imported, and the next call tries again."""
    global _attempt, _module
    if _module is not None:
        return _module
    loaded = sys.modules.get("onnxruntime")
    if loaded is not None and not getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        _module = loaded  # imported by the caller's code already, completely
        return _module
    with _lock:
        if _module is None and _attempt is None:
            attempt = _Attempt()
            threading.Thread(target=_import, args=(attempt,), name="oga-import-onnxruntime", daemon=True).start()
            # Published once the thread runs: an interrupt inside start() leaves no attempt that
            # would never end (the next call starts another; the module lock orders the two).
            _attempt = attempt
        attempt = _attempt
    while _module is None and not attempt.done.is_set():
        time.sleep(0.001)
    if _module is not None:
        return _module
    with _lock:
        if _attempt is attempt:
            _attempt = None  # failed: the next call tries again
    raise attempt.error


def _import(attempt):
    global _module
    try:
        import onnxruntime

        _module = onnxruntime
    except BaseException as error:  # the waiting callers raise it
        attempt.error = error
    finally:
        attempt.done.set()
