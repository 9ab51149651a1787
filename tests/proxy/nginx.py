"""Debian's nginx running the shipped ``deploy/nginx.conf``, rendered for a test.

Rendering changes only what ties the file to its container - the listen address, the
upstream servers, the static root - and adds temp paths under the test's directory, so
nginx runs as any user. Every change must match the shipped file exactly as expected
(``ConfigDrift`` otherwise): a test never silently runs a config other than the one
shipped. Tests that need a different config (the buffering bug, a short read timeout)
change named directives in named locations the same checked way.
"""

from __future__ import annotations

import getpass
import grp
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "nginx.conf"
MIME_TYPES = Path("/etc/nginx/mime.types")
START_TIMEOUT = 10.0

# Location blocks tests may change, by the start of their ``location`` line.
LOCATIONS = {
    "stream": "location ~ ^/(api/messages/",
    "ws": "location /ws/ ",
    "static": "location /static/ ",
}
TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


class ConfigDrift(AssertionError):
    """The shipped config no longer looks the way the test rendering expects."""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def _replace(text: str, pattern: str, replacement: str, expected: int = 1) -> str:
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    if count != expected:
        raise ConfigDrift(f"expected {expected} match(es) of {pattern!r}, found {count}")
    return new


def _location_span(text: str, name: str) -> tuple[int, int]:
    """Start and end (the closing brace) of a location block that holds no nested block."""
    header = LOCATIONS[name]
    start = text.find(header)
    if start < 0 or text.find(header, start + 1) >= 0:
        raise ConfigDrift(f"expected one block starting {header!r}")
    body = text.index("{", start) + 1
    end = text.index("}", body)
    if "{" in text[body:end]:
        raise ConfigDrift(f"block {header!r} holds a nested block")
    return body, end


def set_directive(text: str, location: str, directive: str, value: str) -> str:
    """Set ``directive`` in a location: replace its one line, or add it."""
    body, end = _location_span(text, location)
    block = text[body:end]
    line = re.compile(rf"^(\s*){re.escape(directive)}\s[^;]*;", re.MULTILINE)
    found = line.findall(block)
    if len(found) > 1:
        raise ConfigDrift(f"{directive} appears {len(found)} times in {location}")
    if found:
        block = line.sub(lambda m: f"{m.group(1)}{directive} {value};", block)
    else:
        block = f"{block}    {directive} {value};\n        "
    return text[:body] + block + text[end:]


def render(
    *,
    port: int,
    upstreams: Sequence[str],
    static_root: Path,
    temp_dir: Path,
    changes: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    text = SHIPPED.read_text()
    server_line = re.compile(r"^[ \t]*server web:\d+ (.*);\n", flags=re.MULTILINE)
    servers = list(server_line.finditer(text))
    if not servers:
        raise ConfigDrift("no `server web:PORT ...;` lines in the upstream block")
    # `resolve` is for container names; the test upstreams are addresses.
    params = " ".join(p for p in servers[0].group(1).split() if p != "resolve")
    lines = "".join(f"        server {address} {params};\n" for address in upstreams)
    first = servers[0].start()
    text = server_line.sub("", text)
    text = text[:first] + lines + text[first:]
    text = _replace(text, r"^(\s*)listen 80( [^;]*)?;", rf"\g<1>listen 127.0.0.1:{port}\g<2>;")
    text = _replace(text, r"alias /srv/static/;", f"alias {static_root}/;")
    temp = "".join(f"    {kind}_temp_path {temp_dir / kind};\n" for kind in TEMP_PATHS)
    text = _replace(text, r"^http \{\n", f"http {{\n{temp}")
    for location, directives in (changes or {}).items():
        for directive, value in directives.items():
            text = set_directive(text, location, directive, value)
    return text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class NginxServer:
    """One nginx master (not a daemon) with its own prefix directory and logs."""

    def __init__(
        self,
        directory: Path,
        upstreams: Sequence[str],
        *,
        static_root: Path | None = None,
        changes: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.dir = directory
        self.port = free_port()
        self.static_root = static_root or directory / "static"
        self.static_root.mkdir(parents=True, exist_ok=True)
        (directory / "temp").mkdir(parents=True, exist_ok=True)
        self.conf = directory / "nginx.conf"
        self.conf.write_text(
            render(
                port=self.port,
                upstreams=upstreams,
                static_root=self.static_root,
                temp_dir=directory / "temp",
                changes=changes,
            )
        )
        shutil.copy(MIME_TYPES, directory / "mime.types")
        self.access_log = directory / "access.log"
        self.error_log = directory / "error.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def command(self, *extra: str) -> list[str]:
        binary = nginx_binary()
        assert binary is not None
        globals_ = f"daemon off; pid {self.dir / 'nginx.pid'}; error_log {self.error_log} info;"
        if os.geteuid() == 0:
            # Workers would otherwise drop to `nobody`, who cannot enter the test's tmp dir.
            globals_ += f" user {getpass.getuser()} {grp.getgrgid(os.getgid()).gr_name};"
        return [
            binary,
            "-e",
            str(self.error_log),
            "-p",
            str(self.dir),
            "-c",
            str(self.conf),
            "-g",
            globals_,
            *extra,
        ]

    def check(self) -> subprocess.CompletedProcess[str]:
        """``nginx -t`` on the rendered file."""
        return subprocess.run(
            self.command("-t"), capture_output=True, text=True, timeout=30, check=False
        )

    def start(self) -> NginxServer:
        with open(self.access_log, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.errors()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not listen: {self.errors()}") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def errors(self) -> str:
        try:
            return self.error_log.read_text(errors="replace")
        except OSError:
            return ""

    def access_lines(self) -> list[str]:
        return self.access_log.read_text(errors="replace").splitlines()
