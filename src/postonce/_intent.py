"""The nouns of an intent's life: its states, attempt outcomes and legal moves.

Pure data. The outbox stores these values; the engine decides between them.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "FOREIGN_SHOWN",
    "STORED_BODY_LIMIT",
    "TERMINAL",
    "UNRESOLVED",
    "AttemptRecord",
    "Census",
    "Foreign",
    "IllegalMove",
    "IntentInfo",
    "IntentRecord",
    "Lease",
    "NewIntent",
    "Opened",
    "Outcome",
    "Purged",
    "State",
    "StoredResponse",
    "move",
    "operator_move",
    "storable_response",
]


class State(str, enum.Enum):
    """Where an intent stands. Stored as its value."""

    PENDING = "pending"  # durable, not being sent; due at ``due_at``
    SENDING = "sending"  # a sender holds the lease (or held it and died)
    SUCCEEDED = "succeeded"  # a final 2xx answer is stored
    FAILED = "failed"  # a final non-2xx answer is stored, or the key was refused as mismatched
    EXPIRED = "expired"  # delivery ambiguous past the horizon: reconcile, never re-send
    INDETERMINATE = "indeterminate"  # an answer that leaves the effect unknown: reconcile
    CANCELLED = "cancelled"  # never delivered, and stopped by an operator or its deadline


TERMINAL = frozenset(
    {State.SUCCEEDED, State.FAILED, State.EXPIRED, State.INDETERMINATE, State.CANCELLED}
)

#: The endings whose outcome is unknown: a reconciler (or a person) resolves them
#: to succeeded or failed; they are never sent again and never purged unresolved.
UNRESOLVED = frozenset({State.EXPIRED, State.INDETERMINATE})


class Outcome(str, enum.Enum):
    """What one attempt tells about delivery. Stored as its value."""

    NOT_SENT = "not_sent"  # the server cannot have seen it (connect error, pool timeout)
    AMBIGUOUS = "ambiguous"  # written, then no answer: it may have been applied
    IN_PROGRESS = "in_progress"  # the server is still working on this key (e.g. 409)
    RETRYABLE = "retryable"  # an answer that invites a retry (429, 502/503/504, ...)
    MISMATCH = "mismatch"  # the key was first used with a different request
    #: An answer that ends the intent without proving the effect absent: a 5xx the
    #: provider stored and replays, or says not to retry. Never retried: reconcile.
    INDETERMINATE = "indeterminate"
    FINAL = "final"  # any other answer: the result of the intent


# Every legal move, and nothing else. Terminal states leave only by an explicit
# operator action (``resolve``), which is the one move out of EXPIRED and
# INDETERMINATE (made by a person, or by a drain's reconciler).
_MOVES: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.SENDING, State.CANCELLED, State.EXPIRED}),
    State.SENDING: frozenset(
        {
            State.SENDING,  # a dead owner's lease taken over
            State.PENDING,
            State.SUCCEEDED,
            State.FAILED,
            State.EXPIRED,
            State.INDETERMINATE,
            State.CANCELLED,
        }
    ),
    State.SUCCEEDED: frozenset(),
    State.FAILED: frozenset(),
    State.EXPIRED: frozenset({State.SUCCEEDED, State.FAILED}),  # operator resolution
    State.INDETERMINATE: frozenset({State.SUCCEEDED, State.FAILED}),  # operator resolution
    State.CANCELLED: frozenset(),
}


class IllegalMove(ValueError):
    """A state transition that the life cycle does not allow."""


def move(current: State, to: State) -> State:
    """Return ``to`` if the life cycle allows ``current -> to``, else raise."""
    if to not in _MOVES[current]:
        raise IllegalMove(f"an intent cannot move from {current.value} to {to.value}")
    return to


def operator_move(record: IntentRecord, to: State, now: float) -> State:
    """Check an operator's cancel or resolve against the rules; raise IllegalMove with why.

    Cancel: only an intent that was never possibly delivered and that no live
    sender holds. Resolve: only an unresolved intent (expired or
    indeterminate), to succeeded or failed, after a person or a reconciler
    checked with the provider.
    """
    if to is State.CANCELLED:
        if record.state in TERMINAL:
            raise IllegalMove(f"it is already {record.state.value}")
        if record.delivered_maybe:
            raise IllegalMove(
                "it may have been delivered (a send may have reached the server), "
                "so cancelling could hide a charge; let it finish, or wait for it to expire "
                "and resolve it"
            )
        if record.lease_expires_at is not None and record.lease_expires_at > now:
            raise IllegalMove(f"a sender ({record.lease_owner}) holds it right now")
        return move(record.state, to)
    if to in (State.SUCCEEDED, State.FAILED):
        if record.state not in UNRESOLVED:
            raise IllegalMove(
                "only an expired or indeterminate intent is resolved; "
                f"this one is {record.state.value}"
            )
        return move(record.state, to)
    raise IllegalMove(f"an operator cannot move an intent to {to.value}")


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A final answer as the outbox keeps it."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    truncated: bool  # the body was longer than the outbox keeps; ``body`` is its head
    sha256: str = ""  # of the whole body as received, truncated or not


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """One row of the outbox, as the shells read it back."""

    id: int
    reference: str
    key: str
    provider: str
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]  # non-secret request headers only
    body: bytes
    fingerprint: str
    state: State
    created_at: float
    first_delivery_at: float | None  # anchor of the retry horizon; None while never sent
    due_at: float | None
    deadline_at: float | None
    attempts: int
    last_outcome: Outcome | None
    lease_owner: str | None
    lease_expires_at: float | None
    response: StoredResponse | None
    note: str | None
    purged_at: float | None = None  # a tombstone: the request and answer were purged
    sender: str | None = None  # who may send it (None: written before senders were kept)
    origin: str | None = None  # scheme://host:port it is addressed to
    meta: Any = None  # the caller's JSON data (``meta=``): neither request nor fingerprint
    settle_due_at: float | None = None  # a settlement handler owes a call, from this time
    settle_attempts: int = 0  # handler calls that raised
    settle_error: str | None = None  # the last one's error
    settled_at: float | None = None  # when the handler returned for this intent
    #: The names of the call's own secrets its sends need (headers in lower case, query
    #: parameters as ``?name``), never their values: a sender without them cannot send it.
    needs: tuple[str, ...] = ()

    @property
    def delivered_maybe(self) -> bool:
        """Whether any send of this intent may have reached the server."""
        return self.first_delivery_at is not None


@dataclass(frozen=True, slots=True)
class IntentInfo:
    """What ``response.extensions["postonce"]`` says about the intent behind a response."""

    reference: str
    key: str
    state: State
    attempts: int  # attempts recorded for the intent, across every process
    replayed: bool  # the server marked this answer as a replay of an earlier one
    from_outbox: bool  # the answer was read from the outbox; nothing was sent now
    truncated: bool = False  # from the outbox, and longer than the outbox keeps


#: Response bodies longer than this are stored as their first bytes plus the
#: SHA-256 of the whole body, and flagged as truncated.
STORED_BODY_LIMIT = 1 << 20
# Headers that describe the stored bytes' transport, not the answer itself.
_DROP_RESPONSE_HEADERS = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "set-cookie", "connection"}
)


def storable_response(status: int, headers: list[tuple[str, str]], body: bytes) -> StoredResponse:
    """A response as the outbox keeps it: transport headers dropped, body capped."""
    kept = tuple((n, v) for n, v in headers if n.lower() not in _DROP_RESPONSE_HEADERS)
    truncated = len(body) > STORED_BODY_LIMIT
    return StoredResponse(
        status=status,
        headers=kept,
        body=body[:STORED_BODY_LIMIT] if truncated else body,
        truncated=truncated,
        sha256=hashlib.sha256(body).hexdigest(),
    )


class NewIntent(NamedTuple):
    """An intent as a caller asks for it, before it is stored."""

    reference: str
    key: str
    key_given: bool  # the caller chose the key; another stored key is a conflict
    provider: str
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    fingerprint: str
    deadline_at: float | None
    #: Who may send it: the sending client's identity (None: unowned, adopted by
    #: the first client whose origins include ``origin``).
    sender: str | None = None
    #: ``scheme://host:port`` the request is addressed to.
    origin: str | None = None
    #: The caller's JSON data, as text (``meta=``): stored, never sent or fingerprinted.
    meta: str | None = None
    #: The names of the call's own secrets its sends need (``IntentRecord.needs``).
    needs: tuple[str, ...] = ()


class Lease(NamedTuple):
    """The right to send one intent, until ``expires_at``, proven by ``token``."""

    intent_id: int
    token: str
    owner: str
    expires_at: float
    #: Taken by the write-ahead that created the intent: its first send follows
    #: at once, from this process (``decide.carried``).
    fresh: bool = False


class Opened(NamedTuple):
    """What ``open_intent`` found, and the lease it took if it took one."""

    record: IntentRecord
    lease: Lease | None
    created: bool
    conflict: str | None  # why the stored intent is not this request; nothing claimed
    anchor_before: float | None  # the horizon anchor before this claim set it


@dataclass(frozen=True, slots=True)
class Foreign:
    """Due intents a drain may not send, of one sender and origin: whose client sends them."""

    sender: str | None  # None: unowned, written by a release from before sender identities
    origin: str | None
    due: int
    #: When the first of them fell due (a pending row's due time, a sending row's
    #: lease expiry): none of them has been claimed since. None: the store does not say.
    waiting_since: float | None = None


@dataclass(frozen=True, slots=True)
class Census:
    """What a drain could not finish, and why: nothing unfinished is invisible."""

    not_ours: int  # due, but another sender's or to another origin
    in_flight_elsewhere: int  # this sender's, leased by another owner (live, or not yet known dead)
    next_lease_expiry: float | None  # the earliest of those leases' expiries
    #: Whose the ``not_ours`` intents are, most first (at most FOREIGN_SHOWN groups).
    #: Empty from a store that does not say (its ``not_ours`` still counts them).
    foreign: tuple[Foreign, ...] = ()
    #: This sender's settlements still owed after their handler raised.
    settle_failing: int = 0
    #: Due intents of no sender addressed to this client's origins (written by an
    #: older release after the migration): the drain's next pass adopts them.
    unowned: int = 0
    #: The ``now`` the census counted at (what ``waiting_since`` is measured against).
    at: float | None = None


#: The most sender-and-origin groups a census names; ``not_ours`` counts them all.
FOREIGN_SHOWN = 10


class Purged(int):
    """What ``purge`` returns: how many intents it purged (or tombstones it deleted).

    An ``int``, so a caller that counts keeps working; ``kept_owed`` is how
    many of that age it kept because their settlement is still owed (a store
    that returns a plain ``int`` does not say).
    """

    kept_owed: int

    def __new__(cls, purged: int, kept_owed: int = 0) -> Purged:
        made = super().__new__(cls, purged)
        made.kept_owed = kept_owed
        return made

    def __repr__(self) -> str:
        return f"Purged({int(self)}, kept_owed={self.kept_owed})"


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One send, as the attempts table keeps it."""

    started_at: float
    duration: float
    outcome: Outcome
    status: int | None
    error_type: str | None
    replayed: bool
