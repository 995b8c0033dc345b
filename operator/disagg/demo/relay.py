"""A TCP relay in front of the API server that counts the bytes the server sends.

TLS passes through untouched: the relay sees sizes, not content. The watch-scope test and
bench use it to measure the operator's API traffic.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import yaml


class CountingRelay:
    """Forwards 127.0.0.1:<port> to the API server, counting server-to-client bytes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.received = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if count:
                    with self._lock:
                        self.received += len(chunk)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for end in self._sockets:
                end.close()

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path, relayed: Path) -> CountingRelay:
        """A relay to the kubeconfig's server, and a copy of the kubeconfig pointing at it."""
        config = yaml.safe_load(kubeconfig.read_text())
        server = config["clusters"][0]["cluster"]["server"]
        host, port = server.removeprefix("https://").rsplit(":", 1)
        relay = cls((host, int(port)))
        config["clusters"][0]["cluster"]["server"] = f"https://{host}:{relay.port}"
        relayed.write_text(yaml.safe_dump(config))
        return relay
