"""Sender identity and origins: an intent goes only to its own origin, sent only by its sender.

A shared outbox (one SQLite file per OS user by default, one PostgreSQL outbox
for many hosts) holds the intents of many clients. These tests prove, against
the real loopback server and every backend, that a drain or a resuming call
never sends another sender's intent, that credentials go only to the client's
own origins, and that no credential reaches the outbox in any spelling.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce import State
from postonce._outbox.locate import open_store
from postonce._sender import auth_material, client_origins, origin_of, sender_identity
from tests.conftest import (
    FAST,
    ClientFactory,
    LoopbackServer,
    OutboxUnderTest,
    loopback_intent,
    outbox_bytes,
)

ONE_TRY = FAST.model_copy(update={"attempts": 1})
#: The loopback server's profile, saying its Bearer is a long-lived key (ietf_draft cannot).
IETF_KEYS = postonce.get_provider("ietf_draft").model_copy(update={"credentials": "api_key"})
ROOT = Path(__file__).resolve().parent.parent


# -- the pure rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://api.stripe.com/v1/charges", "https://api.stripe.com:443"),
        ("HTTPS://API.Stripe.com:443/x", "https://api.stripe.com:443"),
        ("http://127.0.0.1:8000/a?b=1", "http://127.0.0.1:8000"),
        ("http://[::1]:9/a", "http://[::1]:9"),
        ("http://h.test", "http://h.test:80"),
        ("ftp://h.test/a", None),
        ("/v1/charges", None),
        ("http://h.test:99999/", None),
    ],
)
def test_origin_of(url: str, origin: str | None) -> None:
    """An origin is scheme, lower-cased host and port, the default port spelled out."""
    assert origin_of(url) == origin


def test_client_origins_come_from_origins_else_base_url() -> None:
    """origins= wins over base_url; neither gives None; a bad entry is refused."""
    assert client_origins("https://a.test/v1/", None) == frozenset({"https://a.test:443"})
    assert client_origins("https://a.test", ["http://b.test", "https://c.test:8443/x"]) == (
        frozenset({"http://b.test:80", "https://c.test:8443"})
    )
    assert client_origins("", None) is None
    with pytest.raises(ValueError, match="origins="):
        client_origins("", ["b.test"])


def test_identity_is_a_keyed_hash_of_the_credentials_or_the_name() -> None:
    """Two keys give two identities, one key the same; the name wins; no credential shows."""
    a = sender_identity(None, "stripe", [("Authorization", "Bearer sk_live_A")])
    assert a == sender_identity(None, "stripe", [("authorization", "Bearer sk_live_A")])
    assert a != sender_identity(None, "stripe", [("Authorization", "Bearer sk_live_B")])
    assert a != sender_identity(None, "adyen", [("Authorization", "Bearer sk_live_A")])
    assert a.startswith("stripe#")
    assert "sk_live" not in a
    assert sender_identity("checkout-web", "stripe", [("a", "b")]) == "checkout-web"


def test_auth_material_reads_basic_and_digest_credentials() -> None:
    """Basic, digest and tuple auth identify by value; anything else by its type."""
    assert auth_material(httpx.BasicAuth("u", "p1")) != auth_material(httpx.BasicAuth("u", "p2"))
    assert auth_material(httpx.DigestAuth("u", "p1")) != auth_material(httpx.DigestAuth("u", "p2"))
    assert auth_material(("u", "p1")) != auth_material(("u", "p2"))
    assert auth_material(None) == []


# -- who sends what --------------------------------------------------------------------------


def pending_intent(client: Any, reference: str) -> str:
    """Leave one intent pending (a 503 before the server's idempotency layer); its key."""
    with pytest.raises(postonce.IntentPending):
        client.post_once(
            "/ietf/v1/charges",
            json={"amount": 1, "_test": {"before": [{"status": 503}]}},
            intent=reference,
            retry=ONE_TRY,
        )
    record = client.lookup(reference)
    assert record is not None
    assert record.due_at is not None
    time.sleep(max(0.0, record.due_at - time.time()))  # due now: a drain would take it
    return str(record.key)


def test_two_accounts_on_one_outbox_never_send_each_others_intents(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """Each account's drain sends only its own pending charge and counts the other's."""
    a = make_client(
        server.base_url, provider=IETF_KEYS, headers={"Authorization": "Bearer sk_test_ACCOUNT_A"}
    )
    b = make_client(
        server.base_url, provider=IETF_KEYS, headers={"Authorization": "Bearer sk_test_ACCOUNT_B"}
    )
    assert a.sender != b.sender
    key_a = pending_intent(a, "acct-a/charge")
    key_b = pending_intent(b, "acct-b/charge")
    report_b = b.drain()
    assert (report_b.claimed, report_b.succeeded, report_b.not_ours) == (1, 1, 1)
    report_a = a.drain()
    assert (report_a.claimed, report_a.succeeded, report_a.not_ours) == (1, 1, 0)
    for key, account in ((key_a, "A"), (key_b, "B")):
        assert len(server.effects_for(key)) == 1
        sent_with = {r["authorization"] for r in server.requests_for(key)}
        assert sent_with == {f"Bearer sk_test_ACCOUNT_{account}"}


def test_resuming_another_senders_intent_is_a_conflict(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """The same reference from another sender is refused before anything is sent."""
    a = make_client(server.base_url, name="service-a")
    b = make_client(server.base_url, name="service-b")
    key = pending_intent(a, "shared-ref")
    before = len(server.requests_for(key))
    with pytest.raises(postonce.IntentConflict, match="service-a") as info:
        b.post_once("/ietf/v1/charges", json={"amount": 1}, intent="shared-ref")
    assert info.value.intent == "shared-ref"
    assert len(server.requests_for(key)) == before


def test_a_drain_leaves_intents_to_other_origins_alone(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """One sender name, two origins: each client drains only what goes to its own origin."""
    a = make_client(server.base_url, name="svc")
    other = make_client("http://127.0.0.1:9", name="svc")  # same name, another origin
    pending_intent(a, "to-server")
    assert (other.drain().claimed, other.drain().not_ours) == (0, 1)
    assert a.drain().succeeded == 1


def test_a_key_rotation_adopts_the_previous_identity(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """After a key change the old intents wait; adopt(previous) hands them to the new key."""
    old = make_client(
        server.base_url, provider=IETF_KEYS, headers={"Authorization": "Bearer sk_test_OLD"}
    )
    key = pending_intent(old, "rotated")
    new = make_client(
        server.base_url, provider=IETF_KEYS, headers={"Authorization": "Bearer sk_test_NEW"}
    )
    assert new.drain().claimed == 0
    assert new.adopt(old.sender) == 1
    assert new.adopt(old.sender) == 0
    assert new.drain().succeeded == 1
    assert {r["authorization"] for r in server.requests_for(key)} == {
        "Bearer sk_test_OLD",  # the first attempt, a 503
        "Bearer sk_test_NEW",
    }
    assert len(server.effects_for(key)) == 1


def test_intents_written_before_senders_are_adopted_by_their_origin(
    server: LoopbackServer,
    make_client: ClientFactory,
    outbox: OutboxUnderTest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unowned intent (schema 1) goes to the first client of its origin, said in a log line."""
    store = open_store(outbox)
    store.open_intent(
        loopback_intent(server, "legacy", body=b'{"amount":3}'),  # no sender: schema 1
        owner="old-host/1",
        now=time.time() - 60,  # its sender died a minute ago: its lease ran out
        lease_for=1.0,
    )
    if not isinstance(outbox, postonce.testing.MemoryOutbox):
        store.close()
    stranger = make_client("http://127.0.0.1:9", name="elsewhere")
    assert stranger.drain().claimed == 0  # not its origin: not adopted, not sent
    caplog.set_level(logging.WARNING, logger="postonce")
    owner = make_client(server.base_url)
    report = owner.drain()
    assert (report.claimed, report.succeeded) == (1, 1)
    assert any("1 intents written before" in r.getMessage() for r in caplog.records)
    record = owner.lookup("legacy")
    assert record is not None
    assert (record.sender, record.state) == (owner.sender, State.SUCCEEDED)


# -- refused before anything is stored ----------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "url", "match"),
    [
        pytest.param("", "/v1/charges", "relative URL", id="relative"),
        pytest.param("http://api.test", "http://user:pass@api.test/c", "auth=", id="userinfo"),
        pytest.param(
            "http://api.test",
            "https://evil.test/c",
            "not one of this client's origins",
            id="other-origin",
        ),
        pytest.param("http://api.test", "ftp://api.test/c", "only http and https", id="scheme"),
        pytest.param("http://api.test", "http://[::1/c", "cannot build this URL", id="unbuildable"),
    ],
)
def test_unsendable_or_foreign_urls_are_refused_before_storing(
    make_client: ClientFactory, base_url: str, url: str, match: str
) -> None:
    """A typed one-line error naming the intent; no row written, nothing sent."""
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(201))  # type: ignore[func-returns-value]
    client = make_client(base_url, transport=transport)
    with pytest.raises(postonce.InvalidRequest, match=match) as info:
        client.post_once(url, json={}, intent="bad-url")
    assert info.value.intent == "bad-url"
    assert "\n" not in str(info.value)
    assert client.lookup("bad-url") is None
    assert sent == []


def test_an_empty_name_and_credentials_without_an_origin_are_refused(tmp_path: Path) -> None:
    """Client(name="") and a credentialed client with no base_url fail at construction."""
    with pytest.raises(postonce.ConfigurationError, match="name="):
        postonce.Client("http://api.test", name="", outbox=tmp_path / "o.sqlite3")
    with pytest.raises(postonce.ConfigurationError, match="base_url= or origins="):
        postonce.Client(headers={"Authorization": "Bearer x"}, outbox=tmp_path / "o.sqlite3")


def test_a_drain_without_a_base_url_is_refused(tmp_path: Path) -> None:
    """A drain would send stored URLs with this client's credentials: it needs an origin."""
    with (
        postonce.Client(outbox=tmp_path / "o.sqlite3") as client,
        pytest.raises(postonce.ConfigurationError, match="base_url="),
    ):
        client.drain()


# -- no credential at rest, in any spelling ------------------------------------------------


def test_no_credential_in_any_spelling_reaches_the_outbox_the_cli_or_the_logs(
    server: LoopbackServer,
    outbox_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Headers, per-call headers, query, client params, auth and cookies: none at rest."""
    caplog.set_level(logging.DEBUG, logger="postonce")
    client = postonce.Client(
        server.base_url,
        outbox=outbox_path,
        retry=FAST,
        headers={"Authorization": "Bearer sk_test_CLIENTHEADER", "X-Worker": "visible"},
        params={"api_key": "CLIENTPARAM"},
        auth=("acct", "AUTHPASSWORD"),
        cookies={"session": "COOKIEJAR"},
        secret_headers=["X-Api-Key"],
        secret_params=["sig2"],
    )
    response = client.post_once(
        "/ietf/v1/charges?access_token=QUERYTOKEN&visible=yes",
        json={"amount": 1, "_test": {"before": [{"status": 503}]}},
        params={"access_token": "QUERYTOKEN", "sig2": "CALLSIG", "visible": "yes"},
        headers={"X-Api-Key": "CALLAPIKEY", "Cookie": "c=CALLCOOKIE"},
        intent="secrets",
    )
    assert response.status_code == 201
    key = response.extensions["postonce"].key
    # Every send carried the secrets again, the stored query beside them.
    for request in server.requests_for(key):
        for part in ("QUERYTOKEN", "CALLSIG", "CLIENTPARAM", "visible=yes"):
            assert part in request["query"]
    client.close()
    secrets = [
        "CLIENTHEADER",
        "CLIENTPARAM",
        "AUTHPASSWORD",
        "COOKIEJAR",
        "QUERYTOKEN",
        "CALLSIG",
        "CALLAPIKEY",
        "CALLCOOKIE",
    ]
    blob = outbox_bytes(str(outbox_path))
    cli = "".join(
        subprocess.run(
            [sys.executable, "-m", "postonce", "outbox", "--outbox", str(outbox_path), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for args in (["export"], ["list"], ["show", "secrets"])
    )
    logs = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for secret in secrets:
        assert secret.encode() not in blob, secret
        assert secret not in cli, secret
        assert secret not in logs, secret
    assert b"visible=yes" in blob  # the ordinary query is kept
    assert "secrets" in cli


def test_per_call_secret_params_are_re_added_on_every_send(make_client: ClientFactory) -> None:
    """A secret query parameter is in memory for this call's retries, never in the stored URL."""
    seen: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(503 if len(seen) == 1 else 201)

    client = make_client("https://api.test", transport=httpx.MockTransport(handler))
    client.post_once("/c", json={}, params={"api_key": "k1", "x": "1"}, intent="p")
    assert [dict(u.params) for u in seen] == [{"x": "1", "api_key": "k1"}] * 2
    record = client.lookup("p")
    assert record is not None
    assert record.url == "https://api.test/c?x=1"
    assert json.dumps(list(client.outbox.export_rows()), default=str).count("k1") == 0


@pytest.mark.parametrize(
    ("provider", "header"),
    [
        ("adyen", "X-API-Key"),
        ("paypal_orders", "PayPal-Auth-Assertion"),
        ("aws_client_token", "X-Amz-Security-Token"),
        ("google_request_id", "X-Goog-Api-Key"),
    ],
)
def test_each_providers_credential_header_is_never_stored(
    make_client: ClientFactory, outbox: OutboxUnderTest, provider: str, header: str
) -> None:
    """A profile's documented credential header, passed per call, is sent but never stored."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503 if len(seen) == 1 else 201)

    client = make_client(
        "https://api.test", provider=provider, transport=httpx.MockTransport(handler)
    )
    body = {"amount": 1}
    client.post_once("/c", json=body, headers={header: "PROVIDERSECRET"}, intent="cred")
    assert [r.headers[header] for r in seen] == ["PROVIDERSECRET"] * 2
    client.close()
    assert b"PROVIDERSECRET" not in outbox_bytes(outbox)


def test_a_providers_credential_header_on_the_client_shapes_its_identity(tmp_path: Path) -> None:
    """Two Adyen clients with different X-API-Key values are two senders."""
    made = [
        postonce.Client(
            "https://checkout-test.adyen.com",
            provider="adyen",
            headers={"X-API-Key": key},
            outbox=tmp_path / "o.sqlite3",
        )
        for key in ("AQE_one", "AQE_two")
    ]
    assert made[0].sender != made[1].sender
    for client in made:
        client.close()
