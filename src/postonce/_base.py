"""What ``Client`` and ``AsyncClient`` share: configuration and the plan of a call.

Everything here is decided without I/O (opening the outbox aside), so the two
clients differ only in how they perform the flow's effects.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any, TypedDict, TypeVar

import httpx

from ._arguments import check_wait, refuse_unknown
from ._budget import RetryBudget
from ._drain import UNSENDABLE_WAIT, Tally, unsendable
from ._exceptions import (
    ConfigurationError,
    IntentConflict,
    IntentPending,
    InvalidRequest,
    OutboxError,
    PostonceError,
    UnknownIntent,
    UnknownProvider,
)
from ._flow import Callback, Effect, Sender, StoreCall, from_outbox, send_claimed
from ._heartbeat import Heartbeat
from ._http import adapt_timeout, library_of
from ._intent import TERMINAL, IntentRecord, NewIntent, Opened, State
from ._lease import new_owner
from ._notify import Notified, notification_move, notified_intent
from ._observe import Hooks
from ._outbox.base import Store, Target
from ._outbox.locate import OutboxSpec, check_spec, open_store
from ._pace import Pace
from ._policy import TESTING, RetryPolicy
from ._redirects import mark_answers
from ._sender import (
    auth_material,
    client_origins,
    client_sender,
)
from ._settings import Setting, Settings
from ._settle import Settlement, reconcile_flow, settle_flow
from ._wire import (
    COMPACT_JSON,
    UNSET,
    HeaderInput,
    Prepared,
    parsed_url,
    prepare,
    supplied_secrets,
)
from .providers import BUILTIN_PROVIDERS, Provider, get_provider, provider_identity, same_provider

__all__ = [
    "LEASE_MARGIN",
    "ONE_OFF",
    "WAIT_POLL",
    "BaseClient",
    "DeadlineInput",
    "OnceOptions",
    "named",
    "with_options",
]

#: Seconds a lease must outlast a send's timeout when no heartbeat renews it.
LEASE_MARGIN = 2.0
#: Longest ``wait()`` sleeps before it looks again (a missed notification costs this).
WAIT_POLL = 1.0

logger = logging.getLogger("postonce")

DeadlineInput = datetime | timedelta | None
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)
T = TypeVar("T")


class OneOff:
    """The type of :data:`ONE_OFF`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "postonce.ONE_OFF"


#: ``intent=postonce.ONE_OFF``: this call is deliberately its own intent, with a new
#: key each time. Calling again sends again: nothing ties two such calls together.
ONE_OFF = OneOff()

#: Why a call without a name for its intent is refused.
NO_INTENT = (
    "this call names no intent: pass intent= with what must happen once (e.g. "
    "intent=f'order-{order_id}/charge'), so that calling again (a double click, a retried "
    "handler, a restart) finds the first call instead of charging again. A call that is "
    "deliberately its own intent says intent=postonce.ONE_OFF; nothing was stored or sent"
)


class OnceOptions(TypedDict, total=False):
    """The options of ``request_once`` and its ``post_once``/``put_once``/... shortcuts.

    Every option is keyword-only and may be left out:

    - ``intent``: what you want done once, e.g. ``"order-1234/charge"``; calling again
      with it returns the stored answer or resumes the pending intent with its key.
      Required, unless ``key`` (or the key's header or body field) names the intent;
      ``postonce.ONE_OFF`` makes the call deliberately its own intent.
    - ``key``: your own idempotency key instead of a minted UUIDv4 (checked against
      the provider's rules before anything is stored).
    - ``json``: a JSON body; fingerprinted as canonical JSON (key order does not matter).
    - ``content``: a raw body (bytes or str); fingerprinted as its bytes.
    - ``data``: a form body: a flat mapping of names to scalars, or to lists of scalars
      for a repeated field; field order does not matter. A nested dict or list is
      refused: use the provider's bracket names, e.g. ``metadata[order_id]``.
    - ``params``: query parameters, merged into the URL as httpx merges them.
    - ``headers``: this call's headers; secret ones are sent but never stored.
    - ``timeout``: the httpx timeout of each send (default: the client's).
    - ``provider``: a profile name or :class:`Provider` for this call (default: the client's).
    - ``retry``: a :class:`RetryPolicy` for this call (default: the client's).
    - ``deadline``: a ``timedelta`` or an aware ``datetime``; past it the intent is not
      sent again (cancelled if never delivered, else expired).
    - ``fingerprint_fields``: dotted JSON fields that alone make the fingerprint.
    - ``meta``: your JSON data kept with the intent (at most 8 KiB; never secrets): part of
      neither the request nor the fingerprint; given back on records, on ``Settlement``
      and in the CLI. The first call's ``meta`` is kept.
    """

    intent: str | OneOff | None
    key: str | None
    json: Any
    content: Any
    data: Any
    params: Any
    headers: HeaderInput
    timeout: Any
    provider: str | Provider | None
    retry: RetryPolicy | None
    deadline: DeadlineInput
    fingerprint_fields: Sequence[str] | None
    meta: Any


F = TypeVar("F", bound=Callable[..., Any])


def with_options(method: F) -> F:
    """Give a ``*_once`` method its options for ``help()`` and ``inspect.signature``.

    The methods take ``**options: Unpack[OnceOptions]`` (typed for mypy); their
    signature is set to the explicit parameter list of ``BaseClient._plan``, and the
    one description of the options (``OnceOptions``) is appended to the
    docstring: one source for both clients and every shortcut.
    """
    own = inspect.cleandoc(method.__doc__ or "")
    options = inspect.cleandoc(OnceOptions.__doc__ or "").split("\n", 2)[2]
    method.__doc__ = f"{own}\n\n{options}"
    method.__signature__ = _signature(  # type: ignore[attr-defined]  # read by inspect, help()
        with_method=method.__name__ == "request_once"
    )
    return method


def _signature(*, with_method: bool) -> inspect.Signature:
    """``request_once``'s parameters, or a shortcut's (no ``method``): those of ``_plan``.

    ``_plan`` takes every option by name, so its parameter list is the one
    written down; the public methods show it with their own return type.
    """
    planned = inspect.signature(BaseClient._plan)
    parameters = list(planned.parameters.values())
    if not with_method:
        parameters = [p for p in parameters if p.name != "method"]
    return planned.replace(parameters=parameters, return_annotation="httpx.Response")


def _deadline(deadline: DeadlineInput, now: float, reference: str | None) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, timedelta):
        return now + deadline.total_seconds()
    if isinstance(deadline, datetime) and deadline.tzinfo is not None:
        return deadline.timestamp()
    raise ConfigurationError(
        "deadline= takes a timedelta or a timezone-aware datetime", intent=reference
    )


#: The most ``meta=`` may hold, as UTF-8 JSON: application data, not a payload.
META_LIMIT = 8192


def encode_meta(meta: Any, intent: str | None) -> str | None:
    """``meta=`` as the JSON text stored with the intent; InvalidRequest if it cannot be."""
    if meta is None:
        return None
    try:
        text = COMPACT_JSON.encode(meta)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"meta= must be JSON-serialisable: {exc}", intent=intent) from exc
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        # A lone surrogate (a bad decode's leftover) has no UTF-8 spelling: no outbox
        # can keep it. A NUL is fine here: JSON spells it \u0000, which every outbox keeps.
        raise InvalidRequest(
            f"meta= holds a lone surrogate ({text[exc.start]!a}) in a string, which "
            "no outbox can store (it has no UTF-8 spelling); nothing was stored or sent",
            intent=intent,
        ) from exc
    if size > META_LIMIT:
        raise InvalidRequest(
            f"meta= holds {size} bytes of JSON; at most {META_LIMIT} are kept "
            "(store a reference to your own record instead)",
            intent=intent,
        )
    return text


def outcome_of(call: Callable[[], T]) -> T | OutboxError:
    """A store call's answer, or the OutboxError it raised."""
    try:
        return call()
    except OutboxError as exc:
        return exc


def named(exc: PostonceError, reference: str, key: str) -> PostonceError:
    """The same error, naming the intent it happened to."""
    if exc.intent is not None:
        return exc
    renamed = type(exc)(exc.message, intent=reference, key=key)
    renamed.__cause__ = exc.__cause__ or exc
    return renamed


#: Marks of the calls this context (thread or task) runs inside: a close() of a
#: client with one of them still under way would wait for itself. A task started
#: inside a call copies the marks; once that call has ended they mean nothing.
_IN_CALL: contextvars.ContextVar[tuple[object, ...]] = contextvars.ContextVar(
    "postonce_in_call", default=()
)
_CallTicket = tuple[contextvars.Token[tuple[object, ...]], object]


class BaseClient:
    """Settings and planning shared by both clients; see ``Client`` for the parameters."""

    _http: httpx.Client | httpx.AsyncClient
    #: Whether this client awaits coroutine hooks (AsyncClient) or refuses them (Client).
    _awaits_hooks = False

    def __init__(self, outbox: OutboxSpec, settings: Settings) -> None:
        #: What this client was configured with, checked once (see ``_settings``).
        self.settings = settings
        #: The origins this client's credentials go to (None: it named none).
        self.origins: frozenset[str] | None = None
        #: Who this client sends as; an intent is sent only by a client of its sender.
        self.sender = ""
        # Checked now, opened on first use: a typo'd URL or directory fails where the
        # client is built, not at the first charge with a key that was never stored.
        check_spec(outbox)
        self._outbox_spec = outbox
        self._store: Store | None = (
            None if outbox is None or isinstance(outbox, str | os.PathLike) else outbox
        )
        self._owns_store = self._store is None
        self._adopted = False  # intents of no sender taken on (once per store)
        self._open_lock = threading.RLock()  # opening the store, and closing it
        self._closed = False  # close() / aclose() ends a client for good: no new calls
        self._released = False  # ... and then lets go of its httpx client and outbox
        self._busy_lock = threading.Lock()
        self._idle = threading.Condition(self._busy_lock)
        self._live: set[object] = set()  # a mark per call under way: close() waits for them
        self._drain_stops: list[Callable[[], object]] = []  # stop the drains under way
        self._owner = new_owner()  # host, boot, pid and start time: others can tell it died
        self._owner_pid = os.getpid()
        self._clock = settings.clock
        self._heartbeat = Heartbeat(
            settings.heartbeat or settings.lease_seconds, settings.lease_seconds, self._clock
        )
        self._lib: ModuleType = httpx  # set with the httpx client: httpx or httpx2
        #: The Sender of a call with no options of its own, and the httpx params it saw.
        self._plain_sender: tuple[Sender | None, object, object] = (None, None, None)
        #: Whether any hook wraps sends: the drive loops time the outbox only then.
        self._around_send = any(h.around_send is not None for h in settings.hooks)

    # The settings, by the names the options have: read from ``settings``, and set
    # into a new ``settings`` (the next call sends by it).
    provider = Setting[Provider]()
    retry = Setting[RetryPolicy]()
    lease_seconds = Setting[float]()
    heartbeat = Setting[float | None]()
    hooks = Setting[tuple[Hooks, ...]]()
    retry_budget = Setting[RetryBudget | None]()
    on_settled = Setting[Callable[[Settlement], Any] | None]()
    reconcile = Setting[Callable[[IntentRecord], Any] | None]()
    reconcile_every = Setting[float]()
    credentials_for = Setting[Callable[[IntentRecord], Any] | None]()

    @property
    def owner(self) -> str:
        """This process's lease-owner id (made anew in a child forked after the client was)."""
        if self._owner_pid != os.getpid():
            # A forked child is another process: with the parent's pid in its owner id,
            # a claimant would see the parent gone and take the child's live sends.
            self._owner, self._owner_pid = new_owner(), os.getpid()
        return self._owner

    def _own_http(
        self,
        http: HttpT | None,
        kind: str,
        base_url: httpx.URL | str,
        headers: HeaderInput,
        options: dict[str, Any],
    ) -> tuple[HttpT, bool]:
        """The caller's httpx client (theirs to close), or one built here (ours).

        ``kind`` is ``"Client"`` or ``"AsyncClient"``. The library is httpx,
        or httpx2 when the caller's client or transport is httpx2's. Either way
        postonce's own response hook goes first on it: an answer that arrived
        stays an answer whatever the application's hooks raise (see _redirects).
        """
        if http is None:
            self._lib = library_of(options.get("transport"))
            if "timeout" in options:
                options = {**options, "timeout": adapt_timeout(options["timeout"], self._lib)}
            made: HttpT = getattr(self._lib, kind)(base_url=base_url, headers=headers, **options)
            self._identify(made)
            mark_answers(made, asynchronous=kind == "AsyncClient")
            return made, True
        if options or headers is not None or base_url:
            raise ConfigurationError(
                "pass base_url, headers and httpx options to your httpx client, not beside http="
            )
        self._lib = library_of(http)
        self._identify(http)
        mark_answers(http, asynchronous=kind == "AsyncClient")
        return http, False

    def _check_lease(self, timeout: Any) -> None:
        """Without a heartbeat, a send must end inside its lease: refuse a timeout that cannot.

        httpx's timeouts bound each phase (connect, each read, each write, the
        pool), so their sum bounds a send only roughly: a server dripping bytes
        stays within the read timeout forever. The heartbeat is the real
        guarantee; this refuses the configurations that plainly break it.
        """
        if self.heartbeat is not None:
            return
        phases = [getattr(timeout, name, None) for name in ("connect", "read", "write", "pool")]
        total = None if any(p is None for p in phases) else sum(phases)  # type: ignore[arg-type]
        if total is None or total + LEASE_MARGIN > self.lease_seconds:
            raise ConfigurationError(
                f"with heartbeat=None a send must end inside its lease, but the timeout "
                f"({'none' if total is None else f'{total:g} s'} in all) plus a "
                f"{LEASE_MARGIN:g} s margin exceeds lease_seconds={self.lease_seconds:g}: "
                "keep the heartbeat, or set a finite timeout shorter than the lease"
            )

    def _identify(self, http: httpx.Client | httpx.AsyncClient) -> None:
        """Settle this client's origins and sender identity from its httpx client's settings."""
        self._check_lease(http.timeout)
        try:
            self.origins = client_origins(str(http.base_url), self.settings.origins)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        credentials = [
            *(
                (n, v)
                for n, v in http.headers.multi_items()
                if n.lower() in self.settings.secret_names
            ),
            *(
                (n, v)
                for n, v in http.params.multi_items()
                if n.lower() in self.settings.secret_params
            ),
            *auth_material(http.auth),
        ]
        if credentials and self.origins is None:
            raise ConfigurationError(
                "this client has credentials (auth, or secret headers or params) but no origin "
                "to keep them to: give it base_url= or origins="
            )
        try:
            self.sender = client_sender(
                self.settings.name, self.provider.name, self.provider.credentials, credentials
            )
        except ValueError as exc:  # its credentials cannot name it: it needs name=
            raise ConfigurationError(str(exc)) from None

    # -- the outbox ----------------------------------------------------------

    def _begin_call(self) -> _CallTicket:
        """Count a call under way (close() waits for it); refused once the client is closed."""
        mark = object()
        with self._busy_lock:
            if self._closed:
                raise ConfigurationError(
                    "this client is closed: nothing was stored or sent; make a new client "
                    "(close() and aclose() end a client for good)"
                )
            self._live.add(mark)
        return _IN_CALL.set((*_IN_CALL.get(), mark)), mark

    def _end_call(self, ticket: _CallTicket) -> None:
        token, mark = ticket
        with self._busy_lock:  # first: a reset that failed must not leave close() waiting
            self._live.discard(mark)
            if not self._live and self._closed:  # only close() waits, once _closed is set
                self._idle.notify_all()
        _IN_CALL.reset(token)

    @contextmanager
    def _in_call(self) -> Iterator[None]:
        """:meth:`_begin_call` and :meth:`_end_call` around a block."""
        ticket = self._begin_call()
        try:
            yield
        finally:
            self._end_call(ticket)

    @contextmanager
    def _draining(self, stop_now: Callable[[], object] | None) -> Iterator[None]:
        """A drain as a call under way, that close() stops at once through ``stop_now``.

        ``stop_now`` sets the drain's own stop event. None for an event the
        caller passed: postonce never sets that one (it may stop more than
        this drain), and such a drain sees the close at its next look.
        """
        with self._in_call():
            if stop_now is None:
                yield
                return
            with self._busy_lock:
                self._drain_stops.append(stop_now)
                closing = self._closed
            if closing:
                stop_now()
            try:
                yield
            finally:
                with self._busy_lock:
                    self._drain_stops.remove(stop_now)

    def _closing(self) -> None:
        """Close the client to new calls and stop its drains (once; a repeat does nothing).

        Raises ConfigurationError inside one of this client's own calls still
        under way (a hook, ``on_settled``, ``reconcile``): close() would wait
        for itself.
        """
        if any(mark in self._live for mark in _IN_CALL.get()):
            raise ConfigurationError(
                "close() was called inside one of this client's own calls (a hook, on_settled "
                "or reconcile); it waits for every call to end, so it would wait for itself"
            )
        with self._busy_lock:
            stops = [] if self._closed else list(self._drain_stops)
            self._closed = True
        for stop_now in stops:
            try:
                stop_now()
            except Exception as exc:  # that drain has just ended (its event loop with it)
                logger.debug("close: a drain could not be told to stop: %s", exc)

    def _wait_idle(self) -> None:
        """Wait until no call of this client is under way (they finish as usual)."""
        with self._idle:
            while self._live:
                self._idle.wait()

    def _check_released(self) -> None:
        """Refuse the outbox and the httpx client once close() has let go of them.

        New calls are refused earlier (:meth:`_begin_call`); this stops what
        is not a call (the ``outbox`` property) and a call still under way
        after a close that gave up waiting for it (Ctrl-C, a cancelled
        ``aclose()``): the outbox is not opened again, and a send gets this
        typed error rather than the closed httpx client's bare RuntimeError
        (the flow records the intent as maybe delivered, for a drain).
        """
        if self._released:
            raise ConfigurationError(
                "this client was closed while the call was under way or before it, and has "
                "let go of its outbox and httpx client: nothing more is stored or sent by it, "
                "and a drain finishes what it left"
            )

    def _let_go_of_store(self) -> None:
        """Close the outbox this client opened, never while another thread opens it."""
        with self._open_lock:
            store = self._store if self._owns_store else None
            if store is not None:
                self._store = None
        if store is not None:
            store.close()

    @property
    def outbox(self) -> Store:
        """The outbox store, opened on first use; closed with the client."""
        self._check_released()
        if self._store is None or not self._adopted:
            with self._open_lock:
                store = self._opened_store()
                call = self._adoption_due()
                if call is not None:
                    self._adopted_result(outcome_of(lambda: store.adopt(**call.kwargs)))
        return self._store if self._store is not None else store

    def _opened_store(self) -> Store:
        """The store, opened if it is not yet (nothing adopted).

        Under the lock that closing takes too: a store is never opened after
        close() has let go of it.
        """
        with self._open_lock:
            self._check_released()
            if self._store is None:
                self._store = open_store(self._outbox_spec, durability=self.settings.durability)
            return self._store

    def _adoption_due(self) -> StoreCall | None:
        """The store call that takes on intents of no sender addressed to this client's origins.

        Until it has worked once: every such intent (written before senders were
        kept). After that, asked before each drain pass: the pending and sending
        ones only, which a process of an older release, still running after the
        migration, keeps writing.
        """
        if not self._adopted:
            return StoreCall("adopt", {"sender": self.sender, "origins": self.origins})
        if self.origins is None:
            return None  # nothing is addressed to a client of no origins
        return StoreCall(
            "adopt", {"sender": self.sender, "origins": self.origins, "unfinished": True}
        )

    def _adopted_result(self, adopted: int | OutboxError) -> None:
        """Note an adoption's result; a failure is logged and tried again before the next claim.

        The first adoption is housekeeping: an outbox that cannot answer it now
        (a dropped connection) must not stop the call or the drain that opened
        it. A drain pass's (once the first has worked) is raised: it is that
        pass's claim, failed as a claim fails (a one-shot drain raises, a
        ``forever`` one logs and waits).
        """
        if isinstance(adopted, OutboxError):
            if self._adopted:
                raise adopted
            logger.warning("outbox: adopting intents of no sender failed (%s); will retry", adopted)
            return
        self._adopted = True
        if adopted:
            logger.warning(
                "outbox: %d intents written before sender identities were kept now belong to "
                "sender %r (they are addressed to %s)",
                adopted,
                self.sender,
                ", ".join(sorted(self.origins or ())),
            )

    def adopt(self, previous: str) -> int:
        """Take over the intents of sender ``previous`` addressed to this client's origins.

        For a key rotation: a client's default identity changes with its
        credentials, so intents written under the old key belong to the old
        identity (shown by ``postonce outbox list``) until adopted. Returns how
        many intents were adopted.
        """
        if self.origins is None:
            raise ConfigurationError("adopting intents needs a client with base_url= or origins=")
        with self._in_call():
            adopted: int = self.outbox.adopt(
                sender=self.sender, origins=self.origins, previous=previous
            )
        return adopted

    def use_outbox(self, outbox: OutboxSpec) -> None:
        """Point this client at another outbox; only before the outbox is first used."""
        if self._store is not None:
            raise ConfigurationError("the outbox is already open; choose it before first use")
        check_spec(outbox)
        self._outbox_spec = outbox
        self._adopted = False
        if outbox is not None and not isinstance(outbox, str | os.PathLike):
            self._store, self._owns_store = outbox, False

    # -- planning a call -----------------------------------------------------

    def _begin_once(
        self, method: str, url: httpx.URL | str, options: OnceOptions, called: str
    ) -> tuple[Prepared, Sender, NewIntent, _CallTicket]:
        """Plan a ``*_once`` call and mark it under way; ``called`` names the public method.

        A misspelt option is named (with the closest one) by ``refuse_unknown``.
        """
        try:
            prepared, sender, new = self._plan(method, url, **options)
        except TypeError:
            refuse_unknown(self, called, options)  # a misspelt option, named; else as raised
            raise
        try:
            ticket = self._begin_call()
        except PostonceError as exc:
            raise named(exc, prepared.reference, prepared.key) from exc
        return prepared, sender, new, ticket

    def _plan_enqueue(self, method: str, url: httpx.URL | str, options: OnceOptions) -> NewIntent:
        """Check, encode and fingerprint an intent to write in the application's transaction.

        Every rule a ``*_once`` call applies before its write-ahead applies here.
        A drain sends it, as its own client sends: this call takes no ``retry=``
        or ``timeout=`` of its own.
        """
        for name in ("retry", "timeout"):
            if name in options:
                raise TypeError(
                    f"{type(self).__name__}.enqueue() takes no {name}=: a drain sends the "
                    f"intent, with its own client's {name}"
                )
        try:
            _, _, new = self._plan(method, url, **options)
        except TypeError:
            refuse_unknown(self, "enqueue", options)
            raise
        return new

    @staticmethod
    def _enqueue_refused(exc: PostonceError, new: NewIntent) -> PostonceError:
        """An error opening the outbox for ``enqueue``, named, and explained if it is a lock."""
        if isinstance(exc, OutboxError) and "locked" in exc.message:
            return OutboxError(
                f"{exc.message}: the outbox's tables are created or migrated when it is first "
                "opened, which needs the database's write lock, and a transaction that has "
                "written holds it. Open the outbox when the application starts, before any "
                "transaction (client.outbox)",
                reference=new.reference,
                key=new.key,
            )
        return named(exc, new.reference, new.key)

    @staticmethod
    def _target_of(store: Store, new: NewIntent) -> Target:
        """Where the application's connection must write ``new``: the outbox's table."""
        target: Target | None = getattr(store, "app_target", None)
        if target is None:
            raise ConfigurationError(
                "enqueue writes through the application's own database connection, so the "
                "outbox must live in that database: a SQLite file (sqlite:///app.db?create=1 "
                "for the application's own file) or PostgreSQL; nothing was written",
                reference=new.reference,
                key=new.key,
            )
        return target

    def _plan(
        self,
        method: str,
        url: httpx.URL | str,
        *,
        intent: str | OneOff | None = None,
        key: str | None = None,
        json: Any = UNSET,
        content: Any = UNSET,
        data: Any = UNSET,
        params: Any = None,
        headers: HeaderInput = None,
        timeout: Any = httpx.USE_CLIENT_DEFAULT,
        provider: str | Provider | None = None,
        retry: RetryPolicy | None = None,
        deadline: DeadlineInput = None,
        fingerprint_fields: Sequence[str] | None = None,
        meta: Any = None,
    ) -> tuple[Prepared, Sender, NewIntent]:
        """Check, encode and fingerprint a call: what to store and how to send it."""
        one_off = isinstance(intent, OneOff)
        intent = None if isinstance(intent, OneOff) else intent  # (narrows the type too)
        try:
            profile = get_provider(provider) if provider is not None else self.provider
        except PostonceError as exc:
            raise type(exc)(exc.message, intent=intent) from None
        prepared = prepare(
            self._http,
            method,
            url,
            provider=profile,
            intent=intent,
            key=key,
            json=json,
            content=content,
            data=data,
            params=params,
            headers=headers,
            # The call's profile names its provider's credential headers (X-API-Key...).
            secret_names=self.settings.secret_names | profile.credential_headers,
            fingerprint_fields=fingerprint_fields,
            origins=self.origins,
            secret_params=self.settings.secret_params,
        )
        if intent is None and not one_off and not prepared.key_given:
            raise InvalidRequest(NO_INTENT)
        sender = self._sender(
            profile, retry, timeout, prepared.secret_headers, prepared.secret_params
        )
        new = NewIntent(
            reference=prepared.reference,
            key=prepared.key,
            key_given=prepared.key_given,
            provider=provider_identity(profile),
            method=prepared.method,
            url=prepared.url,
            headers=prepared.headers,
            body=prepared.body,
            fingerprint=prepared.fingerprint,
            deadline_at=_deadline(deadline, self._clock(), prepared.reference),
            sender=self.sender,
            origin=prepared.origin,
            meta=encode_meta(meta, prepared.reference),
            needs=prepared.needs,
        )
        return prepared, sender, new

    def _sender(
        self,
        provider: Provider,
        retry: RetryPolicy | None = None,
        timeout: Any = httpx.USE_CLIENT_DEFAULT,
        secret_headers: tuple[tuple[str, str], ...] = (),
        secret_params: tuple[tuple[str, str], ...] = (),
    ) -> Sender:
        plain = (
            retry is None
            and timeout is httpx.USE_CLIENT_DEFAULT
            and not secret_headers
            and not secret_params
            and not TESTING.on
        )
        if plain:
            # Most calls send as the client does: one Sender (it is frozen) serves them
            # all while the settings are the same object (setting one makes a new one);
            # the call's profile, the owner (a forked child is another) and httpx's
            # params are compared too.
            cached, made_with, params = self._plain_sender
            http_params = self._http.params
            if (
                cached is not None
                and made_with is self.settings
                and cached.provider is provider
                and cached.owner is self.owner
                and params is http_params
            ):
                return cached
        sender = self._new_sender(provider, retry, timeout, secret_headers, secret_params)
        if plain:
            self._plain_sender = (sender, self.settings, http_params)
        return sender

    def _new_sender(
        self,
        provider: Provider,
        retry: RetryPolicy | None,
        timeout: Any,
        secret_headers: tuple[tuple[str, str], ...],
        secret_params: tuple[tuple[str, str], ...],
    ) -> Sender:
        lib = self._lib
        if timeout is httpx.USE_CLIENT_DEFAULT:
            timeout = lib.USE_CLIENT_DEFAULT  # httpx2's client knows only its own marker
        else:
            timeout = adapt_timeout(timeout, lib)
            self._check_lease(timeout)
        policy = retry if retry is not None else self.retry
        if TESTING.on and TESTING.attempts is not None and policy.attempts > TESTING.attempts:
            policy = policy.model_copy(update={"attempts": TESTING.attempts})
        return Sender(
            provider=provider,
            policy=policy,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            clock=self._clock,
            build_request=self._builder(secret_params),
            timeout=timeout,
            secret_headers=secret_headers,
            hooks=self.hooks,
            retry_budget=self.retry_budget,
            lib=lib,
            settle_hold=self._settle_hold,
            reconciles=self.reconcile is not None,
        )

    def _builder(self, secret: tuple[tuple[str, str], ...]) -> Callable[..., httpx.Request]:
        """``build_request`` for sends of stored URLs, with the query nothing stored.

        httpx replaces a URL's query with the client's ``params=`` where it has
        any; so the stored query goes in as params too, merged with the client's
        and with this call's secret parameters (kept out of the stored URL).
        """
        http = self._http
        if not secret and not http.params:
            return http.build_request
        url_type: Any = type(http.base_url)

        def build(method: str, url: str, **options: Any) -> httpx.Request:
            query = (*parsed_url(url_type, url).params.multi_items(), *secret)
            return http.build_request(method, url, params=query, **options)

        return build

    def _drain_flow(
        self, opened: Opened, tally: Tally | None = None
    ) -> Generator[Effect, Any, httpx.Response]:
        """The flow that sends one intent a drain claimed: once, with its stored key.

        If the send ends the intent, the drain is the process that ended it: it
        delivers the settlement at once (counted in ``tally``).
        """
        record = opened.record
        assert opened.lease is not None
        try:
            provider = self._provider_for(record)
            secret_headers, secret_params = (
                (yield from self._credentials_flow(record)) if record.needs else ((), ())
            )
        except PostonceError as exc:
            # Handed back due later, not as it was: a one-shot drain, which takes
            # only what was due when it began, would take it again for ever.
            yield from self._release_flow(opened, wait=UNSENDABLE_WAIT)
            raise unsendable(exc, record.reference, record.key) from exc
        try:
            response: httpx.Response = yield from send_claimed(
                self._sender(provider, secret_headers=secret_headers, secret_params=secret_params),
                record,
                opened.lease,
                opened.anchor_before,
                ends_at=None,
                foreground=False,
            )
        except PostonceError:
            if (yield from self._settle_after_call(record.reference)) and tally is not None:
                tally.add("settled")
            raise
        if (yield from self._settle_after_call(record.reference)) and tally is not None:
            tally.add("settled")
        return response

    def _credentials_flow(
        self, record: IntentRecord
    ) -> Generator[Effect, Any, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]]:
        """The secrets of the call that stored ``record``, from ``credentials_for=``.

        An intent sent with credentials of its own call (a platform's per-merchant
        key) is never sent again without them: with none supplied, the drain
        hands it back (``unsendable``) rather than let the provider answer 401.
        """
        if self.credentials_for is None:
            raise ConfigurationError(
                f"it was sent with credentials of its own call ({', '.join(record.needs)}); "
                "give this client credentials_for= to supply them"
            )
        try:
            supplied = yield Callback(self.credentials_for, record)
        except Exception as exc:
            # Its type only: the application's message may quote the very secret.
            raise ConfigurationError(f"credentials_for= raised {type(exc).__name__}") from exc
        return supplied_secrets(record.needs, supplied)

    def _release_flow(
        self, opened: Opened, wait: float | None = None, due_at: float | None = None
    ) -> Generator[Effect, Any, None]:
        """Hand back a claim the drain will not send: due as it was (the drain is stopping),
        ``wait`` seconds from now (this client cannot send it), or at ``due_at`` (its
        origin asked for a pause)."""
        assert opened.lease is not None
        now = self._clock()
        if wait is not None:
            due_at = now + wait
        yield StoreCall(
            "release",
            {
                "lease": opened.lease,
                "now": now,
                "due_at": opened.record.due_at if due_at is None else due_at,
                "anchor": opened.anchor_before,
            },
        )

    def _claim_call(
        self, due_by: float, limit: int, paused: frozenset[str] = frozenset()
    ) -> StoreCall | None:
        """The claim of a drain pass, to this client's origins but ``paused`` ones (None:
        every origin is paused, nothing to claim)."""
        origins = self.origins
        if paused and origins is not None:
            origins = origins - paused
            if not origins:
                return None
        return StoreCall(
            "claim_due",
            {
                "owner": self.owner,
                "now": self._clock(),
                "limit": limit,
                "lease_for": self.lease_seconds,
                "due_by": due_by,
                # Only this sender's intents, to this client's origins: the drain sends
                # with this client's credentials.
                "sender": self.sender,
                "origins": origins,
            },
        )

    def _pace(self, rate: float | None) -> Pace:
        """A drain's pauses and rate per origin (see ``_pace``); a bad rate is refused here."""
        try:
            return Pace(self._clock, self.retry.retry_after_max, rate)
        except ValueError as exc:
            raise ConfigurationError(f"drain {exc}") from None

    def _check_drain(self, concurrency: int = 1, interval: float = 1.0) -> None:
        """A drain's settings, and its origins: it sends with this client's credentials.

        A drain sends stored URLs only to its own origins. ``interval`` must be a
        finite number of seconds: a NaN would make a worker spin on the outbox.
        """
        if concurrency < 1 or not (math.isfinite(interval) and interval > 0):
            raise ConfigurationError(
                "drain needs concurrency >= 1 and a finite interval > 0 (seconds), "
                f"not concurrency={concurrency!r}, interval={interval!r}"
            )
        if self.origins is None:
            raise ConfigurationError(
                "a drain needs a client with base_url= (or origins=): it sends only the intents "
                "addressed to its own origins"
            )

    # -- settlements and reconciliation ----------------------------------------

    def _settle_after_call(self, reference: str) -> Generator[Effect, Any, bool]:
        """After a call that ended an intent: take its settlement and run the handler.

        Called only when this call's own flow ended the intent (not for an answer
        read from the outbox). The settlement is taken atomically, so of two
        callers that see it owed only one runs the handler; one a drain holds,
        or whose handler already failed (retried with backoff by drains), is left.
        """
        if self.on_settled is None:
            return False
        record: IntentRecord | None = yield StoreCall("get", {"reference": reference})
        if (
            record is None
            or not self._ours(record)
            or record.settle_due_at is None
            or record.settled_at is not None
            or record.settle_attempts > 0
        ):
            return False
        fence: float | None = yield StoreCall(
            "take_settlement",
            {
                "intent_id": record.id,
                "owed_at": record.settle_due_at,
                "now": self._clock(),
                "hold": self.lease_seconds,
            },
        )
        if fence is None:
            return False
        taken = dataclasses.replace(record, settle_due_at=fence)
        return (yield from settle_flow(self.on_settled, taken, self._clock, self._lib))

    def _ours(self, record: IntentRecord) -> bool:
        """Whether a stored intent is this client's: its sender, to one of its origins."""
        if record.sender is not None and record.sender != self.sender:
            return False
        return self.origins is None or record.origin is None or record.origin in self.origins

    def _aftercare(self, tally: Tally) -> Generator[Effect, Any, None]:
        """A drain's pass over what ended: reconcile unresolved intents, deliver settlements.

        Each reconciliation and each settlement stands alone: one that fails
        (the application's function raised or answered nonsense, or the outbox
        could not record its result) is logged, counted in the report
        (``reconcile_failed``, ``settle_failed``) and tried again in a later
        pass; it never ends the drain, nor keeps the others from their turn.
        """
        if self.reconcile is not None:
            yield from self._reconcile_pass(tally)
        if self.on_settled is not None:
            owed: list[IntentRecord] = yield from self._claimed(
                tally,
                "claim_settlements",
                "claiming owed settlements",
                hold=self.lease_seconds,
            )
            for record in owed:
                yield from self._deliver(record, tally)

    def _reconcile_pass(self, tally: Tally) -> Generator[Effect, Any, None]:
        """Ask the reconciler about the unresolved intents due a question; settle each answer."""
        assert self.reconcile is not None
        unresolved: list[IntentRecord] = yield from self._claimed(
            tally, "claim_expired", "claiming intents to reconcile", every=self.reconcile_every
        )
        for record in unresolved:
            try:
                resolved = yield from reconcile_flow(
                    self.reconcile,
                    record,
                    sender=self.sender,
                    clock=self._clock,
                    settle_hold=self._settle_hold,
                    failed=tally.adder("reconcile_failed"),
                )
            except Exception as exc:
                tally.aftercare_failed("reconcile_failed", "recording its resolution", record, exc)
                continue
            if resolved is not None:
                tally.add("reconciled")
                yield from self._deliver(resolved, tally)

    def _claimed(
        self, tally: Tally, method: str, doing: str, **options: float
    ) -> Generator[Effect, Any, list[IntentRecord]]:
        """Up to 64 of this sender's records a drain takes for ``method``; none if that failed."""
        try:
            taken: list[IntentRecord] = yield StoreCall(
                method,
                {
                    "sender": self.sender,
                    "now": self._clock(),
                    "limit": 64,
                    "origins": self.origins,
                    **options,
                },
            )
        except Exception as exc:
            tally.aftercare_failed("errors", doing, None, exc)
            return []
        return taken

    def _deliver(self, record: IntentRecord, tally: Tally) -> Generator[Effect, Any, None]:
        """Call the settlement handler for one ended intent; a failure is counted and skipped."""
        if self.on_settled is None:
            return
        try:
            delivered = yield from settle_flow(
                self.on_settled,
                record,
                self._clock,
                self._lib,
                failed=tally.adder("settle_failed"),
            )
        except Exception as exc:
            tally.aftercare_failed("settle_failed", "recording its settlement", record, exc)
            return
        if delivered:
            tally.add("settled")

    @property
    def _settle_hold(self) -> float | None:
        """How long an ending this client settles is held by it (None: it runs no handler)."""
        return self.lease_seconds if self.on_settled is not None else None

    def _notification_flow(
        self, state: State, intent: str | None, key: str | None, note: str
    ) -> Generator[Effect, Any, Notified]:
        """``resolve_from_notification``: find the intent a notification names, decide
        (``_notify.notification_move``), and resolve it as an operator would, or not."""
        if (intent is None) == (key is None):
            raise TypeError("resolve_from_notification takes intent= or key=, one of them")
        found: IntentRecord | None = yield (
            StoreCall("get", {"reference": intent})
            if intent is not None
            else StoreCall("get_by_key", {"key": key})
        )
        record = notified_intent(found, intent, key)
        move, why = notification_move(record, state)
        if move == "resolve":
            moved: IntentRecord = yield from self._operator_flow(
                record.reference, state, note or why
            )
            return Notified(moved, True, None, why)
        if move == "contradicts":
            logger.warning("notification about intent %r: %s", record.reference, why)
        return Notified(record, False, why if move == "contradicts" else None, why)

    def _operator_flow(
        self, intent: str, to: State, note: str
    ) -> Generator[Effect, Any, IntentRecord]:
        """An operator's move made through this client: recorded, then its settlement delivered.

        Only for this client's sender's intents: the handler is this client's.
        """
        found: IntentRecord | None = yield StoreCall("get", {"reference": intent})
        if found is None:
            raise UnknownIntent("no intent of this name is stored in this outbox", intent=intent)
        if not self._ours(found):
            raise IntentConflict(
                f"it belongs to sender {found.sender!r} at {found.origin}, not to this client "
                f"({self.sender!r}); resolve it through that client, or with postonce outbox "
                "resolve",
                intent=intent,
                key=found.key,
            )
        moved: IntentRecord = yield StoreCall(
            "operator_move",
            {
                "reference": intent,
                "to": to,
                "now": self._clock(),
                "note": note,
                "settle_hold": self._settle_hold,
            },
        )
        if self.on_settled is not None:
            yield from settle_flow(self.on_settled, moved, self._clock, self._lib)
        return moved

    def _waiting(
        self, intent: str, timeout: float
    ) -> Generator[tuple[int, float] | None, Any, httpx.Response]:
        """``wait()``'s loop, its I/O left to the shell that drives it.

        Yields None to have the intent read (sent back: its record), or
        ``(intent id, seconds)`` to have the outbox waited on for a change (sent
        back: anything). Returns the final answer; raises its terminal error,
        ``UnknownIntent`` or ``IntentPending`` after ``timeout`` seconds, and
        ``InvalidRequest`` for a name no outbox can hold or a timeout that is
        not a finite number of seconds, before anything is read.
        """
        timeout = check_wait(intent, timeout)
        deadline = time.monotonic() + timeout
        while True:
            record = yield None
            answer = self._settled_answer(record, intent)
            if answer is not None:
                return answer
            assert record is not None
            left = deadline - time.monotonic()
            if left <= 0:
                raise IntentPending(
                    f"not finished after {timeout:g} s", intent=intent, key=record.key
                )
            yield record.id, min(left, WAIT_POLL)

    def _settled_answer(self, record: IntentRecord | None, intent: str) -> httpx.Response | None:
        """An ended intent's final answer (or its terminal error, raised); None if unfinished.

        Another sender's intent is unknown here: its answer is that sender's.
        """
        if record is None:
            raise UnknownIntent(
                "no intent of this name is stored in this outbox (or it was purged with its "
                "tombstone)",
                intent=intent,
            )
        if not self._ours(record):
            raise UnknownIntent(
                f"the intent of this name belongs to sender {record.sender!r} at "
                f"{record.origin}, not to this client ({self.sender!r}); wait for it through "
                "that client",
                intent=intent,
            )
        if record.state not in TERMINAL:
            return None
        return from_outbox(record, self._lib)

    def _census_call(self) -> StoreCall:
        """Count what a drain leaves: others' due intents, and its own that others hold."""
        return StoreCall(
            "census", {"sender": self.sender, "origins": self.origins, "now": self._clock()}
        )

    def _provider_for(self, record: IntentRecord) -> Provider:
        """The profile a stored intent was made under: this client's, or a built-in.

        ``record.provider`` is an identity (see ``provider_identity``): this
        client's profile serves it when the identities match, a built-in when
        it is that built-in's plain name. Anything else is an error naming both.
        """
        if same_provider(record.provider, provider_identity(self.provider)):
            return self.provider
        if record.provider in BUILTIN_PROVIDERS:
            return BUILTIN_PROVIDERS[record.provider]
        raise UnknownProvider(
            f"it is stored under provider {record.provider!r}, and this client's profile is "
            f"{provider_identity(self.provider)!r} (its key facts differ, or it is another "
            "provider); configure a client with the profile the intent was made with",
            reference=record.reference,
            key=record.key,
        )
