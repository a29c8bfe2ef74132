"""What each store move means, decided once for every backend.

Pure functions of a record, the caller's request and ``now``: no connection,
no lock, no clock. Each answers with the column values to write (a plain
``dict`` of column name to value) and the record or ``Opened`` the caller is
handed back. The SQL stores spell the changes as ``UPDATE ... SET``; the
memory store applies them to its dictionaries. So who may take an intent,
what a claim sets and what an attempt records are written here alone, and a
backend file keeps only what truly differs: connections, locking, SQL.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Collection, Iterable
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any

from .._diff import conflict_with
from .._intent import (
    TERMINAL,
    UNRESOLVED,
    IntentRecord,
    Outcome,
    State,
    StoredResponse,
    operator_move,
)
from .._sender import origin_of
from .base import (
    FOREIGN_SHOWN,
    AttemptRecord,
    Census,
    Foreign,
    Lease,
    NewIntent,
    Opened,
)

__all__ = [
    "KEY_TAKEN",
    "LEASE_SWEEP",
    "PURGEABLE",
    "Changes",
    "adoptions",
    "attempt_row",
    "carried",
    "carried_attempts",
    "census_of",
    "claim_anchor",
    "conflict_with",
    "created",
    "due_by",
    "foreign_of",
    "insert_row",
    "lease_exit_deferred",
    "lease_free",
    "moved",
    "owed",
    "purged",
    "reconcile_taken",
    "recorded",
    "released",
    "reopened",
    "settled",
    "settlement_done",
    "settlement_failed",
    "settlement_taken",
    "stats_of",
    "stats_report",
    "taken",
    "waiting_since",
]

#: Column name -> value, as a store writes them.
Changes = dict[str, Any]

#: The states whose rows purge may reduce to tombstones. An expired or
#: indeterminate intent stays until it is resolved: purging it would hide it
#: from "needs attention".
PURGEABLE = tuple(sorted(s.value for s in TERMINAL - UNRESOLVED))

_TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)

#: Ended intents whose exit from the lease index a store defers, then takes out
#: in one statement (see :func:`lease_exit_deferred`); on SQLite also the fresh
#: write-aheads after which a store sweeps its tail (schema v6).
LEASE_SWEEP = 32
_ABSENT = object()

#: Why a new intent whose key another reference holds is refused.
KEY_TAKEN = "this key already belongs to another intent"


def pairs_json(pairs: Iterable[tuple[str, str]]) -> str:
    """Header (name, value) pairs as the JSON the outbox keeps: a list of two-string lists.

    What ``json.dumps`` writes, without its spaces, in half its time (it walks
    any object; these are strings, escaped by its own C escaper). Every answer
    kept writes its headers so.
    """
    return "[" + ",".join(f"[{_json_string(n)},{_json_string(v)}]" for n, v in pairs) + "]"


@functools.lru_cache(maxsize=256)
def headers_json(headers: tuple[tuple[str, str], ...]) -> str:
    """The stored form of a request's headers (a service sends the same few sets: cached)."""
    return pairs_json(headers)


def insert_row(new: NewIntent, lease: Lease, now: float) -> Changes:
    """The columns of a new intent: stored, and leased to its first sender, in one write."""
    row: Changes = {
        "reference": new.reference,
        "key": new.key,
        "provider": new.provider,
        "method": new.method,
        "url": new.url,
        "headers": headers_json(new.headers),
        "body": bytes(new.body),
        "fingerprint": new.fingerprint,
        "state": State.SENDING.value,
        "created_at": now,
        "updated_at": now,
        # The first send follows at once: the horizon starts with the write-ahead.
        "first_delivery_at": now,
        "deadline_at": new.deadline_at,
        "attempts": 0,
        "lease_owner": lease.owner,
        "lease_expires_at": lease.expires_at,
        "claim_token": lease.token,
        "sender": new.sender,
        "origin": new.origin,
        "meta": new.meta,
    }
    if new.needs:  # only then: the common INSERT stays the statement it was
        row["needs"] = json.dumps(list(new.needs))
    return row


def enqueued_row(new: NewIntent, now: float) -> Changes:
    """The columns of an intent written in the application's transaction, sent by a drain.

    Pending and due at once, leased to no one: nothing is sent until the
    transaction commits and a drain claims it (or ``post_once`` of the same
    intent resumes it). Never sent yet, so its horizon starts at its first
    claim, as a released claim's does.
    """
    row = insert_row(new, Lease(0, "", "", 0.0), now)
    row.update(
        state=State.PENDING.value,
        due_at=now,
        first_delivery_at=None,
        lease_owner=None,
        lease_expires_at=None,
        claim_token=None,
    )
    return row


def created(new: NewIntent, intent_id: int, lease: Lease, now: float) -> Opened:
    """What ``open_intent`` hands back for the row :func:`insert_row` wrote."""
    record = IntentRecord(
        id=intent_id,
        reference=new.reference,
        key=new.key,
        provider=new.provider,
        method=new.method,
        url=new.url,
        headers=new.headers,
        body=bytes(new.body),
        fingerprint=new.fingerprint,
        state=State.SENDING,
        created_at=now,
        first_delivery_at=now,
        due_at=None,
        deadline_at=new.deadline_at,
        attempts=0,
        last_outcome=None,
        lease_owner=lease.owner,
        lease_expires_at=lease.expires_at,
        response=None,
        note=None,
        sender=new.sender,
        origin=new.origin,
        meta=json.loads(new.meta) if new.meta else None,
        needs=new.needs,
    )
    return Opened(
        record,
        Lease(intent_id, lease.token, lease.owner, lease.expires_at, fresh=True),
        created=True,
        conflict=None,
        anchor_before=None,
    )


def taken(record: IntentRecord, lease: Lease, now: float, anchor: float) -> tuple[Opened, Changes]:
    """A lease taken on a stored intent: the columns to write and what the taker is handed.

    ``anchor`` is the horizon anchor from now on; the one the row had is kept
    in ``anchor_before`` so a claim that sends nothing can put it back.
    """
    changes: Changes = {
        "state": State.SENDING.value,
        "lease_owner": lease.owner,
        "lease_expires_at": lease.expires_at,
        "claim_token": lease.token,
        "first_delivery_at": anchor,
        "updated_at": now,
    }
    opened = Opened(
        dataclasses.replace(
            record,
            state=State.SENDING,
            first_delivery_at=anchor,
            lease_owner=lease.owner,
            lease_expires_at=lease.expires_at,
        ),
        lease._replace(intent_id=record.id),
        created=False,
        conflict=None,
        anchor_before=record.first_delivery_at,
    )
    return opened, changes


def lease_free(record: IntentRecord, now: float, alive: Callable[[str], bool]) -> bool:
    """Whether a claimant may take the intent's lease: none, expired, or its owner is gone."""
    if record.lease_expires_at is None or record.lease_expires_at <= now:
        return True
    return record.lease_owner is not None and not alive(record.lease_owner)


def reopened(
    record: IntentRecord,
    new: NewIntent,
    lease: Lease,
    now: float,
    alive: Callable[[str], bool] = lambda owner: True,
) -> tuple[Opened, Changes | None]:
    """``open_intent`` found ``new``'s reference stored: take it over, or say why not.

    Taken only when it is the same request, unfinished and not leased by a
    live sender (``alive`` tells of an owner whose lease has not run out);
    otherwise nothing is written (``None``) and the caller reads the stored
    record (a conflict, a finished answer, or a sender to wait for).
    """
    conflict = conflict_with(record, new)
    free = lease_free(record, now, alive)
    if conflict or record.state in TERMINAL or not free:
        kept = Opened(
            record, None, created=False, conflict=conflict, anchor_before=record.first_delivery_at
        )
        return kept, None
    # The caller sends at once: a row never sent starts its horizon now.
    anchor = record.first_delivery_at if record.first_delivery_at is not None else now
    opened, changes = taken(record, lease, now, anchor)
    if record.sender is None and new.sender is not None:  # an unowned row: this sender adopts it
        changes.update(sender=new.sender, origin=new.origin)
        opened = opened._replace(
            record=dataclasses.replace(opened.record, sender=new.sender, origin=new.origin)
        )
    return opened, changes


def adoptions(
    rows: list[tuple[int, str, str | None]], sender: str, origins: frozenset[str]
) -> list[tuple[int, Changes]]:
    """What adopting rows ``(id, url, origin)`` writes: ``sender`` on those to ``origins``.

    A row written before origins were kept gets its origin (read from its URL)
    whether or not it is adopted, so a later client's claim can filter on it.
    """
    out: list[tuple[int, Changes]] = []
    for intent_id, url, origin in rows:
        where = origin or origin_of(url)
        if where in origins:
            out.append((intent_id, {"sender": sender, "origin": where}))
        elif origin is None and where is not None:
            out.append((intent_id, {"origin": where}))
    return out


def claim_anchor(record: IntentRecord, now: float) -> float:
    """The horizon anchor a drain's claim sets: kept once a send may have landed, else now."""
    if record.delivered_maybe:
        assert record.first_delivery_at is not None
        return record.first_delivery_at
    return now


def recorded(
    lease: Lease,
    attempt: AttemptRecord,
    *,
    state: State,
    anchor: float | None,
    due_at: float | None,
    lease_until: float | None,
    response: StoredResponse | None,
    note: str | None,
    settle_hold: float | None = None,
) -> Changes:
    """The columns one recorded attempt sets (the attempt count is raised by one besides).

    ``lease_until`` keeps the lease for the next attempt; None hands it back.
    A note or a response is written only when given: an attempt without one
    keeps what the row had. ``settle_hold``: see :func:`owed`.
    """
    keep = lease_until is not None
    changes: Changes = {
        "state": state.value,
        "last_outcome": attempt.outcome.value,
        "first_delivery_at": anchor,
        "due_at": due_at,
        "lease_owner": lease.owner if keep else None,
        "lease_expires_at": lease_until,
        "claim_token": lease.token if keep else None,
        "updated_at": attempt.started_at + attempt.duration,
    }
    if note is not None:
        changes["note"] = note
    changes.update(owed(state, attempt.started_at + attempt.duration, settle_hold))
    if response is not None:
        changes.update(
            response_status=response.status,
            response_headers=pairs_json(response.headers),
            response_body=bytes(response.body),
            response_truncated=int(response.truncated),
            response_sha256=response.sha256,
        )
    return changes


def lease_exit_deferred(changes: Changes) -> Changes | None:
    """``changes`` that end an intent less its lease's end, or None where nothing is deferred.

    An intent in a lease index (``lease_expires_at``; on SQLite, one a sweep
    or a heartbeat took in while it was sending) leaves it when the answer
    hands the lease back, which writes that index's page in a second commit.
    The lease of an ended intent means nothing
    (:func:`~postonce._outbox.rows.decode_row` reads it as None), so a store
    that indexes leases may leave it in the row and take it out later,
    :data:`LEASE_SWEEP` intents in one statement. Only a change to a terminal
    state that hands the lease back (no owner, no expiry) is deferred; the row's
    empty ``lease_owner`` is what says its expiry is stale.
    """
    hands_back = (
        changes.get("lease_owner", _ABSENT) is None
        and changes.get("lease_expires_at", _ABSENT) is None
    )
    if not hands_back or changes.get("state") not in _TERMINAL_VALUES:
        return None
    deferred = dict(changes)
    del deferred["lease_expires_at"]
    return deferred


def carried(lease: Lease, number: int, attempt: AttemptRecord, changes: Changes) -> bool:
    """Whether the intent row alone keeps attempt ``number``: no attempts-table row.

    True for the first attempt of the process that wrote the intent ahead
    (``lease.fresh``: its send followed the write-ahead at once) when it ended
    the intent with an answer it stores (the common first-try 2xx, or a final
    4xx): the row's ``first_delivery_at``, ``updated_at``, ``last_outcome`` and
    ``response_status`` say what the attempt said, its start to within the
    planning of one call, and :func:`carried_attempts` reads it back. A first
    send by a drain or a takeover (long after the write-ahead), a replayed
    answer or an attempt that ended in an error keeps its row: the intent row
    could not say so. Saves one B-tree page per intent in the commit of its answer.
    """
    return (
        lease.fresh
        and number == 1
        and changes.get("state") in _TERMINAL_VALUES
        and changes.get("response_status") == attempt.status
        and attempt.status is not None
        and attempt.error_type is None
        and not attempt.replayed
    )


def carried_attempts(
    state: str,
    attempts: int,
    first_delivery_at: float | None,
    updated_at: float,
    last_outcome: str | None,
    status: int | None,
    purged_at: float | None,
) -> list[AttemptRecord]:
    """The attempt an intent row carries (see :func:`carried`), for an intent with no attempt rows.

    Its start is the write-ahead's time, the planning of one call before the
    send, and its duration runs to the answer's record: the attempt as the row
    knows it (who sent it is the process that wrote it ahead; not kept).
    A purged intent (a tombstone) has lost its attempts, carried ones too.
    """
    if (
        purged_at is not None
        or attempts != 1
        or state not in _TERMINAL_VALUES
        or status is None
        or last_outcome is None
        or first_delivery_at is None
    ):
        return []
    return [
        AttemptRecord(
            started_at=float(first_delivery_at),
            duration=max(0.0, float(updated_at) - float(first_delivery_at)),
            outcome=Outcome(last_outcome),
            status=int(status),
            error_type=None,
            replayed=False,
        )
    ]


def attempt_row(
    lease: Lease, number: int, attempt: AttemptRecord, changes: Changes, *, carry: bool = True
) -> Changes | None:
    """The attempts-table row of attempt ``number`` of the leased intent.

    None when the intent row carries the attempt (:func:`carried`) and the
    backend lets it (``carry``; PostgreSQL keeps every attempt with its owner).
    """
    if carry and carried(lease, number, attempt, changes):
        return None
    return {
        "intent_id": lease.intent_id,
        "number": number,
        "started_at": attempt.started_at,
        "duration": attempt.duration,
        "outcome": attempt.outcome.value,
        "status": attempt.status,
        "error_type": attempt.error_type,
        "replayed": int(attempt.replayed),
        "owner": lease.owner,
    }


def released(now: float, due_at: float | None, anchor: float | None) -> Changes:
    """An unsent claim handed back: pending, due at ``due_at`` (default now).

    ``anchor`` restores the horizon anchor the claim found: a claim that sent
    nothing must not start the horizon.
    """
    return {
        "state": State.PENDING.value,
        "due_at": now if due_at is None else due_at,
        "first_delivery_at": anchor,
        "lease_owner": None,
        "lease_expires_at": None,
        "claim_token": None,
        "updated_at": now,
    }


def owed(state: State, now: float, settle_hold: float | None) -> Changes:
    """A settlement owed when an intent ends, held ``settle_hold`` s by whoever ended it.

    ``None``: the client that ended it runs no settlement handler, so none is
    owed. Otherwise ``settle_due_at`` is set in the same commit as the terminal
    state: the process that ended it calls its handler at once, and a drain
    takes the settlement over only after the hold (the process died between).
    """
    if settle_hold is None or state not in TERMINAL:
        return {}
    # A new settlement: its own fence (settle_due_at), no failures of an older one.
    return {
        "settle_due_at": now + settle_hold,
        "settled_at": None,
        "settle_attempts": 0,
        "settle_error": None,
    }


def settled(now: float, state: State, note: str, settle_hold: float | None = None) -> Changes:
    """A terminal move without a send (expired, cancelled, resolved): no lease, nothing due."""
    return {
        "state": state.value,
        "note": note,
        "due_at": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "claim_token": None,
        "updated_at": now,
        **owed(state, now, settle_hold),
    }


def moved(
    record: IntentRecord, to: State, now: float, note: str, settle_hold: float | None = None
) -> tuple[IntentRecord, Changes]:
    """An operator's cancel or resolve, checked by the life-cycle rules (raises IllegalMove)."""
    operator_move(record, to, now)
    changes = settled(now, to, note, settle_hold)
    after = dataclasses.replace(
        record,
        state=to,
        note=note,
        due_at=None,
        lease_owner=None,
        lease_expires_at=None,
        settle_due_at=changes.get("settle_due_at", record.settle_due_at),
    )
    return after, changes


def settlement_taken(now: float, hold: float) -> Changes:
    """A drain takes an owed settlement: no one else for ``hold`` seconds."""
    return {"settle_due_at": now + hold}


def settlement_done(now: float) -> Changes:
    """The handler returned: the settlement is delivered."""
    return {"settled_at": now, "settle_due_at": None, "settle_error": None}


def settlement_failed(error: str, retry_at: float) -> Changes:
    """The handler raised: try again at ``retry_at`` (the attempt count is raised besides)."""
    return {"settle_error": error[:1000], "settle_due_at": retry_at}


def reconcile_taken(now: float, every: float) -> Changes:
    """A drain asks about an expired intent: no one asks again for ``every`` seconds."""
    return {"reconcile_at": now + every}


def purged(now: float) -> Changes:
    """What a tombstone keeps of a finished intent: no request, no answer body."""
    return {
        "body": b"",
        "headers": "[]",
        "response_headers": None,
        "response_body": None,
        "lease_expires_at": None,  # a lease whose end a store deferred: out of the index
        "purged_at": now,
    }


def stats_report(
    counts: dict[str, int],
    *,
    oldest: float | None,
    next_due: float | None,
    lease_due: float | None,
    tombstones: int,
    due_now: int,
    leased: int,
    lease_expiry: float | None,
    owed: int = 0,
    failing: int = 0,
) -> dict[str, Any]:
    """``outbox stats`` from the figures a store counted.

    ``in_flight``: sending under a lease that has not run out (a live sender, or
    one not yet known dead); ``next_lease_expiry`` is when the first runs out.
    """
    states = {state.value: 0 for state in State}
    states.update(counts)
    candidates = [t for t in (next_due, lease_due) if t is not None]
    return {
        "states": states,
        "due_now": int(due_now),
        "oldest_pending_created_at": oldest,
        "next_due_at": min(candidates) if candidates else None,
        "expired_needing_attention": states[State.EXPIRED.value],
        "indeterminate_needing_attention": states[State.INDETERMINATE.value],
        "tombstones": int(tombstones),
        "in_flight": int(leased),
        "next_lease_expiry": lease_expiry,
        "settlements_owed": int(owed),  # ended intents whose handler has not returned yet
        "settlements_failing": int(failing),  # of those, ones whose handler raised
    }


def due_by(record: IntentRecord, by: float) -> bool:
    """Pending and due by ``by``, or sending under a lease that ran out by then."""
    if record.state is State.PENDING:
        return record.due_at is not None and record.due_at <= by
    if record.state is State.SENDING:
        return record.lease_expires_at is not None and record.lease_expires_at <= by
    return False


def stats_of(records: list[IntentRecord], now: float) -> dict[str, Any]:
    """``outbox stats`` counted from the records themselves (a store without SQL)."""
    counts: dict[str, int] = {}
    for r in records:
        if r.purged_at is None:
            counts[r.state.value] = counts.get(r.state.value, 0) + 1
    pending = [r for r in records if r.state is State.PENDING]
    leased = [r for r in records if r.state is State.SENDING and r.lease_expires_at is not None]
    live = [r.lease_expires_at or 0.0 for r in leased if (r.lease_expires_at or 0.0) > now]
    owed = [r for r in records if r.settle_due_at is not None]
    return stats_report(
        counts,
        oldest=min((r.created_at for r in pending), default=None),
        next_due=min((r.due_at for r in pending if r.due_at is not None), default=None),
        lease_due=min((r.lease_expires_at or 0.0 for r in leased), default=None),
        tombstones=sum(1 for r in records if r.purged_at is not None),
        due_now=sum(1 for r in records if due_by(r, now)),
        leased=len(live),
        lease_expiry=min(live, default=None),
        owed=len(owed),
        failing=sum(1 for r in owed if r.settle_attempts),
    )


def census_of(
    records: list[IntentRecord],
    now: float,
    admits: Callable[[str | None, str | None], bool],
    origins: Collection[str] | None = None,
) -> Census:
    """What a drain left, counted from the records: others' due intents, its own held elsewhere.

    A due intent of no sender addressed to one of ``origins`` is nobody else's:
    it is ``unowned`` (the drain's next pass adopts it), not another sender's.
    """
    held = [
        r.lease_expires_at or 0.0
        for r in records
        if r.state is State.SENDING
        and (r.lease_expires_at or 0.0) > now
        and admits(r.sender, r.origin)
    ]
    due = [r for r in records if due_by(r, now) and not admits(r.sender, r.origin)]
    unowned = [r for r in due if r.sender is None and r.origin in (origins or ())]
    theirs: dict[tuple[str | None, str | None], list[float]] = {}
    for r in due:
        if r.sender is not None or r.origin not in (origins or ()):
            theirs.setdefault((r.sender, r.origin), []).append(waiting_since(r))
    failing = sum(
        1
        for r in records
        if r.settle_due_at is not None and r.settle_attempts and admits(r.sender, r.origin)
    )
    return Census(
        sum(len(since) for since in theirs.values()),
        len(held),
        min(held, default=None),
        foreign_of((s, o, len(since), min(since)) for (s, o), since in theirs.items()),
        failing,
        len(unowned),
        now,
    )


def waiting_since(record: IntentRecord) -> float:
    """When a due intent fell due: a sending one's lease expiry, a pending one's due time."""
    when = record.lease_expires_at if record.state is State.SENDING else record.due_at
    return 0.0 if when is None else when


def foreign_of(
    groups: Iterable[tuple[str | None, str | None, int, float | None]],
) -> tuple[Foreign, ...]:
    """Whose due intents a drain may not send: the FOREIGN_SHOWN largest groups, most first.

    Each group is ``(sender, origin, how many, when the first fell due)``.
    """
    ranked = sorted(groups, key=lambda g: (-g[2], g[0] or "", g[1] or ""))
    return tuple(Foreign(s, o, int(n), since) for s, o, n, since in ranked[:FOREIGN_SHOWN])
