"""A TCP relay between the browser and Daphne that a test can cut, like a network drop.

``cut()`` closes every open connection in both directions and turns new ones away until
``restore()``: the browser sees its streams die mid-response and its retries fail, exactly
as when a proxy or the network goes away, while Daphne keeps generating. ``freeze()``
makes the open connections go silent without closing (a NAT or proxy that dropped them):
only the silence tells; new connections pass.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        self.frozen: set[socket.socket] = set()
        self.refusing = threading.Event()
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            # Checked again and recorded under the lock ``cut`` takes: a connection
            # accepted while a cut is made is either closed by it or refused here.
            with self.lock:
                refused = self.refusing.is_set()
                if not refused:
                    self.open.update((client, upstream))
            if refused:
                client.close()
                upstream.close()
                continue
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if src not in self.frozen:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src)
            self._close(dst)

    def _close(self, sock: socket.socket) -> None:
        with self.lock:
            self.open.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def cut(self) -> None:
        """Drop every connection now and refuse new ones until ``restore``."""
        with self.lock:
            self.refusing.set()
            self.cuts += 1
            victims = list(self.open)
        for sock in victims:
            self._close(sock)

    def freeze(self) -> None:
        """Stop forwarding on every open connection, in both directions, closing none."""
        with self.lock:
            self.frozen.update(self.open)

    def restore(self) -> None:
        self.refusing.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.listener.close()
        self.cut()
