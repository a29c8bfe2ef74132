"""What the application learns when an intent ends: settlement handlers and reconciliation.

Pure flows, driven by the clients' loops like the send flow. A settlement is
owed in the same commit that ends an intent (``decide.owed``); the process that
ended it calls the handler at once; the outbox marks it delivered only after
the handler returns. A process that dies in between leaves it owed, and a drain
calls the handler again: delivery is at least once, so handlers must be
idempotent (they receive the intent's reference for that). A handler that
raises is called again later, with backoff; it never changes the intent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx

from ._flow import Callback, Effect, StoreCall
from ._intent import IllegalMove, IntentRecord, State
from ._policy import settle_backoff

__all__ = ["Resolution", "Settlement", "reconcile_flow", "settle_flow", "settlement_of"]

logger = logging.getLogger("postonce")


@dataclass(frozen=True, slots=True)
class Settlement:
    """An intent that ended, as its settlement handler (``on_settled=``) receives it."""

    intent: str  # the caller's reference: key your handler's own idempotency on it
    key: str
    state: State  # succeeded, failed, expired, cancelled (or resolved to succeeded/failed)
    response: httpx.Response | None  # the final answer, when one is stored
    meta: Any  # the ``meta=`` given with the call
    note: str | None  # why it ended so (an expiry, a cancellation, a resolution)


@dataclass(frozen=True, slots=True)
class Resolution:
    """A reconciler's answer about an expired intent: it did, or did not, take effect."""

    state: State
    note: str = ""

    @classmethod
    def succeeded(cls, note: str = "") -> Resolution:
        """The provider shows the effect (say, a charge found by its metadata)."""
        return cls(State.SUCCEEDED, note)

    @classmethod
    def failed(cls, note: str = "") -> Resolution:
        """The provider shows no effect."""
        return cls(State.FAILED, note)


def settlement_of(record: IntentRecord, lib: ModuleType = httpx) -> Settlement:
    """The settlement of an ended intent, with its stored answer as a response."""
    response = None
    if record.response is not None:
        stored = record.response
        response = lib.Response(
            stored.status,
            headers=list(stored.headers),
            content=stored.body,
            request=lib.Request(record.method, record.url),
        )
    return Settlement(
        record.reference, record.key, record.state, response, record.meta, record.note
    )


def settle_flow(
    handler: Callable[[Settlement], Any],
    record: IntentRecord,
    clock: Callable[[], float],
    lib: ModuleType = httpx,
) -> Generator[Effect, Any, bool]:
    """Call the handler for one ended intent; record it delivered, or when to try again.

    ``record.settle_due_at`` is the settlement's fence: the result is recorded
    only if that settlement is still the one owed (a newer ending owes its own).
    """
    owed_at = record.settle_due_at
    assert owed_at is not None
    try:
        yield Callback(handler, settlement_of(record, lib))
    except Exception as exc:
        wait = settle_backoff(record.settle_attempts)
        logger.warning(
            "settlement handler failed for intent %r (%s: %s); it is called again in %.1f s",
            record.reference,
            type(exc).__name__,
            exc,
            wait,
            extra={"intent": record.reference, "key": record.key},
        )
        yield StoreCall(
            "settlement_failed",
            {
                "intent_id": record.id,
                "error": f"{type(exc).__name__}: {exc}",
                "retry_at": clock() + wait,
                "owed_at": owed_at,
            },
        )
        return False
    done = yield StoreCall(
        "settlement_done", {"intent_id": record.id, "now": clock(), "owed_at": owed_at}
    )
    return bool(done)


def reconcile_flow(
    reconcile: Callable[[IntentRecord], Any],
    record: IntentRecord,
    *,
    sender: str,
    clock: Callable[[], float],
    settle_hold: float | None,
) -> Generator[Effect, Any, IntentRecord | None]:
    """Ask the reconciler about one expired intent; record its answer as ``outbox resolve`` would.

    Returns the resolved record (which owes a settlement where a handler runs),
    or None when the reconciler cannot tell yet (it is asked again later).
    """
    try:
        answer = yield Callback(reconcile, record)
    except Exception as exc:
        logger.warning(
            "reconciler failed for expired intent %r (%s: %s); it is asked again later",
            record.reference,
            type(exc).__name__,
            exc,
            extra={"intent": record.reference, "key": record.key},
        )
        return None
    if answer is None:
        return None
    if not isinstance(answer, Resolution) or answer.state not in (State.SUCCEEDED, State.FAILED):
        logger.error(
            "reconciler answered %r for intent %r: it must return a postonce.Resolution or None",
            answer,
            record.reference,
        )
        return None
    note = f"reconciled by {sender}" + (f": {answer.note}" if answer.note else "")
    try:
        resolved: IntentRecord = yield StoreCall(
            "operator_move",
            {
                "reference": record.reference,
                "to": answer.state,
                "now": clock(),
                "note": note,
                "settle_hold": settle_hold,
            },
        )
    except (IllegalMove, KeyError) as exc:
        # Resolved (or purged) by someone else since it was claimed: their answer stands.
        logger.info("reconciler's answer for %r not recorded: %s", record.reference, exc)
        return None
    return resolved
