"""The stored request is the one httpx would send."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import postonce
from postonce._wire import merge_url
from postonce.testing import MemoryOutbox


@pytest.mark.parametrize(
    ("base", "client_params", "url", "params"),
    [
        pytest.param("https://api.test", None, "/v1/charges", None, id="plain"),
        pytest.param("https://api.test/sub", None, "/v1/charges", None, id="base-path"),
        pytest.param("https://api.test/sub/", None, "v1/charges?x=1", None, id="query-in-url"),
        pytest.param("https://api.test", None, "https://other.test/a", {"b": "2"}, id="absolute"),
        pytest.param("https://api.test", {"k": "c"}, "/a?x=1", {"y": "2"}, id="merged-params"),
        pytest.param("", None, "http://h.test/a b", None, id="escaping"),
    ],
)
def test_merge_url_matches_httpx(
    base: str, client_params: dict[str, str] | None, url: str, params: Any
) -> None:
    """merge_url gives the URL httpx's own build_request sends, less the client's own params.

    The client's params are left out of the stored URL (they may be credentials;
    httpx adds them at every send).
    """
    with (
        httpx.Client(base_url=base, params=client_params) as http,
        httpx.Client(base_url=base) as bare,
    ):
        assert merge_url(http, url, params) == bare.build_request("POST", url, params=params).url


def test_a_send_keeps_the_stored_query_beside_the_clients_params() -> None:
    """httpx replaces a URL's query with the client's params; the send keeps both.

    (httpx 0.28 sends ``/a?k=c`` for ``/a?x=1`` on a client with ``params={"k": "c"}``;
    a stored query lost that way would send another request than the one stored.)
    """
    seen: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(201)

    transport = httpx.MockTransport(handler)
    with postonce.Client(
        "https://api.test", params={"k": "c"}, transport=transport, outbox=MemoryOutbox()
    ) as client:
        client.post_once("/a?x=1", json={}, params={"y": "2"}, intent="q")
        record = client.lookup("q")
    assert record is not None
    assert record.url == "https://api.test/a?y=2"  # httpx's own rule: params= replaces the query
    assert seen[0].params.multi_items() == [("k", "c"), ("y", "2")]
