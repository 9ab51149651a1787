"""The web tier's entry point in its container: ``setup``, ``serve`` and ``health``.

``setup`` runs once per deployment before any web process starts: migrations, static files
for nginx, and a generated ``SECRET_KEY`` when none is given (kept in ``SECRET_KEY_FILE``
so sessions survive restarts). Running it once, not in every web process, keeps several
processes or containers from racing to migrate the same database.

``serve`` runs ``WEB_PROCESSES`` Daphne processes on consecutive ports from
``WEB_BASE_PORT`` (nginx's upstream lists the same ports). Several processes per
container, not one per container: nginx balances them with ``least_conn`` and they share
one tmpfs for Prometheus' multiprocess files. SIGTERM is forwarded so each process drains
its generations (``STREAM_SHUTDOWN_DEADLINE``); a process that dies on its own is started
again while the others keep streaming, and one that dies right after starting stops the
container, because that is a configuration error a restart will not fix.

``health`` is the container healthcheck: every process answers ``/healthz``.

Daphne never gets ``--http-timeout``: it ends a response that is still streaming.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A process that dies sooner than this after starting is misconfigured, not crashed.
STARTUP_GRACE = 10.0
RESTART_DELAY_MAX = 30.0
HEALTH_TIMEOUT = 3.0


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def ports() -> list[int]:
    base = env_int("WEB_BASE_PORT", 8001)
    return [base + i for i in range(env_int("WEB_PROCESSES", 4))]


def daphne_command(port: int) -> list[str]:
    """One Daphne process. WebSocket pings (``DAPHNE_PING_INTERVAL``) stay well below
    nginx's 600 s read timeout and common 60 s load balancer idle timeouts."""
    return [
        sys.executable,
        "-m",
        "daphne",
        "--bind",
        os.environ.get("WEB_BIND", "0.0.0.0"),
        "--port",
        str(port),
        "--proxy-headers",
        "--ping-interval",
        str(env_int("DAPHNE_PING_INTERVAL", 20)),
        "--ping-timeout",
        str(env_int("DAPHNE_PING_TIMEOUT", 30)),
        "--application-close-timeout",
        "10",
        "--websocket_timeout",
        "86400",
        # nginx writes the access log; one per request is enough.
        "--verbosity",
        "0",
        "chatsite.asgi:application",
    ]


def with_secret_key(env: dict[str, str], *, create: bool) -> dict[str, str]:
    """``SECRET_KEY`` from the environment, else from ``SECRET_KEY_FILE`` (made by setup)."""
    if env.get("SECRET_KEY") or not env.get("SECRET_KEY_FILE"):
        return env
    path = Path(env["SECRET_KEY_FILE"])
    if not path.exists():
        if not create:
            sys.exit(f"{path} is missing: run `web.py setup` first or set SECRET_KEY")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    return {**env, "SECRET_KEY": path.read_text().strip()}


def setup() -> int:
    env = with_secret_key(dict(os.environ), create=True)
    manage = [sys.executable, str(ROOT / "manage.py")]
    # A migration may rewrite a large table in one statement: no bound on its answer.
    env.setdefault("DATABASE_WAIT_TIMEOUT", "0")
    for command in (["migrate", "--noinput"], ["collectstatic", "--noinput"]):
        result = subprocess.run([*manage, *command], cwd=ROOT, env=env, check=False)
        if result.returncode != 0:
            return result.returncode
    return 0


def clear_metrics_dir() -> None:
    """prometheus_client's multiprocess files must not outlive the processes that wrote
    them; a fresh start begins with an empty directory."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)


class Supervisor:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (port, started at)
        self.delays: dict[int, float] = {}  # port -> next restart delay
        self.stopping = False

    def start(self, port: int) -> None:
        proc = subprocess.Popen(daphne_command(port), cwd=ROOT, env=self.env)
        self.children[proc.pid] = (port, time.monotonic())
        print(f"web: Daphne pid {proc.pid} on port {port}", flush=True)

    def stop(self, signum: int, _frame: object) -> None:
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        for port in ports():
            self.start(port)
        failed = 0
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid not in self.children:
                continue
            port, started = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                continue
            lived = time.monotonic() - started
            print(f"web: Daphne on port {port} exited with {code} after {lived:.0f} s", flush=True)
            if lived < STARTUP_GRACE:
                failed = code or 1
                self.stop(signal.SIGTERM, None)
                continue
            delay = self.delays.get(port, 1.0) if lived < 60 else 1.0
            self.delays[port] = min(delay * 2, RESTART_DELAY_MAX)
            time.sleep(delay)
            if not self.stopping:
                self.start(port)
        return failed


def serve() -> int:
    if len(ports()) > 1 and not os.environ.get("REDIS_URL"):
        # Without Redis each process keeps its own event log and beats no heartbeat: the
        # processes would take each other's answers for orphans and end them.
        print(
            "web: WEB_PROCESSES > 1 needs REDIS_URL (the processes share the event log, "
            "reader counts and heartbeats through it); set it or set WEB_PROCESSES=1",
            file=sys.stderr,
        )
        return 2
    env = with_secret_key(dict(os.environ), create=False)
    clear_metrics_dir()
    return Supervisor(env).run()


def health() -> int:
    for port in ports():
        url = f"http://127.0.0.1:{port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT) as response:
                if response.status != 200:
                    print(f"{url}: {response.status}")
                    return 1
        except OSError as exc:
            print(f"{url}: {exc}")
            return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["setup", "serve", "health"])
    command = parser.parse_args().command
    return {"setup": setup, "serve": serve, "health": health}[command]()


if __name__ == "__main__":
    sys.exit(main())
