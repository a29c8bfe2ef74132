"""``Client``: the blocking shell that drives an intent's flow over httpx and an outbox."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection, Generator, Sequence
from datetime import datetime, timedelta
from typing import Any, TypedDict

import httpx
from typing_extensions import Unpack

from ._drain import DrainReport, Tally, count_outcome, run_drain, stop_on_signals
from ._exceptions import ConfigurationError, OutboxError, PostonceError
from ._flow import Send, Sender, Sleep, StoreCall, run, send_claimed
from ._intent import IntentRecord
from ._outbox.base import NewIntent, Opened, Store
from ._outbox.locate import OutboxSpec, open_store
from ._outbox.sqlite import Durability
from ._policy import RetryPolicy
from ._wire import DEFAULT_SECRET_HEADERS, UNSET, HeaderInput, prepare
from .providers import Provider, get_provider

__all__ = ["Client"]

logger = logging.getLogger("postonce")

DeadlineInput = datetime | timedelta | None


class OnceOptions(TypedDict, total=False):
    """The keyword arguments of ``request_once``, for its shortcuts."""

    intent: str | None
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


def _deadline(deadline: DeadlineInput, now: float, reference: str | None) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, timedelta):
        return now + deadline.total_seconds()
    if isinstance(deadline, datetime) and deadline.tzinfo is not None:
        return deadline.timestamp()
    raise ConfigurationError(
        "deadline= takes a timedelta or a timezone-aware datetime", reference=reference
    )


def _named(exc: PostonceError, reference: str, key: str) -> PostonceError:
    """The same error, naming the intent it happened to."""
    if exc.reference is not None:
        return exc
    named = type(exc)(exc.message, reference=reference, key=key)
    named.__cause__ = exc.__cause__ or exc
    return named


class Client:
    """An httpx client whose ``post_once`` makes a non-idempotent call happen once.

    ``provider`` is a built-in profile name or a :class:`postonce.Provider`.
    ``headers`` (and ``auth``) live in this process only: they are never
    written to the outbox, and whoever sends an intent supplies them again.
    ``outbox`` is a path, ``sqlite:///path`` or a store; ``None`` reads
    ``POSTONCE_OUTBOX``, else uses ``outbox.sqlite3`` under
    ``platformdirs.user_data_path("postonce")``. It is opened on first use.

    Pass httpx's own options (``timeout``, ``transport``, ``auth``,
    ``event_hooks``, ``verify``, ``proxy``, ...) as keywords, or a ready
    ``httpx.Client`` as ``http=`` (which you then close yourself).
    """

    def __init__(
        self,
        base_url: httpx.URL | str = "",
        *,
        provider: str | Provider = "ietf_draft",
        headers: HeaderInput = None,
        outbox: OutboxSpec = None,
        retry: RetryPolicy | None = None,
        durability: Durability = "full",
        secret_headers: Collection[str] = (),
        lease_seconds: float = 120.0,
        http: httpx.Client | None = None,
        **httpx_options: Any,
    ) -> None:
        self.provider = get_provider(provider)
        self.retry = retry if retry is not None else RetryPolicy()
        if lease_seconds <= 0:
            raise ConfigurationError("lease_seconds must be positive")
        self.lease_seconds = float(lease_seconds)
        self._secret_names = frozenset(
            {*DEFAULT_SECRET_HEADERS, *(name.lower() for name in secret_headers)}
        )
        if http is not None:
            if httpx_options or headers is not None or base_url:
                raise ConfigurationError(
                    "pass base_url, headers and httpx options to your httpx.Client, "
                    "not beside http="
                )
            self._http, self._owns_http = http, False
        else:
            self._http = httpx.Client(base_url=base_url, headers=headers, **httpx_options)
            self._owns_http = True
        self._outbox_spec = outbox
        self._durability: Durability = durability
        self._store: Store | None = (
            None if outbox is None or isinstance(outbox, str | os.PathLike) else outbox
        )
        self._owns_store = self._store is None
        self._open_lock = threading.Lock()
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self._clock: Callable[[], float] = time.time

    # -- the outbox ----------------------------------------------------------

    @property
    def outbox(self) -> Store:
        """The outbox store, opened on first use."""
        if self._store is None:
            with self._open_lock:
                if self._store is None:
                    self._store = open_store(self._outbox_spec, durability=self._durability)
        return self._store

    def use_outbox(self, outbox: OutboxSpec) -> None:
        """Point this client at another outbox; only before the outbox is first used."""
        if self._store is not None:
            raise ConfigurationError("the outbox is already open; choose it before first use")
        self._outbox_spec = outbox
        if outbox is not None and not isinstance(outbox, str | os.PathLike):
            self._store, self._owns_store = outbox, False

    def lookup(self, intent: str) -> IntentRecord | None:
        """The stored intent with this reference, or None."""
        return self.outbox.get(intent)

    # -- requests ------------------------------------------------------------

    def request_once(
        self,
        method: str,
        url: httpx.URL | str,
        *,
        intent: str | None = None,
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
    ) -> httpx.Response:
        """Send ``method url`` once per intent; return the one true answer.

        ``intent`` names what you want done once (``"order-1234/charge"``);
        without it the call is its own intent. The intent is committed to the
        outbox before the first send. A final answer (2xx, or a 4xx such as
        402) is returned as the ``httpx.Response``; calling again with the same
        ``intent`` returns it from the outbox (``extensions["postonce"]``
        says so) or resumes the pending intent with its stored key.

        Raises :class:`IntentPending` when the retry budget runs out first,
        :class:`IntentExpired` when the provider may have forgotten the key,
        :class:`IdempotencyKeyMismatch`, :class:`IntentConflict`, or
        :class:`InvalidRequest` / :class:`OutboxError` before anything is sent.
        """
        try:
            profile = get_provider(provider) if provider is not None else self.provider
        except PostonceError as exc:
            raise type(exc)(exc.message, reference=intent) from None
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
            secret_names=self._secret_names,
            fingerprint_fields=fingerprint_fields,
        )
        try:
            store = self.outbox
        except PostonceError as exc:
            raise _named(exc, prepared.reference, prepared.key) from exc
        sender = Sender(
            provider=profile,
            policy=retry if retry is not None else self.retry,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            clock=self._clock,
            build_request=self._http.build_request,
            timeout=timeout,
            secret_headers=prepared.secret_headers,
        )
        new = NewIntent(
            reference=prepared.reference,
            key=prepared.key,
            key_given=prepared.key_given,
            provider=profile.name,
            method=prepared.method,
            url=prepared.url,
            headers=prepared.headers,
            body=prepared.body,
            fingerprint=prepared.fingerprint,
            deadline_at=_deadline(deadline, self._clock(), prepared.reference),
        )
        return self._drive(run(sender, new), store, prepared.reference, prepared.key)

    def _drive(
        self,
        flow: Generator[Any, Any, httpx.Response],
        store: Store,
        reference: str,
        key: str,
        on_send: Callable[[], None] | None = None,
    ) -> httpx.Response:
        """Perform a flow's effects with blocking calls until it returns or raises."""
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            except OutboxError as exc:
                raise _named(exc, reference, key) from exc
            value, error = None, None
            try:
                if isinstance(effect, Send):
                    if on_send is not None:
                        on_send()
                    value = self._http.send(effect.request)
                elif isinstance(effect, Sleep):
                    time.sleep(effect.seconds)
                else:
                    assert isinstance(effect, StoreCall)
                    value = getattr(store, effect.method)(**effect.kwargs)
            except Exception as exc:
                error = exc

    def post_once(self, url: httpx.URL | str, **kwargs: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("POST", url, ...)``: the usual case."""
        return self.request_once("POST", url, **kwargs)

    def put_once(self, url: httpx.URL | str, **kwargs: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("PUT", url, ...)``."""
        return self.request_once("PUT", url, **kwargs)

    def patch_once(self, url: httpx.URL | str, **kwargs: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("PATCH", url, ...)``."""
        return self.request_once("PATCH", url, **kwargs)

    def delete_once(self, url: httpx.URL | str, **kwargs: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("DELETE", url, ...)``."""
        return self.request_once("DELETE", url, **kwargs)

    # -- the drain -----------------------------------------------------------

    def drain(
        self,
        *,
        forever: bool = False,
        interval: float = 5.0,
        concurrency: int = 1,
        stop: threading.Event | None = None,
        progress: Callable[[DrainReport], None] | None = None,
    ) -> DrainReport:
        """Send every due intent once, with its stored key; return a DrainReport.

        Due intents are pending ones whose due time has come and sending ones
        whose sender died (its lease expired). Each is leased, sent once, and
        recorded; a retryable outcome stores its next due time instead of
        sleeping. With ``forever=True`` this is a worker loop that looks for due
        intents every ``interval`` seconds. In the main thread, SIGTERM and
        SIGINT (or ``stop.set()`` from anywhere) stop it cleanly: attempts in
        flight finish and are recorded, and claimed intents not yet sent are
        released.

        The headers and auth of this client are what the drain sends with:
        the outbox holds no credentials.
        """
        if concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        store = self.outbox
        tally = Tally()
        stop = stop if stop is not None else threading.Event()

        def claim(due_by: float, limit: int) -> list[Opened]:
            return store.claim_due(
                owner=self.owner,
                now=self._clock(),
                limit=limit,
                lease_for=self.lease_seconds,
                due_by=due_by,
            )

        def process(opened: Opened) -> None:
            record = opened.record
            assert opened.lease is not None
            try:
                provider = self._provider_for(record.provider)
            except PostonceError:
                logger.error(
                    "drain: intent %r names provider %r, which this client does not know; "
                    "configure the client with that profile",
                    record.reference,
                    record.provider,
                )
                store.release(opened.lease, now=self._clock(), due_at=self._clock() + interval)
                tally.add("errors")
                return
            sender = Sender(
                provider=provider,
                policy=self.retry,
                owner=self.owner,
                lease_seconds=self.lease_seconds,
                clock=self._clock,
                build_request=self._http.build_request,
                timeout=httpx.USE_CLIENT_DEFAULT,
            )
            flow = send_claimed(
                sender, record, opened.lease, opened.anchor_before, ends_at=None, foreground=False
            )
            count_outcome(
                tally,
                lambda: self._drive(
                    flow, store, record.reference, record.key, lambda: tally.add("sent")
                ),
            )

        def release(opened: Opened) -> None:
            assert opened.lease is not None
            due = opened.record.due_at
            store.release(opened.lease, now=self._clock(), due_at=due or self._clock())

        with stop_on_signals(stop):
            return run_drain(
                claim=claim,
                process=process,
                release=release,
                clock=self._clock,
                tally=tally,
                forever=forever,
                interval=interval,
                concurrency=concurrency,
                stop=stop,
                progress=progress,
            )

    def _provider_for(self, name: str) -> Provider:
        """The profile a stored intent was made under: this client's, or a built-in."""
        return self.provider if name == self.provider.name else get_provider(name)

    # -- life cycle ----------------------------------------------------------

    def close(self) -> None:
        """Close the httpx client and the outbox, where this client opened them."""
        if self._owns_http:
            self._http.close()
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
