"""``Client``: the blocking shell that drives an intent's flow over httpx and an outbox."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import httpx
from typing_extensions import Unpack

from ._appdb import app_connection
from ._base import (
    BaseClient,
    OnceOptions,
    named,
    outcome_of,
    with_options,
)
from ._budget import RetryBudget
from ._drain import (
    DrainReport,
    Tally,
    Turn,
    count_outcome,
    flows_for,
    note_census,
    outbox_name,
    run_drain,
    stop_on_signals,
)
from ._exceptions import OutboxError, PostonceError
from ._flow import Abandoned, Callback, Effect, Send, Sender, Sleep, StoreCall, run
from ._intent import IntentInfo, IntentRecord, NewIntent, Opened, State
from ._notify import Notified
from ._observe import Hooks, SendDetail, sending
from ._outbox.base import Store
from ._outbox.locate import OutboxSpec
from ._outbox.sqlite import Durability
from ._pace import Pace
from ._policy import RetryPolicy
from ._redirects import next_hop
from ._settings import settings as checked_settings
from ._settle import Resolution, Settlement
from ._wire import HeaderInput
from .providers import Provider

__all__ = ["Client"]

logger = logging.getLogger("postonce")


class Client(BaseClient):
    """An httpx client whose ``post_once`` makes a non-idempotent call happen once.

    ``provider`` is a built-in profile name or a :class:`postonce.Provider`.
    ``headers`` (and ``auth``) live in this process only: they are never
    written to the outbox, and whoever sends an intent supplies them again.
    ``outbox`` is a path, ``sqlite:///path``, ``postgresql://…[?schema=name]``
    (with the ``postgres`` extra) or a store; ``None`` reads
    ``POSTONCE_OUTBOX``, else uses ``outbox.sqlite3`` under
    ``platformdirs.user_data_path("postonce")``. It is opened on first use.

    ``clock`` (Unix seconds; default ``time.time``) is the wall clock every
    stored time and the retry horizon use; pass one to simulate time in tests.

    ``hooks`` (a :class:`postonce.Hooks` or several) are called with a frozen
    detail record for each attempt, scheduled retry, replay, expiry and
    give-up; everything is also logged to ``logging.getLogger("postonce")``.
    ``retry_budget`` is a client-wide token bucket that foreground retries
    draw on (botocore's standard mode): ``True`` (default) gives this client
    its own :class:`postonce.RetryBudget`, ``False`` turns it off, an
    instance can be shared. With it spent, retries are left to the drain.

    ``credentials_for`` supplies the secrets of an intent whose call brought
    its own (``headers={"X-API-Key": merchant_key}``, recorded by name in
    ``IntentRecord.needs``, never by value): a drain calls it with the stored
    intent and sends with the mapping it returns (each needed header name, a
    query parameter as ``"?name"``). Without it, or when it returns None, such
    an intent is handed back pending (``DrainReport.unsendable``), never sent
    without its credentials.

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
        lease_seconds: float = 15.0,
        heartbeat: float | Literal["auto"] | None = "auto",
        clock: Callable[[], float] | None = None,
        hooks: Hooks | Sequence[Hooks] | None = None,
        retry_budget: RetryBudget | bool = True,
        name: str | None = None,
        origins: Collection[str] | None = None,
        secret_params: Collection[str] = (),
        on_settled: Callable[[Settlement], Any] | None = None,
        reconcile: Callable[[IntentRecord], Resolution | None] | None = None,
        reconcile_every: float = 3600.0,
        credentials_for: Callable[[IntentRecord], Mapping[str, str] | None] | None = None,
        http: httpx.Client | None = None,
        **httpx_options: Any,
    ) -> None:
        super().__init__(
            outbox,
            checked_settings(
                awaits=False,
                provider=provider,
                retry=retry,
                durability=durability,
                secret_headers=secret_headers,
                lease_seconds=lease_seconds,
                heartbeat=heartbeat,
                clock=clock,
                hooks=hooks,
                retry_budget=retry_budget,
                name=name,
                origins=origins,
                secret_params=secret_params,
                on_settled=on_settled,
                reconcile=reconcile,
                reconcile_every=reconcile_every,
                credentials_for=credentials_for,
            ),
        )
        self._http: httpx.Client
        self._http, self._owns_http = self._own_http(
            http, "Client", base_url, headers, httpx_options
        )

    # -- the outbox ----------------------------------------------------------

    def lookup(self, intent: str) -> IntentRecord | None:
        """The stored intent with this reference, or None."""
        with self._in_call():
            record: IntentRecord | None = self.outbox.get(intent)
        return record

    # -- requests ------------------------------------------------------------

    @with_options
    def request_once(
        self, method: str, url: httpx.URL | str, **options: Unpack[OnceOptions]
    ) -> httpx.Response:
        """Send ``method url`` once per intent; return the one true answer.

        ``intent`` names what you want done once (``"order-1234/charge"``);
        it is required (or a ``key=`` of yours names the intent; ``postonce.ONE_OFF``
        makes the call deliberately its own intent). The intent is committed to the
        outbox before the first send. A final answer (2xx, or a 4xx such as
        402) is returned as the ``httpx.Response``; calling again with the same
        ``intent`` returns it from the outbox (``extensions["postonce"]``
        says so) or resumes the pending intent with its stored key.

        Raises :class:`IntentPending` when the retry budget runs out first (or
        the outbox failed after the intent was stored: the drain finishes it),
        :class:`IntentIndeterminate` when the answer leaves the effect unknown,
        :class:`IntentExpired` when the provider may have forgotten the key,
        :class:`IdempotencyKeyMismatch`, :class:`IntentConflict`, or
        :class:`InvalidRequest` / :class:`OutboxError` when nothing was stored or sent.
        """
        return self._once(method, url, options, "request_once")

    def _once(
        self, method: str, url: httpx.URL | str, options: OnceOptions, called: str
    ) -> httpx.Response:
        """A ``*_once`` call; ``called`` names the public method, for a misspelt option."""
        prepared, sender, new, ticket = self._begin_once(method, url, options, called)
        try:
            return self._request(prepared.reference, prepared.key, sender, new)
        finally:
            self._end_call(ticket)

    def _request(self, reference: str, key: str, sender: Sender, new: NewIntent) -> httpx.Response:
        try:
            store = self.outbox
        except PostonceError as exc:
            raise named(exc, reference, key) from exc
        try:
            response: httpx.Response = self._drive(run(sender, new), store, reference, key)
        except Exception as exc:
            # A postonce error, or a response hook's own error raised after its answer
            # was recorded: either may have ended the intent. One read back is not new.
            if not getattr(exc, "from_outbox", False):
                self._settle(store, reference, key)
            raise
        if not response.extensions["postonce"].from_outbox:
            self._settle(store, reference, key)
        return response

    def _settle(self, store: Store, reference: str, key: str) -> None:
        """Deliver the settlement this call owes (if it ended the intent) before returning."""
        if self.on_settled is None:
            return
        try:
            self._drive(self._settle_after_call(reference), store, reference, key)
        except OutboxError as exc:
            # Left owed in the outbox: a drain delivers it. The call's own outcome stands.
            logger.warning("settlement of %r left to the drain: %s", reference, exc)

    def wait(self, intent: str, *, timeout: float = 30.0) -> httpx.Response:
        """The final answer of ``intent``, as soon as any process on this outbox ends it.

        Raises the intent's terminal error (``IntentExpired``, ...) as ``post_once``
        would, :class:`UnknownIntent` (a ``KeyError``) for an intent this client
        does not have, and ``IntentPending`` when ``timeout`` seconds pass first;
        a timeout that is negative, infinite or NaN is :class:`InvalidRequest`.
        On PostgreSQL it listens for the outbox's notifications; elsewhere it polls.
        """
        with self._in_call():
            return self._wait(intent, timeout)

    def _wait(self, intent: str, timeout: float) -> httpx.Response:
        store = self.outbox
        steps = self._waiting(intent, timeout)
        ask = next(steps)
        while True:
            result = None
            if ask is None:
                result = store.get(intent)
            else:
                store.wait_change(*ask)
            try:
                ask = steps.send(result)
            except StopIteration as done:
                answer: httpx.Response = done.value
                return answer

    def resolve(self, intent: str, state: State, *, note: str = "") -> IntentRecord:
        """Resolve an expired or indeterminate intent, as ``outbox resolve``; it is settled."""
        with self._in_call():
            store = self.outbox
            moved: IntentRecord = self._drive(
                self._operator_flow(intent, State(state), note), store, intent, ""
            )
        return moved

    def resolve_from_notification(
        self,
        state: State | str,
        *,
        intent: str | None = None,
        key: str | None = None,
        note: str = "",
    ) -> Notified:
        """Apply a provider's notification that the operation behind an intent ``state``
        (succeeded or failed), naming it by ``intent`` or by the idempotency ``key`` the
        provider echoes (Stripe's ``event.request.idempotency_key``).

        An expired or indeterminate intent is resolved (as :meth:`resolve`; its
        settlement follows). One that agrees, or is still being sent, is left as it
        is. A stored ending that says otherwise is never overwritten: the
        contradiction is logged and returned, not applied.
        """
        with self._in_call():
            flow = self._notification_flow(State(state), intent, key, note)
            notified: Notified = self._drive(flow, self.outbox, intent or "", key or "")
        return notified

    def cancel(self, intent: str, *, note: str = "") -> IntentRecord:
        """Cancel an intent never delivered (as ``outbox cancel``); its settlement follows."""
        return self.resolve(intent, State.CANCELLED, note=note)

    def _drive(
        self,
        flow: Generator[Effect, Any, Any],
        store: Store,
        reference: str,
        key: str,
        turn: Turn | None = None,
    ) -> Any:
        """Perform a flow's effects with blocking calls until it returns or raises.

        On Ctrl-C the flow is told it is abandoned and its clean-up (store
        calls only) is performed before the interrupt goes on. A drain's flow
        sends in its ``turn``: the send is counted, and the turn given back
        once the send is over, whatever its end.
        """
        value: Any = None
        error: BaseException | None = None
        interrupted: BaseException | None = None
        sends, outbox_seconds = 0, 0.0
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                if interrupted is not None:
                    raise interrupted from None
                return stop.value
            except Abandoned:
                assert interrupted is not None
                raise interrupted from None
            except OutboxError as exc:
                raise named(exc, reference, key) from exc
            value, error = None, None
            if interrupted is not None and not isinstance(effect, StoreCall):
                error = Abandoned()
                continue
            try:
                if isinstance(effect, Send):
                    sends += 1
                    detail = None
                    if self._around_send:  # the hook's record, made only for a hook
                        detail = SendDetail(reference, key, sends, outbox_seconds)
                    outbox_seconds = 0.0
                    value = self._sent(effect, store, reference, detail, turn)
                elif isinstance(effect, Sleep):
                    time.sleep(effect.seconds)
                elif isinstance(effect, Callback):
                    value = effect.fn(effect.arg)
                else:
                    began = time.perf_counter()
                    value = effect.on(store)
                    outbox_seconds += time.perf_counter() - began
            except Exception as exc:
                error = exc
            except KeyboardInterrupt as exc:
                interrupted, error = exc, Abandoned()

    def _sent(
        self,
        effect: Send,
        store: Store,
        reference: str,
        detail: SendDetail | None,
        turn: Turn | None,
    ) -> httpx.Response:
        """Perform a Send: in its drain turn, its lease renewed, inside any around_send hook."""
        self._check_released()
        if turn is not None:
            turn.sending()
        try:
            with self._heartbeat.holding(store, effect.lease):
                if detail is None:
                    response = self._send(effect.request, reference)
                else:
                    with sending(self.hooks, detail):
                        response = self._send(effect.request, reference)
            if turn is not None:
                turn.answered(response.status_code, response.headers)
            return response
        finally:
            if turn is not None:
                turn.end()

    def _send(self, request: httpx.Request, intent: str) -> httpx.Response:
        """Send without httpx following redirects; follow same-origin ones here (see next_hop)."""
        http = self._http
        response = http.send(request, follow_redirects=False)
        history: list[httpx.Response] = []
        while (hop := next_hop(http, response, len(history), intent)) is not None:
            history.append(response)
            response = http.send(hop, follow_redirects=False)
            response.history = list(history)
        return response

    @with_options
    def post_once(self, url: httpx.URL | str, **options: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("POST", url, ...)``: the usual case."""
        return self._once("POST", url, options, "post_once")

    @with_options
    def put_once(self, url: httpx.URL | str, **options: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("PUT", url, ...)``."""
        return self._once("PUT", url, options, "put_once")

    @with_options
    def patch_once(self, url: httpx.URL | str, **options: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("PATCH", url, ...)``."""
        return self._once("PATCH", url, options, "patch_once")

    @with_options
    def delete_once(self, url: httpx.URL | str, **options: Unpack[OnceOptions]) -> httpx.Response:
        """``request_once("DELETE", url, ...)``."""
        return self._once("DELETE", url, options, "delete_once")

    def enqueue(
        self,
        url: httpx.URL | str,
        *,
        connection: Any,
        method: str = "POST",
        **options: Unpack[OnceOptions],
    ) -> IntentInfo:
        """Write an intent in the application's own transaction; send nothing.

        ``connection`` is the application's open connection to the database the
        outbox lives in (``sqlite3.Connection``, ``psycopg.Connection``, or a
        SQLAlchemy ``Connection`` or ``Session``): the intent is inserted there,
        in the transaction the application commits with its own rows, or rolls
        back with them. Nothing is committed, rolled back or sent here. Once
        committed, a drain sends it (on PostgreSQL a running worker drain is
        woken by the commit), or ``post_once`` with the same ``intent`` and
        request resumes it with its stored key.

        Every rule of ``post_once`` applies before anything is written, and
        bad input is refused with nothing written: an :class:`InvalidRequest`
        for the request or the connection (closed, in autocommit outside a
        transaction, to another database), an :class:`IntentConflict` if the
        intent is stored with another request. The same intent and request
        enqueued again writes nothing and returns the stored intent
        (``from_outbox=True``). The options are ``post_once``'s, less
        ``retry`` and ``timeout``: the drain sends with its own client's.
        """
        new = self._plan_enqueue(method, url, options)
        try:
            store = self.outbox
            target = self._target_of(store, new)
        except PostonceError as exc:
            raise self._enqueue_refused(exc, new) from exc
        return app_connection(connection, new).enqueue(target, new, self._clock())

    # -- the drain -----------------------------------------------------------

    def drain(
        self,
        *,
        forever: bool = False,
        interval: float = 5.0,
        concurrency: int = 1,
        stop: threading.Event | None = None,
        progress: Callable[[DrainReport], None] | None = None,
        rate: float | None = None,
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
        the outbox holds no credentials. So a drain sends only the intents of
        this client's sender, addressed to its origins; others' due intents are
        left alone and counted in the report's ``not_ours``.

        Gentle to a recovering provider: a 429 or 503 with ``Retry-After`` pauses
        that origin's due intents for the time asked (at most the policy's
        ``retry_after_max``); sends in flight go on. ``rate`` caps the sends a
        second to each origin.
        """
        self._check_drain(concurrency, interval)
        pace = self._pace(rate)
        stop_now = None
        if stop is None:
            stop = threading.Event()
            stop_now = stop.set
        with self._draining(stop_now):
            return self._drain(forever, interval, concurrency, stop, progress, pace)

    def _drain(
        self,
        forever: bool,
        interval: float,
        concurrency: int,
        stop: threading.Event,
        progress: Callable[[DrainReport], None] | None,
        pace: Pace,
    ) -> DrainReport:
        store = self.outbox
        tally = Tally()

        def claim(due_by: float, limit: int, paused: frozenset[str]) -> list[Opened]:
            adopt = self._adoption_due()  # one that failed when the outbox opened
            if adopt is not None:
                self._adopted_result(outcome_of(lambda: adopt.on(store)))
            call = self._claim_call(due_by, limit, paused)
            claimed: list[Opened] = call.on(store) if call is not None else []
            return claimed

        def process(opened: Opened, turn: Turn) -> None:
            record = opened.record
            try:
                outcome: object = self._drive(
                    self._drain_flow(opened, tally), store, record.reference, record.key, turn
                )
            except Exception as exc:
                outcome = exc
            count_outcome(tally, outcome)

        def release(opened: Opened, due_at: float | None) -> None:
            flow = self._release_flow(opened, due_at=due_at)
            self._drive(flow, store, opened.record.reference, "")

        with stop_on_signals(stop), self._idle_wait(store, forever, stop) as idle:
            report = run_drain(
                claim=claim,
                process=process,
                release=release,
                clock=self._clock,
                tally=tally,
                forever=forever,
                interval=interval,
                concurrency=concurrency,
                flows=flows_for(store, concurrency),
                stop=stop,
                pace=pace,
                closed=lambda: self._closed,
                progress=progress,
                aftercare=lambda: self._aftercare_quietly(store, tally),
                idle=idle,
            )
        # Counted after the drain, best effort: a drain that could not count still drained.
        census = self._census_call()
        return note_census(
            report,
            outcome_of(lambda: census.on(store)),
            self.sender,
            self.origins,
            outbox_name(store),
        )

    @staticmethod
    def _idle_wait(
        store: Store, forever: bool, stop: threading.Event
    ) -> AbstractContextManager[Callable[[float], object]]:
        """How a worker drain waits when nothing is due: woken on PostgreSQL by an enqueue's
        commit (NOTIFY), else until its interval passes or it is stopped."""
        listener = getattr(store, "due_listener", None)
        if forever and listener is not None:
            waiting: AbstractContextManager[Callable[[float], object]] = listener(stop)
            return waiting
        return nullcontext(stop.wait)

    def _aftercare_quietly(self, store: Store, tally: Tally) -> None:
        """Reconcile and settle between drain passes; an outbox failure waits for the next."""
        try:
            self._drive(self._aftercare(tally), store, "", "")
        except OutboxError as exc:
            logger.warning("drain: settlements and reconciliation wait for the next pass: %s", exc)

    # -- life cycle ----------------------------------------------------------

    def close(self) -> None:
        """Close the httpx client and the outbox, where this client opened them.

        Calls under way (in other threads) finish first, as they would have,
        retry waits included; drains under way stop as on ``stop.set()`` (one
        given its own ``stop=`` event at its next look, within its interval:
        that event is not set). The client is then closed for good: a later
        call raises ConfigurationError before anything is stored or sent.
        Raises ConfigurationError inside one of this client's own calls (a
        hook, ``on_settled``), where it would wait for itself.
        """
        self._closing()
        try:
            self._wait_idle()
        finally:  # interrupted (Ctrl-C) or not, and again on a repeat close
            self._release()

    def _release(self) -> None:
        self._released = True  # first: a send still under way is refused from now on
        if self._owns_http:
            self._http.close()
        self._heartbeat.close()
        self._let_go_of_store()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
