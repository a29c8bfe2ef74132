"""The stored request is the one httpx would send."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import postonce
from postonce._wire import address, merge_url
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


def _sent_to(client: postonce.Client, url: str, intent: str) -> str:
    client.post_once(url, json={}, intent=intent)
    record = client.lookup(intent)
    assert record is not None
    return record.url


def test_a_url_resolved_once_follows_a_new_base_url() -> None:
    """The resolved address of ``"/a"`` is kept per base URL: setting ``base_url`` is obeyed.

    httpx replaces its base URL object when ``base_url`` is set; an address kept
    under the old one must not be served for the new one.
    """
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(201)

    transport = httpx.MockTransport(handler)
    with postonce.Client(
        "https://one.test",
        origins=["https://one.test", "https://two.test"],
        transport=transport,
        outbox=MemoryOutbox(),
    ) as client:
        assert _sent_to(client, "/a", "first") == "https://one.test/a"
        assert _sent_to(client, "/a", "again") == "https://one.test/a"
        client._http.base_url = "https://two.test"  # httpx's setter takes a str
        assert _sent_to(client, "/a", "moved") == "https://two.test/a"
    assert seen == ["https://one.test/a", "https://one.test/a", "https://two.test/a"]


def test_a_refused_url_is_refused_every_time_and_per_client_origins() -> None:
    """Only an accepted address is kept, and it is kept per client's origins.

    Two clients on one httpx client (one base URL object): a URL the first
    accepted is still refused by the second, whose origins leave it out; a
    refusal is not remembered as an answer either, so it names each call's
    own intent and stores nothing.
    """
    transport = httpx.MockTransport(lambda r: httpx.Response(201))
    with httpx.Client(base_url="https://api.test", transport=transport) as http:
        open_ = postonce.Client(
            http=http, origins=["https://api.test", "https://other.test"], outbox=MemoryOutbox()
        )
        strict = postonce.Client(http=http, origins=["https://api.test"], outbox=MemoryOutbox())
        assert _sent_to(open_, "https://other.test/a", "open") == "https://other.test/a"
        for intent in ("first", "second"):
            with pytest.raises(postonce.InvalidRequest, match="not one of this client's") as err:
                strict.post_once("https://other.test/a", json={}, intent=intent)
            assert err.value.intent == intent
            assert strict.lookup(intent) is None
        open_.close()
        strict.close()


class _BaseSetMidCall:
    """An httpx client stand-in whose base URL is set by another thread just after it is read."""

    def __init__(self, first: httpx.URL, then: httpx.URL) -> None:
        self.first, self.then, self.reads = first, then, 0

    @property
    def base_url(self) -> httpx.URL:
        self.reads += 1
        return self.first if self.reads == 1 else self.then


class _Fixed:
    def __init__(self, base: httpx.URL) -> None:
        self.base_url = base


def test_an_address_resolved_while_base_url_changed_is_not_kept_for_the_old_base() -> None:
    """Resolved against a base URL set mid-call, an address is not kept under the one read first."""
    one, two = httpx.URL("https://race-one.test"), httpx.URL("https://race-two.test")
    racing: Any = _BaseSetMidCall(one, two)
    assert address(racing, "/a", None, None, frozenset(), "r")[0] == "https://race-two.test/a"
    steady: Any = _Fixed(one)  # the same base URL object as the first read above
    assert address(steady, "/a", None, None, frozenset(), "r")[0] == "https://race-one.test/a"
