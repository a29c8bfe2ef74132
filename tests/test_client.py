"""Decision-level tests of Client.post_once: mock transports, a real outbox."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce import Outcome, State
from postonce._outbox.locate import open_store
from tests.conftest import FAST, AsyncDriven, ClientFactory, outbox_bytes
from tests.http_library import Response

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A mock transport that answers from a script and keeps every request."""

    def __init__(self, *answers: httpx.Response | Exception | Handler) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return answer(request)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def keys(self, header: str = "Idempotency-Key") -> list[str | None]:
        return [r.headers.get(header) for r in self.requests]


def ok(status: int = 201, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"id": "ch_1"}, headers=headers)


def read_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def connect_error(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def dead_url() -> str:
    """A loopback URL nobody listens on: a real refused connection, provably not sent."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def only_record(client: postonce.Client) -> postonce.IntentRecord:
    (record,) = client.outbox.list_intents()
    return record


# -- one key per intent ------------------------------------------------------------


def test_every_attempt_carries_the_same_key(make_client: ClientFactory) -> None:
    """Retries after 503, 409 and a timeout all carry the key of the first attempt."""
    rec = Recorder(
        httpx.Response(503),
        httpx.Response(409),
        httpx.ReadTimeout("slow"),
        httpx.Response(201, json={"id": "ch_1"}),
    )
    client = make_client(transport=rec.transport)
    response = client.post_once("/charge", json={"amount": 1}, intent="o-1")
    assert response.status_code == 201
    assert len(rec.requests) == 4
    assert len(set(rec.keys())) == 1
    assert [response.extensions["postonce"].key] == list(set(rec.keys()))
    assert response.extensions["postonce"].attempts == 4


def test_same_intent_again_returns_stored_answer_without_sending(
    make_client: ClientFactory,
) -> None:
    """A terminal intent answers from the outbox: nothing is sent, the key is not re-minted."""
    rec = Recorder(ok(201))
    client = make_client(transport=rec.transport)
    first = client.post_once("/charge", json={"amount": 1}, intent="o-2")
    second = client.post_once("/charge", json={"amount": 1}, intent="o-2")
    assert len(rec.requests) == 1
    assert second.status_code == 201
    assert second.json() == first.json()
    info = second.extensions["postonce"]
    assert info.from_outbox is True
    assert info.key == first.extensions["postonce"].key


def test_a_new_client_on_the_same_outbox_resumes_with_the_stored_key(
    make_client: ClientFactory,
) -> None:
    """A pending intent resumed by another client (as after a restart) keeps its key."""
    failing = Recorder(httpx.Response(503))
    with pytest.raises(postonce.IntentPending) as pending:
        make_client(transport=failing.transport).post_once(
            "/charge", json={"amount": 1}, intent="o-3"
        )
    rec = Recorder(ok(201))
    response = make_client(transport=rec.transport).post_once(
        "/charge", json={"amount": 1}, intent="o-3"
    )
    assert response.status_code == 201
    assert rec.keys() == [pending.value.key]
    assert set(failing.keys()) == {pending.value.key}


def test_without_intent_each_call_is_its_own_intent(make_client: ClientFactory) -> None:
    """Two calls without intent= mint two keys and store two intents."""
    rec = Recorder(ok(201))
    client = make_client(transport=rec.transport)
    client.post_once("/charge", json={"amount": 1}, intent=postonce.ONE_OFF)
    client.post_once("/charge", json={"amount": 1}, intent=postonce.ONE_OFF)
    keys = rec.keys()
    assert len(set(keys)) == 2
    for key in keys:
        assert key is not None
        record = client.lookup(key)
        assert record is not None
        assert record.state is State.SUCCEEDED


def test_caller_key_is_used_raw(make_client: ClientFactory) -> None:
    """key= goes on the wire as the raw header value, never in Structured-Fields quotes."""
    rec = Recorder(ok(201))
    make_client(transport=rec.transport).post_once(
        "/charge", json={"a": 1}, intent="o-4", key="order-1234-charge"
    )
    raw = dict(rec.requests[0].headers.raw)
    assert raw[b"Idempotency-Key"] == b"order-1234-charge"


def test_minted_key_is_unquoted_uuid4(make_client: ClientFactory) -> None:
    """The minted key is a bare canonical UUIDv4 on the wire."""
    rec = Recorder(ok(201))
    make_client(transport=rec.transport).post_once(
        "/charge", json={"a": 1}, intent=postonce.ONE_OFF
    )
    value = rec.requests[0].headers["Idempotency-Key"]
    assert '"' not in value
    assert len(value) == 36
    assert value[14] == "4"


def test_key_already_used_by_another_intent_is_a_conflict(make_client: ClientFactory) -> None:
    """One key never serves two intents."""
    rec = Recorder(ok(201))
    client = make_client(transport=rec.transport)
    client.post_once("/charge", json={"a": 1}, intent="o-5", key="k-shared-0001")
    with pytest.raises(postonce.IntentConflict) as exc:
        client.post_once("/charge", json={"a": 1}, intent="o-6", key="k-shared-0001")
    assert exc.value.intent == "o-6"
    assert len(rec.requests) == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("o-10", None, id="named-then-unnamed"),
        pytest.param(None, "o-11", id="unnamed-then-named"),
    ],
)
def test_a_key_belongs_to_one_intent_across_named_and_unnamed_calls(
    make_client: ClientFactory, first: str | None, second: str | None
) -> None:
    """A call without intent= (its key is its reference) and a named intent never share a key.

    On SQLite the key index holds named intents only (schema v4): this clash is
    the one it cannot see, so it is looked up before the write-ahead.
    """
    rec = Recorder(ok(201))
    client = make_client(transport=rec.transport)
    client.post_once("/charge", json={"a": 1}, key="k-across-0001", intent=first)
    with pytest.raises(postonce.IntentConflict, match="another intent"):
        client.post_once("/charge", json={"a": 1}, key="k-across-0001", intent=second)
    assert len(rec.requests) == 1
    # The same call again is the same intent: answered from the outbox, not refused.
    again = client.post_once("/charge", json={"a": 1}, key="k-across-0001", intent=first)
    assert again.extensions["postonce"].from_outbox is True
    assert len(rec.requests) == 1


# -- conflicts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("second_path", "second_body"),
    [
        pytest.param("/charge", {"amount": 2}, id="body"),
        pytest.param("/refund", {"amount": 1}, id="path"),
        pytest.param("/charge?capture=false", {"amount": 1}, id="query"),
    ],
)
def test_same_reference_different_request_is_refused_before_sending(
    make_client: ClientFactory, second_path: str, second_body: dict[str, int]
) -> None:
    """IntentConflict names the intent, and the second request is never sent."""
    rec = Recorder(ok(201))
    client = make_client(transport=rec.transport)
    client.post_once("/charge", json={"amount": 1}, intent="o-7")
    with pytest.raises(postonce.IntentConflict) as exc:
        client.post_once(second_path, json=second_body, intent="o-7")
    assert exc.value.intent == "o-7"
    assert "o-7" in str(exc.value)
    assert len(rec.requests) == 1


def test_key_order_and_whitespace_do_not_make_a_conflict(make_client: ClientFactory) -> None:
    """The fingerprint is canonical JSON: reordered keys are the same request."""
    rec = Recorder(ok(201))
    client = make_client(transport=rec.transport)
    client.post_once("/charge", json={"a": 1, "b": 2}, intent="o-8")
    again = client.post_once("/charge", json={"b": 2, "a": 1}, intent="o-8")
    assert again.extensions["postonce"].from_outbox is True


def test_fingerprint_fields_ignore_other_fields(make_client: ClientFactory) -> None:
    """With fingerprint_fields, only the named fields decide whether it is the same request."""
    rec = Recorder(ok(201))
    client = make_client(transport=rec.transport)
    client.post_once(
        "/charge", json={"amount": 1, "meta": "x"}, intent="o-9", fingerprint_fields=["amount"]
    )
    again = client.post_once(
        "/charge", json={"amount": 1, "meta": "y"}, intent="o-9", fingerprint_fields=["amount"]
    )
    assert again.extensions["postonce"].from_outbox is True
    with pytest.raises(postonce.IntentConflict):
        client.post_once(
            "/charge", json={"amount": 2, "meta": "x"}, intent="o-9", fingerprint_fields=["amount"]
        )


# -- classification and retries ------------------------------------------------------


def test_in_flight_409_waits_and_is_never_a_failure(make_client: ClientFactory) -> None:
    """409 means "still processing": the same key is retried until the answer comes."""
    rec = Recorder(httpx.Response(409), httpx.Response(409), ok(201))
    response = make_client(transport=rec.transport).post_once("/c", json={}, intent="o-10")
    assert response.status_code == 201
    assert len(set(rec.keys())) == 1


def test_in_flight_answers_do_not_use_up_attempts(make_client: ClientFactory) -> None:
    """Ten 409s then a 201 succeed under attempts=2: waiting on in-flight is not retrying."""
    rec = Recorder(*[httpx.Response(409)] * 10, ok(201))
    two = FAST.model_copy(update={"attempts": 2, "in_flight_initial": 0.0, "in_flight_max": 0.0})
    response = make_client(transport=rec.transport).post_once(
        "/c", json={}, intent="o-10b", retry=two
    )
    assert response.status_code == 201
    assert len(rec.requests) == 11


def test_409_until_budget_spent_leaves_the_intent_pending(make_client: ClientFactory) -> None:
    """A 409 that outlasts the budget raises IntentPending, never a failure."""
    rec = Recorder(httpx.Response(409))
    short = FAST.model_copy(update={"timeout": 0.5})
    client = make_client(transport=rec.transport, retry=short)
    with pytest.raises(postonce.IntentPending) as exc:
        client.post_once("/c", json={}, intent="o-11")
    assert exc.value.due_at is not None
    row = only_record(client)
    assert row.state is State.PENDING
    assert row.due_at == exc.value.due_at
    assert row.lease_owner is None


def test_final_4xx_is_returned_and_stored(make_client: ClientFactory) -> None:
    """A 402 is the intent's answer: returned, stored as failed, never retried."""
    rec = Recorder(httpx.Response(402, json={"error": "card_declined"}))
    client = make_client(transport=rec.transport)
    response = client.post_once("/c", json={}, intent="o-12")
    assert response.status_code == 402
    assert len(rec.requests) == 1
    record = client.lookup("o-12")
    assert record is not None
    assert record.state is State.FAILED
    again = client.post_once("/c", json={}, intent="o-12")
    assert again.status_code == 402
    assert again.json() == {"error": "card_declined"}
    assert len(rec.requests) == 1


def test_mismatch_raises_and_is_never_retried(make_client: ClientFactory) -> None:
    """The profile's key-reuse answer to a seen key raises IdempotencyKeyMismatch, also later."""
    problem = {"Content-Type": "application/problem+json"}
    rec = Recorder(httpx.Response(503), httpx.Response(422, json={}, headers=problem))
    client = make_client(transport=rec.transport)
    with pytest.raises(postonce.IdempotencyKeyMismatch) as exc:
        client.post_once("/c", json={}, intent="o-13")
    assert len(rec.requests) == 2
    assert isinstance(exc.value.response, Response)
    assert exc.value.response.status_code == 422
    with pytest.raises(postonce.IdempotencyKeyMismatch):
        client.post_once("/c", json={}, intent="o-13")
    assert len(rec.requests) == 2


@pytest.mark.parametrize(
    "content_type", ["application/problem+json", "application/json"], ids=["problem", "plain"]
)
def test_first_send_422_is_an_answer(make_client: ClientFactory, content_type: str) -> None:
    """A 422 to the first send of a fresh key is the caller's final answer, not a mismatch."""
    rec = Recorder(httpx.Response(422, json={}, headers={"Content-Type": content_type}))
    client = make_client(transport=rec.transport)
    response = client.post_once("/c", json={}, intent="o-13b")
    assert response.status_code == 422
    assert client.outbox.attempts("o-13b")[0].outcome is Outcome.FINAL
    assert only_record(client).state is State.FAILED


def test_stripe_mismatch_is_400_idempotency_error(make_client: ClientFactory) -> None:
    """Under the stripe profile, 400 idempotency_error is a mismatch, other 400s are answers."""
    mismatch = httpx.Response(400, json={"error": {"type": "idempotency_error"}})
    invalid = httpx.Response(400, json={"error": {"type": "invalid_request_error"}})
    lost = httpx.Response(503)  # the first attempt reached the server: its key is known there
    client = make_client(provider="stripe", transport=Recorder(lost, mismatch, invalid).transport)
    with pytest.raises(postonce.IdempotencyKeyMismatch):
        client.post_once("/c", json={}, intent="o-14")
    assert client.post_once("/c", json={}, intent="o-15").status_code == 400


def test_retry_after_is_honoured(make_client: ClientFactory) -> None:
    """A 503 with Retry-After: 1 delays the next attempt by at least one second."""
    rec = Recorder(httpx.Response(503, headers={"Retry-After": "1"}), ok(201))
    client = make_client(transport=rec.transport)
    client.post_once("/c", json={}, intent="o-16")
    attempts = client.outbox.attempts("o-16")
    assert [a.outcome for a in attempts] == [Outcome.RETRYABLE, Outcome.FINAL]
    assert attempts[1].started_at - attempts[0].started_at >= 1.0


def test_hostile_retry_after_is_capped(make_client: ClientFactory) -> None:
    """Retry-After: 999999 is capped at retry_after_max; past the budget it defers."""
    rec = Recorder(httpx.Response(503, headers={"Retry-After": "999999"}))
    client = make_client(transport=rec.transport)
    with pytest.raises(postonce.IntentPending) as exc:
        client.post_once("/c", json={}, intent="o-17")
    assert exc.value.due_at is not None
    record = client.lookup("o-17")
    assert record is not None
    assert record.due_at is not None
    assert record.due_at - record.created_at <= FAST.retry_after_max + 5
    assert len(rec.requests) == 1


def test_stripe_should_retry_false_makes_a_503_indeterminate(make_client: ClientFactory) -> None:
    """Stripe-Should-Retry: false on a 503 is not retried, and leaves the effect unknown."""
    rec = Recorder(httpx.Response(503, headers={"Stripe-Should-Retry": "false"}))
    client = make_client(provider="stripe", transport=rec.transport)
    with pytest.raises(postonce.IntentIndeterminate):
        client.post_once("/c", json={}, intent="o-18")
    assert len(rec.requests) == 1


def test_replay_marker_is_reported(make_client: ClientFactory) -> None:
    """An Idempotent-Replayed: true answer is marked replayed in the extension and attempt."""
    rec = Recorder(ok(201, **{"Idempotent-Replayed": "true"}))
    client = make_client(transport=rec.transport)
    response = client.post_once("/c", json={}, intent="o-19")
    assert response.extensions["postonce"].replayed is True
    assert client.outbox.attempts("o-19")[0].replayed is True


def test_budget_attempts_per_call_override(make_client: ClientFactory) -> None:
    """retry= per call overrides the client's policy."""
    rec = Recorder(httpx.Response(503))
    client = make_client(transport=rec.transport)
    with pytest.raises(postonce.IntentPending):
        client.post_once(
            "/c", json={}, intent="o-20", retry=FAST.model_copy(update={"attempts": 2})
        )
    assert len(rec.requests) == 2


def test_a_setting_changed_between_calls_applies_to_the_next_call(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls with no options of their own share how the client sends, until a setting changes.

    Each public setting is changed after a call and must rule the next one:
    the retry policy, the retry budget, the hooks, the lease, the settlement
    handler, the provider, the httpx client's own query parameters, and the
    lease owner (renewed in a forked child).
    """
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if "/fail" in request.url.path:
            return httpx.Response(503)
        seen.append(str(request.url))
        return ok(201)

    rec = Recorder(answer)
    client = make_client(transport=rec.transport)
    real: Any = getattr(client, "client", client)  # the AsyncClient behind AsyncDriven
    with pytest.raises(postonce.IntentPending):
        client.post_once("/fail", json={}, intent="s-1")
    assert len(rec.requests) == FAST.attempts

    real.retry = FAST.model_copy(update={"attempts": 2})
    with pytest.raises(postonce.IntentPending):
        client.post_once("/fail", json={}, intent="s-2")
    assert len(rec.requests) == FAST.attempts + 2

    real.retry_budget = postonce.RetryBudget(capacity=0)  # no retry affordable
    with pytest.raises(postonce.IntentPending):
        client.post_once("/fail", json={}, intent="s-3")
    assert len(rec.requests) == FAST.attempts + 3

    attempts: list[postonce.AttemptDetail] = []
    real.hooks = (postonce.Hooks(on_attempt=attempts.append),)
    client.post_once("/ok", json={}, intent="s-4")
    assert [a.intent for a in attempts] == ["s-4"]

    real.lease_seconds = 300.0
    leases: list[float | None] = []

    def lease_then_ok(request: httpx.Request) -> httpx.Response:
        leases.append(_lease_now(real, "s-5"))  # read while the send is under way
        return ok(201)

    rec.answers = [lease_then_ok]
    client.post_once("/ok", json={}, intent="s-5")
    (expires_at,) = leases
    assert expires_at is not None
    assert expires_at > only_created(real, "s-5") + 200

    settled: list[postonce.Settlement] = []
    real.on_settled = settled.append
    rec.answers = [answer]
    client.post_once("/ok", json={}, intent="s-6")
    assert [s.intent for s in settled] == ["s-6"]

    real.provider = postonce.Provider(name="other", key_field="X-Other-Key", retention=86400)
    client.post_once("/ok", json={}, intent="s-7")
    assert rec.requests[-1].headers.get("X-Other-Key") is not None
    assert rec.requests[-1].headers.get("Idempotency-Key") is None

    # The caller's own httpx client, changed between calls: its params join the
    # stored query (httpx alone would replace that query with them).
    client.post_once("/ok?a=1", json={}, intent="s-8")
    real._http.params = {"v": "2"}
    client.post_once("/ok?a=1", json={}, intent="s-9")
    assert [sorted(httpx.URL(url).params.multi_items()) for url in seen[-2:]] == [
        [("a", "1")],
        [("a", "1"), ("v", "2")],
    ]

    # A fork: the child's calls must lease as the child, or another process seeing
    # the parent gone could take over the child's live sends.
    monkeypatch.setattr(postonce._base, "new_owner", lambda: "owner-of-the-child")
    real._owner_pid = -1  # as os.getpid() differs after a fork
    owners: list[str | None] = []

    def owner_then_ok(request: httpx.Request) -> httpx.Response:
        record = real.outbox.get("s-10")
        owners.append(record.lease_owner)  # read while the send is under way
        return ok(201)

    rec.answers = [owner_then_ok]
    client.post_once("/ok", json={}, intent="s-10")
    assert owners == ["owner-of-the-child"]


def _lease_now(client: Any, intent: str) -> float | None:
    record = client.outbox.get(intent)
    assert record is not None
    return record.lease_expires_at  # type: ignore[no-any-return]


def only_created(client: Any, intent: str) -> float:
    record = client.outbox.get(intent)
    assert record is not None
    return record.created_at  # type: ignore[no-any-return]


def test_resume_continues_attempt_numbers(make_client: ClientFactory) -> None:
    """Attempts across calls are numbered on, and all recorded in the attempts table."""
    client = make_client(transport=Recorder(httpx.Response(503)).transport)
    one = FAST.model_copy(update={"attempts": 1, "wait_initial": 0.0, "wait_max": 0.0})
    with pytest.raises(postonce.IntentPending):
        client.post_once("/c", json={}, intent="o-21", retry=one)
    client2 = make_client(transport=Recorder(ok(201)).transport)
    response = client2.post_once("/c", json={}, intent="o-21")
    assert response.extensions["postonce"].attempts == 2
    assert [a.status for a in client2.outbox.attempts("o-21")] == [503, 201]


# -- the horizon and deadlines -------------------------------------------------------


def short_memory(seconds: float) -> postonce.Provider:
    return postonce.Provider(name="short", retention=timedelta(seconds=seconds))


def test_ambiguous_until_the_horizon_expires_and_never_resends(
    make_client: ClientFactory,
) -> None:
    """Timeouts until the provider may forget the key: expired, and later calls send nothing."""
    rec = Recorder(read_timeout)
    patient = FAST.model_copy(update={"attempts": 1000})
    client = make_client(provider=short_memory(0.5), transport=rec.transport, retry=patient)
    with pytest.raises(postonce.IntentExpired) as exc:
        client.post_once("/c", json={}, intent="o-22")
    assert exc.value.intent == "o-22"
    sent = len(rec.requests)
    assert sent >= 1
    record = client.lookup("o-22")
    assert record is not None
    assert record.state is State.EXPIRED
    with pytest.raises(postonce.IntentExpired):
        client.post_once("/c", json={}, intent="o-22")
    assert len(rec.requests) == sent


def test_expired_horizon_is_checked_before_a_resumed_send(make_client: ClientFactory) -> None:
    """A pending intent whose horizon passed while it waited is expired, not sent."""
    import time

    one = FAST.model_copy(update={"attempts": 1})
    first = Recorder(read_timeout)
    with pytest.raises(postonce.IntentPending):
        make_client(provider=short_memory(0.3), transport=first.transport).post_once(
            "/c", json={}, intent="o-23", retry=one
        )
    time.sleep(0.35)
    later = Recorder(ok(201))
    with pytest.raises(postonce.IntentExpired):
        make_client(provider=short_memory(0.3), transport=later.transport).post_once(
            "/c", json={}, intent="o-23"
        )
    assert later.requests == []


def test_never_sent_intents_do_not_start_the_horizon(make_client: ClientFactory) -> None:
    """Refused connections only: the horizon has not started, the intent stays pending."""
    client = make_client(dead_url(), provider=short_memory(0.2))
    with pytest.raises(postonce.IntentPending):
        client.post_once("/c", json={}, intent="o-24")
    row = only_record(client)
    assert row.state is State.PENDING
    assert row.first_delivery_at is None
    assert {a.outcome for a in client.outbox.attempts("o-24")} == {Outcome.NOT_SENT}


def test_deadline_stops_a_never_sent_intent(make_client: ClientFactory) -> None:
    """deadline= cancels an intent that was never delivered once it passes."""
    client = make_client(dead_url(), retry=FAST.model_copy(update={"attempts": 1000}))
    with pytest.raises(postonce.IntentCancelled):
        client.post_once("/c", json={}, intent="o-25", deadline=timedelta(seconds=0.1))
    record = client.lookup("o-25")
    assert record is not None
    assert record.state is State.CANCELLED


def test_deadline_with_ambiguous_delivery_expires(make_client: ClientFactory) -> None:
    """Past the deadline with delivery ambiguous, the intent expires for reconciliation.

    The client's clock moves a second with each send and not otherwise, so the
    first send is always before the 0.1 s deadline and the next check after it.
    On the wall clock, a loaded CI once took longer than 0.1 s to reach the first
    send, and the intent was cancelled as never sent instead.
    """
    now = [time.time()]

    def a_second_then_no_answer(request: httpx.Request) -> httpx.Response:
        now[0] += 1.0
        return read_timeout(request)

    rec = Recorder(a_second_then_no_answer)
    client = make_client(
        transport=rec.transport,
        retry=FAST.model_copy(update={"attempts": 1000}),
        clock=lambda: now[0],
    )
    with pytest.raises(postonce.IntentExpired):
        client.post_once("/c", json={}, intent="o-26", deadline=timedelta(seconds=0.1))
    assert len(rec.requests) == 1


# -- keys in the body ------------------------------------------------------------------


def test_square_key_travels_in_the_body(make_client: ClientFactory) -> None:
    """Body-field profiles get the key injected into the JSON body, not a header."""
    rec = Recorder(ok(200))
    client = make_client(provider="square", transport=rec.transport)
    response = client.post_once("/v2/payments", json={"amount_money": {"amount": 1}}, intent="sq")
    sent = json.loads(rec.requests[0].content)
    assert sent["idempotency_key"] == response.extensions["postonce"].key
    assert "Idempotency-Key" not in rec.requests[0].headers


def test_body_field_key_given_by_the_caller_is_adopted(make_client: ClientFactory) -> None:
    """A key the caller already put in the body field is the intent's key."""
    rec = Recorder(ok(200))
    client = make_client(provider="square", transport=rec.transport)
    response = client.post_once("/p", json={"idempotency_key": "my-key-1", "x": 1}, intent="sq2")
    assert response.extensions["postonce"].key == "my-key-1"
    assert json.loads(rec.requests[0].content)["idempotency_key"] == "my-key-1"


def test_body_field_profile_needs_a_json_object(make_client: ClientFactory) -> None:
    """A body-field profile refuses a non-object body before storing anything."""
    rec = Recorder(ok(200))
    client = make_client(provider="aws_client_token", transport=rec.transport)
    with pytest.raises(postonce.InvalidRequest):
        client.post_once("/p", content=b"raw", intent="aws")
    assert rec.requests == []


# -- methods and bodies ----------------------------------------------------------------


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_other_methods_carry_keys(make_client: ClientFactory, method: str) -> None:
    """request_once and its shortcuts send PUT/PATCH/DELETE with a key too."""
    rec = Recorder(ok(200))
    client = make_client(transport=rec.transport)
    shortcut = {"PUT": client.put_once, "PATCH": client.patch_once, "DELETE": client.delete_once}
    shortcut[method]("/thing/1", intent=f"m-{method}")
    assert rec.requests[0].method == method
    assert rec.requests[0].headers.get("Idempotency-Key")


def test_form_and_raw_bodies_are_stored_and_sent_unchanged(make_client: ClientFactory) -> None:
    """data= and content= bodies are sent as given and resent byte for byte."""
    rec = Recorder(httpx.Response(503), ok(201))
    client = make_client(transport=rec.transport)
    client.post_once("/f", data={"amount": "1"}, intent="form")
    assert rec.requests[0].content == rec.requests[1].content == b"amount=1"
    assert rec.requests[1].headers["content-type"] == "application/x-www-form-urlencoded"
    client.post_once("/r", content=b"\x00\x01raw", intent="raw")
    assert rec.requests[-1].content == b"\x00\x01raw"


# -- write-ahead and secrets -----------------------------------------------------------


def test_intent_row_is_committed_before_the_first_byte(
    make_client: ClientFactory, outbox: str
) -> None:
    """A transport that reads the outbox from another connection at send time finds the row."""
    seen: list[postonce.IntentRecord] = []
    checker = open_store(outbox)

    def look(request: httpx.Request) -> httpx.Response:
        seen.extend(checker.list_intents())
        return ok(201)

    try:
        make_client(transport=httpx.MockTransport(look)).post_once(
            "/charge", json={"amount": 7}, intent="wa-1"
        )
    finally:
        checker.close()
    (row,) = seen
    assert row.reference == "wa-1"
    assert row.state is State.SENDING
    assert json.loads(row.body) == {"amount": 7}
    assert row.key
    assert row.fingerprint
    assert row.created_at > 0
    assert row.url == "http://api.test/charge"
    assert row.method == "POST"


def test_no_secret_reaches_the_outbox(make_client: ClientFactory, outbox: str) -> None:
    """Authorization, Cookie and caller-marked secret headers never touch the disk."""
    rec = Recorder(httpx.Response(503), ok(201))
    client = make_client(
        transport=rec.transport,
        headers={"Authorization": "Bearer sk_test_CLIENTSECRET"},
        secret_headers=["X-Api-Signature"],
        name="secrets",  # ietf_draft cannot tell a Bearer key from a refreshed token
    )
    client.post_once(
        "/c",
        json={"amount": 1},
        intent="sec",
        headers={
            "Cookie": "session=COOKIESECRET",
            "Proxy-Authorization": "Basic PROXYSECRET",
            "X-Api-Signature": "SIGSECRET",
            "X-Trace": "visible-trace",
        },
    )
    # Every attempt carried the secrets...
    for request in rec.requests:
        assert request.headers["Authorization"] == "Bearer sk_test_CLIENTSECRET"
        assert request.headers["X-Api-Signature"] == "SIGSECRET"
    client.close()
    # ...and no byte of the outbox (database, WAL, shared memory; or every row) holds one.
    blob = outbox_bytes(outbox)
    for secret in (b"CLIENTSECRET", b"COOKIESECRET", b"PROXYSECRET", b"SIGSECRET"):
        assert secret not in blob
    assert b"visible-trace" in blob


def test_event_hook_error_keeps_the_intent_for_the_drain(make_client: ClientFactory) -> None:
    """An exception after the request may have been written, with no answer, leaves it pending."""
    # A transport that took the body and broke (no answer arrived); a response
    # hook raising on an answer is tests/test_response_hooks.py's.
    client = make_client(transport=Recorder(RuntimeError("transport failed")).transport)
    with pytest.raises(RuntimeError, match="transport failed"):
        client.post_once("/c", json={}, intent="hook")
    row = only_record(client)
    assert row.state is State.PENDING
    assert row.first_delivery_at is not None
    assert client.outbox.attempts("hook")[0].outcome is Outcome.AMBIGUOUS


# -- httpx options -----------------------------------------------------------------------


def test_a_ready_httpx_client_is_used_and_left_open(outbox_path: Path) -> None:
    """http= takes a configured httpx.Client; closing postonce's client leaves it open."""
    rec = Recorder(ok(201))
    http = httpx.Client(base_url="http://api.test", transport=rec.transport)
    client = postonce.Client(http=http, outbox=outbox_path, retry=FAST)
    assert client.post_once("/c", json={}, intent="own").status_code == 201
    client.close()
    assert not http.is_closed
    assert str(rec.requests[0].url) == "http://api.test/c"
    http.close()


def test_http_and_httpx_options_together_are_refused(outbox_path: Path) -> None:
    """Options for httpx belong on the httpx.Client when one is passed."""
    with pytest.raises(postonce.ConfigurationError):
        postonce.Client(http=httpx.Client(), outbox=outbox_path, timeout=3.0)


def test_httpx_auth_is_applied_and_never_stored(make_client: ClientFactory, outbox: str) -> None:
    """auth= works as in httpx: every send is authenticated, the outbox holds no credential."""
    rec = Recorder(httpx.Response(503), ok(201))
    client = make_client(transport=rec.transport, auth=("acct", "AUTHSECRET"))
    client.post_once("/c", json={"a": 1}, intent="auth")
    assert all(r.headers["Authorization"].startswith("Basic ") for r in rec.requests)
    client.close()
    blob = outbox_bytes(outbox)
    basic = rec.requests[0].headers["Authorization"].split()[1].encode()
    assert basic not in blob
    assert b"AUTHSECRET" not in blob


def test_form_field_order_is_the_same_intent(make_client: ClientFactory) -> None:
    """data= with the same fields in another order is the same request, not IntentConflict."""
    rec = Recorder(ok(200))
    client = make_client(provider="stripe", transport=rec.transport)
    first = client.post_once(
        "/v1/charges", data={"amount": "100", "currency": "eur"}, intent="form-1"
    )
    again = client.post_once(
        "/v1/charges", data={"currency": "eur", "amount": "100"}, intent="form-1"
    )
    assert again.extensions["postonce"].from_outbox
    assert again.extensions["postonce"].key == first.extensions["postonce"].key
    assert len(rec.requests) == 1
    with pytest.raises(postonce.IntentConflict):
        client.post_once("/v1/charges", data={"amount": "101", "currency": "eur"}, intent="form-1")


# -- a closed client ----------------------------------------------------------------


def test_a_closed_client_refuses_a_call_before_storing_or_sending(
    make_client: ClientFactory, outbox: str
) -> None:
    """After close() (aclose()), a call raises ConfigurationError naming its intent.

    It used to open the outbox again, commit the intent, fail on the closed
    httpx client, and record the intent as maybe delivered: stored, never
    sent, and left for a drain to send.
    """
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return ok(201)

    client: Any = make_client(transport=httpx.MockTransport(answer))
    client.post_once("/before", json={"amount": 1}, intent="before-close")
    if isinstance(client, AsyncDriven):
        client._run(client.client.aclose())  # closed, its event loop kept for the call below
    else:
        client.close()
    with pytest.raises(postonce.ConfigurationError, match="closed") as caught:
        client.post_once("/after", json={"amount": 2}, intent="after-close")
    assert caught.value.intent == "after-close"
    with pytest.raises(postonce.ConfigurationError, match="closed"):
        client.lookup("before-close")
    assert sent == ["/before"]
    checker = open_store(outbox)
    try:
        assert checker.get("after-close") is None
        assert checker.get("before-close") is not None
    finally:
        checker.close()
