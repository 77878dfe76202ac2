"""A relay on 127.0.0.1 that gives an S3 server on loopback the latency of a real object store.

``LatencyRelay(upstream_port, delay_s=0.02)`` listens on a port of its own and relays every
connection byte for byte to the server, holding back each HTTP request for ``delay_s`` (a round
trip of a store tens of milliseconds away) before it passes it on. ``jitter_s`` adds to each
request an exponentially distributed wait of that mean, the long tail real stores have
(``seed`` makes it repeatable). Requests on separate connections wait side by side, as they
would on a network, so requests a client makes at once cost one round trip, not one each.

The relay counts: ``requests()`` is every request seen since the last ``reset()`` as
``Request(method, target, started, answered)`` (monotonic seconds: when its headers arrived and
when the first byte of the answer went back), and ``round_trips(requests)`` how many of them
had to follow one another: the most requests of the window of which none overlapped another.

Requests are found by reading HTTP/1.1 as a client sends it (request line and headers, then a
body of ``Content-Length`` bytes or in ``chunked`` transfer coding), so keep-alive connections
carrying many requests are delayed and counted once per request. Answers are never changed.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from dataclasses import dataclass

MAX_HEADER_BYTES = 256 * 1024


@dataclass(frozen=True)
class Request:
    """One request the relay passed on."""

    method: str
    target: str  # the request target: path and query
    started: float  # monotonic time its headers arrived
    answered: float | None  # monotonic time the first byte of its answer was sent back

    @property
    def kind(self) -> str:
        """GET, HEAD, PUT, DELETE, POST or LIST (a GET of a bucket with ``list-type``)."""
        path = self.target.split("?", 1)[0]
        if self.method == "GET" and path.strip("/").count("/") == 0:  # a bucket (path style)
            return "LIST"
        return self.method


def round_trips(requests: list[Request]) -> int:
    """The number of round trips the requests took: the largest set of them of which no two
    were in flight at the same time (by earliest answer first, which finds the largest)."""
    count = 0
    free_from = float("-inf")
    for request in sorted(requests, key=lambda r: r.answered or r.started):
        if request.started >= free_from:
            count += 1
            free_from = request.answered or request.started
    return count


class _RequestReader:
    """Finds where each request starts in the bytes a client sends on one connection."""

    def __init__(self) -> None:
        self._head = b""
        self._body_left = 0  # bytes of a Content-Length body still to come
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk (and its CRLF) still to come
        self._line = b""  # a chunk size or trailer line begun in an earlier piece
        self._in_trailers = False

    def feed(self, data: bytes) -> list[tuple[int, str, str]]:
        """The requests whose headers end in ``data``: (where their headers start in ``data``,
        0 if in an earlier piece; method; target)."""
        found: list[tuple[int, str, str]] = []
        offset = 0
        while offset < len(data):
            if self._body_left:
                taken = min(self._body_left, len(data) - offset)
                self._body_left -= taken
                offset += taken
            elif self._chunked:
                offset = self._chunks(data, offset)
            else:
                offset = self._headers(data, offset, found)
        return found

    def _headers(self, data: bytes, offset: int, found: list[tuple[int, str, str]]) -> int:
        previous = len(self._head)
        start = offset if not previous else 0
        self._head += data[offset:]
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HEADER_BYTES:
                raise ValueError("request headers too long for the relay")
            return len(data)
        consumed = end + 4 - previous  # bytes of ``data`` taken by these headers
        head, self._head = self._head[:end].decode("latin-1"), b""
        lines = head.split("\r\n")
        method, target = (lines[0].split(" ") + ["", ""])[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in lines[1:])}
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if not self._chunked:
            self._body_left = int(headers.get("content-length") or 0)
        found.append((start, method, target))
        return offset + consumed

    def _chunks(self, data: bytes, offset: int) -> int:
        """Consumes chunked body bytes from ``offset``; returns where it stopped. A chunk is a
        size line, that many bytes and CRLF; the last has size 0 and is followed by trailer
        lines and an empty line. Chunk data is counted, never kept."""
        while offset < len(data):
            if self._chunk_left:  # a chunk's data and its CRLF
                taken = min(self._chunk_left, len(data) - offset)
                self._chunk_left -= taken
                offset += taken
                continue
            line_end = data.find(b"\n", offset)
            if line_end < 0:
                self._line += data[offset:]
                return len(data)
            line = (self._line + data[offset:line_end]).rstrip(b"\r")
            self._line, offset = b"", line_end + 1
            if self._in_trailers:
                if not line:  # the empty line that ends the body
                    self._chunked = self._in_trailers = False
                    return offset
            elif int(line.split(b";")[0] or b"0", 16) == 0:
                self._in_trailers = True
            else:
                self._chunk_left = int(line.split(b";")[0], 16) + 2
        return offset


class LatencyRelay:
    """A relay that delays each HTTP request by ``delay_s`` (+ jitter) and counts requests;
    ``start``, use ``endpoint`` (or ``port``), ``stop``."""

    def __init__(self, upstream_port: int, delay_s: float = 0.02, jitter_s: float = 0.0,
                 seed: int | None = None) -> None:
        if delay_s < 0 or jitter_s < 0:
            raise ValueError("delay_s and jitter_s must be >= 0")
        self.upstream = ("127.0.0.1", upstream_port)
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.port = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._requests: list[list] = []  # [method, target, started, answered]
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LatencyRelay:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name="latency-relay").start()
        return self

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            doomed = list(self._sockets)
            self._sockets.clear()
        for end in ([listener] if listener else []) + doomed:
            _close(end)

    def __enter__(self) -> LatencyRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ counting

    def reset(self) -> None:
        """Forgets the requests seen so far."""
        with self._lock:
            self._requests.clear()

    def requests(self) -> list[Request]:
        """Every request since the last ``reset()``, in the order they arrived."""
        with self._lock:
            return [Request(*r) for r in self._requests]

    def _wait(self) -> float:
        with self._lock:
            extra = self._random.expovariate(1 / self.jitter_s) if self.jitter_s else 0.0
        return self.delay_s + extra

    # ------------------------------------------------------------ relaying

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            for end in (client, upstream):
                end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._listener is not listener:
                    _close(client)
                    _close(upstream)
                    return
                self._sockets.update((client, upstream))
            pending: list[list] = []  # this connection's requests not answered yet
            threading.Thread(target=self._requests_out, args=(client, upstream, pending),
                             daemon=True).start()
            threading.Thread(target=self._answers_back, args=(upstream, client, pending),
                             daemon=True).start()

    def _requests_out(self, client: socket.socket, upstream: socket.socket,
                      pending: list[list]) -> None:
        reader = _RequestReader()
        try:
            while data := client.recv(65536):
                sent = 0
                for start, method, target in reader.feed(data):
                    upstream.sendall(data[sent:start])  # the previous request's body
                    sent = start
                    record = [method, target, time.monotonic(), None]
                    with self._lock:
                        self._requests.append(record)
                        pending.append(record)
                    time.sleep(self._wait())  # the request's round trip, before it goes on
                upstream.sendall(data[sent:])
        except (OSError, ValueError):
            pass
        finally:
            self._drop(client, upstream)

    def _answers_back(self, upstream: socket.socket, client: socket.socket,
                      pending: list[list]) -> None:
        try:
            while data := upstream.recv(65536):
                with self._lock:
                    for record in pending:
                        record[3] = time.monotonic()
                    pending.clear()
                client.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(upstream, client)

    def _drop(self, *ends: socket.socket) -> None:
        with self._lock:
            self._sockets.difference_update(ends)
        for end in ends:
            _close(end)


def _close(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        end.close()
