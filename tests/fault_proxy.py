"""A seeded fault-injecting HTTP/1.1 proxy for the chaos suite, on 127.0.0.1 only.

It sits between a client and the loopback test server. For each HTTP request
it reads in full (request line, headers, a ``Content-Length`` or chunked
body; keep-alive aware), it decides one of:

* ``pass``: forward it and relay the answer;
* ``drop_response``: forward it, read the server's whole answer, then close
  the client's connection without sending it (the server processed it; the
  client sees a protocol error: ambiguous);
* ``delay``: forward it, read the whole answer, hold it ``delay_hold`` seconds,
  then close the connection without relaying it (the client sees a read
  timeout when its read timeout is shorter, else a protocol error after the
  hold: ambiguous either way, and the run stays bounded);
* ``reset_before``: reset the client's connection (``SO_LINGER 0``: a real
  RST) before forwarding anything: the server never sees the request, although
  the client wrote it (ambiguous to the client);
* ``answer_503`` / ``answer_429``: answer ``503`` / ``429`` with
  ``Retry-After: 0`` itself, without forwarding.

Every decision comes from one ``random.Random(seed)``, drawn once per request
in the order requests arrive: the same seed gives the same sequence of
decisions. ``script()`` queues decisions that are taken before random ones, for
deterministic tests. Every decision is logged as ``(kind, idempotency key)``
(``faults()`` is that log without ``pass``) and counted by kind; ``upstream_error``
counts failures of the proxy's own upstream exchange, never an injected fault.

Each forwarded request gets a fresh upstream connection, closed once the answer
is read: no idle upstream connection can be closed under a request by the
server's keep-alive timeout, which would be a fault nobody injected.

The proxy runs its own event loop in a thread, so sync test code starts and
stops it (``with FaultProxy(...) as proxy:``). ``stop()`` closes the listener,
cancels every connection task and waits for them: nothing outlives it.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FAULT_KINDS", "KINDS", "FaultProxy", "Message"]

#: The faults the proxy injects, in the order their probabilities are laid out.
FAULT_KINDS: tuple[str, ...] = (
    "drop_response",
    "delay",
    "reset_before",
    "answer_503",
    "answer_429",
)
#: Every decision: no fault, or one of the faults.
KINDS: tuple[str, ...] = ("pass", *FAULT_KINDS)

_HEAD_LIMIT = 64 * 1024
_CANNED = {
    "answer_503": (503, "Service Unavailable"),
    "answer_429": (429, "Too Many Requests"),
}


class ProxyProtocolError(Exception):
    """A message the proxy cannot frame: the connection is closed."""


@dataclass(frozen=True)
class Message:
    """One HTTP/1.1 message as read off the wire: its raw bytes and parsed head."""

    raw: bytes
    start_line: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        """The first value of the header ``name`` (case-insensitive), or None."""
        lowered = name.lower()
        for header_name, value in self.headers:
            if header_name == lowered:
                return value
        return None

    @property
    def wants_close(self) -> bool:
        """Whether this message ends its connection (``Connection: close`` or HTTP/1.0)."""
        tokens = {t.strip().lower() for t in (self.header("connection") or "").split(",")}
        if "close" in tokens:
            return True
        first = self.start_line.split(" ", 1)[0]
        version = first if first.startswith("HTTP/") else self.start_line.rsplit(" ", 1)[-1]
        return version == "HTTP/1.0" and "keep-alive" not in tokens


def _parse_head(head: bytes) -> tuple[str, tuple[tuple[str, str], ...]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProxyProtocolError(f"malformed header line {line!r}")
        headers.append((name.strip().lower(), value.strip()))
    return lines[0], tuple(headers)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, raw (sizes, chunks and trailers), to forward as it came."""
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        parts.append(line)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise ProxyProtocolError(f"bad chunk size {line!r}") from exc
        if size == 0:
            while True:
                trailer = await reader.readuntil(b"\r\n")
                parts.append(trailer)
                if trailer == b"\r\n":
                    return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))


async def _read_message(
    reader: asyncio.StreamReader, *, response_to: str | None = None
) -> Message | None:
    """The next whole message on ``reader``; None on a clean end between messages.

    ``response_to`` is the request method when reading a response (a response
    to HEAD, and 1xx/204/304 answers, have no body; a response without framing
    runs to the end of the connection).
    """
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProxyProtocolError("connection closed mid-head") from exc
    except asyncio.LimitOverrunError as exc:
        raise ProxyProtocolError("head too long") from exc
    start_line, headers = _parse_head(head)
    message = Message(raw=head, start_line=start_line, headers=headers)
    transfer = (message.header("transfer-encoding") or "").lower()
    length = message.header("content-length")
    if response_to is not None:
        try:
            status = int(start_line.split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise ProxyProtocolError(f"bad status line {start_line!r}") from exc
        if response_to == "HEAD" or status < 200 or status in (204, 304):
            return message
    if "chunked" in transfer:
        body = await _read_chunked(reader)
    elif length is not None:
        try:
            body = await reader.readexactly(int(length))
        except ValueError as exc:
            raise ProxyProtocolError(f"bad Content-Length {length!r}") from exc
    elif response_to is not None:
        body = await reader.read()  # delimited by the end of the connection
    else:
        body = b""
    return Message(raw=head + body, start_line=start_line, headers=headers)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (``SO_LINGER`` on, timeout 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _canned(kind: str) -> bytes:
    status, reason = _CANNED[kind]
    body = b'{"error":"injected by the fault proxy"}'
    return (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Retry-After: 0\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    ).encode() + body


class FaultProxy:
    """A seeded fault-injecting proxy from 127.0.0.1:<port> to one loopback upstream.

    ``fault_rate`` is the probability that a request gets a fault; it is split
    between the kinds in proportion to ``weights`` (evenly by default).
    """

    def __init__(
        self,
        upstream: str,
        *,
        seed: int,
        fault_rate: float = 0.2,
        weights: Mapping[str, float] | None = None,
        delay_hold: float = 1.0,
        io_timeout: float = 30.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
            raise ValueError(f"the fault proxy only forwards to loopback, not {upstream!r}")
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError("fault_rate must be between 0 and 1")
        chosen = dict(weights) if weights is not None else dict.fromkeys(FAULT_KINDS, 1.0)
        unknown = set(chosen) - set(FAULT_KINDS)
        if unknown or not chosen or any(w < 0 for w in chosen.values()):
            raise ValueError(f"weights must be non-negative, over {FAULT_KINDS}: {chosen}")
        total = sum(chosen.values())
        self._upstream = (parts.hostname, parts.port)
        self.seed = seed
        self.fault_rate = fault_rate
        #: The probability of each fault kind for one request.
        self.probabilities = {k: fault_rate * chosen.get(k, 0.0) / total for k in FAULT_KINDS}
        self.delay_hold = delay_hold
        self.io_timeout = io_timeout
        self._rng = random.Random(seed)
        self._script: deque[str] = deque()
        self._lock = threading.Lock()
        self._decisions: list[tuple[str, str | None]] = []
        self._counts: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.url = ""

    # -- from the test's thread ------------------------------------------------------------

    def start(self) -> str:
        """Listen on 127.0.0.1 (a free port) in a thread of its own; return the proxy's URL."""
        if self._thread is not None:
            raise RuntimeError("the fault proxy is already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), loop)
        port = future.result(timeout=10)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, end every connection and its task, stop the loop and the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=timeout)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=timeout)
            if thread.is_alive():
                raise RuntimeError("the fault proxy's thread did not stop")
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def script(self, *kinds: str) -> None:
        """Queue decisions for the next requests, taken before any random one."""
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"unknown fault kind {kind!r}; known: {KINDS}")
        with self._lock:
            self._script.extend(kinds)

    def faults(self) -> list[tuple[str, str | None]]:
        """Every fault injected so far, in order: (kind, idempotency key or None)."""
        with self._lock:
            return [d for d in self._decisions if d[0] != "pass"]

    def decisions(self) -> list[tuple[str, str | None]]:
        """Every decision so far, ``pass`` included, in order: (kind, idempotency key or None)."""
        with self._lock:
            return list(self._decisions)

    def counts(self) -> dict[str, int]:
        """How many requests got each decision (``pass`` included), plus ``upstream_error``."""
        with self._lock:
            return dict(self._counts)

    def fault_counts(self) -> dict[str, int]:
        """Faults injected by kind, every kind listed (0 when none)."""
        with self._lock:
            return {kind: self._counts.get(kind, 0) for kind in FAULT_KINDS}

    def active_connections(self) -> int:
        """Connection tasks still running (0 after ``stop()``)."""
        return len(self._tasks)

    # -- on the proxy's loop ---------------------------------------------------------------

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(
            self._connection, host="127.0.0.1", port=0, limit=_HEAD_LIMIT
        )
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # Cancelled again until every connection has ended: on Python 3.11, asyncio.wait_for
        # can swallow a cancellation that meets its inner result (an upstream answer arriving
        # as we cancel), and that connection would go on to hold its answer for delay_hold.
        while tasks := [task for task in self._tasks if not task.done()]:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=0.1)
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), timeout=5)

    def decide(self, key: str | None) -> str:
        """The next decision (scripted first, else seeded), counted and logged."""
        with self._lock:
            if self._script:
                kind = self._script.popleft()
            else:
                draw = self._rng.random()
                kind = "pass"
                edge = 0.0
                for fault in FAULT_KINDS:
                    edge += self.probabilities[fault]
                    if draw < edge:
                        kind = fault
                        break
            self._counts[kind] += 1
            self._decisions.append((kind, key))
            return kind

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.TimeoutError,
            ProxyProtocolError,
            OSError,
        ):
            pass  # the client went away or spoke nonsense: this connection is over
        except asyncio.CancelledError:
            # stop() ends this connection. Ending normally rather than cancelled
            # keeps asyncio's stream callback from logging the cancellation.
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await _read_message(reader)
            if request is None:
                return
            kind = self.decide(request.header("idempotency-key"))
            if kind == "reset_before":
                _reset(writer)
                return
            if kind in _CANNED:
                writer.write(_canned(kind))
                await writer.drain()
                if request.wants_close:
                    return
                continue
            response = await self._forward(request)
            if response is None:
                self._count("upstream_error")
                _reset(writer)
                return
            if kind == "drop_response":
                return
            if kind == "delay":
                await asyncio.sleep(self.delay_hold)
                return
            writer.write(response.raw)
            await writer.drain()
            if request.wants_close or response.wants_close:
                return

    async def _forward(self, request: Message) -> Message | None:
        """Send ``request`` on a fresh upstream connection; its whole answer, or None."""
        host, port = self._upstream
        method = request.start_line.split(" ", 1)[0]
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=_HEAD_LIMIT), self.io_timeout
            )
        except (OSError, asyncio.TimeoutError):
            return None
        try:
            up_writer.write(request.raw)
            await up_writer.drain()
            return await asyncio.wait_for(
                _read_message(up_reader, response_to=method), self.io_timeout
            )
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ProxyProtocolError):
            return None
        finally:
            up_writer.close()
