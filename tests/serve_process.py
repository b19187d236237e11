"""`oga serve` as the serving tests run it: a child process on 127.0.0.1, started and stopped by the
test, with bounded waits everywhere.

ServeProcess(args) runs `python -m oga serve ARGS --host 127.0.0.1` (with --port 0 unless ARGS name a
port), reads the bound address from the command's "oga serve: ... on http://HOST:PORT" line, and
waits for GET /health. stop() sends SIGTERM and waits for the exit status; whatever is left after
the test (a hung server) is killed, with its process group (Ray's processes when --replicas runs).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

_LISTENING = re.compile(r"oga serve: .* on (http://127\.0\.0\.1:\d+)")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(self, args, *, log_path, env=None, start_timeout=120.0):
        args = [str(a) for a in args]
        if "--port" not in args:
            args += ["--port", "0"]
        self.log_path = str(log_path)
        self.log = open(self.log_path, "w+b")
        environment = dict(os.environ, **(env or {}))
        environment.setdefault("PYTHONUNBUFFERED", "1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "oga", "serve", "--host", "127.0.0.1", "--log-level", "warning", *args],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
            start_new_session=True)
        try:
            self.base_url = self._wait_for_address(start_timeout)
            self.wait_healthy(start_timeout)
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self):
        return self.process.pid

    def output(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _wait_for_address(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.output())
            if match:
                return match.group(1)
            if self.process.poll() is not None:
                raise RuntimeError(f"oga serve exited with {self.process.returncode}:\n{self.output()}")
            time.sleep(0.05)
        raise TimeoutError(f"oga serve did not report its address within {timeout} s:\n{self.output()}")

    def get(self, path, timeout=10.0):
        """(status, headers, body bytes) of GET path."""
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def wait_healthy(self, timeout):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"oga serve exited with {self.process.returncode}:\n{self.output()}")
            try:
                status, _, body = self.get("/health", timeout=5.0)
                if status == 200 and json.loads(body)["status"] == "ok":
                    return
                last = (status, body)
            except (OSError, ValueError) as e:
                last = e
            time.sleep(0.1)
        raise TimeoutError(f"oga serve was not healthy within {timeout} s (last: {last}):\n{self.output()}")

    def metrics(self):
        """{(name, frozenset(labels.items())): value} of every sample /metrics exposes, parsed by
        prometheus_client's own text parser."""
        from prometheus_client.parser import text_string_to_metric_families

        status, headers, body = self.get("/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain"), (status, headers)
        samples = {}
        for family in text_string_to_metric_families(body.decode("utf-8")):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return samples

    def signal(self, sig):
        self.process.send_signal(sig)

    def stop(self, timeout=60.0) -> int:
        """SIGTERM, then the exit status (killing the process group if it does not exit in time)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        """Ends the server and everything it started (its process group), at once."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(30)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if self.process.poll() is None:
                self.stop(timeout=60.0)
        finally:
            self.kill()


def metric(samples, name, **labels):
    """One sample's value (0.0 when the series does not exist)."""
    return samples.get((name, frozenset(labels.items())), 0.0)
