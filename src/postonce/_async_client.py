"""``AsyncClient``: the async shell over the same flows, httpx.AsyncClient and an outbox.

It differs from ``Client`` only in how effects are performed: sends and
sleeps are awaited, and store calls go to the outbox's own writer thread,
which commits concurrent intents together (group commit). Runs on asyncio,
and on trio through anyio.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Collection, Generator, Sequence
from contextlib import AsyncExitStack
from typing import Any, Literal

import anyio
import httpx
from typing_extensions import Unpack

from ._appdb import async_app_connection
from ._base import BaseClient, OnceOptions, named, with_options
from ._budget import RetryBudget
from ._drain import (
    JUST_BEFORE,
    AsyncTurns,
    DrainReport,
    HandBack,
    Pause,
    TakeTurn,
    Tally,
    Turn,
    claim_failed,
    claim_steps,
    count_outcome,
    flows_for,
    least_batch,
    next_batch,
    note_census,
    outbox_name,
)
from ._exceptions import OutboxError, PostonceError
from ._flow import Abandoned, Callback, Effect, Send, Sender, Sleep, StoreCall, run
from ._intent import Census, IntentInfo, IntentRecord, NewIntent, Opened, State
from ._notify import Notified
from ._observe import (
    Hooks,
    Pending,
    SendDetail,
    await_hooks,
    collect_awaitables,
    drop_hooks,
    is_coroutine_function,
    sending,
    stop_collecting,
)
from ._outbox.base import Store, Target
from ._outbox.locate import OutboxSpec
from ._outbox.sqlite import Durability
from ._outbox.threaded import StoreThread, loop_notifier
from ._pace import Pace
from ._policy import RetryPolicy
from ._redirects import next_hop
from ._settings import settings as checked_settings
from ._settle import Settlement
from ._wire import HeaderInput
from .providers import Provider

__all__ = ["AsyncClient"]

logger = logging.getLogger("postonce")


def _stopper(stop: anyio.Event) -> Callable[[], object]:
    """``stop.set`` as any thread or event loop can call it: handed to the drain's loop.

    Never waits for that loop (it may be the caller's own, or stopped): the set
    runs on the loop's next turn. A loop already closed raises, and close()
    takes that for a drain already over.
    """
    notify = loop_notifier()
    return functools.partial(notify, stop.set)


class AsyncClient(BaseClient):
    """The async twin of :class:`postonce.Client`: same parameters, same guarantees.

    ``await client.post_once(...)`` commits the intent before the first send,
    like ``Client``, but the commit happens on the outbox's writer threads
    (``postonce-outbox-writer``), so the event loop never blocks on the outbox.
    On SQLite concurrent calls share one commit; on PostgreSQL each call takes
    its own path on a pooled connection, and concurrent records share one.
    Pass any httpx async transport, for example
    ``httpx_aiohttp.AiohttpTransport()`` for throughput at high concurrency;
    the guarantees do not depend on it.

    Hooks may be coroutine functions (``async def``): each is awaited where
    its event happens, before the call goes on.
    """

    _awaits_hooks = True

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
        reconcile: Callable[[IntentRecord], Any] | None = None,
        reconcile_every: float = 3600.0,
        credentials_for: Callable[[IntentRecord], Any] | None = None,
        http: httpx.AsyncClient | None = None,
        **httpx_options: Any,
    ) -> None:
        super().__init__(
            outbox,
            checked_settings(
                awaits=True,
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
        self._http: httpx.AsyncClient
        self._http, self._owns_http = self._own_http(
            http, "AsyncClient", base_url, headers, httpx_options
        )
        self._thread: StoreThread | None = None
        self._opening: anyio.Lock | None = None
        self._target: Target | None = None  # where enqueue writes, once the outbox said

    # -- the outbox ----------------------------------------------------------

    async def _store_thread(self) -> StoreThread:
        self._check_released()
        if self._thread is None:
            # One opener: many tasks arriving at once must not each start a thread.
            if self._opening is None:
                self._opening = anyio.Lock()
            async with self._opening:
                if self._thread is None:
                    store = self._store
                    if store is None:
                        store = await anyio.to_thread.run_sync(self._opened_store)
                    thread = StoreThread(store)
                    if not self._adopted:  # (each drain pass adopts what came since)
                        await self._adopt(thread)
                    self._thread = thread
        return self._thread

    async def _adopt(self, thread: StoreThread) -> None:
        """Take on intents of no sender, on the store's thread (until it has worked once)."""
        call = self._adoption_due()
        if call is not None:
            try:
                self._adopted_result(await thread.call(call.method, call.kwargs))
            except OutboxError as exc:
                self._adopted_result(exc)

    async def lookup(self, intent: str) -> IntentRecord | None:
        """The stored intent with this reference, or None."""
        with self._in_call():
            record: IntentRecord | None = await (await self._store_thread()).call(
                "get", {"reference": intent}
            )
        return record

    # -- requests ------------------------------------------------------------

    @with_options
    async def request_once(
        self, method: str, url: httpx.URL | str, **options: Unpack[OnceOptions]
    ) -> httpx.Response:
        """Send ``method url`` once per intent; see :meth:`postonce.Client.request_once`.

        If the task is cancelled, the intent stays durable in its true state:
        a send that may have been written is recorded as ambiguous and left
        pending for the drain; a claim that sent nothing is released.
        """
        return await self._once(method, url, options, "request_once")

    async def _once(
        self, method: str, url: httpx.URL | str, options: OnceOptions, called: str
    ) -> httpx.Response:
        """A ``*_once`` call; ``called`` names the public method, for a misspelt option."""
        prepared, sender, new, ticket = self._begin_once(method, url, options, called)
        try:
            return await self._request(prepared.reference, prepared.key, sender, new)
        finally:
            self._end_call(ticket)

    async def _request(
        self, reference: str, key: str, sender: Sender, new: NewIntent
    ) -> httpx.Response:
        try:
            thread = await self._store_thread()
        except PostonceError as exc:
            raise named(exc, reference, key) from exc
        try:
            response: httpx.Response = await self._drive(run(sender, new), thread, reference, key)
        except Exception as exc:
            # A postonce error, or a response hook's own error raised after its answer
            # was recorded: either may have ended the intent. One read back is not new.
            if not getattr(exc, "from_outbox", False):
                await self._settle(thread, reference, key)
            raise
        if not response.extensions["postonce"].from_outbox:
            await self._settle(thread, reference, key)
        return response

    async def _settle(self, thread: StoreThread, reference: str, key: str) -> None:
        """Deliver the settlement this call owes (if it ended the intent) before returning."""
        if self.on_settled is None:
            return
        try:
            await self._drive(self._settle_after_call(reference), thread, reference, key)
        except OutboxError as exc:
            # Left owed in the outbox: a drain delivers it. The call's own outcome stands.
            logger.warning("settlement of %r left to the drain: %s", reference, exc)

    async def wait(self, intent: str, *, timeout: float = 30.0) -> httpx.Response:
        """``await`` the final answer of ``intent``; see :meth:`postonce.Client.wait`."""
        with self._in_call():
            return await self._wait(intent, timeout)

    async def _wait(self, intent: str, timeout: float) -> httpx.Response:
        thread = await self._store_thread()
        steps = self._waiting(intent, timeout)
        ask = next(steps)
        while True:
            if ask is None:
                result: Any = await thread.call("get", {"reference": intent})
            else:  # off the event loop: PostgreSQL blocks on LISTEN, others sleep briefly
                result = await anyio.to_thread.run_sync(thread.store.wait_change, *ask)
            try:
                ask = steps.send(result)
            except StopIteration as done:
                answer: httpx.Response = done.value
                return answer

    async def resolve(self, intent: str, state: State, *, note: str = "") -> IntentRecord:
        """Resolve an expired or indeterminate intent; see :meth:`postonce.Client.resolve`."""
        with self._in_call():
            thread = await self._store_thread()
            moved: IntentRecord = await self._drive(
                self._operator_flow(intent, State(state), note), thread, intent, ""
            )
        return moved

    async def resolve_from_notification(
        self,
        state: State | str,
        *,
        intent: str | None = None,
        key: str | None = None,
        note: str = "",
    ) -> Notified:
        """A provider's notification; see :meth:`postonce.Client.resolve_from_notification`."""
        with self._in_call():
            thread = await self._store_thread()
            flow = self._notification_flow(State(state), intent, key, note)
            notified: Notified = await self._drive(flow, thread, intent or "", key or "")
        return notified

    async def cancel(self, intent: str, *, note: str = "") -> IntentRecord:
        """Cancel an intent never delivered; see :meth:`postonce.Client.cancel`."""
        return await self.resolve(intent, State.CANCELLED, note=note)

    async def _drive(
        self,
        flow: Generator[Effect, Any, Any],
        thread: StoreThread,
        reference: str,
        key: str,
        turn: Turn | None = None,
    ) -> Any:
        """Perform a flow's effects with awaits until it returns or raises.

        On cancellation the flow is told it is abandoned and its clean-up
        (store calls only) is performed, shielded, before the cancellation
        goes on. A store call already queued still completes and its result
        reaches the flow first: the flow must know what it committed.
        A drain's flow sends in its ``turn``: the send is counted, and the turn
        given back once the send is over, whatever its end.
        """
        pending, token = collect_awaitables()
        try:
            return await self._perform(flow, thread, pending, reference, key, turn)
        finally:
            drop_hooks(pending)
            stop_collecting(token)

    async def _perform(
        self,
        flow: Generator[Effect, Any, Any],
        thread: StoreThread,
        pending: Pending,
        reference: str,
        key: str,
        turn: Turn | None,
    ) -> Any:
        value: Any = None
        error: BaseException | None = None
        cancelled: BaseException | None = None
        cancelled_exc = anyio.get_cancelled_exc_class()
        sends, outbox_seconds = 0, 0.0
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                if cancelled is not None:
                    raise cancelled from None
                await await_hooks(pending)
                return stop.value
            except Abandoned:
                assert cancelled is not None
                raise cancelled from None
            except Exception as exc:
                if cancelled is None:
                    await await_hooks(pending)
                if isinstance(exc, OutboxError):
                    raise named(exc, reference, key) from exc
                raise
            value, error = None, None
            if pending and cancelled is None:
                # Coroutine hooks run before the call goes on, as plain hooks do.
                try:
                    await await_hooks(pending)
                except cancelled_exc as exc:
                    cancelled = exc
            if cancelled is not None and not isinstance(effect, StoreCall):
                error = Abandoned()
                continue
            try:
                if isinstance(effect, Send):
                    sends += 1
                    detail = None
                    if self._around_send:  # the hook's record, made only for a hook
                        detail = SendDetail(reference, key, sends, outbox_seconds)
                    outbox_seconds = 0.0
                    value = await self._sent(effect, thread.store, reference, detail, turn)
                elif isinstance(effect, Sleep):
                    await anyio.sleep(effect.seconds)
                elif isinstance(effect, Callback):
                    value = await _call_back(effect)
                else:
                    began = time.perf_counter()
                    ticket = thread.submit(effect.method, effect.kwargs)
                    if cancelled is None:
                        value = await ticket.wait()
                    else:  # the clean-up of a cancelled call: finished whatever comes
                        with anyio.CancelScope(shield=True):
                            value = await ticket.wait()
                    outbox_seconds += time.perf_counter() - began
            except cancelled_exc as exc:
                cancelled = exc
                if isinstance(effect, StoreCall):
                    try:
                        with anyio.CancelScope(shield=True):
                            value = await ticket.wait()
                    except Exception as store_error:
                        error = store_error
                else:
                    error = Abandoned()
            except Exception as exc:
                error = exc

    async def _sent(
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
                    response = await self._send(effect.request, reference)
                else:
                    with sending(self.hooks, detail):
                        response = await self._send(effect.request, reference)
            if turn is not None:
                turn.answered(response.status_code, response.headers)
            return response
        finally:
            if turn is not None:
                turn.end()

    async def _send(self, request: httpx.Request, intent: str) -> httpx.Response:
        """Send without httpx following redirects; follow same-origin ones here (see next_hop)."""
        http = self._http
        response = await http.send(request, follow_redirects=False)
        history: list[httpx.Response] = []
        while (hop := next_hop(http, response, len(history), intent)) is not None:
            history.append(response)
            response = await http.send(hop, follow_redirects=False)
            response.history = list(history)
        return response

    @with_options
    async def post_once(
        self, url: httpx.URL | str, **options: Unpack[OnceOptions]
    ) -> httpx.Response:
        """``request_once("POST", url, ...)``: the usual case."""
        return await self._once("POST", url, options, "post_once")

    @with_options
    async def put_once(
        self, url: httpx.URL | str, **options: Unpack[OnceOptions]
    ) -> httpx.Response:
        """``request_once("PUT", url, ...)``."""
        return await self._once("PUT", url, options, "put_once")

    @with_options
    async def patch_once(
        self, url: httpx.URL | str, **options: Unpack[OnceOptions]
    ) -> httpx.Response:
        """``request_once("PATCH", url, ...)``."""
        return await self._once("PATCH", url, options, "patch_once")

    @with_options
    async def delete_once(
        self, url: httpx.URL | str, **options: Unpack[OnceOptions]
    ) -> httpx.Response:
        """``request_once("DELETE", url, ...)``."""
        return await self._once("DELETE", url, options, "delete_once")

    async def enqueue(
        self,
        url: httpx.URL | str,
        *,
        connection: Any,
        method: str = "POST",
        **options: Unpack[OnceOptions],
    ) -> IntentInfo:
        """Write an intent in the application's transaction; see :meth:`postonce.Client.enqueue`.

        ``connection``: a ``psycopg.AsyncConnection``, or a SQLAlchemy
        ``AsyncConnection`` or ``AsyncSession``, to the outbox's database.
        """
        new = self._plan_enqueue(method, url, options)
        try:
            self._check_released()
            target = self._target
            if target is None:  # asked once, off the loop (PostgreSQL answers with a query)
                thread = await self._store_thread()
                target = await anyio.to_thread.run_sync(self._target_of, thread.store, new)
                self._target = target
        except PostonceError as exc:
            raise self._enqueue_refused(exc, new) from exc
        writer = await async_app_connection(connection, new)
        return await writer.enqueue(target, new, self._clock())

    # -- the drain -----------------------------------------------------------

    async def drain(
        self,
        *,
        forever: bool = False,
        interval: float = 5.0,
        concurrency: int = 1,
        stop: anyio.Event | None = None,
        progress: Callable[[DrainReport], None] | None = None,
        rate: float | None = None,
    ) -> DrainReport:
        """Send every due intent once, with its stored key; see :meth:`postonce.Client.drain`.

        Up to ``concurrency`` intents are sent at once as tasks. Set ``stop``
        (or cancel the task) to end a ``forever`` drain: attempts in flight
        finish and are recorded, claims not yet sent are released.
        """
        self._check_drain(concurrency, interval)
        pace = self._pace(rate)
        stop_now = None
        if stop is None:
            stop = anyio.Event()
            stop_now = _stopper(stop)  # close() may run on another thread or loop
        with self._draining(stop_now):
            return await self._drain(forever, interval, concurrency, stop, progress, pace)

    async def _drain(
        self,
        forever: bool,
        interval: float,
        concurrency: int,
        stop: anyio.Event,
        progress: Callable[[DrainReport], None] | None,
        pace: Pace,
    ) -> DrainReport:
        thread = await self._store_thread()
        tally = Tally()
        started, began = self._clock(), time.monotonic()
        limiter = anyio.CapacityLimiter(flows_for(thread.store, concurrency))
        turns = AsyncTurns(concurrency, tally)
        # Paced as the sync drain's (see BATCH_SECONDS): one durable claim serves many sends.
        least = batch = least_batch(concurrency)

        def stopping() -> bool:
            return stop.is_set() or self._closed

        async def one(opened: Opened) -> None:
            """One claimed intent's steps (see ``claim_steps``), its turn taken within a flow."""
            turn: Turn | None = None
            async with AsyncExitStack() as flow:
                try:
                    for step in claim_steps(opened, pace, self._clock, stopping):
                        if isinstance(step, Pause):
                            with anyio.move_on_after(step.seconds):
                                await stop.wait()
                        elif isinstance(step, TakeTurn):
                            await flow.enter_async_context(limiter)
                            turn = await turns.take(step.heard)
                        elif isinstance(step, HandBack):
                            await self._hand_back(opened, step.due_at, thread, tally, step.counted)
                        else:
                            assert turn is not None
                            await self._drain_claimed(opened, turn, thread, tally)
                finally:
                    if turn is not None:
                        turn.end()

        while not stopping():
            passed = time.monotonic()
            due_by = self._clock() if forever else started - JUST_BEFORE
            call = self._claim_call(due_by, batch, pace.paused())
            try:
                await self._adopt(thread)  # a failure is this pass's claim's
                claimed: list[Opened] = (
                    await thread.call(call.method, call.kwargs) if call is not None else []
                )
            except OutboxError:
                claim_failed(tally, forever=forever, interval=interval)
                with anyio.move_on_after(interval):
                    await stop.wait()
                continue
            if not claimed:
                await self._aftercare_quietly(thread, tally)
                if not forever:
                    break
                await self._nothing_due(thread.store, interval, stop)
                continue
            tally.add("claimed", len(claimed))
            async with anyio.create_task_group() as group:
                for opened in claimed:
                    group.start_soon(one, opened)
            batch = next_batch(batch, len(claimed), time.monotonic() - passed, least)
            if progress is not None:
                progress(tally.report(time.monotonic() - began))
        report = tally.report(time.monotonic() - began)
        # Counted after the drain, best effort: a drain that could not count still drained.
        census = self._census_call()
        try:
            counted: Census | OutboxError = await thread.call(census.method, census.kwargs)
        except OutboxError as exc:
            counted = exc
        return note_census(report, counted, self.sender, self.origins, outbox_name(thread.store))

    async def _nothing_due(self, store: Store, interval: float, stop: anyio.Event) -> None:
        """A worker drain with nothing due waits ``interval`` or for ``stop``; on PostgreSQL
        an enqueued intent's commit (NOTIFY) ends the wait at once, as for ``Client.drain``.

        The outbox's listener is a blocking wait on a worker thread, told to end
        when ``stop`` is set (it looks every quarter second); if it cannot listen,
        the drain sleeps its interval as on SQLite.
        """
        listener = getattr(store, "due_listener", None)
        if listener is None:
            with anyio.move_on_after(interval):
                await stop.wait()
            return
        halt = threading.Event()

        def listen() -> None:
            with listener(halt) as wait:
                wait(interval)

        async with anyio.create_task_group() as group:

            async def on_stop() -> None:
                await stop.wait()
                halt.set()

            group.start_soon(on_stop)
            try:
                await anyio.to_thread.run_sync(listen)
            except OutboxError as exc:
                logger.debug("drain: no NOTIFY wake-up (%s); waiting %s s", exc, interval)
                with anyio.move_on_after(interval):
                    await stop.wait()
            finally:
                halt.set()
                group.cancel_scope.cancel()

    async def _drain_claimed(
        self, opened: Opened, turn: Turn, thread: StoreThread, tally: Tally
    ) -> None:
        """Run a claimed intent's drain flow in its turn, and count how it ended."""
        record = opened.record
        try:
            outcome: object = await self._drive(
                self._drain_flow(opened, tally), thread, record.reference, record.key, turn
            )
        except Exception as exc:
            outcome = exc
        count_outcome(tally, outcome)

    async def _hand_back(
        self,
        opened: Opened,
        due_at: float | None,
        thread: StoreThread,
        tally: Tally,
        counted: str,
    ) -> None:
        """Release a claim unsent, as ``_Drain.hand_back`` does (a failure is counted)."""
        reference = opened.record.reference
        try:
            await self._drive(self._release_flow(opened, due_at=due_at), thread, reference, "")
        except OutboxError as exc:
            logger.warning(
                "drain: handing back %r failed (%s); it is claimed again when its lease runs out",
                reference,
                exc,
            )
            tally.add("errors")
            return
        tally.add(counted)

    async def _aftercare_quietly(self, thread: StoreThread, tally: Tally) -> None:
        """Reconcile and settle between drain passes; an outbox failure waits for the next."""
        try:
            await self._drive(self._aftercare(tally), thread, "", "")
        except OutboxError as exc:
            logger.warning("drain: settlements and reconciliation wait: %s", exc)

    # -- life cycle ----------------------------------------------------------

    async def aclose(self) -> None:
        """Close the httpx client, the writer thread and the outbox this client opened.

        Calls under way (other tasks) finish first, as they would have, retry
        waits included; drains under way stop as on ``stop.set()`` (one given
        its own ``stop=`` event at its next look, within its interval: that
        event is not set). Cancelled while it waits, it still lets go of
        everything. The client is then closed for good: a later call raises
        ConfigurationError before anything is stored or sent. Raises
        ConfigurationError inside one of this client's own calls (a hook,
        ``on_settled``), where it would wait for itself.
        """
        self._closing()
        try:
            # A limiter of its own: the calls it waits for need the shared worker threads.
            # Cancelled, it stops waiting (the thread waits on, harmlessly) and lets go.
            await anyio.to_thread.run_sync(
                self._wait_idle, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1)
            )
        finally:  # cancelled or not, and again on a repeat aclose: let go of everything
            with anyio.CancelScope(shield=True):
                await self._release()

    async def _release(self) -> None:
        self._released = True  # first: a send still under way is refused from now on
        if self._owns_http:
            await self._http.aclose()
        self._heartbeat.close()
        if self._thread is not None:
            thread, self._thread = self._thread, None
            await anyio.to_thread.run_sync(thread.close)
        await anyio.to_thread.run_sync(self._let_go_of_store)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _call_back(effect: Callback) -> Any:
    """Call the application's handler or reconciler; a plain function runs off the loop.

    A plain ``on_settled``/``reconcile`` may block (a database write, a provider
    lookup): on a worker thread, the loop runs on. The context is copied, so a
    close() inside it is still caught.
    """
    if is_coroutine_function(effect.fn):
        value = effect.fn(effect.arg)
    else:
        value = await anyio.to_thread.run_sync(effect.fn, effect.arg)
    if inspect.isawaitable(value):
        value = await value
    return value
