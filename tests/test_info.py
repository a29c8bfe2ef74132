"""Typed results and discoverable options: info(), explicit *_once keywords, one name for intent."""

from __future__ import annotations

import inspect
import pydoc
import warnings
from typing import Any, get_type_hints

import anyio
import httpx
import pytest

import postonce
from postonce.testing import MemoryOutbox

ONCE_METHODS = ["request_once", "post_once", "put_once", "patch_once", "delete_once"]
OPTIONS = list(get_type_hints(postonce.OnceOptions))


def created(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json={"id": "ch_1"})


def test_info_types_what_the_extension_says() -> None:
    """postonce.info(response) is a typed OnceInfo naming the intent, key and state."""
    with postonce.Client(
        "http://api.test", outbox=MemoryOutbox(), transport=httpx.MockTransport(created)
    ) as client:
        first = client.post_once("/charges", json={"amount": 1}, intent="order-1/charge")
        again = client.post_once("/charges", json={"amount": 1}, intent="order-1/charge")
    sent, stored = postonce.info(first), postonce.info(again)
    assert isinstance(sent, postonce.OnceInfo)
    assert sent.intent == "order-1/charge"
    assert sent.key == first.extensions["postonce"].key
    assert sent.state is postonce.State.SUCCEEDED
    assert sent.attempts == 1
    assert (sent.from_outbox, stored.from_outbox) == (False, True)
    assert stored.key == sent.key


def test_info_on_an_ordinary_response_is_a_postonce_error() -> None:
    """A response that did not come from a *_once call is refused by name."""
    with pytest.raises(postonce.PostonceError, match="did not come from a postonce"):
        postonce.info(httpx.Response(200))


@pytest.mark.parametrize("kind", [postonce.Client, postonce.AsyncClient])
@pytest.mark.parametrize("name", ONCE_METHODS)
def test_every_option_is_an_explicit_keyword(kind: Any, name: str) -> None:
    """Each *_once method on both clients names every option in its signature."""
    parameters = inspect.signature(getattr(kind, name)).parameters
    assert not [p for p in parameters.values() if p.kind is p.VAR_KEYWORD]
    keywords = [n for n, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert keywords == OPTIONS


@pytest.mark.parametrize("kind", [postonce.Client, postonce.AsyncClient])
@pytest.mark.parametrize("name", ONCE_METHODS)
def test_help_lists_every_option_with_a_line(kind: Any, name: str) -> None:
    """help(Client.post_once) describes every option, from the one shared source."""
    text = pydoc.render_doc(getattr(kind, name), renderer=pydoc.TextDoc())
    for option in OPTIONS:
        assert f"- ``{option}``:" in text, option


def test_the_shortcuts_pass_every_option_through() -> None:
    """post_once's explicit keywords all reach the request: key, params and headers included."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201)

    async def main() -> None:
        async with postonce.AsyncClient(
            "http://api.test", outbox=MemoryOutbox(), transport=httpx.MockTransport(handler)
        ) as client:
            await client.put_once(
                "/charges",
                data={"amount": "1"},
                params={"expand": "x"},
                headers={"X-Trace": "t1"},
                key="my-key-000000001",
                intent="p-1",
            )

    anyio.run(main)
    (request,) = seen
    assert request.method == "PUT"
    assert request.url.params["expand"] == "x"
    assert request.headers["X-Trace"] == "t1"
    assert request.headers["Idempotency-Key"] == "my-key-000000001"
    assert request.content == b"amount=1"


def test_exceptions_name_the_intent_as_intent() -> None:
    """Errors carry .intent; intent= and the older reference= both build them."""
    new = postonce.IntentPending("pending", intent="order-2/charge", key="k", due_at=1.0)
    old = postonce.IntentPending("pending", reference="order-2/charge", key="k")
    assert new.intent == old.intent == "order-2/charge"
    assert "intent 'order-2/charge'" in str(new)
    assert postonce.InvalidRequest("bad", intent="x").intent == "x"
    assert postonce.ConfigurationError("bad").intent is None


def test_reference_is_a_deprecated_alias_of_intent() -> None:
    """.reference still answers, with a DeprecationWarning pointing at .intent."""
    error = postonce.IntentExpired("expired", intent="order-3/charge", key="k")
    with pytest.warns(DeprecationWarning, match=r"\.intent"):
        assert error.reference == "order-3/charge"
    with pytest.warns(DeprecationWarning, match=r"\.intent"):
        assert postonce.InvalidRequest("bad").reference is None


def test_intent_and_reference_that_disagree_are_refused() -> None:
    """Two different names for one intent is a programming error, not a guess."""
    with pytest.raises(TypeError, match="disagree"):
        postonce.IntentConflict("c", intent="a", reference="b", key="k")
    with pytest.raises(TypeError, match="needs intent="):
        postonce.IntentConflict("c", key="k")


def test_postonce_itself_never_reads_the_deprecated_alias() -> None:
    """A call that ends in an error raises no DeprecationWarning from postonce's own code."""

    def pending(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with (
            postonce.Client(
                "http://api.test",
                outbox=MemoryOutbox(),
                transport=httpx.MockTransport(pending),
                retry=postonce.RetryPolicy(attempts=1),
            ) as client,
            pytest.raises(postonce.IntentPending) as raised,
        ):
            client.post_once("/charges", json={}, intent="order-4/charge")
    assert raised.value.intent == "order-4/charge"
