"""A TCP proxy between a client and the test Redis that can cut a reply the server sent.

``FaultProxy(address)`` listens on a free port of 127.0.0.1 and forwards both ways to the
server at ``address``: ``(host, port)``, or a Unix socket's path.
``cut_reply_to(pattern)`` closes, instead of forwarding it, the next reply on a connection
whose last command held ``pattern`` (a script's SHA1, ``b"BLPOP"``): the server ran the
command, the client sees its connection closed (and redis-py, with its retries on, sends
the command again on a new connection). ``cut`` counts the replies cut so far. No mock: a
real socket between a real client and a real server.

A connection's two pump threads each read one of its sockets. A process stopped (SIGSTOP)
inside ``recv()`` restarts the call on the same descriptor number when it resumes: had a
cut closed that descriptor meanwhile, a newer connection could have it, and the stopped
pump would swallow that connection's bytes. So a cut or ``close()`` only shuts the sockets
down (a pump reading one sees its end), and the last pump of a connection closes them.
``close()`` shuts the listener down too (an ``accept()`` blocked on it returns) and joins
every thread: a closed proxy serves no connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from django_rcoord.embedded import free_port


class _Connection:
    """A client's socket and its server's, closed by the last of its two pumps to end."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.sockets = (client, server)
        self._pumps = 2
        self._lock = threading.Lock()

    def shut_down(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def pump_ended(self) -> None:
        self.shut_down()
        with self._lock:
            self._pumps -= 1
            last = self._pumps == 0
        if last:
            for sock in self.sockets:
                sock.close()


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
        self._connections: list[_Connection] = []
        self._threads: list[threading.Thread] = []
        # Test hook: while cleared, reply pumps stop before their next recv() (pause_replies).
        self._replies_go = threading.Event()
        self._replies_go.set()
        #: The reply pumps stopped there now: the descriptor each will read, and its inode.
        self.stopped: list[tuple[int, int]] = []
        self._start(self._accept)

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

    def pause_replies(self) -> None:
        """Stop each reply pump before its next ``recv()``, its descriptor already chosen,
        as a process stopped inside ``recv()`` is, until ``resume_replies()``."""
        self._replies_go.clear()

    def resume_replies(self) -> None:
        self._replies_go.set()

    def close(self) -> None:
        """Serve no connection from now on: stop accepting, end every connection, and
        return once every thread of the proxy has ended."""
        with self._lock:
            self._closed = True
            connections = list(self._connections)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it
        for connection in connections:
            connection.shut_down()
        self.resume_replies()
        for thread in self._threads:
            thread.join()
        self._listener.close()

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # shut down by close()
            try:
                server = self._connect()
            except OSError:
                client.close()  # the server is gone: the client sees its connection end
                continue
            connection = _Connection(client, server)
            with self._lock:
                if self._closed:  # accepted as close() began
                    connection.shut_down()
                    client.close()
                    server.close()
                    return
                self._connections.append(connection)
                # Started under the lock: close() joins every pump it could miss otherwise.
                key = id(connection)
                self._start(self._pump, connection, 0, key, False)
                self._start(self._pump, connection, 1, key, True)

    def _connect(self) -> socket.socket:
        if isinstance(self.address, str):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.address)
            return server
        return socket.create_connection(self.address)

    def _pump(self, connection: _Connection, side: int, key: int, replies: bool) -> None:
        source, sink = connection.sockets[side], connection.sockets[1 - side]
        try:
            while True:
                descriptor = source.fileno()
                if replies:
                    self._stop_point(descriptor)
                # By number, as a recv() restarted after a stop is: the descriptor stays
                # this connection's until its last pump closes it.
                data = os.read(descriptor, 65536)
                if not data:
                    break
                if replies and self._should_cut(key):
                    break
                if not replies:
                    self._note_command(key, data)
                sink.sendall(data)
        except OSError:
            pass
        connection.pump_ended()

    def _stop_point(self, descriptor: int) -> None:
        if self._replies_go.is_set():
            return
        stop = (descriptor, os.fstat(descriptor).st_ino)
        with self._lock:
            self.stopped.append(stop)
        self._replies_go.wait()
        with self._lock:
            self.stopped.remove(stop)

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
