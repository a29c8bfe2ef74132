"""The outbox's decisions, as tables: what each store move writes and hands back.

Pure functions of a record, a request and ``now``: the SQLite, PostgreSQL and
memory stores all apply these, so a rule tested here holds on every backend.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from postonce import State
from postonce._intent import IntentRecord, Outcome, StoredResponse
from postonce._outbox import decide
from postonce._outbox.base import AttemptRecord, Lease, NewIntent
from postonce._outbox.rows import COLUMN_NAMES, decode_row

NOW = 1000.0
NEW = NewIntent(
    reference="o-1",
    key="k-1",
    key_given=False,
    provider="stripe",
    method="POST",
    url="https://api.test/c",
    headers=(),
    body=b"{}",
    fingerprint="f",
    deadline_at=None,
    sender="svc",
    origin="https://api.test:443",
)
STORED = IntentRecord(
    id=7, reference="o-1", key="k-1", provider="stripe", method="POST",
    url="https://api.test/c", headers=(), body=b"{}", fingerprint="f",
    state=State.PENDING, created_at=NOW - 10, first_delivery_at=NOW - 10, due_at=NOW,
    deadline_at=None, attempts=1, last_outcome=None, lease_owner=None,
    lease_expires_at=None, response=None, note=None, sender="svc",
    origin="https://api.test:443",
)  # fmt: skip
LEASE = Lease(0, "token", "me", NOW + 60)


@pytest.mark.parametrize(
    ("stored", "new", "conflict"),
    [
        pytest.param(STORED, NEW, None, id="same"),
        pytest.param(STORED, NEW._replace(sender="other"), "belongs to sender 'svc'", id="sender"),
        pytest.param(replace(STORED, sender=None), NEW, None, id="unowned-row"),
        pytest.param(
            STORED, NEW._replace(origin="https://b.test:443"), "addressed to", id="origin"
        ),
        pytest.param(
            STORED, NEW._replace(provider="paypal_orders"), "provider 'stripe'", id="prov"
        ),
        pytest.param(
            STORED, NEW._replace(provider="stripe#0123456789ab"), "provider", id="facts-changed"
        ),
        pytest.param(
            replace(STORED, provider="ledger"),
            NEW._replace(provider="ledger#0123456789ab"),
            None,
            id="bare-custom-name-from-an-older-outbox",
        ),
        pytest.param(STORED, NEW._replace(fingerprint="g"), "different request", id="body"),
        pytest.param(STORED, NEW._replace(key="k-2", key_given=True), "different key", id="key"),
        pytest.param(STORED, NEW._replace(key="k-2"), None, id="minted-key-is-not-compared"),
    ],
)
def test_conflict_with(stored: IntentRecord, new: NewIntent, conflict: str | None) -> None:
    """Why a stored intent is not the request a caller resumes it with."""
    found = decide.conflict_with(stored, new)
    if conflict is None:
        assert found is None
    else:
        assert found is not None
        assert conflict in found


@pytest.mark.parametrize(
    ("stored", "alive", "taken"),
    [
        pytest.param(STORED, True, True, id="pending"),
        pytest.param(replace(STORED, state=State.SUCCEEDED), True, False, id="finished"),
        pytest.param(
            replace(STORED, state=State.SENDING, lease_owner="x", lease_expires_at=NOW + 5),
            True,
            False,
            id="live-lease",
        ),
        pytest.param(
            replace(STORED, state=State.SENDING, lease_owner="x", lease_expires_at=NOW + 5),
            False,
            True,
            id="owner-gone",
        ),
        pytest.param(
            replace(STORED, state=State.SENDING, lease_owner="x", lease_expires_at=NOW),
            True,
            True,
            id="lease-ran-out",
        ),
    ],
)
def test_reopened_takes_only_a_free_unfinished_intent(
    stored: IntentRecord, alive: bool, taken: bool
) -> None:
    """A lease is free when there is none, it ran out, or its owner is provably gone."""
    opened, changes = decide.reopened(stored, NEW, LEASE, NOW, lambda owner: alive)
    assert (changes is not None) == taken
    assert (opened.lease is not None) == taken
    if taken:
        assert changes is not None
        assert changes["claim_token"] == "token"
        assert opened.record.first_delivery_at == NOW - 10  # the horizon keeps its anchor
        assert opened.anchor_before == NOW - 10


def test_an_unowned_row_is_adopted_when_taken() -> None:
    """Reopening a row of no sender writes this caller's sender and origin on it."""
    opened, changes = decide.reopened(replace(STORED, sender=None, origin=None), NEW, LEASE, NOW)
    assert changes is not None
    assert (changes["sender"], changes["origin"]) == ("svc", "https://api.test:443")
    assert opened.record.sender == "svc"


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        pytest.param((1, "https://api.test/c", None), [(1, "svc", "https://api.test:443")], id="a"),
        pytest.param((2, "https://b.test/c", None), [(2, None, "https://b.test:443")], id="b"),
        pytest.param((3, "https://b.test/c", "https://b.test:443"), [], id="known-foreign"),
        pytest.param((4, "not a url", None), [], id="no-origin"),
    ],
)
def test_adoptions(
    row: tuple[int, str, str | None], expected: list[tuple[int, str | None, str]]
) -> None:
    """Rows of no sender go to the sender whose origins they address; others learn their origin."""
    found = decide.adoptions([row], "svc", frozenset({"https://api.test:443"}))
    assert [(i, c.get("sender"), c["origin"]) for i, c in found] == expected


@pytest.mark.parametrize(
    ("record", "anchor"),
    [
        pytest.param(replace(STORED, first_delivery_at=None), NOW, id="never-sent"),
        pytest.param(STORED, NOW - 10, id="maybe-delivered"),
    ],
)
def test_claim_anchor(record: IntentRecord, anchor: float) -> None:
    """A drain's claim starts the horizon now only for an intent never possibly delivered."""
    assert decide.claim_anchor(record, NOW) == anchor


ANSWERED = decide.recorded(
    LEASE,
    AttemptRecord(NOW, 0.25, Outcome.FINAL, 201, None, False),
    state=State.SUCCEEDED,
    anchor=NOW - 0.001,
    due_at=None,
    lease_until=None,
    response=StoredResponse(201, (), b"{}", False, "abc"),
    note=None,
)
_ANSWER = AttemptRecord(NOW, 0.25, Outcome.FINAL, 201, None, False)
#: The writer-ahead's lease (decide.created); a claim's or a taker's is not fresh:
#: its first send may come long after the write-ahead.
FRESH = LEASE._replace(fresh=True)


@pytest.mark.parametrize(
    ("lease", "number", "attempt", "changes", "carried"),
    [
        pytest.param(FRESH, 1, _ANSWER, ANSWERED, True, id="first-try-2xx"),
        pytest.param(
            FRESH,
            1,
            replace(_ANSWER, status=402),
            {**ANSWERED, "state": "failed", "response_status": 402},
            True,
            id="first-try-final-4xx",
        ),
        pytest.param(FRESH, 2, _ANSWER, ANSWERED, False, id="second-attempt"),
        pytest.param(LEASE, 1, _ANSWER, ANSWERED, False, id="not-the-writer-ahead"),
        pytest.param(FRESH, 1, replace(_ANSWER, replayed=True), ANSWERED, False, id="replayed"),
        pytest.param(
            FRESH,
            1,
            replace(_ANSWER, outcome=Outcome.AMBIGUOUS, status=None, error_type="ReadTimeout"),
            {**ANSWERED, "state": "pending", "response_status": None},
            False,
            id="ambiguous",
        ),
        pytest.param(
            FRESH,
            1,
            replace(_ANSWER, status=503, outcome=Outcome.RETRYABLE),
            {k: v for k, v in ANSWERED.items() if not k.startswith("response")}
            | {"state": "pending"},
            False,
            id="retry-keeps-no-answer",
        ),
        pytest.param(
            FRESH,
            1,
            replace(_ANSWER, status=500, outcome=Outcome.RETRYABLE),
            {**ANSWERED, "state": "expired", "response_status": None},
            False,
            id="expired-without-answer",
        ),
    ],
)
def test_which_attempt_the_intent_row_carries(
    lease: Lease,
    number: int,
    attempt: AttemptRecord,
    changes: decide.Changes,
    carried: bool,
) -> None:
    """Only the writer-ahead's own first attempt, ending the intent with its answer, is carried."""
    assert decide.carried(lease, number, attempt, changes) is carried
    row = decide.attempt_row(lease, number, attempt, changes)
    assert (row is None) is carried
    # A backend that keeps every attempt (PostgreSQL) always has its row.
    assert decide.attempt_row(lease, number, attempt, changes, carry=False) is not None


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        pytest.param(
            ("succeeded", 1, NOW, NOW + 0.25, "final", 201, None),
            [AttemptRecord(NOW, 0.25, Outcome.FINAL, 201, None, False)],
            id="carried",
        ),
        pytest.param(
            ("failed", 1, NOW, NOW + 1, "mismatch", 400, None),
            [AttemptRecord(NOW, 1.0, Outcome.MISMATCH, 400, None, False)],
            id="mismatch",
        ),
        pytest.param(("sending", 0, NOW, NOW, None, None, None), [], id="never-answered"),
        pytest.param(("succeeded", 2, NOW, NOW + 1, "final", 201, None), [], id="two-attempts"),
        pytest.param(("succeeded", 1, NOW, NOW + 1, "final", 201, NOW + 5), [], id="tombstone"),
        pytest.param(("expired", 1, NOW, NOW + 1, "ambiguous", None, None), [], id="no-answer"),
        pytest.param(("cancelled", 1, None, NOW, "final", 201, None), [], id="no-anchor"),
    ],
)
def test_carried_attempts(columns: tuple[Any, ...], expected: list[AttemptRecord]) -> None:
    assert decide.carried_attempts(*columns) == expected


ENDED = {"state": "succeeded", "lease_owner": None, "lease_expires_at": None, "claim_token": None}


@pytest.mark.parametrize(
    ("changes", "deferred"),
    [
        pytest.param(
            ENDED,
            {"state": "succeeded", "lease_owner": None, "claim_token": None},
            id="ends-hands-back",
        ),
        pytest.param(
            {**ENDED, "state": "failed", "response_status": 402},
            {"state": "failed", "lease_owner": None, "claim_token": None, "response_status": 402},
            id="final-4xx",
        ),
        pytest.param({**ENDED, "state": "pending"}, None, id="deferred-retry"),
        pytest.param({**ENDED, "state": "sending"}, None, id="keeps-sending"),
        pytest.param(
            {**ENDED, "lease_owner": "me", "lease_expires_at": NOW + 20}, None, id="ends-leased"
        ),
        pytest.param({"state": "succeeded"}, None, id="lease-untouched"),
        pytest.param({**ENDED, "lease_owner": "me"}, None, id="owner-kept"),
    ],
)
def test_lease_exit_deferred(changes: decide.Changes, deferred: decide.Changes | None) -> None:
    """Only an end that hands the lease back leaves its expiry for a later sweep."""
    assert decide.lease_exit_deferred(changes) == deferred


def _row(**columns: Any) -> tuple[Any, ...]:
    """An intents row in ``COLUMN_NAMES`` order: a pending intent, with ``columns`` set."""
    base: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
    base.update(
        id=7, reference="o-1", key="k-1", provider="stripe", method="POST",
        url="https://api.test/c", headers="[]", body=b"{}", fingerprint="f",
        state="pending", created_at=NOW, attempts=0, settle_attempts=0,
    )  # fmt: skip
    base.update(columns)
    return tuple(base[name] for name in COLUMN_NAMES)


@pytest.mark.parametrize(
    ("columns", "lease_expires_at"),
    [
        pytest.param({"state": "sending", "lease_owner": "me"}, NOW + 15, id="sending"),
        pytest.param({"state": "succeeded"}, None, id="ended-swept-later"),
        pytest.param({"state": "failed"}, None, id="ended-4xx"),
        pytest.param({"state": "succeeded", "lease_owner": "me"}, NOW + 15, id="ended-leased"),
        pytest.param({"state": "pending"}, NOW + 15, id="pending-as-stored"),
    ],
)
def test_a_stale_lease_reads_as_none(
    columns: dict[str, Any], lease_expires_at: float | None
) -> None:
    """decode_row: an ended intent with no lease owner has no lease, whatever the row still says."""
    record = decode_row(_row(lease_expires_at=NOW + 15, **columns))
    assert record.lease_expires_at == lease_expires_at


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
def test_stored_states_and_outcomes_are_plain_strings(state: State, outcome: Outcome) -> None:
    """What a store binds is the value as a plain ``str``, never the enum member.

    A ``str`` subclass takes sqlite3's adapter path on every bind, and the
    value is what the schema's CHECKs and every reader compare.
    """
    attempt = AttemptRecord(NOW, 0.25, outcome, 201, None, False)
    changes = decide.recorded(
        LEASE, attempt, state=state, anchor=None, due_at=None, lease_until=None,
        response=None, note=None,
    )  # fmt: skip
    row = decide.attempt_row(LEASE, 2, attempt, changes, carry=False)
    assert row is not None
    values = (changes["state"], changes["last_outcome"], row["outcome"])
    assert [type(v) for v in values] == [str, str, str]
    assert values == (state.value, outcome.value, outcome.value)
    for fixed in (decide.insert_row(NEW, LEASE, NOW), decide.released(NOW, None, None)):
        assert type(fixed["state"]) is str


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
@pytest.mark.parametrize("outcome", [None, *Outcome], ids=lambda o: o.value if o else "none")
def test_a_row_decodes_every_state_and_outcome_to_its_member(
    state: State, outcome: Outcome | None
) -> None:
    """decode_row: each stored value reads back as the member itself (not an equal string)."""
    record = decode_row(
        _row(state=state.value, last_outcome=outcome.value if outcome else None, lease_owner="me")
    )
    assert type(record.state) is State
    assert record.state is state
    assert record.last_outcome is outcome


@pytest.mark.parametrize(
    "columns", [{"state": "lost"}, {"last_outcome": "maybe"}], ids=["state", "outcome"]
)
def test_a_row_with_a_value_no_member_has_is_refused(columns: dict[str, Any]) -> None:
    """decode_row: a value outside the enums raises ValueError, as the enum's class does."""
    with pytest.raises(ValueError, match="is not a valid"):
        decode_row(_row(**columns))


@pytest.mark.parametrize(
    "pairs",
    [
        pytest.param((), id="none"),
        pytest.param((("content-type", "application/json"),), id="one"),
        pytest.param((("x-a", "1"), ("x-a", "2")), id="repeated"),
        pytest.param((("x-quote", 'say "hi" \\ bye'),), id="quotes-backslash"),
        pytest.param((("x-ctl", "a\tb\nc\x00\x1f"),), id="control-characters"),
        pytest.param((("x-latin", "caf\xe9 \u2603 \U0001f600"),), id="non-ascii"),
        pytest.param((("", ""),), id="empty"),
    ],
)
def test_stored_header_pairs_are_the_json_of_the_pairs(pairs: tuple[tuple[str, str], ...]) -> None:
    """pairs_json writes what json.dumps writes, less spaces: it reads back as the same pairs."""
    text = decide.pairs_json(pairs)
    assert json.loads(text) == json.loads(json.dumps(pairs)) == [list(p) for p in pairs]
    assert text == json.dumps(pairs, separators=(",", ":"))
    assert decide.headers_json(pairs) == text


def test_an_enqueued_row_is_pending_due_now_leased_to_no_one_and_never_sent() -> None:
    """Written in the application's transaction: a drain may claim it once committed."""
    row = decide.enqueued_row(NEW, NOW)
    written = decide.insert_row(NEW, LEASE, NOW)
    assert {
        name: row[name]
        for name in ("state", "due_at", "first_delivery_at", "lease_owner", "lease_expires_at")
    } == {
        "state": State.PENDING.value,
        "due_at": NOW,
        "first_delivery_at": None,  # its horizon starts at its first claim
        "lease_owner": None,
        "lease_expires_at": None,
    }
    assert row["claim_token"] is None
    unchanged = set(written) - {
        "state", "due_at", "first_delivery_at", "lease_owner", "lease_expires_at", "claim_token"
    }  # fmt: skip
    assert {name: row[name] for name in unchanged} == {name: written[name] for name in unchanged}
