"""The real vLLM server for the ``vllm`` tests: one per session, on the tiny planted model.

The server runs from its own venv (``tests/vllm/make-venv``; ``CHAT_VLLM_VENV`` says
where, default ``~/.cache/chat-vllm/venv``); without it every test here skips, saying so.
The model is built into a temporary directory first (``tests.vllm.tinymodel``, a few
seconds). The server is pinned to one core: unpinned, a long answer takes both cores and
the product under test starves. ``--enable-log-requests`` makes aborts visible in its log
(``VLLMServer.aborted``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = Path.home() / ".cache" / "chat-vllm" / "venv"
MODEL = "tiny"
MAX_MODEL_LEN = 2048
START_TIMEOUT = 240.0  # 25-45 s on a shared 2-core machine; a cold page cache is slower
POLL_INTERVAL = 0.25


def vllm_python() -> Path | None:
    """The vLLM venv's Python, when ``tests/vllm/make-venv`` made the venv."""
    venv = Path(os.environ.get("CHAT_VLLM_VENV") or DEFAULT_VENV)
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists() or not python.exists():
        return None
    return python


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VLLMServer:
    url: str
    model: str
    max_model_len: int
    log_path: Path
    model_dir: Path
    proc: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def aborted(self, request_id: str) -> bool:
        """Whether vLLM logged the abort of the request sent with ``X-Request-Id``."""
        needle = f"chatcmpl-{request_id}"
        return any(needle in line and "bort" in line for line in self.log_text().splitlines())

    def wait_aborted(self, request_id: str, limit: float = 10.0) -> bool:
        """Poll vLLM's log (another process's output: nothing to await) for the abort."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.aborted(request_id):
                return True
            time.sleep(0.05)
        return self.aborted(request_id)


def build_model(python: Path, directory: Path) -> None:
    subprocess.run(
        [str(python), "-m", "tests.vllm.tinymodel", str(directory)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _wait_healthy(server: VLLMServer) -> None:
    # Polling: readiness is another process's state, and vLLM's port stays closed while
    # the model loads.
    deadline = time.monotonic() + START_TIMEOUT
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                tail = server.log_text()[-3000:]
                raise RuntimeError(f"vLLM exited with {server.proc.returncode}:\n{tail}")
            try:
                if client.get(f"{server.url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(POLL_INTERVAL)
    raise TimeoutError(f"vLLM did not answer /health within {START_TIMEOUT:g} s")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    python = vllm_python()
    if python is None:
        pytest.skip(
            "needs the vLLM venv: run tests/vllm/make-venv (CHAT_VLLM_VENV says where; "
            ".ci/run makes it)"
        )
    model_dir = tmp_path_factory.mktemp("tiny-model")
    build_model(python, model_dir)
    port = _free_port()
    log_dir = ROOT / "test-artifacts" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"vllm-{port}.log"
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--enforce-eager",
        "--enable-log-requests",
        "--reasoning-parser", "qwen3",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    if shutil.which("taskset"):
        command = ["taskset", "-c", "0", *command]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with open(log_path, "wb") as log:
        # A session of its own: the server's engine processes are stopped with it.
        proc = subprocess.Popen(
            command,
            cwd=model_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = VLLMServer(f"http://127.0.0.1:{port}", MODEL, MAX_MODEL_LEN, log_path, model_dir, proc)
    try:
        _wait_healthy(server)
        yield server
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (the API server and its engine core), then
    SIGKILL to what is left of it."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
