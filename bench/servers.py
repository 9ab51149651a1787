"""The processes under test, started by the harness, and what /proc says about them.

Each server gets a listening socket bound here (a deep backlog, so a ramp of thousands of
connections never meets a refused connect) and inherits it (``--fd``), like the test
suite's Daphne processes. CPU and memory are read from ``/proc/<pid>/stat`` and
``/proc/<pid>/status``: no cooperation from the server is needed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
BACKLOG = 8192
READY_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Usage:
    cpu_seconds: float
    rss_bytes: int


def _stat(pid: int | str) -> tuple[str, list[str]]:
    """``/proc/<pid>/stat``: the command name, and the fields after it. State is [0];
    utime, stime, cutime, cstime (fields 14-17 of the full line) are [11] to [14]; rss
    (pages, field 24) is [21]."""
    with open(f"/proc/{pid}/stat") as f:
        line = f.read()
    return line[line.index("(") + 1 : line.rindex(")")], line.rsplit(")", 1)[1].split()


def proc_usage(pid: int) -> Usage:
    _, fields = _stat(pid)
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return Usage(cpu, int(fields[21]) * PAGE_SIZE)


@dataclass(frozen=True, slots=True)
class MachineUsage:
    """CPU seconds since boot: the whole machine's busy time (every core, any process,
    the kernel's), and the data services' share of it; ``at`` is the monotonic clock."""

    busy_seconds: float
    postgres_seconds: float
    redis_seconds: float
    at: float


# Processes by their kernel name (``/proc/<pid>/comm``): PostgreSQL's postmaster and
# backends all run as ``postgres``, whatever title they show in ``ps``.
SERVICE_NAMES = {"postgres": "postgres", "redis-server": "redis"}


def machine_usage() -> MachineUsage:
    """Read off ``/proc``. A service's CPU includes its exited children's (``cutime``,
    ``cstime``: the postmaster's count the backends of connections closed meanwhile); a
    service process that exits between two readings takes its own CPU with it, which
    is why the figures come from the long-lived ones."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user's)
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]
    services = dict.fromkeys(SERVICE_NAMES.values(), 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            name, fields = _stat(entry.name)
        except OSError:  # exited meanwhile
            continue
        service = SERVICE_NAMES.get(name)
        if service is not None:
            services[service] += sum(int(x) for x in fields[11:15])  # utime..cstime
    return MachineUsage(
        busy / CLOCK_TICKS,
        services["postgres"] / CLOCK_TICKS,
        services["redis"] / CLOCK_TICKS,
        time.monotonic(),
    )


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    return sock


class Server:
    """A server process on an inherited socket; ``argv`` gets ``{fd}`` filled in."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Server:
        self.sock = listening_socket()
        self.port = self.sock.getsockname()[1]
        fd = self.sock.fileno()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [a.replace("{fd}", str(fd)) for a in self.argv],
                cwd=ROOT,
                env=self.env,
                pass_fds=(fd,),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait_ready(self, path: str) -> None:
        """One request; it waits in the accept queue until the process serves it."""
        response = httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=READY_TIMEOUT)
        if response.status_code >= 500:
            raise RuntimeError(f"{self.name} answered {response.status_code} on {path}")

    def usage(self) -> Usage:
        return proc_usage(self.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def daphne(name: str, env: dict[str, str], log_dir: Path) -> Server:
    argv = [sys.executable, "-m", "daphne", "--fd", "{fd}", "chatsite.asgi:application"]
    return Server(name, argv, env, log_dir).start()


RELAY_SERVERS = {
    "uvicorn": [sys.executable, "-m", "bench.relay", "--fd", "{fd}"],
    "daphne": [sys.executable, "-m", "daphne", "--fd", "{fd}", "bench.relay:app"],
}


def relay(name: str, env: dict[str, str], log_dir: Path, server: str = "uvicorn") -> Server:
    """The baseline relay, served by ``server`` (``RELAY_SERVERS``)."""
    return Server(name, RELAY_SERVERS[server], env, log_dir).start()


def emulator(name: str, env: dict[str, str], log_dir: Path) -> Server:
    """The vLLM wire emulator (it records when each request was aborted)."""
    code = (
        "import sys, uvicorn;"
        "from tests.emulator.vllm_emulator import create_app, quiet_intentional_drops;"
        "quiet_intentional_drops();"
        "uvicorn.run(create_app(model='bench-model'), fd=int(sys.argv[1]),"
        " log_level='warning', access_log=False, timeout_keep_alive=5)"
    )
    return Server(name, [sys.executable, "-c", code, "{fd}"], env, log_dir).start()


def profile(server: Server, directory: Path) -> subprocess.Popen[bytes]:
    """Sample the server with py-spy until it exits; the flame graph lands in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--nonblocking",
            "--gil",
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            str(directory / f"{server.name}.folded.txt"),
            "--pid",
            str(server.pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Cluster:
    """The servers of one side (ours or the baseline) and their summed /proc figures."""

    def __init__(self, servers: list[Server]) -> None:
        self.servers = servers

    def usage(self) -> Usage:
        usages = [s.usage() for s in self.servers]
        return Usage(sum(u.cpu_seconds for u in usages), sum(u.rss_bytes for u in usages))

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def wait_for(predicate: object, timeout: float, interval: float = 0.05) -> bool:
    """Poll another process's state (no event exists to await) until true or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return False
