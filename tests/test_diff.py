"""What differs between a stored request and a new one: named by part, never by value."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from postonce import State
from postonce._diff import MOST_NAMED, Request, differences
from postonce._intent import IntentRecord, StoredResponse
from postonce._outbox import decide
from postonce._outbox.base import NewIntent

JSON = (("content-type", "application/json"),)
FORM = (("content-type", "application/x-www-form-urlencoded"),)
URL = "https://api.test/v1/charges"


def json_request(body: Any, *, url: str = URL, method: str = "POST", key: str = "k-1") -> Request:
    """A JSON request as the outbox keeps it."""
    return Request(method, url, JSON, json.dumps(body).encode(), key)


BASE = json_request({"amount": 1, "currency": "eur", "items": [{"qty": 1}]})


@pytest.mark.parametrize(
    ("stored", "new", "expected"),
    [
        pytest.param(BASE, BASE, [], id="same"),
        pytest.param(
            BASE,
            json_request({"items": [{"qty": 1}], "currency": "eur", "amount": 1}),
            [],
            id="key-order-is-not-a-difference",
        ),
        pytest.param(
            BASE,
            BASE._replace(method="PUT"),
            ["the method (PUT here, POST stored)"],
            id="method",
        ),
        pytest.param(
            BASE,
            BASE._replace(url="https://api.test/charges"),
            ["the path"],
            id="path",
        ),
        pytest.param(
            BASE._replace(url=URL + "?currency=eur&old=1&same=x"),
            BASE._replace(url=URL + "?currency=usd&debug=1&same=x"),
            ["query parameters: currency changed; debug added; old removed"],
            id="query",
        ),
        pytest.param(
            BASE,
            json_request({"amount": 2, "currency": "eur", "items": [{"qty": 1}]}),
            ["JSON fields: amount changed"],
            id="json-scalar",
        ),
        pytest.param(
            BASE,
            json_request({"amount": 1, "currency": "eur", "items": [{"qty": 3}, {"qty": 1}]}),
            ["JSON fields: items[0].qty changed; items[1] added"],
            id="json-nested-and-list",
        ),
        pytest.param(
            json_request({"amount": 1, "note": "x", "meta": {"a": 1, "b": 2}}),
            json_request({"amount": 1, "meta": {"a": 1}, "extra": True}),
            ["JSON fields: extra added; meta.b, note removed"],
            id="json-added-removed",
        ),
        pytest.param(
            json_request({"amount": 1}),
            json_request({"amount": 1.0}),
            ["JSON fields: amount changed"],
            id="json-int-is-not-float",
        ),
        pytest.param(
            json_request({"flag": 1}),
            json_request({"flag": True}),
            ["JSON fields: flag changed"],
            id="json-one-is-not-true",
        ),
        pytest.param(
            json_request({"a.b": 1, "bob@example.com": {"z": 1}}),
            json_request({"a.b": 2, "bob@example.com": {"z": 2}}),
            ["JSON fields: [<key>], [<key>].z changed"],
            id="json-keys-that-are-data-are-not-printed",
        ),
        pytest.param(
            json_request([1, 2]),
            json_request({"a": 1}),
            ["the JSON body as a whole (its top-level value)"],
            id="json-top-level",
        ),
        pytest.param(
            json_request({"reference": "k-1", "amount": 1}, key="k-1"),
            json_request({"reference": "k-2", "amount": 1}, key="k-2"),
            [],
            id="a-body-borne-key-is-not-a-difference",
        ),
        pytest.param(
            json_request({f"f{i:02}": 1 for i in range(MOST_NAMED + 3)}),
            json_request({f"f{i:02}": 2 for i in range(MOST_NAMED + 3)}),
            [
                "JSON fields: "
                + ", ".join(f"f{i:02}" for i in range(MOST_NAMED))
                + " changed; and 3 more"
            ],
            id="json-many-are-counted",
        ),
        pytest.param(
            Request("POST", URL, FORM, b"amount=100&currency=eur&metadata%5Bo%5D=1", "k"),
            Request("POST", URL, FORM, b"amount=200&currency=eur&description=x", "k"),
            ["form fields: amount changed; description added; metadata[o] removed"],
            id="form",
        ),
        pytest.param(
            Request("POST", URL, FORM, b"tag=a&tag=b", "k"),
            Request("POST", URL, FORM, b"tag=b&tag=a", "k"),
            ["form fields: tag changed"],
            id="form-repeated-field-order",
        ),
        pytest.param(
            BASE,
            Request("POST", URL, FORM, b"amount=1", "k-1"),
            ["the body's type (application/x-www-form-urlencoded here, application/json stored)"],
            id="body-type",
        ),
        pytest.param(
            Request("POST", URL, (), b"abc", "k"),
            Request("POST", URL, (), b"abd", "k"),
            ["the body (compared as bytes)"],
            id="raw",
        ),
        pytest.param(
            BASE._replace(url="https://api.test/a?x=1"),
            json_request({"amount": 5}, url="https://api.test/b?x=2", method="PUT"),
            [
                "the method (PUT here, POST stored)",
                "the path",
                "query parameters: x changed",
                "JSON fields: amount changed; currency, items removed",
            ],
            id="everything",
        ),
    ],
)
def test_differences(stored: Request, new: Request, expected: list[str]) -> None:
    """Each part that differs is named once, in request order, without a value."""
    assert differences(stored, new) == expected


def test_no_value_is_ever_shown() -> None:
    """Secret values in the path, query and body never reach the description."""
    stored = json_request(
        {"card": "4242424242424242", "cvc": "123"}, url=URL + "/cus_SECRETA?token=tok_SECRETA"
    )
    new = json_request(
        {"card": "4000000000000002", "cvc": "999"}, url=URL + "/cus_SECRETB?token=tok_SECRETB"
    )
    said = "; ".join(differences(stored, new))
    assert "card" in said
    assert "token" in said
    assert "the path" in said
    for value in ("4242", "4000", "123", "999", "SECRETA", "SECRETB"):
        assert value not in said


NEW = NewIntent(
    reference="o-1",
    key="k-1",
    key_given=False,
    provider="stripe",
    method="POST",
    url=URL,
    headers=JSON,
    body=b'{"amount":1}',
    fingerprint="f",
    deadline_at=None,
    sender="svc",
    origin="https://api.test:443",
)
STORED = IntentRecord(
    id=7, reference="o-1", key="k-1", provider="stripe", method="POST",
    url=URL, headers=JSON, body=b'{"amount":2}', fingerprint="g",
    state=State.PENDING, created_at=1.0, first_delivery_at=1.0, due_at=None,
    deadline_at=None, attempts=1, last_outcome=None, lease_owner=None,
    lease_expires_at=None, response=None, note=None, sender="svc",
    origin="https://api.test:443",
)  # fmt: skip


def test_conflict_with_names_the_fields_that_differ() -> None:
    """conflict_with says which JSON field differs between stored and new."""
    found = decide.conflict_with(STORED, NEW)
    assert found is not None
    assert "different request; this call differs in JSON fields: amount changed" in found
    assert "new intent= name" not in found  # still pending: nothing to start over


def test_conflict_with_same_parts_says_the_fingerprint_was_made_otherwise() -> None:
    """A fingerprint that differs while every part compares equal names fingerprint_fields."""
    found = decide.conflict_with(replace(STORED, body=NEW.body), NEW)
    assert found is not None
    assert "different request (method, path, query or body)" in found
    assert "fingerprint_fields" in found


@pytest.mark.parametrize("state", [State.FAILED, State.CANCELLED])
def test_conflict_with_a_finished_failure_says_how_to_go_on(state: State) -> None:
    """A failed or cancelled intent is done: the message gives a new name, never a purge."""
    response = StoredResponse(404, (), b"", False) if state is State.FAILED else None
    found = decide.conflict_with(replace(STORED, state=state, response=response), NEW)
    assert found is not None
    assert f"It ended {state.value}" in found
    assert ("(HTTP 404)" in found) is (state is State.FAILED)
    assert "new intent= name" in found
    # Purging tombstones would free every finished name of that age to be charged again.
    assert "purge" not in found


def test_conflict_with_a_success_gives_no_advice_to_start_over() -> None:
    """A succeeded intent's conflict does not suggest a new name: its effect happened."""
    found = decide.conflict_with(replace(STORED, state=State.SUCCEEDED), NEW)
    assert found is not None
    assert "new intent= name" not in found


def test_conflict_with_another_sender_gives_the_fix() -> None:
    """Another sender's intent: an outbox per application, or adopt() after a key rotation."""
    found = decide.conflict_with(STORED, NEW._replace(sender="other-app"))
    assert found is not None
    assert "belongs to sender 'svc', not to this client ('other-app')" in found
    assert "outbox= or the POSTONCE_OUTBOX variable" in found
    assert "client.adopt('svc')" in found
    assert "name=" in found
