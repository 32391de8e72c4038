"""A TCP proxy between a client and the test Redis that can cut a reply the server sent.

``FaultProxy(address)`` listens on a free port of 127.0.0.1 and forwards both ways to the
server at ``address``: ``(host, port)``, or a Unix socket's path.
``cut_reply_to(pattern)`` closes, instead of forwarding it, the next reply on a connection
whose last command held ``pattern`` (a script's SHA1, ``b"BLPOP"``): the server ran the
command, the client sees its connection closed (and redis-py, with its retries on, sends
the command again on a new connection). ``cut`` counts the replies cut so far. No mock: a
real socket between a real client and a real server.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from django_rcoord.embedded import free_port


class FaultProxy:
    def __init__(self, address: tuple[str, int] | str) -> None:
        self.address = address
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._pattern: bytes | None = None  # armed: cut the reply to a command holding it
        self._marked: set[int] = set()  # connections whose last command held the pattern
        self._last: dict[int, bytes] = {}  # each connection's last command
        self.cut = 0
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_reply_to(self, pattern: bytes | str) -> None:
        """Cut the reply to the next command that holds ``pattern``, once: one already sent
        and still unanswered (a blocked ``BLPOP``) included."""
        with self._lock:
            self._pattern = pattern.encode() if isinstance(pattern, str) else pattern
            self._marked = {key for key, last in self._last.items() if self._pattern in last}

    def armed(self) -> bool:
        with self._lock:
            return self._pattern is not None

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = self._connect()
            self._sockets += [client, server]
            key = id(client)
            threading.Thread(
                target=self._pump, args=(client, server, key, False), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, key, True), daemon=True
            ).start()

    def _connect(self) -> socket.socket:
        if isinstance(self.address, str):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.address)
            return server
        return socket.create_connection(self.address)

    def _pump(self, source: socket.socket, sink: socket.socket, key: int, replies: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if replies and self._should_cut(key):
                    break
                if not replies:
                    self._note_command(key, data)
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _note_command(self, key: int, data: bytes) -> None:
        with self._lock:
            self._last[key] = data
            if self._pattern is not None and self._pattern in data:
                self._marked.add(key)
            else:
                self._marked.discard(key)

    def _should_cut(self, key: int) -> bool:
        with self._lock:
            if key not in self._marked:
                return False
            self._marked.discard(key)
            self._pattern = None
            self.cut += 1
            return True
