"""The life of one ``request_once`` call, as a generator of I/O requests.

:func:`run` decides everything and performs no I/O. It yields effects — a
store call, a send, a sleep — and is resumed with each result (or has the
effect's exception thrown into it). A shell drives it in a short loop:
``Client`` with blocking calls, an async client with awaits. So the order of
durable writes and sends, which is what makes the guarantees hold, is written
down once, here.

The order, in short: the write-ahead (``open_intent``) commits the intent
and its lease before the first send; each attempt is recorded, fenced by the
lease token, before the next step is taken; the horizon gate runs before every
send that may reach a server that has seen the key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import httpx

from ._budget import RetryBudget
from ._classify import classify_exception, classify_response, is_replay
from ._diff import conflict_with
from ._engine import CLOCK_TOLERANCE, Budget, Step, StepKind, decide, gate, over_budget
from ._exceptions import (
    IdempotencyKeyMismatch,
    IntentCancelled,
    IntentConflict,
    IntentError,
    IntentExpired,
    IntentIndeterminate,
    IntentPending,
    IntentPurged,
    IntentResolved,
    OutboxError,
)
from ._intent import (
    TERMINAL,
    UNRESOLVED,
    AttemptRecord,
    IntentInfo,
    IntentRecord,
    Lease,
    NewIntent,
    Opened,
    Outcome,
    State,
    storable_response,
)
from ._observe import (
    AttemptDetail,
    EndDetail,
    ExpiryDetail,
    GiveUpDetail,
    Hooks,
    ReplayDetail,
    RetryDetail,
    StartDetail,
    emit,
)
from ._policy import RetryPolicy
from ._redirects import expect_answer
from ._watch import Watch, watched
from ._wire import parsed_url, wire_headers
from .providers import Provider

__all__ = [
    "Abandoned",
    "Callback",
    "Effect",
    "Send",
    "Sender",
    "Sleep",
    "StoreCall",
    "from_outbox",
    "run",
    "send_claimed",
    "settle_hold_for",
]

logger = logging.getLogger("postonce")


class StoreCall(NamedTuple):
    """Call ``store.<method>(**kwargs)``; resume with its result once it has committed.

    Every call is waited for, the record of a 2xx answer included: an answer
    ``post_once`` returns is an answer the outbox keeps, through a crash of the
    process (a provider that answers a completed key with 409 forever could not
    repair a lost record).
    """

    method: str
    kwargs: dict[str, Any]

    def on(self, store: Any) -> Any:
        """Perform this call on ``store`` (a shell's blocking path)."""
        return getattr(store, self.method)(**self.kwargs)


class Send(NamedTuple):
    """Send ``request`` and read the whole answer; resume with the ``httpx.Response``.

    ``lease`` is held for the send: a shell's heartbeat renews it while the
    request is in flight, so a slow but live send is never taken over.
    """

    request: httpx.Request
    lease: Lease | None = None


class Sleep(NamedTuple):
    seconds: float


@dataclass(frozen=True, slots=True)
class Sender:
    """How this process sends: the profile, the policy, its identity and its secrets."""

    provider: Provider
    policy: RetryPolicy
    owner: str
    lease_seconds: float
    clock: Callable[[], float]
    build_request: Callable[..., httpx.Request]
    timeout: Any  # an httpx timeout, or httpx's USE_CLIENT_DEFAULT
    secret_headers: tuple[tuple[str, str], ...] = ()  # memory only, never stored
    hooks: tuple[Hooks, ...] = ()
    retry_budget: RetryBudget | None = None  # client-wide; charged by foreground retries
    lib: ModuleType = httpx  # httpx, or httpx2 when the caller's client is httpx2's
    #: The client runs a settlement handler: an intent it ends owes a settlement,
    #: held this many seconds by this process before a drain may take it over.
    settle_hold: float | None = None
    #: The client has a reconciler: an expired or indeterminate ending owes no
    #: settlement yet; the reconciler's resolution owes the one settlement.
    reconciles: bool = False


def settle_hold_for(sender: Sender, state: State) -> float | None:
    """The settlement hold of an ending in ``state`` (None: no settlement is owed now).

    With a reconciler, an unresolved ending waits for it: the handler hears
    of the intent once, with the state the reconciler found.
    """
    if sender.reconciles and state in UNRESOLVED:
        return None
    return sender.settle_hold


class Callback(NamedTuple):
    """Call the application's ``fn(arg)`` (awaited if it is a coroutine); resume with the result.

    A settlement handler or a reconciler: it raises into the flow like any effect.
    """

    fn: Callable[[Any], Any]
    arg: Any


Effect = StoreCall | Send | Sleep | Callback


def _annotate(response: httpx.Response, info: IntentInfo) -> httpx.Response:
    response.extensions["postonce"] = info
    return response


def from_outbox(record: IntentRecord, lib: ModuleType = httpx) -> httpx.Response:
    """The stored answer of a terminal intent, or the error that stands for it.

    ``lib`` is the HTTP library whose Response to build: httpx or httpx2. An
    error raised here says ``from_outbox``: the intent ended before this call.
    """
    try:
        return _stored_answer(record, lib)
    except IntentError as exc:
        exc.from_outbox = True
        raise


def _stored_answer(record: IntentRecord, lib: ModuleType) -> httpx.Response:
    if record.purged_at is not None:
        raise IntentPurged(
            f"it finished as {record.state.value} and was purged; only its tombstone is left, "
            "and it is not executed again",
            reference=record.reference,
            key=record.key,
        )
    if record.state is State.EXPIRED:
        raise IntentExpired(
            record.note or "delivery was ambiguous past the retry horizon; reconcile it",
            reference=record.reference,
            key=record.key,
        )
    if record.state is State.CANCELLED:
        raise IntentCancelled(
            record.note or "the intent was cancelled", reference=record.reference, key=record.key
        )
    stored = record.response
    # An answer that left the effect unknown is never handed back as the result,
    # resolved or not: its status would read as a failure.
    indeterminate = record.last_outcome is Outcome.INDETERMINATE
    if stored is None or (indeterminate and record.state is not State.INDETERMINATE):
        ended = "its answer left the effect unknown" if indeterminate else "it expired"
        raise IntentResolved(
            f"{ended} and it was resolved as {record.state.value}"
            + (f": {record.note}" if record.note else "")
            + "; no answer of the provider's says so",
            reference=record.reference,
            key=record.key,
            state=record.state.value,
            note=record.note or "",
        )
    response: httpx.Response = lib.Response(
        stored.status,
        headers=list(stored.headers),
        content=stored.body,
        request=lib.Request(record.method, record.url),
    )
    info = IntentInfo(
        reference=record.reference,
        key=record.key,
        state=record.state,
        attempts=record.attempts,
        replayed=False,
        from_outbox=True,
        truncated=stored.truncated,
    )
    if record.last_outcome is Outcome.MISMATCH:
        raise IdempotencyKeyMismatch(
            "the server refused the key as used for another request",
            reference=record.reference,
            key=record.key,
            response=_annotate(response, info),
        )
    if record.state is State.INDETERMINATE:
        raise IntentIndeterminate(
            record.note or f"HTTP {stored.status} left the effect unknown; reconcile it",
            reference=record.reference,
            key=record.key,
            response=_annotate(response, info),
        )
    return _annotate(response, info)


def _stop(sender: Sender, step: Step, record: IntentRecord) -> Exception:
    if step.kind is StepKind.CANCEL:
        return IntentCancelled(step.reason, reference=record.reference, key=record.key)
    emit(sender.hooks, ExpiryDetail(record.reference, record.key, step.reason))
    return IntentExpired(step.reason, reference=record.reference, key=record.key)


def run(sender: Sender, new: NewIntent) -> Generator[Effect, Any, httpx.Response]:
    """Drive one intent to a final answer, or to the error that says where it stands."""
    policy, clock = sender.policy, sender.clock
    ends_at = clock() + policy.timeout if policy.timeout is not None else None
    opened = yield from _write_ahead(sender, new, ends_at)
    if not isinstance(opened, Opened):
        return opened  # the intent had ended: its stored answer
    record = opened.record
    assert opened.lease is not None
    try:
        return (
            yield from send_claimed(
                sender,
                record,
                opened.lease,
                opened.anchor_before,
                ends_at=ends_at,
                foreground=True,
                key_given=new.key_given,
            )
        )
    except OutboxError as exc:
        # The intent is stored (the write-ahead committed): whatever the outbox
        # failed to record, the drain finishes it with the same key.
        raise IntentPending(
            f"the outbox failed after the intent was stored ({exc.message}); its last step may "
            "not be recorded, and nothing is lost: the drain finishes it with the same key",
            reference=record.reference,
            key=record.key,
        ) from exc


def _write_ahead(
    sender: Sender, new: NewIntent, ends_at: float | None
) -> Generator[Effect, Any, Opened | httpx.Response]:
    """Store the intent and take its lease; nothing is sent before this commit.

    Returns the claim, or the stored answer of an intent that had ended. A
    write-ahead that raised is tried once more before the caller is told
    anything: a commit whose acknowledgement was lost (the connection cut
    after the server committed) raises like one that failed, and only the
    outbox can tell them apart. The second try finds the row (on PostgreSQL
    its unique index waits for the first transaction to end) or writes it.
    """
    policy, clock = sender.policy, sender.clock
    polls = 0
    unconfirmed: OutboxError | None = None
    while True:
        try:
            opened: Opened = yield StoreCall(
                "open_intent",
                {
                    "new": new,
                    "owner": sender.owner,
                    "now": clock(),
                    "lease_for": sender.lease_seconds,
                },
            )
        except OutboxError as exc:
            if unconfirmed is None:
                unconfirmed = exc
                continue
            return (yield from _unconfirmed(sender, new, unconfirmed))
        record: IntentRecord = opened.record
        if opened.conflict is not None:
            raise IntentConflict(
                f"{opened.conflict}; nothing was sent", reference=record.reference, key=record.key
            )
        if opened.lease is not None:
            return opened
        if record.state in TERMINAL:
            return from_outbox(record, sender.lib)
        if unconfirmed is not None and _unsent_here(sender, record):
            raise _stored_unsent(record, unconfirmed) from unconfirmed
        # Another sender holds the lease: look again soon (it is usually about to
        # finish), then less often, until it finishes or its lease runs out.
        now = clock()
        lease_left = max(0.0, (record.lease_expires_at or now) - now)
        wait = min(lease_left, policy.in_flight_initial * 2.0**polls, policy.in_flight_max)
        polls += 1
        if ends_at is not None and now + wait > ends_at:
            raise IntentPending(
                "another worker is sending this intent",
                reference=record.reference,
                key=record.key,
                due_at=record.lease_expires_at,
            )
        yield Sleep(max(wait, 0.01))


def _unsent_here(sender: Sender, record: IntentRecord) -> bool:
    """Whether the stored intent is leased to this process and was never sent."""
    return (
        record.state is State.SENDING
        and record.lease_owner == sender.owner
        and record.attempts == 0
    )


def _stored_unsent(record: IntentRecord, error: OutboxError) -> IntentPending:
    return IntentPending(
        f"the outbox's acknowledgement of the write-ahead was lost ({error.message}), but the "
        "intent is stored and this call sent nothing: a drain sends it with its key once this "
        "process's lease runs out (due_at), or call again with the same intent= to resume it",
        reference=record.reference,
        key=record.key,
        due_at=record.lease_expires_at,
    )


def _unconfirmed(
    sender: Sender, new: NewIntent, error: OutboxError
) -> Generator[Effect, Any, httpx.Response]:
    """The write-ahead raised twice: say what a read of the outbox shows, and no more.

    Only a read showing no intent proves nothing was stored; an unreadable
    outbox proves nothing either way, and the caller is told so.
    """
    try:
        found: IntentRecord | None = yield StoreCall("get", {"reference": new.reference})
    except OutboxError:
        raise IntentPending(
            f"the outbox did not confirm the write-ahead ({error.message}) and cannot be read "
            "now: the intent may or may not be stored, and this call sent nothing; call again "
            "with the same intent= to find out (never with a new one)",
            reference=new.reference,
            key=new.key,
        ) from error
    if found is None:
        raise error  # confirmed: nothing was stored, nothing sent
    conflict = conflict_with(found, new)
    if conflict is not None:
        raise IntentConflict(
            f"{conflict}; nothing was sent", reference=found.reference, key=found.key
        )
    if found.state in TERMINAL:
        return from_outbox(found, sender.lib)
    if _unsent_here(sender, found):
        raise _stored_unsent(found, error) from error
    raise IntentPending(
        f"the outbox failed ({error.message}); the intent is stored (as {found.state.value}, "
        f"{found.attempts} attempt(s) so far) and this call sent nothing: the drain finishes it",
        reference=found.reference,
        key=found.key,
        due_at=found.due_at or found.lease_expires_at,
    ) from error


class Abandoned(BaseException):
    """Thrown into a flow whose caller is going away (a cancelled task, Ctrl-C).

    The flow answers with the store calls that leave its intent in its true
    state, then lets this propagate: a send that may have been written is
    recorded as ambiguous and the intent left pending; a claim that sent
    nothing is released without starting the horizon.
    """


@dataclass(slots=True)
class _Progress:
    """What a flow's clean-up must know: the lease, and whether a send is under way."""

    lease: Lease
    delivered_maybe: bool
    in_send: bool = False
    watch: Watch | None = None  # the body of the send under way: was it handed over?
    sent_at: float = 0.0
    attempts: int = 0  # the intent's attempt count so far
    key_given: bool = False  # the caller chose the key: it may be known to the server
    spent: int = 0  # retry-budget tokens this call has taken


def send_claimed(
    sender: Sender,
    record: IntentRecord,
    lease: Lease,
    anchor_before: float | None,
    *,
    ends_at: float | None,
    foreground: bool,
    key_given: bool = False,
) -> Generator[Effect, Any, httpx.Response]:
    """Send an intent whose lease we hold until it is final, deferred, or stopped.

    In the foreground, retries sleep within the caller's budget. In the drain
    (``foreground=False``) nothing sleeps: every retry becomes a due time.
    """
    progress = _Progress(
        lease=lease,
        delivered_maybe=anchor_before is not None,
        attempts=record.attempts,
        key_given=key_given,
    )
    clock = sender.clock
    observed = bool(sender.hooks)
    if observed:
        emit(
            sender.hooks,
            StartDetail(
                record.reference, record.key, sender.provider.name, record.attempts, not foreground
            ),
        )
    state: State | None = None
    error: str | None = None
    try:
        response = yield from _send_claimed(
            sender, record, progress, anchor_before, ends_at=ends_at, foreground=foreground
        )
        info = response.extensions.get("postonce")
        state = info.state if isinstance(info, IntentInfo) else None
        return response
    except BaseException as exc:
        error = type(exc).__name__
        state = _state_of(exc)
        if isinstance(exc, Abandoned):
            yield from _abandon(progress, record, clock, anchor_before)
        raise
    finally:
        if observed:
            emit(
                sender.hooks,
                EndDetail(
                    record.reference,
                    record.key,
                    state,
                    progress.attempts,
                    error,
                    sender.provider.name,  # the name, not the stored identity: a stable label
                    not foreground,
                ),
            )


def _state_of(exc: BaseException) -> State | None:
    """The state an error leaves its intent in, where the error says so."""
    if isinstance(exc, IntentExpired):
        return State.EXPIRED
    if isinstance(exc, IntentIndeterminate):
        return State.INDETERMINATE
    if isinstance(exc, IntentCancelled):
        return State.CANCELLED
    if isinstance(exc, IdempotencyKeyMismatch):
        return State.FAILED
    if isinstance(exc, IntentPending):
        return State.PENDING
    return None


def _abandon(
    progress: _Progress,
    record: IntentRecord,
    clock: Callable[[], float],
    anchor_before: float | None,
) -> Generator[Effect, Any, None]:
    """Leave an abandoned intent in its true state (see :class:`Abandoned`).

    A send stopped before the transport took its body (cancelled while waiting
    for a connection, say) sent nothing: released, not recorded as ambiguous,
    so it can still be cancelled.
    """
    unsent = progress.watch is not None and progress.watch.unread
    if progress.in_send and not unsent:
        yield _ambiguous_record(progress, record, clock, "Abandoned")
    else:
        anchor = record.first_delivery_at if progress.delivered_maybe else anchor_before
        yield StoreCall(
            "release",
            {"lease": progress.lease, "now": clock(), "due_at": clock(), "anchor": anchor},
        )


def _ambiguous_record(
    progress: _Progress, record: IntentRecord, clock: Callable[[], float], error: str
) -> StoreCall:
    """The record of a send that may have been written but ended without an answer."""
    return StoreCall(
        "record",
        {
            "lease": progress.lease,
            "attempt": AttemptRecord(
                progress.sent_at, clock() - progress.sent_at, Outcome.AMBIGUOUS, None, error, False
            ),
            "state": State.PENDING,
            "anchor": record.first_delivery_at,
            "due_at": clock(),
            "lease_until": None,
            "response": None,
            "note": None,
            "durable": False,
        },
    )


def _gate(sender: Sender, record: IntentRecord, anchor: float | None) -> Step | None:
    """Whether a send may go ahead (None), or the step that stops the intent instead."""
    return gate(
        sender.clock(),
        anchor=anchor,
        deadline_at=record.deadline_at,
        provider=sender.provider,
        policy=sender.policy,
    )


def _stopped(
    sender: Sender, record: IntentRecord, lease: Lease, stop: Step, *, foreground: bool
) -> Generator[Effect, Any, httpx.Response]:
    """Settle the intent as the gate's ``stop`` says, and raise its error.

    A refused settle means another worker took the intent over while this one
    stalled: its ending, not this stale one, is what the call is told.
    """
    settled = yield StoreCall(
        "settle",
        {
            "lease": lease,
            "now": sender.clock(),
            "state": stop.state,
            "note": stop.reason,
            "settle_hold": settle_hold_for(sender, stop.state),
        },
    )
    if not settled:
        return (yield from _taken_over(sender, record, None, None, foreground=foreground))
    raise _stop(sender, stop, record)


def _due_to_wait(sender: Sender, record: IntentRecord, *, foreground: bool) -> float | None:
    """The due time a foreground claim must wait for, or None when it may send now.

    A claim is due by definition in the drain; in the foreground, wait for a
    due time only while it is believable: one further off than any wait the
    policy could have asked for was written before the clock went back.
    Both bounds are read against one reading of the clock.
    """
    due_at = record.due_at
    if not foreground or due_at is None:
        return None
    policy, now = sender.policy, sender.clock()
    longest = max(policy.retry_after_max, policy.wait_max, policy.in_flight_max) + CLOCK_TOLERANCE
    return due_at if now < due_at <= now + longest else None


def _wait_until_due(
    sender: Sender,
    record: IntentRecord,
    progress: _Progress,
    anchor_before: float | None,
    due_at: float,
    *,
    ends_at: float | None,
) -> Generator[Effect, Any, bool]:
    """Sleep until ``due_at`` under a lease that lasts past it; False: another worker has it.

    The claim is handed back instead when the caller cannot wait that long. The
    lease is renewed to outlast the wait first: nothing renews a lease during a
    sleep, and a lease that ran out meanwhile would let a drain send before the
    due time the provider asked for (a ``Retry-After``).
    """
    clock = sender.clock
    if ends_at is not None and due_at > ends_at:
        yield StoreCall(
            "release",
            {"lease": progress.lease, "now": clock(), "due_at": due_at, "anchor": anchor_before},
        )
        raise IntentPending(
            "the intent is not due yet",
            reference=record.reference,
            key=record.key,
            due_at=due_at,
        )
    if not (yield from _renewed(sender, record, progress, due_at)):
        return False
    left = due_at - clock()  # the renewal took time: it may be due already
    if left > 0:
        yield Sleep(left)
    return True


def _renewed(
    sender: Sender, record: IntentRecord, progress: _Progress, after: float
) -> Generator[Effect, Any, bool]:
    """Renew the lease to ``lease_seconds`` past ``after``; False: another worker took it over.

    Before a send (see :func:`_renewal_due`), so a send never outlives its lease;
    and before a wait for a due time, so the lease outlasts the wait.
    """
    renewed = yield StoreCall(
        "renew",
        {"lease": progress.lease, "now": sender.clock(), "until": after + sender.lease_seconds},
    )
    if renewed is None:
        return False
    progress.lease = renewed
    return True


def _renewal_due(sender: Sender, lease: Lease) -> bool:
    """Whether less than half of the lease is left."""
    return lease.expires_at - sender.clock() < sender.lease_seconds / 2


def _kept_by_provider(sender: Sender, tried: _Tried, step: Step) -> bool:
    """Whether the provider answers any later send of the key as ``tried`` was answered.

    A 2xx is what every profile's provider stores for the key; a provider that
    stores and replays its 5xx answers (``server_errors="replayed"``: Stripe,
    the IETF draft) stores every answer it executed; a key-reuse answer stands
    for the other request the key was used with. Anything else (a decline under
    Checkout, which keeps only successes) may be executed anew by the next send.
    """
    if tried.response is None:
        return False
    if step.kind is StepKind.MISMATCH:
        return True
    return step.kind is StepKind.FINISH and (
        step.state is State.SUCCEEDED or sender.provider.server_errors == "replayed"
    )


def _taken_over(
    sender: Sender,
    record: IntentRecord,
    kept: _Tried | None,
    step: Step | None,
    *,
    foreground: bool,
) -> Generator[Effect, Any, httpx.Response]:
    """What a call whose lease another worker took over returns: only what is true.

    This process stalled past its lease (a frozen VM, a long pause, SIGSTOP) and
    its record was refused. The outbox's final answer, when it holds one, is the
    answer; else ``kept``, this attempt's answer where the provider answers every
    send of the key alike (see :func:`_kept_by_provider`); else IntentPending:
    the worker that holds the intent finishes it, and ``wait()`` hears how.
    """
    stored = yield StoreCall("get", {"reference": record.reference})
    if stored is not None and stored.state in TERMINAL:
        return from_outbox(stored, sender.lib)
    if kept is not None and step is not None:
        response = _conclude(sender, record, kept, step, foreground=foreground)
        assert response is not None  # a final answer or a key reuse: returned or raised
        return response
    raise IntentPending(
        "another worker took over this intent (this process stalled past its lease) and "
        "finishes it with the same key; wait() for its answer",
        reference=record.reference,
        key=record.key,
    )


class _Wire(NamedTuple):
    """What every attempt of one claim sends: computed once per claim, not per send."""

    url: Any  # the library's URL
    headers: list[tuple[str, str]]


class _Tried(NamedTuple):
    """One attempt, sent and classified."""

    number: int
    sent_at: float
    duration: float
    now: float  # when its outcome was known: the time every decision after it uses
    outcome: Outcome
    response: httpx.Response | None
    error: str | None  # the exception's type name, when it ended in one
    cause: Exception | None
    replayed: bool

    @property
    def status(self) -> int | None:
        return self.response.status_code if self.response is not None else None


def _send_once(
    sender: Sender, record: IntentRecord, progress: _Progress, wire: _Wire, number: int
) -> Generator[Effect, Any, _Tried]:
    """Send the intent once and say what the attempt tells about delivery."""
    clock = sender.clock
    built = sender.build_request(
        record.method, wire.url, content=record.body, headers=wire.headers, timeout=sender.timeout
    )
    request, watch = watched(sender.lib, built, record.body)
    arrived = expect_answer(request)
    # Only a key that may have reached the server before (or one the caller
    # chose, which postonce cannot know to be fresh) can have been reused.
    key_seen = progress.delivered_maybe or progress.key_given
    progress.sent_at = clock()
    progress.in_send = True
    progress.watch = watch
    try:
        response = yield Send(request, progress.lease)
    except sender.lib.TransportError as exc:
        outcome = classify_exception(exc, body_unread=watch.unread)
        return _tried_now(sender, progress, number, outcome, None, type(exc).__name__, exc)
    except Exception as exc:
        progress.in_send = False
        answer, arrived.response = arrived.response, None
        if answer is None:
            # Not a transport failure and no answer came (a request hook, a broken
            # transport): the request may have been written. Keep the intent for the drain.
            yield _ambiguous_record(progress, record, clock, type(exc).__name__)
            raise
        # The answer arrived, then a response hook of the application raised
        # (``raise_for_status``): the answer means what it says. It is kept like
        # any other answer, then the hook's error goes on to the caller unchanged.
        outcome = _answer_outcome(sender, answer, key_seen)
        tried = _tried_now(sender, progress, number, outcome, answer, None, None)
        yield from _keep_answer(sender, record, progress, tried)
        raise
    arrived.response = None  # the answer came back as a value; let it go with its request
    outcome = _answer_outcome(sender, response, key_seen)
    return _tried_now(sender, progress, number, outcome, response, None, None)


def _answer_outcome(sender: Sender, response: httpx.Response, key_seen: bool) -> Outcome:
    return classify_response(
        response.status_code,
        response.headers,
        response.content,
        sender.provider,
        key_seen=key_seen,
    )


def _tried_now(
    sender: Sender,
    progress: _Progress,
    number: int,
    outcome: Outcome,
    response: httpx.Response | None,
    error: str | None,
    cause: Exception | None,
) -> _Tried:
    """The attempt whose send began at ``progress.sent_at`` and ended now, as ``outcome``."""
    clock, sent_at = sender.clock, progress.sent_at
    progress.in_send = False
    duration = clock() - sent_at
    progress.delivered_maybe = progress.delivered_maybe or outcome is not Outcome.NOT_SENT
    replayed = response is not None and is_replay(response.headers, sender.provider)
    return _Tried(number, sent_at, duration, clock(), outcome, response, error, cause, replayed)


def _keep_answer(
    sender: Sender, record: IntentRecord, progress: _Progress, tried: _Tried
) -> Generator[Effect, Any, None]:
    """Record an answer a response hook raised on, as any answer is recorded.

    No foreground retry follows (the caller is about to get the hook's error):
    decided as the drain decides, a retryable answer becomes a due time.
    """
    step = _next_step(sender, record, progress, tried, None)
    _observe(sender, record, tried, step)
    yield _record(sender, record, progress, tried, step)


def _next_step(
    sender: Sender,
    record: IntentRecord,
    progress: _Progress,
    tried: _Tried,
    budget: Budget | None,
) -> Step:
    """The engine's decision after an attempt, held back by the client's retry budget."""
    anchor = record.first_delivery_at if progress.delivered_maybe else None
    response = tried.response
    step = decide(
        tried.outcome,
        status=tried.status,
        headers=response.headers if response is not None else sender.lib.Headers(),
        now=tried.now,
        attempt=tried.number,
        anchor=anchor,
        deadline_at=record.deadline_at,
        provider=sender.provider,
        policy=sender.policy,
        budget=budget,
    )
    progress.attempts = tried.number
    retry_budget = sender.retry_budget
    if retry_budget is not None:
        if step.kind is StepKind.RETRY:
            cost = retry_budget.withdraw(tried.outcome)
            if cost is None:
                step = over_budget(step)
            else:
                progress.spent += cost
        elif step.state is State.SUCCEEDED:
            retry_budget.deposit(progress.spent)
    return step


def _observe(sender: Sender, record: IntentRecord, tried: _Tried, step: Step) -> None:
    """Tell the hooks (and the debug log) about the attempt and any retry it scheduled."""
    if sender.hooks or logger.isEnabledFor(logging.DEBUG):
        emit(
            sender.hooks,
            AttemptDetail(
                intent=record.reference,
                key=record.key,
                provider=sender.provider.name,
                attempt=tried.number,
                outcome=tried.outcome,
                status=tried.status,
                error=tried.error,
                duration=tried.duration,
                replayed=tried.replayed,
                state=step.state,
            ),
        )
        if tried.replayed:
            assert tried.status is not None
            emit(
                sender.hooks, ReplayDetail(record.reference, record.key, tried.number, tried.status)
            )
    if step.kind is StepKind.RETRY or step.kind is StepKind.DEFER:
        assert step.due_at is not None
        emit(
            sender.hooks,
            RetryDetail(
                intent=record.reference,
                key=record.key,
                attempt=tried.number,
                wait=step.wait,
                due_at=step.due_at,
                in_foreground=step.kind is StepKind.RETRY,
                reason=step.reason or f"{tried.outcome.value} on attempt {tried.number}",
            ),
        )


def _record(
    sender: Sender, record: IntentRecord, progress: _Progress, tried: _Tried, step: Step
) -> StoreCall:
    """The store call that records an attempt and the state it leaves the intent in."""
    response = tried.response
    keeps_answer = step.kind in (StepKind.FINISH, StepKind.MISMATCH)
    retrying = step.kind is StepKind.RETRY
    lease_until = tried.now + step.wait + sender.lease_seconds if retrying else None
    # Every record commits before the flow goes on (a process crash loses none);
    # ``durable`` adds the fsync for power loss where a provider's replay could
    # not repair a lost one: a 2xx, a retry or a deferral can be asked again.
    durable = not (retrying or step.kind is StepKind.DEFER or step.state is State.SUCCEEDED)
    anchor = record.first_delivery_at if progress.delivered_maybe else None
    return StoreCall(
        "record",
        {
            "lease": progress.lease,
            "attempt": AttemptRecord(
                tried.sent_at,
                tried.duration,
                tried.outcome,
                tried.status,
                tried.error,
                tried.replayed,
            ),
            "state": step.state,
            # A retry keeps the claim's anchor: the next send may be delivered.
            "anchor": record.first_delivery_at if retrying else anchor,
            "due_at": step.due_at if step.kind is StepKind.DEFER else None,
            "lease_until": lease_until,
            "response": storable_response(
                response.status_code, response.headers.multi_items(), response.content
            )
            if keeps_answer and response is not None
            else None,
            "note": step.reason or None,
            "durable": durable,
            "settle_hold": settle_hold_for(sender, step.state),
        },
    )


def _conclude(
    sender: Sender,
    record: IntentRecord,
    tried: _Tried,
    step: Step,
    *,
    foreground: bool,
) -> httpx.Response | None:
    """The answer to return, or the error that says where the intent stands; None: retry."""
    response = tried.response
    info = IntentInfo(
        reference=record.reference,
        key=record.key,
        state=step.state,
        attempts=tried.number,
        replayed=tried.replayed,
        from_outbox=False,
    )
    if step.kind is StepKind.FINISH:
        assert response is not None
        if step.state is State.INDETERMINATE:
            # Said as loudly as an expiry: someone (or a reconciler) must find out.
            logger.warning(
                "intent %r (key %s) ended indeterminate: %s",
                record.reference,
                record.key,
                step.reason,
                extra={"intent": record.reference, "key": record.key, "outcome": "indeterminate"},
            )
            raise IntentIndeterminate(
                step.reason,
                reference=record.reference,
                key=record.key,
                response=_annotate(response, info),
            )
        return _annotate(response, info)
    if step.kind is StepKind.MISMATCH:
        assert response is not None
        raise IdempotencyKeyMismatch(
            f"{sender.provider.name} refused the key as used for another request "
            f"(HTTP {response.status_code}); it is never retried",
            reference=record.reference,
            key=record.key,
            response=_annotate(response, info),
        )
    if step.kind is StepKind.DEFER:
        why = (
            step.reason
            or f"not final after {tried.number} attempt(s) of its life "
            f"(last: {tried.outcome.value})"
        )
        if foreground:
            emit(
                sender.hooks,
                GiveUpDetail(record.reference, record.key, tried.number, step.due_at, why),
            )
        raise IntentPending(
            f"{why}; the intent is pending until its due time",
            reference=record.reference,
            key=record.key,
            due_at=step.due_at,
        ) from tried.cause
    if step.kind in (StepKind.EXPIRE, StepKind.CANCEL):
        raise _stop(sender, step, record) from tried.cause
    return None


def _send_claimed(
    sender: Sender,
    record: IntentRecord,
    progress: _Progress,
    anchor_before: float | None,
    *,
    ends_at: float | None,
    foreground: bool,
) -> Generator[Effect, Any, httpx.Response]:
    """Gate, send, decide, record, wait: until an attempt ends the call."""
    # The checks that mostly find nothing to do are plain calls; only a step
    # that must yield an effect runs as a generator.
    stop = _gate(sender, record, anchor_before)
    if stop is not None:
        return (yield from _stopped(sender, record, progress.lease, stop, foreground=foreground))
    due_at = _due_to_wait(sender, record, foreground=foreground)
    if due_at is not None and not (
        yield from _wait_until_due(sender, record, progress, anchor_before, due_at, ends_at=ends_at)
    ):
        return (yield from _taken_over(sender, record, None, None, foreground=foreground))
    wire = _Wire(
        url=parsed_url(sender.lib.URL, record.url),  # parsed once per process, not per send
        headers=wire_headers(record.headers, sender.secret_headers, record.key, sender.provider),
    )
    attempts_left = sender.policy.attempts
    number = record.attempts
    while True:
        number += 1
        # Checked again before every send: a sleep can overrun (a suspended
        # process, a clock that jumped) past the horizon or the deadline.
        anchor = record.first_delivery_at if progress.delivered_maybe else anchor_before
        stop = _gate(sender, record, anchor)
        if stop is not None:
            return (
                yield from _stopped(sender, record, progress.lease, stop, foreground=foreground)
            )
        if _renewal_due(sender, progress.lease) and not (
            yield from _renewed(sender, record, progress, sender.clock())
        ):
            return (yield from _taken_over(sender, record, None, None, foreground=foreground))
        tried = yield from _send_once(sender, record, progress, wire, number)
        # Waiting on an in-flight answer is not a retry: only the time budget bounds it.
        if tried.outcome is not Outcome.IN_PROGRESS:
            attempts_left -= 1
        budget = Budget(attempts_left=attempts_left, ends_at=ends_at) if foreground else None
        step = _next_step(sender, record, progress, tried, budget)
        _observe(sender, record, tried, step)
        recorded = yield _record(sender, record, progress, tried, step)
        if not recorded:  # this process stalled past its lease and another worker took over
            kept = tried if _kept_by_provider(sender, tried, step) else None
            return (yield from _taken_over(sender, record, kept, step, foreground=foreground))
        response = _conclude(sender, record, tried, step, foreground=foreground)
        if response is not None:
            return response
        lease = progress.lease
        progress.lease = Lease(
            lease.intent_id, lease.token, lease.owner, tried.now + step.wait + sender.lease_seconds
        )
        yield Sleep(step.wait)
