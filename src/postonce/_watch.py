"""A request that tells whether its body was read: the evidence for ``not_sent``.

An exception's type cannot say whether a request left the process: a
transport may raise ``ConnectTimeout`` after the server executed the request
(httpx-aiohttp does). What can be observed is whether the transport ever
took the body. Each send builds its request with a watched body: iterating
its stream (``read()``, ``aread()``, httpcore writing it) or reading
``request.content`` marks it read. A transport that never took a non-empty
body has not sent a complete request, whatever it raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

__all__ = ["Watch", "watched"]


class Watch:
    """The body of one send, and whether the transport has begun to read it."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.read = False

    def __iter__(self) -> Iterator[bytes]:
        self.read = True
        yield self.body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.read = True
        yield self.body

    @property
    def unread(self) -> bool:
        """Never read, and not empty: the server cannot hold a complete request.

        An empty body proves nothing: the headers alone are a whole request.
        """
        return bool(self.body) and not self.read


def _content(request: Any) -> bytes:
    # Read from the request's own watch: httpx's read() swaps the stream for a copy.
    watch: Watch = request.postonce_watch
    watch.read = True
    return watch.body


_CLASSES: dict[str, tuple[type, type]] = {}


def _classes(lib: ModuleType) -> tuple[type, type]:
    """The watched stream and request classes of one HTTP library (httpx or httpx2).

    The stream must be that library's byte stream (its transports check), and
    the request its Request, whose ``content`` marks the body read.
    """
    made = _CLASSES.get(lib.__name__)
    if made is None:
        stream = type("WatchedBody", (Watch, lib.SyncByteStream, lib.AsyncByteStream), {})
        request = type("WatchedRequest", (lib.Request,), {"content": property(_content)})
        made = _CLASSES[lib.__name__] = (stream, request)
    return made


def watched(lib: ModuleType, request: Any, body: bytes) -> tuple[Any, Watch]:
    """``request`` built again as a watched request, its body behind a :class:`Watch`; and
    the watch.

    Built from the request's own method, URL, headers (with Content-Length) and
    extensions (timeouts); only its body changes: a stream that is the watch,
    with no read copy beside it, so no transport can take the body without the
    watch seeing.
    """
    stream_type, request_type = _classes(lib)
    watch: Watch = stream_type(body)
    made = request_type(
        request.method,
        request.url,
        headers=request.headers,
        stream=watch,
        extensions=request.extensions,
    )
    made.postonce_watch = watch
    return made, watch
