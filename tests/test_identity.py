"""Sender identities that survive token refresh, secret API-key headers, headers that scope a key.

Issue 35, items 1 and 3 (and item 2's marker): the default sender identity is
derived only from credentials that stay the same while the account does, never
from an access token that is refreshed (where postonce cannot tell, the client
must be given ``name=``); the common API-key headers are secret by default and
name the sender; a profile's scope headers (Stripe's ``Stripe-Account``) and a
call's own key belong to the intent's fingerprint; an intent written with a
call's own secrets records their names, never their values.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce._keys import fingerprint
from postonce._sender import account_names, call_account, sender_identity
from tests.conftest import FAST, ClientFactory, LoopbackServer, OutboxUnderTest, outbox_bytes

ONE_TRY = FAST.model_copy(update={"attempts": 1})
ROOT = Path(__file__).resolve().parent.parent


def jwt(subject: str | None, issuer: str = "https://auth.example", **claims: Any) -> str:
    """An unsigned JWT access token: a new one at every refresh (new iat, exp and jti)."""

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    now = int(time.time())
    body: dict[str, Any] = {"iss": issuer, "iat": now, "exp": now + 3600, "jti": uuid.uuid4().hex}
    if subject is not None:
        body["sub"] = subject
    body.update(claims)
    return f"{part({'alg': 'RS256', 'typ': 'at+jwt'})}.{part(body)}.c2lnbmF0dXJl"


class Api:
    """A provider stand-in: 503 to the first request of each key, then 201; keeps every request."""

    def __init__(self, key_header: str = "Idempotency-Key") -> None:
        self.key_header = key_header
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers[self.key_header]
        first = not any(r.headers[self.key_header] == key for r in self.requests)
        self.requests.append(request)
        return httpx.Response(503 if first else 201, json={"id": f"ch_{len(self.requests)}"})

    def sent(self, key: str, header: str) -> list[str | None]:
        """The value of ``header`` on each request sent with ``key``."""
        return [r.headers.get(header) for r in self.requests if r.headers[self.key_header] == key]


def leave_pending(client: Any, reference: str, **options: Any) -> str:
    """Send once (a 503), leaving the intent pending and due now; its key."""
    with pytest.raises(postonce.IntentPending) as info:
        client.post_once(
            "/v1/charges", json={"amount": 1}, intent=reference, retry=ONE_TRY, **options
        )
    record = client.lookup(reference)
    assert record is not None
    assert record.due_at is not None
    time.sleep(max(0.0, record.due_at - time.time()))
    return str(info.value.key)


# -- which credentials name an account -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "credentials", "names_it"),
    [
        ("authorization", "Basic dTpw", None, True),  # a user and password: long-lived
        ("authorization", "Bearer sk_live_1", "api_key", True),
        ("authorization", "sk_live_1", "api_key", True),  # a raw key, no scheme
        ("authorization", "Bearer A21AAF", "token", False),  # PayPal's OAuth token
        ("authorization", "Bearer sk_live_1", None, False),  # the profile cannot tell
        ("authorization", "AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=ab", "token", False),
        ("proxy-authorization", "Bearer p", "api_key", False),  # not the provider's
        ("proxy-authorization", "Basic cDpx", None, True),
        ("x-api-key", "AQE_1", None, True),
        ("api-key", "k", None, True),
        ("apikey", "k", None, True),
        ("x-goog-api-key", "AIza", "token", True),
        ("paypal-auth-assertion", "eyJ.eyJ.", "token", True),  # names the merchant
        ("x-auth-token", "t", None, False),  # a key or a session token: cannot tell
        ("x-access-token", "t", None, False),
        ("x-amz-security-token", "FwoG", "token", False),
        ("x-amz-date", "20260101T000000Z", "token", False),
        ("cookie", "session=1", None, False),
        ("access_token", "t", None, False),
        ("api_key", "k", None, True),
        ("auth", "u\x00p", None, True),  # auth=("u", "p")
    ],
)
def test_which_credentials_name_an_account(
    name: str, value: str, credentials: str | None, names_it: bool
) -> None:
    """A long-lived key names its account; a refreshed or per-request credential never does."""
    named, doubtful = account_names([(name, value)], credentials)
    assert (bool(named), bool(doubtful)) == (names_it, not names_it)


def test_a_jwt_names_its_issuer_and_subject_not_its_value() -> None:
    """Two tokens of one subject name one account; another subject or issuer another."""
    first, refreshed = jwt("merchant-1"), jwt("merchant-1")
    assert first != refreshed
    named = [account_names([("authorization", f"Bearer {t}")], None)[0] for t in (first, refreshed)]
    assert named[0] == named[1] != []
    other = account_names([("authorization", f"Bearer {jwt('merchant-2')}")], None)[0]
    elsewhere = account_names([("authorization", f"Bearer {jwt('merchant-1', 'https://b')}")], None)
    assert other != named[0] != elsewhere[0]
    # client_id stands in for sub (a client-credentials token may have no sub).
    assert account_names([("authorization", f"Bearer {jwt(None, client_id='app')}")], None)[0]
    # Neither: nothing names the account.
    assert account_names([("authorization", f"Bearer {jwt(None)}")], None)[0] == []


def test_long_lived_keys_keep_the_identity_earlier_releases_gave_them(tmp_path: Path) -> None:
    """An upgrade orphans nothing: a Stripe key, an Adyen key, Basic auth keep their senders."""
    # The senders release 0.x (before issue 35) gave these clients.
    cases: list[tuple[str, dict[str, str] | None, tuple[str, str] | None, str]] = [
        ("stripe", {"Authorization": "Bearer sk_test_1"}, None, "stripe#6d069133800ee446"),
        ("adyen", {"X-API-Key": "AQE_1"}, None, "adyen#9ebf1b6d48fe7e06"),
        ("ietf_draft", None, ("acct", "pw"), "ietf_draft#514dc2104a2bd6d3"),
        ("ietf_draft", None, None, "ietf_draft#c17eed88ffb0115e"),
    ]
    for provider, headers, auth, earlier in cases:
        with postonce.Client(
            "https://api.test",
            provider=provider,
            headers=headers,
            auth=auth,
            outbox=tmp_path / "o.sqlite3",
        ) as client:
            assert client.sender == earlier


# -- item 1: a sender identity that survives token refresh ---------------------------------

FIRST_PROCESS = textwrap.dedent(
    """
    import sys
    import postonce

    base_url, outbox, token = sys.argv[1:4]
    client = postonce.Client(
        base_url,
        outbox=outbox,
        headers={"Authorization": f"Bearer {token}"},
        retry=postonce.RetryPolicy(attempts=1, wait_initial=0.01, wait_max=0.01),
    )
    for reference in ("oauth/resumed", "oauth/drained"):
        try:
            client.post_once(
                "/ietf/v1/charges",
                json={"amount": 7, "_test": {"before": [{"status": 503}]}},
                intent=reference,
            )
        except postonce.IntentPending:
            pass
    print(client.sender)
    client.close()
    """
)


def test_a_refreshed_access_token_resumes_and_drains_the_previous_process_intents(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """A process whose JWT token was refreshed is the same sender: it resumes and drains."""
    outbox = tmp_path / "outbox.sqlite3"
    first = subprocess.run(
        [sys.executable, "-c", FIRST_PROCESS, server.base_url, str(outbox), jwt("merchant-7")],
        cwd=ROOT,
        env=os.environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    with postonce.Client(
        server.base_url,
        outbox=outbox,
        headers={"Authorization": f"Bearer {jwt('merchant-7')}"},  # refreshed at start-up
        retry=FAST,
    ) as second:
        assert second.sender == first.stdout.strip()
        resumed = second.post_once(
            "/ietf/v1/charges",
            json={"amount": 7, "_test": {"before": [{"status": 503}]}},
            intent="oauth/resumed",
        )
        assert resumed.status_code == 201
        record = second.lookup("oauth/drained")
        assert record is not None
        time.sleep(max(0.0, (record.due_at or 0.0) - time.time()))
        report = second.drain()
        assert (report.claimed, report.succeeded, report.not_ours) == (1, 1, 0)
        for reference in ("oauth/resumed", "oauth/drained"):
            done = second.lookup(reference)
            assert done is not None
            assert done.state is postonce.State.SUCCEEDED
            assert len(server.effects_for(done.key)) == 1


@pytest.mark.parametrize(
    ("provider", "headers", "says"),
    [
        pytest.param(
            "paypal_orders",
            {"Authorization": "Bearer A21AAF_SECRETVALUE"},
            "access token that is",
            id="paypal-oauth",
        ),
        pytest.param(
            "square",
            {"Authorization": "Bearer EAAA_SECRETVALUE"},
            "access token that is",
            id="square",
        ),
        pytest.param(
            "ietf_draft",
            {"Authorization": "Bearer SECRETVALUE"},
            "cannot tell whether its Authorization",
            id="ietf-bearer",
        ),
        pytest.param(
            "checkout",
            {"Authorization": "sk_sbox_SECRETVALUE"},
            "cannot tell whether its Authorization",
            id="checkout-key-or-oauth",
        ),
        pytest.param(
            "ietf_draft",
            {"X-Auth-Token": "SECRETVALUE"},
            "cannot tell whether its X-Auth-Token",
            id="x-auth-token",
        ),
        pytest.param(
            "aws_client_token",
            {"X-Amz-Security-Token": "FwoG_SECRETVALUE"},
            "cannot tell",
            id="aws-session-token",
        ),
    ],
)
def test_a_credential_that_may_be_refreshed_needs_a_name(
    tmp_path: Path, provider: str, headers: dict[str, str], says: str
) -> None:
    """Without name= such a client is refused at construction, told how to fix it."""
    outbox = tmp_path / "o.sqlite3"
    with pytest.raises(postonce.ConfigurationError, match=says) as info:
        postonce.Client("https://api.test", provider=provider, headers=headers, outbox=outbox)
    message = str(info.value)
    assert "name=" in message
    assert "adopt(" in message
    assert "\n" not in message
    for value in headers.values():
        assert value not in message
    # The fix it names works, and changes nothing else.
    with postonce.Client(
        "https://api.test", provider=provider, headers=headers, name="payments", outbox=outbox
    ) as named:
        assert named.sender == "payments"


def test_the_error_names_the_identity_earlier_releases_derived(tmp_path: Path) -> None:
    """Its adopt() hint is the sender an earlier release stored these credentials' intents under."""
    headers = {"Authorization": "Bearer sk_test_legacy"}
    previous = sender_identity(None, "ietf_draft", [("authorization", "Bearer sk_test_legacy")])
    with pytest.raises(postonce.ConfigurationError, match=f"adopt\\('{previous}'\\)"):
        postonce.Client("https://api.test", headers=headers, outbox=tmp_path / "o.sqlite3")
    # The profile copy it suggests declares a long-lived key: the earlier identity again.
    keyed = postonce.get_provider("ietf_draft").model_copy(update={"credentials": "api_key"})
    with postonce.Client(
        "https://api.test", provider=keyed, headers=headers, outbox=tmp_path / "o.sqlite3"
    ) as client:
        assert client.sender == previous


def test_a_long_lived_key_beside_a_refreshed_token_names_the_sender(tmp_path: Path) -> None:
    """Google: an API key with an OAuth token; the token's refresh keeps the sender."""
    senders = set()
    for token in ("ya29.first", "ya29.refreshed"):
        with postonce.Client(
            "https://compute.googleapis.com",
            provider="google_request_id",
            headers={"Authorization": f"Bearer {token}", "X-Goog-Api-Key": "AIza_1"},
            outbox=tmp_path / "o.sqlite3",
        ) as client:
            senders.add(client.sender)
    assert len(senders) == 1


def test_a_named_client_resumes_and_drains_across_a_token_refresh(
    make_client: ClientFactory,
) -> None:
    """PayPal with name=: the next process's new token sends the previous one's intents."""
    api = Api("PayPal-Request-Id")
    transport = httpx.MockTransport(api)

    def paypal(token: str) -> Any:
        return make_client(
            "https://api-m.paypal.com",
            provider="paypal_orders",
            name="shop",
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
        )

    before = paypal("A21AA_first")
    resumed_key = leave_pending(before, "pp/resumed")
    drained_key = leave_pending(before, "pp/drained")
    after = paypal("A21AA_refreshed")
    assert after.sender == before.sender == "shop"
    after.post_once("/v1/charges", json={"amount": 1}, intent="pp/resumed")
    assert after.drain().succeeded == 1
    for key in (resumed_key, drained_key):
        assert api.sent(key, "PayPal-Request-Id") == [key, key]
        assert api.sent(key, "Authorization") == ["Bearer A21AA_first", "Bearer A21AA_refreshed"]


# -- item 3: secret by default, in identity too --------------------------------------------


@pytest.mark.parametrize(
    "header", ["X-API-Key", "Api-Key", "apikey", "X-Auth-Token", "X-Access-Token", "Private-Token"]
)
def test_common_api_key_headers_are_never_stored(
    make_client: ClientFactory, outbox: OutboxUnderTest, header: str
) -> None:
    """A per-call API-key header under a profile that does not name it is sent, never stored."""
    api = Api()
    client = make_client("https://api.test", transport=httpx.MockTransport(api))
    response = client.post_once(
        "/v1/charges", json={"amount": 1}, headers={header: "CALLSECRETKEY"}, intent="k"
    )
    key = response.extensions["postonce"].key
    assert api.sent(key, header) == ["CALLSECRETKEY"] * 2
    client.close()
    assert b"CALLSECRETKEY" not in outbox_bytes(outbox)


def test_two_clients_differing_only_in_x_api_key_never_send_each_others_intents(
    make_client: ClientFactory,
) -> None:
    """B's drain leaves account A's pending charge alone; A's drain sends it with A's key."""
    api = Api()
    transport = httpx.MockTransport(api)
    a = make_client("https://api.test", headers={"X-API-Key": "key_A"}, transport=transport)
    b = make_client("https://api.test", headers={"X-API-Key": "key_B"}, transport=transport)
    assert a.sender != b.sender
    key = leave_pending(a, "acct-a/charge")
    report_b = b.drain()
    assert (report_b.claimed, report_b.not_ours) == (0, 1)
    assert a.drain().succeeded == 1
    assert api.sent(key, "X-API-Key") == ["key_A", "key_A"]


def test_a_call_under_another_accounts_key_is_another_request(
    make_client: ClientFactory, outbox: OutboxUnderTest
) -> None:
    """A platform's intent sent with merchant A's key is refused with merchant B's: nothing sent."""
    api = Api()
    platform = make_client("https://api.test", transport=httpx.MockTransport(api))
    key = leave_pending(platform, "order-1/charge", headers={"X-API-Key": "merchant_A_key"})
    with pytest.raises(postonce.IntentConflict) as info:
        platform.post_once(
            "/v1/charges",
            json={"amount": 1},
            intent="order-1/charge",
            headers={"X-API-Key": "merchant_B_key"},
        )
    assert "merchant_B_key" not in str(info.value)
    assert api.sent(key, "X-API-Key") == ["merchant_A_key"]
    # The same merchant's key resumes it.
    platform.post_once(
        "/v1/charges",
        json={"amount": 1},
        intent="order-1/charge",
        headers={"X-API-Key": "merchant_A_key"},
    )
    assert api.sent(key, "X-API-Key") == ["merchant_A_key"] * 2
    platform.close()
    assert b"merchant_A_key" not in outbox_bytes(outbox)


def test_a_call_account_is_a_slow_hash_of_long_lived_keys_only() -> None:
    """A call's key names an account (never shown); a refreshed token names none."""
    a = call_account("ietf_draft", None, [("X-API-Key", "merchant_A_key")])
    assert a is not None
    assert "merchant_A_key" not in a
    assert a == call_account("ietf_draft", None, [("x-api-key", "merchant_A_key")])
    assert a != call_account("ietf_draft", None, [("X-API-Key", "merchant_B_key")])
    assert call_account("paypal_orders", "token", [("Authorization", "Bearer A21")]) is None


# -- item 3: headers that scope a key ------------------------------------------------------

STRIPE = "https://api.stripe.com"
PLATFORM_KEY = {"Authorization": "Bearer sk_test_platform"}


def test_another_stripe_account_is_another_request(make_client: ClientFactory) -> None:
    """The same intent for another connected account is an IntentConflict; nothing is sent."""
    api = Api()
    client = make_client(
        STRIPE, provider="stripe", headers=PLATFORM_KEY, transport=httpx.MockTransport(api)
    )
    key = leave_pending(client, "acct/charge", headers={"Stripe-Account": "acct_A"})
    with pytest.raises(postonce.IntentConflict, match="headers: Stripe-Account changed"):
        client.post_once(
            "/v1/charges",
            json={"amount": 1},
            intent="acct/charge",
            headers={"Stripe-Account": "acct_B"},
        )
    assert api.sent(key, "Stripe-Account") == ["acct_A"]
    client.post_once(
        "/v1/charges",
        json={"amount": 1},
        intent="acct/charge",
        headers={"Stripe-Account": "acct_A"},
    )
    assert api.sent(key, "Stripe-Account") == ["acct_A", "acct_A"]
    record = client.lookup("acct/charge")
    assert record is not None
    assert ("stripe-account", "acct_A") in [(n.lower(), v) for n, v in record.headers]


def test_a_client_wide_stripe_account_goes_with_the_intent(make_client: ClientFactory) -> None:
    """Set on the client, the account is stored with the intent: any drain sends it there."""
    api = Api()
    transport = httpx.MockTransport(api)
    connected = make_client(
        STRIPE,
        provider="stripe",
        headers={**PLATFORM_KEY, "Stripe-Account": "acct_A"},
        transport=transport,
    )
    key = leave_pending(connected, "connected/charge")
    # The platform's own drain (same key, no Stripe-Account) finishes it for acct_A.
    platform = make_client(STRIPE, provider="stripe", headers=PLATFORM_KEY, transport=transport)
    assert platform.sender == connected.sender
    assert platform.drain().succeeded == 1
    assert api.sent(key, "Stripe-Account") == ["acct_A", "acct_A"]
    # And the same intent from a client of another account is another request.
    other = make_client(
        STRIPE,
        provider="stripe",
        headers={**PLATFORM_KEY, "Stripe-Account": "acct_B"},
        transport=transport,
    )
    with pytest.raises(postonce.IntentConflict):
        other.post_once("/v1/charges", json={"amount": 1}, intent="connected/charge")


def test_a_request_with_no_scope_keeps_its_fingerprint() -> None:
    """Fingerprints stored by earlier releases still match: no scope, no change."""
    digest = fingerprint("POST", "/v1/charges", json_body={"amount": 1}, is_json=True)
    assert digest == "e2635725c1a3abad949bf2cbb578e30163c7548bae3acbf3315c2a29c8dd7709"
    scoped = fingerprint(
        "POST",
        "/v1/charges",
        json_body={"amount": 1},
        is_json=True,
        scope=[("Stripe-Account", "a")],
    )
    assert scoped != digest
    assert scoped == fingerprint(
        "POST",
        "/v1/charges",
        json_body={"amount": 1},
        is_json=True,
        scope=[("stripe-account", "a")],
    )


def test_a_profile_cannot_store_a_credential_as_scope() -> None:
    """A header both secret and stored, or the key's own, is refused; names compare folded."""
    base = {"name": "p", "retention": "PT1H"}
    with pytest.raises(ValueError, match="both a scope header"):
        postonce.Provider(**base, credential_headers={"X-Key"}, scope_headers={"x-key"})
    with pytest.raises(ValueError, match="key's own header"):
        postonce.Provider(**base, scope_headers={"Idempotency-Key"})
    profile = postonce.Provider(**base, credential_headers={"X-Key"}, scope_headers={"X-Tenant"})
    assert profile.credential_headers == frozenset({"x-key"})
    assert profile.scope_headers == frozenset({"x-tenant"})


# -- item 2's marker: an intent says which of a call's own secrets it needs ----------------


def test_an_intent_records_the_names_of_the_call_secrets_it_needs(
    make_client: ClientFactory, outbox: OutboxUnderTest
) -> None:
    """Names only (headers folded, query parameters as ?name); the client's own are not needs."""
    api = Api()
    client = make_client(
        "https://api.test",
        headers={"Authorization": "Bearer CLIENTKEY"},
        provider=postonce.get_provider("ietf_draft").model_copy(update={"credentials": "api_key"}),
        transport=httpx.MockTransport(api),
    )
    client.post_once(
        "/v1/charges",
        json={"amount": 1},
        params={"api_key": "CALLPARAMSECRET", "visible": "1"},
        headers={"X-API-Key": "CALLHEADERSECRET", "Authorization": "Bearer CLIENTKEY"},
        intent="needs/own",
    )
    client.post_once("/v1/charges", json={"amount": 2}, intent="needs/none")
    own, none = client.lookup("needs/own"), client.lookup("needs/none")
    assert own is not None
    assert none is not None
    assert own.needs == ("?api_key", "x-api-key")  # Authorization is the client's own
    assert none.needs == ()
    exported = {row["reference"]: row["needs"] for row in client.outbox.export_rows()}
    assert exported == {"needs/own": ["?api_key", "x-api-key"], "needs/none": []}
    client.close()
    blob = outbox_bytes(outbox)
    assert b"CALLPARAMSECRET" not in blob
    assert b"CALLHEADERSECRET" not in blob
