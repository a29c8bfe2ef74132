"""A mock transport that hands the request to its handler without reading the body first.

httpx.MockTransport reads every request body before its handler runs, so an
error the handler raises comes after the body was taken: postonce rightly calls
that attempt ambiguous. A handler behind this transport that raises before
touching the body stands for a transport that failed before sending anything,
which postonce can prove ``not_sent``.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

__all__ = ["UnreadMock"]


class UnreadMock(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Like ``httpx.MockTransport(handler)``, but the body is read only if the handler reads it."""

    def __init__(self, handler: Callable[[httpx.Request], httpx.Response]) -> None:
        self.handler = handler

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.handler(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self.handler(request)
