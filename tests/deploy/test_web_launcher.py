"""deploy/web.py serve: several Daphne processes, a healthcheck over all, SIGTERM drains."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.servers import server_env

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "deploy" / "web.py"
START_TIMEOUT = 30.0


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no consecutive free ports")


def health(env: dict[str, str]) -> int:
    return subprocess.run(
        [sys.executable, str(LAUNCHER), "health"], env=env, capture_output=True, check=False
    ).returncode


def test_several_processes_without_redis_are_refused(tmp_path: Path):
    env = server_env(WEB_PROCESSES=2, WEB_BASE_PORT=consecutive_free_ports(2), REDIS_URL=None)
    result = subprocess.run(
        [sys.executable, str(LAUNCHER), "serve"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "WEB_PROCESSES > 1 needs REDIS_URL" in result.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("needs_redis")
def test_serve_runs_every_process_and_stops_on_sigterm(tmp_path: Path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_12345.db").write_bytes(b"stale")
    env = server_env(
        WEB_PROCESSES=2,
        WEB_BASE_PORT=consecutive_free_ports(2),
        WEB_BIND="127.0.0.1",
        PROMETHEUS_MULTIPROC_DIR=metrics_dir,
    )
    assert health(env) != 0  # nothing listens yet: the check can fail
    log = open(tmp_path / "web.log", "wb")  # noqa: SIM115 - owned by the process
    launcher = subprocess.Popen(
        [sys.executable, str(LAUNCHER), "serve"], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    log.close()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        # Polling another process's readiness: there is no event to await.
        while health(env) != 0:
            assert launcher.poll() is None, (tmp_path / "web.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "web.log").read_text()
            time.sleep(0.2)
        assert not (metrics_dir / "counter_12345.db").exists()
        children = [
            line.split()[3]
            for line in (tmp_path / "web.log").read_text().splitlines()
            if line.startswith("web: Daphne pid")
        ]
        assert len(children) == 2
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 0
        for pid in children:
            assert not Path(f"/proc/{pid}").exists()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
