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

from ._exceptions import ConfigurationError
from ._flow import Callback, Effect, StoreCall
from ._intent import IllegalMove, IntentRecord, Outcome, State
from ._policy import settle_backoff

__all__ = ["Resolution", "Settlement", "reconcile_flow", "settle_flow", "settlement_of"]

logger = logging.getLogger("postonce")


@dataclass(frozen=True, slots=True)
class Settlement:
    """An intent that ended, as its settlement handler (``on_settled=``) receives it."""

    intent: str  # the caller's reference: key your handler's own idempotency on it
    key: str
    #: succeeded, failed, expired, indeterminate or cancelled; an expired or
    #: indeterminate intent resolved later ends again as succeeded or failed.
    state: State
    response: httpx.Response | None  # the final answer, when one is stored
    meta: Any  # the ``meta=`` given with the call
    note: str | None  # why it ended so (an expiry, a cancellation, a resolution)


#: What a reconciler may find: the effect happened, or it did not.
RESOLVED = (State.SUCCEEDED, State.FAILED)


@dataclass(frozen=True, slots=True)
class Resolution:
    """A reconciler's answer about an unresolved intent: it did, or did not, take effect.

    ``state`` is ``State.SUCCEEDED`` or ``State.FAILED``, or their values
    ``"succeeded"``/``"failed"`` (made the members); anything else is refused
    here with a ConfigurationError, not later inside a drain. ``note`` says
    what the reconciler found (a charge id): it is kept with the intent.
    """

    state: State
    note: str = ""

    def __post_init__(self) -> None:
        state: object = self.state
        try:
            # State(...) takes a member or its value; a str enum's member is also a str.
            found = State(state) if isinstance(state, str) else None
        except ValueError:
            found = None
        if found not in RESOLVED:
            raise ConfigurationError(
                f"Resolution takes state State.SUCCEEDED or State.FAILED ('succeeded' or "
                f"'failed'), not {state!r}: a reconciler that cannot tell returns None"
            )
        note: object = self.note
        if note is None:
            note = ""
        if not isinstance(note, str):
            raise ConfigurationError(f"Resolution's note is text, not {type(note).__name__}")
        # A frozen dataclass: its own fields are set once, here.
        object.__setattr__(self, "state", found)
        object.__setattr__(self, "note", note)

    @classmethod
    def succeeded(cls, note: str = "") -> Resolution:
        """The provider shows the effect (say, a charge found by its metadata)."""
        return cls(State.SUCCEEDED, note)

    @classmethod
    def failed(cls, note: str = "") -> Resolution:
        """The provider shows no effect."""
        return cls(State.FAILED, note)


def settlement_of(record: IntentRecord, lib: ModuleType = httpx) -> Settlement:
    """The settlement of an ended intent, with its stored answer as a response.

    An indeterminate answer that was since resolved is not handed over as the
    answer (its 5xx would contradict the resolution): ``response`` is None, as
    for a resolved expiry, and ``note`` says what the resolution found.
    """
    response = None
    superseded = (
        record.last_outcome is Outcome.INDETERMINATE and record.state is not State.INDETERMINATE
    )
    if record.response is not None and not superseded:
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
    *,
    failed: Callable[[], object] | None = None,
) -> Generator[Effect, Any, bool]:
    """Call the handler for one ended intent; record it delivered, or when to try again.

    ``record.settle_due_at`` is the settlement's fence: the result is recorded
    only if that settlement is still the one owed (a newer ending owes its own).
    ``failed`` is called when the handler raised and that is recorded (a drain counts it).
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
        # Counted once recorded: a record that fails raises, and its caller counts that.
        if failed is not None:
            failed()
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
    failed: Callable[[], object] | None = None,
) -> Generator[Effect, Any, IntentRecord | None]:
    """Ask the reconciler about one unresolved intent; record its answer as a resolve would.

    Returns the resolved record (which owes a settlement where a handler runs),
    or None when the reconciler cannot tell yet, raised, or answered what is
    not a Resolution (it is asked again after ``reconcile_every``). ``failed``
    is called for those last two (a drain counts them); nothing here raises
    for the reconciler's sake.
    """
    try:
        answer = yield Callback(reconcile, record)
    except Exception as exc:
        logger.warning(
            "reconciler failed for %s intent %r (%s: %s); it is asked again later",
            record.state.value,
            record.reference,
            type(exc).__name__,
            exc,
            extra={"intent": record.reference, "key": record.key},
        )
        if failed is not None:
            failed()
        return None
    if answer is None:
        return None
    # Checked again: a Resolution's fields can be forced past its own checks.
    if (
        not isinstance(answer, Resolution)
        or not isinstance(answer.state, State)
        or answer.state not in RESOLVED
    ):
        logger.error(
            "reconciler answered %r for intent %r: it must return a postonce.Resolution "
            "(Resolution.succeeded(note) or Resolution.failed(note)) or None; it is asked "
            "again later",
            answer,
            record.reference,
            extra={"intent": record.reference, "key": record.key},
        )
        if failed is not None:
            failed()
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
