"""A private ``redis-server`` on a port of its own, for tests that kill and restart Redis
and for the test workers that must not share the suite's Redis (``tests.support.workers``).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 10.0
POLL_INTERVAL = 0.02


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """``redis-server`` on its own port, without persistence: a restart loses every key,
    as a crashed cache node would."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = ROOT / "test-artifacts" / "logs" / f"redis-{port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--daemonize", "no",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        # Polling: readiness is another process's state and Redis offers nothing to await.
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, "redis-server exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(POLL_INTERVAL)
        raise TimeoutError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
