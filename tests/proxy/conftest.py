"""nginx in front of real Daphne processes: the ``nginx`` fixture factory.

Every test here needs Debian's nginx (``apt-get install nginx-light``); those with
several Daphne processes also need Redis, which carries the log they share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.proxy.nginx import NginxServer, nginx_binary
from tests.support.servers import DaphneServer


@pytest.fixture(autouse=True)
def proxy_prerequisites() -> None:
    if nginx_binary() is None:
        pytest.skip("needs nginx (apt-get install nginx-light)")


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Callable[..., NginxServer]]:
    """Factory: ``nginx([daphne or "host:port", ...], changes=...)`` runs the shipped
    config in front of those upstreams; all are stopped at test end."""
    servers: list[NginxServer] = []

    def start(
        upstreams: Sequence[DaphneServer | str],
        changes: Mapping[str, Mapping[str, str]] | None = None,
    ) -> NginxServer:
        directory = tmp_path / f"nginx{len(servers)}"
        addresses = [u if isinstance(u, str) else f"127.0.0.1:{u.port}" for u in upstreams]
        server = NginxServer(directory, addresses, changes=changes)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()
