"""What every backend stores the same way: the intent columns, their decoding, the answer kept."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._exceptions import OutboxError
from .._intent import (
    STORED_BODY_LIMIT,
    TERMINAL,
    AttemptRecord,
    IntentRecord,
    Outcome,
    State,
    StoredResponse,
    storable_response,
)

if TYPE_CHECKING:
    from .base import Store

__all__ = [
    "COLUMNS",
    "COLUMN_NAMES",
    "STORED_BODY_LIMIT",
    "decode_attempt",
    "decode_row",
    "export_rows",
    "needs_durable",
    "newer_schema",
    "storable_response",
]


#: The intent columns a record is decoded from, in :func:`decode_row`'s order.
COLUMN_NAMES = (
    "id",
    "reference",
    "key",
    "provider",
    "method",
    "url",
    "headers",
    "body",
    "fingerprint",
    "state",
    "created_at",
    "first_delivery_at",
    "due_at",
    "deadline_at",
    "attempts",
    "last_outcome",
    "lease_owner",
    "lease_expires_at",
    "response_status",
    "response_headers",
    "response_body",
    "response_truncated",
    "response_sha256",
    "note",
    "purged_at",
    "sender",
    "origin",
    "meta",
    "settle_due_at",
    "settle_attempts",
    "settle_error",
    "settled_at",
    "needs",
)
COLUMNS = ", ".join(COLUMN_NAMES)
# A stored value's member by a dict lookup: ``State(value)`` runs the enum
# metaclass's Python ``__call__`` and ``__new__`` (every claimed row is decoded).
# A value not in them goes through the class, which raises ValueError as before.
_STATE_OF: dict[str, State] = {state.value: state for state in State}
_OUTCOME_OF: dict[str, Outcome] = {outcome.value: outcome for outcome in Outcome}


def _pairs(text: str | None) -> tuple[tuple[str, str], ...]:
    return tuple((str(n), str(v)) for n, v in json.loads(text)) if text else ()


def _time(value: Any) -> float | None:
    """A REAL column as a float (a backend may hand back an int it was given)."""
    return None if value is None else float(value)


def decode_attempt(row: tuple[Any, ...]) -> AttemptRecord:
    """An attempts-table row: ``started_at, duration, outcome, status, error_type, replayed``."""
    started_at, duration, outcome, status, error_type, replayed = row
    return AttemptRecord(
        started_at=float(started_at),
        duration=float(duration),
        outcome=Outcome(outcome),
        status=status,
        error_type=error_type,
        replayed=bool(replayed),
    )


def decode_row(row: tuple[Any, ...]) -> IntentRecord:
    """An intent row, its columns in ``COLUMN_NAMES`` order, as the record the shells read."""
    (
        id_, reference, key, provider, method, url, headers, body, fingerprint, state,
        created_at, first_delivery_at, due_at, deadline_at, attempts, last_outcome,
        lease_owner, lease_expires_at,
    ) = row[:18]  # fmt: skip
    (
        note, purged_at, sender, origin, meta,
        settle_due_at, settle_attempts, settle_error, settled_at, needs,
    ) = row[23:]  # fmt: skip
    state = _STATE_OF.get(state) or State(state)
    if state in TERMINAL and lease_owner is None:
        # An ended intent that handed its lease back: a store may have left the
        # expiry in the row (decide.lease_exit_deferred; on SQLite for good, where
        # the row never entered the lease index). It says nothing.
        lease_expires_at = None
    response = _stored_response(*row[18:23])
    return IntentRecord(
        id=int(id_),
        reference=str(reference),
        key=str(key),
        provider=str(provider),
        method=str(method),
        url=str(url),
        headers=_pairs(headers),
        body=bytes(body),
        fingerprint=str(fingerprint),
        state=state,
        created_at=float(created_at),
        first_delivery_at=_time(first_delivery_at),
        due_at=_time(due_at),
        deadline_at=_time(deadline_at),
        attempts=int(attempts),
        last_outcome=(_OUTCOME_OF.get(last_outcome) or Outcome(last_outcome))
        if last_outcome
        else None,
        lease_owner=lease_owner,
        lease_expires_at=_time(lease_expires_at),
        response=response,
        note=note,
        purged_at=_time(purged_at),
        sender=sender,
        origin=origin,
        meta=json.loads(meta) if meta else None,
        settle_due_at=_time(settle_due_at),
        settle_attempts=int(settle_attempts or 0),
        settle_error=settle_error,
        settled_at=_time(settled_at),
        needs=tuple(json.loads(needs)) if needs else (),
    )


def _stored_response(
    status: Any, headers: Any, body: Any, truncated: Any, sha256: Any
) -> StoredResponse | None:
    """The stored answer of a row (its ``response_*`` columns), or None if it has none."""
    if status is None:
        return None
    return StoredResponse(
        status=int(status),
        headers=_pairs(headers),
        body=bytes(body or b""),
        truncated=bool(truncated),
        sha256=str(sha256 or ""),
    )


_DURABLE_CALLS = frozenset({"open_intent", "settle", "claim_due", "operator_move", "purge"})


def needs_durable(method: str, kwargs: dict[str, Any]) -> bool:
    """Whether a store call commits durably on its own (so its batch must too)."""
    if method == "record":
        return bool(kwargs.get("durable"))
    return method in _DURABLE_CALLS


def newer_schema(where: str, found: int, known: int) -> OutboxError:
    """The error for an outbox a newer postonce wrote: never read or migrate it down."""
    return OutboxError(
        f"the outbox {where} has schema version {found}, written by a newer postonce; "
        f"this one knows versions up to {known}: upgrade postonce"
    )


def export_rows(store: Store) -> Iterator[dict[str, Any]]:
    """Every intent with its attempts, as plain data (bodies as text where they are UTF-8)."""
    for record in store.list_intents():
        yield {
            "reference": record.reference,
            "key": record.key,
            "provider": record.provider,
            "sender": record.sender,
            "origin": record.origin,
            "meta": record.meta,
            "needs": list(record.needs),
            "settle_due_at": record.settle_due_at,
            "settled_at": record.settled_at,
            "settle_error": record.settle_error,
            "state": record.state.value,
            "method": record.method,
            "url": record.url,
            "headers": [list(h) for h in record.headers],
            "body": record.body.decode("utf-8", "replace"),
            "created_at": record.created_at,
            "first_delivery_at": record.first_delivery_at,
            "due_at": record.due_at,
            "deadline_at": record.deadline_at,
            "attempts": [
                {
                    "started_at": a.started_at,
                    "duration": a.duration,
                    "outcome": a.outcome.value,
                    "status": a.status,
                    "error_type": a.error_type,
                    "replayed": a.replayed,
                }
                for a in store.attempts(record.reference)
            ],
            "response_status": record.response.status if record.response else None,
            "note": record.note,
            "purged_at": record.purged_at,
        }
