"""Which HTTP library the suite's clients use: httpx, or httpx2 when POSTONCE_TEST_HTTP=httpx2.

CI runs the suite once per library. The conftest factory, the crash worker and
the CLI drain app all ask here, so the switch is read in one place.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

HTTP_LIBRARY = os.environ.get("POSTONCE_TEST_HTTP", "httpx")

#: The Response class the suite's clients return.
Response: type[Any] = httpx.Response
if HTTP_LIBRARY == "httpx2":
    import httpx2

    Response = httpx2.Response


def default_transport(kind: str = "sync") -> Any:
    """The transport a client should use when the test gives none (None: httpx's own)."""
    if HTTP_LIBRARY != "httpx2":
        return None
    import httpx2

    return httpx2.HTTPTransport() if kind == "sync" else httpx2.AsyncHTTPTransport()
