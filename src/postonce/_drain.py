"""The drain: finish every due intent with its stored key, under leases.

A drain pass claims a batch of due intents (pending and due, or sending under
a lease whose owner died), sends each once, and records what happened: a
final answer, or the next due time. Nothing sleeps on a retry: a retryable
outcome becomes a due time for a later pass. The horizon rules here as in the
foreground: an intent whose horizon passed with delivery ambiguous is moved
to ``expired`` and logged, never sent.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Collection, Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import FrameType
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import anyio
from pydantic import BaseModel, ConfigDict

from ._exceptions import (
    IdempotencyKeyMismatch,
    IntentCancelled,
    IntentExpired,
    IntentIndeterminate,
    IntentPending,
    OutboxError,
    PostonceError,
)
from ._intent import Census, Foreign, IntentRecord, Opened, State
from ._pace import Pace, pace_origin

__all__ = [
    "FOREIGN_MARK",
    "JUST_BEFORE",
    "ORPHANED_AFTER",
    "UNSENDABLE_WAIT",
    "AsyncTurns",
    "ClaimStep",
    "DrainReport",
    "ForeignSender",
    "HandBack",
    "Heard",
    "Pause",
    "Proceed",
    "TakeTurn",
    "Tally",
    "Turn",
    "Turns",
    "Unsendable",
    "claim_failed",
    "claim_steps",
    "describe_sender",
    "flows_for",
    "foreign_message",
    "least_batch",
    "next_batch",
    "note_census",
    "orphan_lines",
    "orphaned",
    "outbox_name",
    "run_drain",
    "unsendable",
    "without_password",
]

logger = logging.getLogger("postonce")

# A one-shot drain takes what was due strictly before it started, so an intent
# it defers with a zero wait is not taken again in the same drain, however
# coarse the clock.
JUST_BEFORE = 1e-6

#: A drain claims about this many seconds of its own work at once (at least
#: ``concurrency * 4`` and 16 intents, at most 256): one durable claim commit
#: serves more sends when sends are quick, while a claimed intent still waits
#: for its send far less than a lease lasts (and the flow renews a lease that
#: has run half out before it sends).
BATCH_SECONDS = 0.25
MOST_CLAIMED = 256

#: Seconds an intent a drain cannot send (its profile unknown to the drain's
#: client, or the credentials of its own call not supplied) waits, handed back
#: pending, before any drain takes it again. Later than the drain's start, so a
#: one-shot drain ends (it takes only what was due when it began); soon enough
#: that a drain restarted with the right configuration sends it within the
#: minute. A ``forever`` drain says so again each time it takes it, at most once
#: a minute an intent.
UNSENDABLE_WAIT = 60.0

#: Seconds the first due intent of another sender must have waited, claimed by
#: no drain, before the census calls that sender orphaned: ten runs of a drain
#: scheduled every minute (see schedule-drain.md), so a sender whose drain runs
#: is never called so, while one whose last process is gone (a token refreshed
#: at start-up, a rotated key, a rename) is named with the call that adopts it.
ORPHANED_AFTER = 600.0


class Unsendable(PostonceError):
    """A claimed intent this drain's client cannot send: handed back due later, and counted.

    Raised by a drain's flow once the claim is released; the drain counts it
    as ``unsendable`` (its report is not ``ok``) and never lets it out.
    """


def unsendable(why: PostonceError, reference: str, key: str) -> Unsendable:
    """The Unsendable for a claim handed back because of ``why``; said in the log, once."""
    exc = Unsendable(
        f"cannot be sent by this client ({why.message}); handed back, due again in "
        f"{UNSENDABLE_WAIT:g} s",
        intent=reference,
        key=key,
    )
    logger.warning("drain: %s", exc, extra={"intent": reference, "key": key})
    return exc


class ForeignSender(BaseModel):
    """Due intents this drain may not send, of one sender and origin (``DrainReport``)."""

    model_config = ConfigDict(frozen=True)

    sender: str | None  # its sender identity (None: written before identities were kept)
    origin: str | None  # the scheme://host:port they are addressed to
    due: int
    waiting_since: float | None = None  # when the first of them fell due; none claimed since
    orphaned: bool = False  # to this client's origins, unclaimed for ORPHANED_AFTER: adopt?


class DrainReport(BaseModel):
    """What one ``drain()`` did.

    ``ok`` is False when anything failed, expired, was left indeterminate or
    broke, an intent could not be sent by this client (``unsendable``), a
    settlement handler or reconciler failed, or a settlement of this client's
    is still owed after its handler raised. Due intents of another
    client (``not_ours``, whose: ``foreign_senders``) are not this drain's to
    send: they leave ``ok`` as it is, and the ``postonce drain`` command says
    so with an exit status of its own.
    """

    model_config = ConfigDict(frozen=True)

    claimed: int = 0  # intents leased by this drain
    sent: int = 0  # HTTP sends made
    succeeded: int = 0
    failed: int = 0  # final non-2xx answers and key mismatches
    expired: int = 0  # horizon or deadline passed with delivery ambiguous: reconcile
    indeterminate: int = 0  # an answer that left the effect unknown (a stored 5xx): reconcile
    cancelled: int = 0  # deadline passed, never delivered
    pending: int = 0  # left pending with a later due time
    # Claims handed back unsent: their origin asked for a pause (429/503 Retry-After),
    # or their rate slot came after their lease would end (due at the slot instead).
    paused: int = 0
    replayed: int = 0  # answers the server marked as replays
    errors: int = 0  # claims that ended in an unexpected error (logged)
    unsendable: int = 0  # claims this client cannot send (an unknown profile, missing credentials):
    # handed back pending, due UNSENDABLE_WAIT later (logged)
    settled: int = 0  # settlement handler calls that returned
    settle_failed: int = 0  # handler calls that raised, or whose result the outbox did not take
    reconciled: int = 0  # expired or indeterminate intents the reconciler resolved
    reconcile_failed: int = 0  # reconciler calls that raised, answered no Resolution, or went
    # unrecorded (the outbox failed): each is asked again after reconcile_every
    # -- counted at the end (the census), of the whole outbox:
    settle_failing: int = 0  # this client's settlements still owed after their handler raised
    not_ours: int = 0  # due intents of another sender or origin, left alone
    foreign_senders: tuple[ForeignSender, ...] = ()  # whose those are, most first
    unowned: int = 0  # due intents of no sender to this client's origins: its next pass adopts
    in_flight_elsewhere: int = 0  # this sender's intents another owner holds a live lease on
    next_lease_expiry: float | None = None  # when the first of those leases runs out
    # -- who drained what:
    sender: str | None = None  # this client's sender identity
    origins: tuple[str, ...] = ()  # the origins this client sends to
    outbox: str | None = None  # the outbox drained: an absolute path, or a URL without password
    duration: float = 0.0  # seconds

    @property
    def ok(self) -> bool:
        return (
            self.failed == 0
            and self.expired == 0
            and self.indeterminate == 0
            and self.errors == 0
            and self.unsendable == 0
            and self.settle_failed == 0
            and self.reconcile_failed == 0
            and self.settle_failing == 0
        )

    @property
    def handlers_failing(self) -> bool:
        """Whether a settlement handler or reconciler failed, or a settlement stays owed so."""
        return bool(self.settle_failed or self.reconcile_failed or self.settle_failing)


@dataclass
class Tally:
    """A thread-safe running count, frozen into a DrainReport at the end."""

    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def adder(self, name: str) -> Callable[[], None]:
        """A function that counts one ``name`` (for a flow to call when it happens)."""
        return functools.partial(self.add, name)

    def aftercare_failed(
        self, name: str, doing: str, record: IntentRecord | None, exc: BaseException
    ) -> None:
        """One reconciliation or settlement step failed: logged, counted as ``name``, skipped.

        It is tried again in a later pass (a claim's hold runs out); the
        drain goes on with the others.
        """
        self.add(name)
        about = "" if record is None else f" for intent {record.reference!r}"
        extra = {} if record is None else {"intent": record.reference, "key": record.key}
        logger.warning(
            "drain: %s%s failed (%s: %s); it is tried again in a later pass",
            doing,
            about,
            type(exc).__name__,
            exc,
            # A postonce error says what it is; anything else is a bug worth its traceback.
            exc_info=None if isinstance(exc, PostonceError) else exc,
            extra=extra,
        )

    def report(self, duration: float) -> DrainReport:
        with self.lock:
            return DrainReport(duration=duration, **self.counts)


#: What a turn tells its drain's pace of an answer: its status and headers.
Heard = Callable[[int, Mapping[str, str]], None]


class Turn:
    """One flow's turn to send: its send is counted, and the turn given back once it is over.

    Given back once: when the send is over, or when the flow ends without one.
    """

    __slots__ = ("_give_back", "_heard", "_tally")

    def __init__(
        self, give_back: Callable[[], None], tally: Tally, heard: Heard | None = None
    ) -> None:
        self._give_back: Callable[[], None] | None = give_back
        self._tally = tally
        self._heard = heard

    def sending(self) -> None:
        self._tally.add("sent")

    def answered(self, status: int, headers: Mapping[str, str]) -> None:
        """The send's answer arrived: the drain's pace hears it (a 429 may pause its origin)."""
        if self._heard is not None:
            self._heard(status, headers)

    def end(self) -> None:
        give_back, self._give_back = self._give_back, None
        if give_back is not None:
            give_back()


class Turns:
    """At most ``limit`` flows between their start and the end of their send.

    A drain on a remote store runs one flow more than it sends (see
    :func:`flows_for`): a flow that has sent gives its turn back and records
    its answer while the next flow takes the turn and sends. A flow takes its
    turn *before* it starts, so its deadline, horizon and lease are checked
    after any wait for the turn, right before its send.
    """

    def __init__(self, limit: int, tally: Tally) -> None:
        # One token a turn, in a queue of C: a threading.Semaphore is Python
        # (a Condition), two of whose calls every drained intent would make.
        self._free: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(limit):
            self._free.put(None)
        self._give_back = functools.partial(self._free.put, None)
        self._tally = tally

    def take(self, heard: Heard | None = None) -> Turn:
        self._free.get()
        return Turn(self._give_back, self._tally, heard)


class AsyncTurns:
    """:class:`Turns` for tasks."""

    def __init__(self, limit: int, tally: Tally) -> None:
        self._free = anyio.Semaphore(limit)
        self._tally = tally

    async def take(self, heard: Heard | None = None) -> Turn:
        await self._free.acquire()
        return Turn(self._free.release, self._tally, heard)


def flows_for(store: object, concurrency: int) -> int:
    """How many intents a drain works on at once: one more than it sends, if records wait.

    A remote store's record (PostgreSQL) waits on a round trip; the extra flow
    commits one intent's record while the next one's request is on the wire,
    and :class:`Turns` keep the sends at ``concurrency``. A local store's
    record (SQLite) has no wait to overlap: an extra thread would only contend.
    """
    return concurrency + 1 if getattr(store, "remote", False) else concurrency


def outbox_name(store: object) -> str | None:
    """The outbox a store opened, for a report: an absolute path, or a URL without password."""
    store = getattr(store, "store", store)  # a StoreThread: the store it serves
    path = getattr(store, "path", None)
    if isinstance(path, str | os.PathLike):
        return os.path.abspath(os.fspath(path))
    url = getattr(store, "url", None)
    if isinstance(url, str):
        return without_password(url, getattr(store, "schema", None))
    return None if store is None else type(store).__name__


def without_password(url: str, schema: str | None = None) -> str:
    """A PostgreSQL URL fit to print: no password (in the userinfo or the query), its schema."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"]
    if schema is not None and schema != "postonce":
        query.append(("schema", schema))
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, quote_via=quote)))


#: The attribute that marks the log record of :func:`foreign_message`.
FOREIGN_MARK = "postonce_foreign"

# ``sender_identity``'s default: the provider's name and 16 hex digits of a hash of credentials.
_DERIVED = re.compile(r"(?P<provider>.+)#[0-9a-f]{16}")


def describe_sender(sender: str | None) -> str:
    """A sender identity in words a person can match to a client's configuration."""
    if sender is None:
        return "no sender (unowned: written by a release from before sender identities)"
    derived = _DERIVED.fullmatch(sender)
    if derived is not None:
        return (
            f"sender {sender!r} (provider {derived['provider']!r}, no name=: "
            "a hash of the client's credentials)"
        )
    return f"sender {sender!r} (name={sender!r})"


def foreign_message(report: DrainReport) -> str:
    """Why a drain left due intents, whose they are, and the way out (for the log and the CLI)."""
    mine = report.origins
    lines = [
        f"{report.not_ours} due intent(s) in {report.outbox or 'the outbox'} were not sent: a "
        "client sends only its own sender's intents, to its own origins (its credentials "
        f"are for those alone). This client is {describe_sender(report.sender)}, sending to "
        f"{', '.join(mine) if mine else 'no origin'}. Left:"
    ]
    shown = 0
    others: list[str] = []
    for group in report.foreign_senders:
        shown += group.due
        if group.sender is not None and group.sender == report.sender:
            lines.append(
                f"  {group.due} of this client's sender to {group.origin}, outside its origins"
            )
        elif group.sender is None:
            lines.append(
                f"  {group.due} unowned (no sender: written by a release from before sender "
                f"identities) to {group.origin or 'an origin not read yet'}: the next drain of "
                "a client sending there adopts them"
            )
        else:
            lines.append(f"  {group.due} of {describe_sender(group.sender)} to {group.origin}")
            if group.origin in mine and not group.orphaned:
                others.append(repr(group.sender))
    if shown < report.not_ours:
        lines.append(f"  {report.not_ours - shown} more of other senders")
    lines.append(
        "The way out: drain them with the client that wrote them (postonce drain --app "
        "MODULE:CLIENT, configured with its name=, or with no name= its provider and "
        "credentials, and its base_url=/origins=)."
    )
    lines += orphan_lines(report.foreign_senders)
    if others:
        lines.append(
            f"If {' or '.join(others)} is this client under an old name= or old credentials "
            "(a key rotation), client.adopt(THAT_SENDER) makes its intents this client's."
        )
    lines.append("If another client's drain sends them, postonce drain --accept-foreign says so.")
    return "\n".join(lines)


def orphan_lines(groups: Collection[ForeignSender]) -> list[str]:
    """What to say of orphaned senders: how long they waited, and the one call that adopts them."""
    lines = []
    for group in groups:
        if not group.orphaned or group.waiting_since is None:
            continue
        since = datetime.fromtimestamp(group.waiting_since, timezone.utc)
        lines.append(
            f"Sender {group.sender!r} looks orphaned: its {group.due} due intent(s) to "
            f"{group.origin} have waited since {since.isoformat(timespec='seconds')} with no "
            "drain of that sender claiming them. If it is this client under an old name= or "
            "old credentials (a token fetched at start-up, a rotated key), adopt them: "
            f"client.adopt({group.sender!r}), or postonce drain --app MODULE:CLIENT --adopt "
            f"{group.sender!r}. Never adopt another service's: this client's credentials "
            "would send them."
        )
    return lines


def orphaned(group: Foreign, sender: str, origins: Collection[str], at: float | None) -> bool:
    """Whether another sender's due intents to this client's origins wait with no drain for them.

    Orphaned: none claimed for ORPHANED_AFTER seconds since the first fell due
    (a running drain of that sender takes them within its interval).
    """
    return (
        group.sender is not None
        and group.sender != sender
        and group.origin in origins
        and group.waiting_since is not None
        and at is not None
        and group.waiting_since <= at - ORPHANED_AFTER
    )


def note_census(
    report: DrainReport,
    census: Census | Exception,
    sender: str,
    origins: Collection[str] | None = None,
    outbox: str | None = None,
) -> DrainReport:
    """The report with what the drain left, and why: counted, and said in the log.

    ``sender`` and ``origins`` are this client's; ``outbox`` names the store drained.
    """
    report = report.model_copy(
        update={"sender": sender, "origins": tuple(sorted(origins or ())), "outbox": outbox}
    )
    if isinstance(census, Exception):
        logger.warning("drain: could not count what it left (%s)", census)
        return report
    report = report.model_copy(
        update={
            "not_ours": census.not_ours,
            "foreign_senders": tuple(
                ForeignSender(
                    sender=f.sender,
                    origin=f.origin,
                    due=f.due,
                    waiting_since=f.waiting_since,
                    orphaned=orphaned(f, sender, origins or (), census.at),
                )
                for f in census.foreign
            ),
            "unowned": census.unowned,
            "in_flight_elsewhere": census.in_flight_elsewhere,
            "next_lease_expiry": census.next_lease_expiry,
            "settle_failing": census.settle_failing,
        }
    )
    if census.not_ours:
        # Marked, so that the postonce command, which says it at the end, does not say it twice.
        logger.warning("drain: %s", foreign_message(report), extra={FOREIGN_MARK: True})
    if census.settle_failing:
        logger.warning(
            "drain: %d settlements of this client are still owed after their handler raised; "
            "postonce outbox list shows why (settlement), and each is retried with backoff",
            census.settle_failing,
        )
    if census.unowned:
        logger.info(
            "drain: %d due intents of no sender (written by an older release since this drain's "
            "last pass) are addressed to this client's origins: its next pass adopts them",
            census.unowned,
        )
    if census.in_flight_elsewhere:
        logger.info(
            "drain: %d intents are in flight elsewhere (leased by another owner until %s at the "
            "earliest)",
            census.in_flight_elsewhere,
            census.next_lease_expiry,
        )
    return report


def count_outcome(tally: Tally, outcome: object) -> None:
    """Count how one claimed intent's flow ended: its response, or what it raised."""
    if isinstance(outcome, Unsendable):
        tally.add("unsendable")  # said by the flow, once
    elif isinstance(outcome, IntentPending):
        tally.add("pending")
    elif isinstance(outcome, IntentExpired):
        tally.add("expired")
    elif isinstance(outcome, IntentIndeterminate):
        tally.add("indeterminate")
    elif isinstance(outcome, IntentCancelled):
        tally.add("cancelled")
    elif isinstance(outcome, IdempotencyKeyMismatch):
        tally.add("failed")
    elif isinstance(outcome, BaseException):
        logger.error("drain: an intent ended in an unexpected error", exc_info=outcome)
        tally.add("errors")
    else:
        info = getattr(outcome, "extensions", {}).get("postonce")
        tally.add("succeeded" if info is not None and info.state is State.SUCCEEDED else "failed")
        if info is not None and info.replayed:
            tally.add("replayed")


def claim_failed(tally: Tally, *, forever: bool, interval: float) -> None:
    """A claim failed (the database went away): a one-shot drain raises, a worker goes on.

    Call from inside the ``except OutboxError`` block; a worker then waits
    ``interval`` and tries again.
    """
    if not forever:
        raise  # the OutboxError being handled by the caller
    logger.exception("drain: cannot claim due intents; retrying in %ss", interval)
    tally.add("errors")


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT ask the drain to stop after the attempts in flight.

    Only the main thread may install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        logger.info(
            "drain: %s received, stopping after the attempts in flight", signal.Signals(signum).name
        )
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def least_batch(concurrency: int) -> int:
    """The fewest a drain claims at once: ``concurrency * 4`` and 16, at most MOST_CLAIMED."""
    return min(max(16, concurrency * 4), MOST_CLAIMED)


def next_batch(batch: int, done: int, seconds: float, least: int) -> int:
    """How many to claim next: what the drain finished in BATCH_SECONDS at this pass's pace.

    Only a full batch measures the pace (a short one was the backlog's end);
    the batch grows at most fourfold a pass and never below ``least``.
    """
    if done < batch or seconds <= 0:
        return batch
    paced = int(done / seconds * BATCH_SECONDS)
    return max(least, min(paced, batch * 4, MOST_CLAIMED))


#: A rate slot closer than this to the end of its claim's lease is not waited for.
SLOT_MARGIN = 1.0


def slot_after_lease(opened: Opened, now: float, wait: float) -> bool:
    """Whether a claim's rate slot, ``wait`` s from ``now``, comes too late for its lease.

    Waiting would let the lease run out, and another drain could claim the intent
    meanwhile: at a low rate, a batch's tail is handed back, due at its slot.
    """
    lease = opened.lease
    return wait > 0 and lease is not None and now + wait > lease.expires_at - SLOT_MARGIN


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds``; a stop ends the wait early (the claim goes back once its turn is taken)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class TakeTurn:
    """Take a turn to send (waiting for one), telling its answers to ``heard``."""

    heard: Heard | None


@dataclass(frozen=True, slots=True)
class HandBack:
    """Release the claim unsent, due at ``due_at`` (None: as it was), counted as ``counted``."""

    due_at: float | None
    counted: str


@dataclass(frozen=True, slots=True)
class Proceed:
    """Run the intent's flow in the turn taken: it sends, or finds why not."""


ClaimStep = Pause | TakeTurn | HandBack | Proceed


def claim_steps(
    opened: Opened, pace: Pace, clock: Callable[[], float], stopping: Callable[[], bool]
) -> Generator[ClaimStep, None, None]:
    """The steps a drain takes with one claimed intent, for either drain to perform.

    Its origin's rate slot first: a slot past the claim's lease hands it back
    due then, any other is waited for. Then the turn to send (the shell gives
    it back when the steps end). A flow that waited for its turn past its slot
    keeps its send one spacing after the last (no burst after a stall). Looked
    at once the turn is taken, right before the send: a pause a 429 set while
    the flow waited holds it back too, and so does a stopping drain.
    """
    origin = pace_origin(opened.record)
    wait = pace.slot(origin)  # (0 for a paused origin: no wait; it goes back after its turn)
    if slot_after_lease(opened, clock(), wait):
        yield HandBack(clock() + wait, "paused")
        return
    if wait > 0:
        yield Pause(wait)
    yield TakeTurn(pace.hearing(origin))
    gap = pace.gap(origin)
    if gap > 0:
        yield Pause(gap)
    until = pace.paused_until(origin)
    if until is not None:
        yield HandBack(until, "paused")
    elif stopping():
        yield HandBack(None, "pending")
    else:
        yield Proceed()


def run_drain(
    *,
    claim: Callable[[float, int, frozenset[str]], list[Opened]],
    process: Callable[[Opened, Turn], None],
    release: Callable[[Opened, float | None], None],
    clock: Callable[[], float],
    tally: Tally,
    forever: bool,
    interval: float,
    concurrency: int,
    flows: int,
    stop: threading.Event,
    pace: Pace,
    closed: Callable[[], bool] = lambda: False,
    progress: Callable[[DrainReport], None] | None = None,
    aftercare: Callable[[], None] | None = None,
    idle: Callable[[float], object] | None = None,
) -> DrainReport:
    """Claim and process batches of due intents until none is due (or until stopped).

    ``claim(due_by, limit, paused)`` leases due intents, none to a ``paused``
    origin; ``process(opened, turn)``
    sends one claimed intent in its ``turn`` and counts its outcome; ``flows``
    of them run at once (see :func:`flows_for`), at most ``concurrency`` of
    those between their start and their send's end.
    ``release(opened, due_at)`` hands back a claim that will not be sent:
    due as it was (``due_at`` None) because the drain is stopping (``stop`` is
    set, or ``closed()`` says its client is), or due when its origin's pause
    ends (``pace``, which also spaces sends at its rate). Without
    ``forever``, only intents due when the drain started
    are taken, so each is sent at most once. ``aftercare`` (reconciliation,
    settlements) runs whenever nothing is due; then a ``forever`` drain waits
    ``idle(interval)`` (default ``stop.wait``; on PostgreSQL, ended early by an
    enqueued intent's commit).
    """
    drain = _Drain(
        claim,
        process,
        release,
        clock,
        tally,
        forever,
        interval,
        concurrency,
        stop,
        closed,
        progress,
        pace,
    )
    # Each flow runs in a copy of the caller's context; one flow runs in the caller's thread.
    with ThreadPoolExecutor(max_workers=flows, thread_name_prefix="postonce-drain") as pool:
        while not drain.stopping():
            passed = time.monotonic()
            claimed = drain.claim_more()
            if claimed is None:
                continue
            if not claimed:
                if aftercare is not None:
                    aftercare()
                if not forever:
                    break
                (idle or stop.wait)(interval)
                continue
            # (Claiming the next batch while this one's last sends run was tried:
            # slower on a CPU-bound drain, so batches stay simple.)
            if flows == 1:
                for opened in claimed:
                    drain.one(opened)
            else:
                list(pool.map(drain.work, [iter(claimed)] * min(flows, len(claimed))))
            drain.batch = next_batch(
                drain.batch, len(claimed), time.monotonic() - passed, drain.least
            )
    return tally.report(time.monotonic() - drain.began)


class _Drain:
    """One :func:`run_drain`: its claims, and the steps each claimed intent takes."""

    def __init__(
        self,
        claim: Callable[[float, int, frozenset[str]], list[Opened]],
        process: Callable[[Opened, Turn], None],
        release: Callable[[Opened, float | None], None],
        clock: Callable[[], float],
        tally: Tally,
        forever: bool,
        interval: float,
        concurrency: int,
        stop: threading.Event,
        closed: Callable[[], bool],
        progress: Callable[[DrainReport], None] | None,
        pace: Pace,
    ) -> None:
        self.claim, self.process, self.release, self.pace = claim, process, release, pace
        self.clock, self.tally, self.forever, self.interval = clock, tally, forever, interval
        self.stop, self.closed, self.progress = stop, closed, progress
        self.started = clock()
        self.began = time.monotonic()
        # Claims are durable commits: take enough at once that one commit serves many
        # sends (see BATCH_SECONDS). The flow renews a lease that has run half out
        # before it sends.
        self.least = self.batch = least_batch(concurrency)
        self.turns = Turns(concurrency, tally)
        self.caller = contextvars.copy_context()
        self.taking = threading.Lock()
        self.broken: list[BaseException] = []

    def stopping(self) -> bool:
        return self.stop.is_set() or self.closed()

    def one(self, opened: Opened) -> None:
        """Send one claimed intent in its turn, or hand it back (see :func:`claim_steps`)."""
        turn: Turn | None = None
        try:
            for step in claim_steps(opened, self.pace, self.clock, self.stopping):
                if isinstance(step, Pause):
                    self.stop.wait(step.seconds)
                elif isinstance(step, TakeTurn):
                    turn = self.turns.take(step.heard)
                elif isinstance(step, HandBack):
                    self.hand_back(opened, step.due_at, step.counted)
                else:
                    assert turn is not None
                    self.process(opened, turn)
        finally:
            if turn is not None:
                turn.end()

    def hand_back(self, opened: Opened, due_at: float | None, counted: str) -> None:
        """Release a claim unsent, counted as ``counted``; an outbox failure leaves the lease
        to run out (the intent is claimed again then) and is counted, never raised."""
        try:
            self.release(opened, due_at)
        except OutboxError as exc:
            logger.warning(
                "drain: handing back %r failed (%s); it is claimed again when its lease runs out",
                opened.record.reference,
                exc,
            )
            self.tally.add("errors")
            return
        self.tally.add(counted)

    def work(self, claimed: Iterator[Opened]) -> None:
        """One of ``flows`` workers: the next claimed intent until none is left.

        (Not a future per intent: each is a Condition, and its result a wait.)
        Once a flow raises what ``process`` does not catch (SystemExit, say),
        no worker starts another: the intents not started stay claimed, as
        the futures not started were cancelled, and the drain raises it.
        """
        while True:
            with self.taking:
                opened = None if self.broken else next(claimed, None)
            if opened is None:
                return
            try:
                self.caller.copy().run(self.one, opened)
            except BaseException as exc:
                self.broken.append(exc)
                raise

    def claim_more(self) -> list[Opened] | None:
        """The next claims; None when the claim failed (logged, counted, waited out)."""
        due_by = self.clock() if self.forever else self.started - JUST_BEFORE
        try:
            claimed = self.claim(due_by, self.batch, self.pace.paused())
        except OutboxError:
            claim_failed(self.tally, forever=self.forever, interval=self.interval)
            self.stop.wait(self.interval)
            return None
        if claimed:
            self.tally.add("claimed", len(claimed))
            if self.progress is not None:
                self.progress(self.tally.report(time.monotonic() - self.began))
        return claimed
