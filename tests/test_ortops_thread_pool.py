"""oga's own thread pool for its operators' parallel loops (ortops/thread_pool.h, OGA_ORTOPS_THREADS /
OgaOrtOpsSetThreads): the operators give the same bits on it as on ONNX Runtime's pool, at any thread
count, with two sessions running loops at once, and it can be switched off again."""
import ctypes
import threading

import numpy as np
import pytest

from oga import ortops
from test_quantized_linear import _gguf, _session


@pytest.fixture
def pool_threads():
    lib = ortops.library()
    lib.OgaOrtOpsSetThreads.argtypes = [ctypes.c_int]
    before = lib.OgaOrtOpsThreads()

    def set_threads(n):
        assert lib.OgaOrtOpsSetThreads(n) == n
        assert lib.OgaOrtOpsThreads() == n

    yield set_threads
    lib.OgaOrtOpsSetThreads(before)


def test_the_operators_give_the_same_bits_on_every_pool(pool_threads):
    rng = np.random.default_rng(11)
    q = _gguf("Q4_1", 1536, 576, rng)
    x = rng.standard_normal((40, 576)).astype(np.float32)
    session = _session(q, threads=2)
    pool_threads(0)
    (expected,) = session.run(None, {"x": x})
    for threads in (1, 2, 3, 8):
        pool_threads(threads)
        for rows in (1, 16, 40):
            np.testing.assert_array_equal(session.run(None, {"x": x[:rows]})[0], expected[:rows])
    pool_threads(0)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)


def test_two_sessions_at_once_share_the_pool(pool_threads):
    """A loop that finds the pool busy runs on its caller: both finish, both right."""
    rng = np.random.default_rng(12)
    weights = [_gguf("Q8_0", 768, 576, rng), _gguf("Q4_0", 1024, 576, rng)]
    x = rng.standard_normal((16, 576)).astype(np.float32)
    sessions = [_session(q, threads=1) for q in weights]
    expected = [s.run(None, {"x": x})[0] for s in sessions]
    pool_threads(3)
    failures = []

    def run(i):
        try:
            for _ in range(50):
                np.testing.assert_array_equal(sessions[i].run(None, {"x": x})[0], expected[i])
        except Exception as e:  # noqa: BLE001  (reported below)
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
