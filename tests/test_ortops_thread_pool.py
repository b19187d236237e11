"""oga's own thread pool for its operators' parallel loops (ortops/thread_pool.h, OGA_ORTOPS_THREADS /
OgaOrtOpsSetThreads): its default size, the operators' same bits on it as on ONNX Runtime's pool at
any thread count, two sessions running loops at once, a forked child, and switching it off."""
import ctypes
import os
import subprocess
import sys
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


@pytest.mark.parametrize("setting, expected", [(None, min(len(os.sched_getaffinity(0)), 16)), ("0", 0), ("3", 3)])
def test_the_default_size_and_the_environment_variable(setting, expected):
    env = {k: v for k, v in os.environ.items() if k != "OGA_ORTOPS_THREADS"}
    if setting is not None:
        env["OGA_ORTOPS_THREADS"] = setting
    code = "from oga import ortops; print(ortops.library().OgaOrtOpsThreads())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert int(out.stdout) == expected


def test_a_forked_child_runs_the_operators_on_a_pool_of_its_own(pool_threads):
    rng = np.random.default_rng(13)
    q = _gguf("Q4_1", 512, 576, rng)
    x = rng.standard_normal((16, 576)).astype(np.float32)
    session = _session(q, threads=1)
    pool_threads(2)
    (expected,) = session.run(None, {"x": x})      # the parent's workers have run
    pid = os.fork()
    if pid == 0:   # the child: exit status 0 only if the operator runs and gives the same bits
        try:
            ok = np.array_equal(session.run(None, {"x": x})[0], expected)
            os._exit(0 if ok and ortops.library().OgaOrtOpsThreads() == 2 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
