"""What postonce tells you while it works: typed hooks with frozen details, and logging.

Every event is logged to ``logging.getLogger("postonce")`` with structured
``extra`` fields (``intent``, ``key``, ``attempt``, ``outcome``, ``wait``), and
passed to the client's :class:`Hooks`. Hooks run on the caller's thread (or
event loop) right where the event happens, so keep them quick; an exception
from a hook is logged and never changes what postonce does.

``AsyncClient`` also takes coroutine functions (``async def``) as hooks and
awaits each one before its call goes on; ``Client`` refuses them when it is
built, since it could only drop the coroutine unawaited.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any

from ._exceptions import PostonceError
from ._intent import IntentInfo, Outcome, State

__all__ = [
    "AttemptDetail",
    "EndDetail",
    "ExpiryDetail",
    "GiveUpDetail",
    "Hooks",
    "OnceInfo",
    "Pending",
    "ReplayDetail",
    "RetryDetail",
    "SendDetail",
    "StartDetail",
    "await_hooks",
    "collect_awaitables",
    "coroutine_hooks",
    "drop_hooks",
    "emit",
    "info",
    "is_coroutine_function",
    "sending",
    "stop_collecting",
]

logger = logging.getLogger("postonce")


@dataclass(frozen=True, slots=True)
class StartDetail:
    """A foreground call or a drain holds an intent's lease and is about to send."""

    intent: str
    key: str
    provider: str
    attempts: int  # sends made before this call (earlier calls, earlier drains)
    drain: bool


@dataclass(frozen=True, slots=True)
class AttemptDetail:
    """One send ended, with this outcome and the state it led to."""

    intent: str
    key: str
    provider: str
    attempt: int  # 1 for the intent's first send, across calls and processes
    outcome: Outcome
    status: int | None  # None: no HTTP answer (timeout, connection error)
    error: str | None  # the exception's type name, when there was no answer
    duration: float  # seconds
    replayed: bool
    state: State


@dataclass(frozen=True, slots=True)
class ReplayDetail:
    """The provider answered with the stored result of an earlier send of this key."""

    intent: str
    key: str
    attempt: int
    status: int


@dataclass(frozen=True, slots=True)
class RetryDetail:
    """The same key will be sent again: in ``wait`` seconds here, or by the drain at ``due_at``."""

    intent: str
    key: str
    attempt: int  # the attempt that just ended
    wait: float
    due_at: float  # wall clock (Unix seconds)
    in_foreground: bool  # False: left to the drain
    reason: str


@dataclass(frozen=True, slots=True)
class GiveUpDetail:
    """The foreground call stopped before a final answer; the intent is pending for the drain."""

    intent: str
    key: str
    attempts: int
    due_at: float | None
    reason: str


@dataclass(frozen=True, slots=True)
class ExpiryDetail:
    """The provider may have forgotten the key (or the deadline passed): reconcile by hand."""

    intent: str
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class EndDetail:
    """The call that started with :class:`StartDetail` ended, however it ended."""

    intent: str
    key: str
    state: State | None  # None when it ended by an error before a state was recorded
    attempts: int  # the intent's sends so far, across calls and processes
    error: str | None  # the exception's type name, if it raised
    provider: str = ""
    drain: bool = False


@dataclass(frozen=True, slots=True)
class SendDetail:
    """One send of an intent is about to go out: what ``Hooks.around_send`` is given."""

    intent: str
    key: str
    number: int  # sends made by this call (or drain claim), this one included
    outbox_seconds: float  # outbox work since the previous send; for the first, the write-ahead


@dataclass(frozen=True, slots=True)
class OnceInfo:
    """What postonce says about the intent behind a response: ``postonce.info(response)``."""

    intent: str  # the caller's intent=, or the key when none was given
    key: str
    state: State
    attempts: int  # sends recorded for the intent, across every process
    replayed: bool  # the server marked this answer as a replay of an earlier one
    from_outbox: bool  # the answer was read from the outbox; nothing was sent now
    truncated: bool  # from the outbox, and longer than the outbox keeps


def info(response: Any) -> OnceInfo:
    """The typed record of the intent behind a response a ``*_once`` call returned.

    The same facts as ``response.extensions["postonce"]``, typed for mypy. Raises
    :class:`PostonceError` for a response that did not come from postonce.
    """
    raw = getattr(response, "extensions", {}).get("postonce")
    if not isinstance(raw, IntentInfo):
        raise PostonceError(
            "this response did not come from a postonce *_once call: it has no "
            'extensions["postonce"]'
        )
    return OnceInfo(
        intent=raw.reference,
        key=raw.key,
        state=raw.state,
        attempts=raw.attempts,
        replayed=raw.replayed,
        from_outbox=raw.from_outbox,
        truncated=raw.truncated,
    )


@dataclass(frozen=True, slots=True)
class Hooks:
    """Callbacks for what happens to intents; pass ``hooks=`` to a client.

    Each receives one frozen detail record. ``on_start`` and ``on_end``
    bracket one call's (or one drain claim's) work on an intent; the other
    five are the events themselves. ``around_send`` returns a context manager
    that wraps each HTTP send (``postonce.otel`` uses it to make the intent's
    span the parent of an httpx instrumentation's spans).
    """

    on_attempt: Callable[[AttemptDetail], object] | None = None
    on_retry_scheduled: Callable[[RetryDetail], object] | None = None
    on_replayed: Callable[[ReplayDetail], object] | None = None
    on_expired: Callable[[ExpiryDetail], object] | None = None
    on_give_up: Callable[[GiveUpDetail], object] | None = None
    on_start: Callable[[StartDetail], object] | None = None
    on_end: Callable[[EndDetail], object] | None = None
    #: Wraps each send: a context manager entered just before the HTTP send and left
    #: after it, on the sending thread or task (e.g. to make a span current).
    around_send: Callable[[SendDetail], AbstractContextManager[object]] | None = None


_HOOK_OF: dict[type, str] = {
    AttemptDetail: "on_attempt",
    RetryDetail: "on_retry_scheduled",
    ReplayDetail: "on_replayed",
    ExpiryDetail: "on_expired",
    GiveUpDetail: "on_give_up",
    StartDetail: "on_start",
    EndDetail: "on_end",
}


def _log(detail: object) -> None:
    if isinstance(detail, AttemptDetail):
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "intent %r attempt %d of its life (every call and drain): %s (%s)",
                detail.intent,
                detail.attempt,
                detail.outcome.value,
                detail.status if detail.status is not None else detail.error,
                extra={
                    "intent": detail.intent,
                    "key": detail.key,
                    "attempt": detail.attempt,
                    "outcome": detail.outcome.value,
                },
            )
    elif isinstance(detail, RetryDetail):
        logger.info(
            "intent %r: %s; the same key is sent again %s",
            detail.intent,
            detail.reason,
            f"in {detail.wait:.2f} s" if detail.in_foreground else "by the drain",
            extra={
                "intent": detail.intent,
                "key": detail.key,
                "attempt": detail.attempt,
                "outcome": "retry",
                "wait": detail.wait,
            },
        )
    elif isinstance(detail, GiveUpDetail):
        logger.warning(
            "intent %r is pending after %d attempt(s) in its life (every call and drain): %s; "
            "the drain will finish it",
            detail.intent,
            detail.attempts,
            detail.reason,
            extra={
                "intent": detail.intent,
                "key": detail.key,
                "attempt": detail.attempts,
                "outcome": "pending",
            },
        )
    elif isinstance(detail, ExpiryDetail):
        logger.warning(
            "intent %r (key %s) expired and needs reconciliation: %s",
            detail.intent,
            detail.key,
            detail.reason,
            extra={"intent": detail.intent, "key": detail.key, "outcome": "expired"},
        )


Pending = list[tuple[str, Any, Awaitable[object]]]

# The awaitables coroutine hooks returned, collected for the AsyncClient task that
# drives the flow (each task has its own context, so concurrent calls never mix).
# The flow is a plain generator and cannot await; its driver awaits them between steps.
_PENDING: ContextVar[Pending | None] = ContextVar("postonce_pending_hooks", default=None)


@contextmanager
def sending(hooks: Sequence[Hooks], detail: SendDetail) -> Iterator[None]:
    """Enter every ``around_send`` for one send; a hook that fails to enter is only logged."""
    with ExitStack() as stack:
        for registered in hooks:
            if registered.around_send is None:
                continue
            try:
                stack.enter_context(registered.around_send(detail))
            except Exception:
                logger.exception("postonce hook around_send failed on %r", detail)
        yield


def is_coroutine_function(hook: object) -> bool:
    """Whether calling ``hook`` makes a coroutine (an ``async def``, or an async ``__call__``)."""
    return inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004 -- an object with an async __call__
    )


def coroutine_hooks(hooks: Hooks) -> Iterator[tuple[str, Callable[..., object]]]:
    """The hooks of ``hooks`` that are coroutine functions, by field name."""
    for field in fields(hooks):
        hook = getattr(hooks, field.name)
        if hook is not None and is_coroutine_function(hook):
            yield field.name, hook


def collect_awaitables() -> tuple[Pending, object]:
    """Start collecting this task's hook awaitables; returns the list and a reset token."""
    pending: Pending = []
    return pending, _PENDING.set(pending)


def stop_collecting(token: object) -> None:
    """Stop collecting (the token from :func:`collect_awaitables`)."""
    _PENDING.reset(token)  # type: ignore[arg-type]  # the Token collect_awaitables made


async def await_hooks(pending: Pending) -> None:
    """Await the coroutine hooks collected so far, in order; a failing one is only logged."""
    while pending:
        name, detail, awaitable = pending.pop(0)
        try:
            await awaitable
        except Exception:
            logger.exception("postonce hook %s failed on %r", name, detail)


def drop_hooks(pending: Pending) -> None:
    """Discard hooks that will not be awaited (the call was cancelled), without a warning."""
    while pending:
        _, _, awaitable = pending.pop(0)
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()


def emit(hooks: Sequence[Hooks], detail: Any) -> None:
    """Log one event and hand it to every registered hook; a failing hook is only logged.

    A hook that returns an awaitable is awaited by the AsyncClient driving
    this call before the call goes on; with nothing to await it, it is
    closed and a warning logged.
    """
    _log(detail)
    name = _HOOK_OF[type(detail)]
    for registered in hooks:
        hook = getattr(registered, name)
        if hook is None:
            continue
        try:
            result = hook(detail)
        except Exception:
            logger.exception("postonce hook %s failed on %r", name, detail)
            continue
        if inspect.isawaitable(result):
            pending = _PENDING.get()
            if pending is not None:
                pending.append((name, detail, result))
            else:
                drop_hooks([(name, detail, result)])
                logger.warning(
                    "postonce hook %s returned an awaitable outside an AsyncClient; "
                    "it was not awaited",
                    name,
                )
