"""Shared fixtures: a real loopback server, fresh outboxes, client factories."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
import uvicorn
from psycopg import sql

import postonce
from postonce._intent import Outcome, State, StoredResponse
from postonce._outbox.base import AttemptRecord, Lease, NewIntent
from postonce._outbox.locate import open_store, split_schema
from postonce._sender import origin_of
from postonce.testing import MemoryOutbox
from tests.http_library import HTTP_LIBRARY, default_transport
from tests.idem_server import IdempotentApp

T = TypeVar("T")

# Tests never wait long: the policy is the library's, only the numbers are small.
FAST = postonce.RetryPolicy(
    attempts=6,
    timeout=20.0,
    wait_initial=0.01,
    wait_max=0.05,
    in_flight_initial=0.05,
    in_flight_max=0.2,
)


@dataclass
class LoopbackServer:
    """A uvicorn server on 127.0.0.1 serving the idempotent test API."""

    app: IdempotentApp
    base_url: str

    def ledger(self) -> dict[str, Any]:
        """The server's own record of what it executed, read over HTTP."""
        return httpx.get(f"{self.base_url}/_ledger").json()  # type: ignore[no-any-return]

    def effects_for(self, key: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger()["effects"] if e["key"] == key]

    def requests_for(self, key: str) -> list[dict[str, Any]]:
        return [r for r in self.ledger()["requests"] if r["key"] == key]


def _serve(app: IdempotentApp) -> tuple[uvicorn.Server, threading.Thread, int]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="loopback-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the loopback test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, int(port)


JSON_HEADERS = (("content-type", "application/json"),)


def loopback_intent(
    server: LoopbackServer,
    reference: str,
    *,
    key: str | None = None,
    sender: str | None = None,
    body: bytes = b'{"amount":1}',
    headers: tuple[tuple[str, str], ...] = JSON_HEADERS,
    fingerprint: str = "0" * 64,
    meta: str | None = None,
) -> NewIntent:
    """A POST to the loopback server's charges, as another process writes it ahead.

    Its key is given (``<reference>-key-0001`` unless ``key``); ``sender=None``
    is a row from before senders were kept: no sender and no origin.
    """
    return NewIntent(
        reference=reference,
        key=key if key is not None else f"{reference}-key-0001",
        key_given=True,
        provider="ietf_draft",
        method="POST",
        url=f"{server.base_url}/ietf/v1/charges",
        headers=headers,
        body=body,
        fingerprint=fingerprint,
        deadline_at=None,
        sender=sender,
        origin=origin_of(server.base_url) if sender is not None else None,
        meta=meta,
    )


def record_final(
    store: postonce.Store,
    lease: Lease | None,
    *,
    state: State = State.SUCCEEDED,
    status: int = 201,
    started_at: float = 1000.0,
    stored: bool = False,
    durable: bool = False,
) -> bool:
    """Record a final answer under ``lease`` as the flow does (one attempt of 0.1 s).

    ``stored``: the answer is kept, as the flow keeps a final one; the first
    attempt of the writer-ahead's lease is then carried by the intent row.
    """
    assert lease is not None
    body = b"{}"
    return store.record(
        lease,
        AttemptRecord(started_at, 0.1, Outcome.FINAL, status, None, False),
        state=state,
        anchor=1000.0,
        due_at=None,
        lease_until=None,
        response=StoredResponse(status, (), body, False, hashlib.sha256(body).hexdigest())
        if stored
        else None,
        note=None,
        durable=durable,
    )


@pytest.fixture(scope="session")
def server() -> Iterator[LoopbackServer]:
    """One real HTTP server on 127.0.0.1 for the whole session."""
    app = IdempotentApp()
    uv, thread, port = _serve(app)
    yield LoopbackServer(app=app, base_url=f"http://127.0.0.1:{port}")
    uv.should_exit = True
    thread.join(timeout=10)


class SlowRecord:
    """Replaces a store's ``record``: says when a record has begun, then holds it ``hold`` s."""

    def __init__(self, store: Any, hold: float) -> None:
        self.real = store.record
        self.hold = hold
        self.started = threading.Event()
        self.finished = threading.Event()
        self.threads: set[str] = set()
        store.record = self

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        self.threads.add(threading.current_thread().name)
        self.started.set()
        time.sleep(self.hold)
        try:
            done: bool = self.real(*args, **kwargs)
            return done
        finally:
            self.finished.set()


@pytest.fixture
def outbox_path(tmp_path: Path) -> Path:
    """A fresh SQLite outbox file for one test."""
    return tmp_path / "outbox.sqlite3"


#: The PostgreSQL server this machine provides (trust auth, database ``test``).
PG_URL = os.environ.get("POSTONCE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@contextmanager
def pg_schema() -> Iterator[str]:
    """An outbox URL in a schema of its own, dropped afterwards.

    An unreachable server is an error, never a skip: CI must not pass without it.
    """
    schema = f"t_{uuid.uuid4().hex[:16]}"
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each outbox test runs on the SQLite, the PostgreSQL and the in-memory outbox."""
    return str(request.param)


#: What the ``outbox`` fixtures give: a SQLite path, a PostgreSQL URL, or a MemoryOutbox.
OutboxUnderTest = str | MemoryOutbox


def _outbox_for(backend: str, tmp_path: Path, name: str) -> Iterator[OutboxUnderTest]:
    if backend == "sqlite":
        yield str(tmp_path / f"{name}.sqlite3")
    elif backend == "memory":
        yield MemoryOutbox()
    else:
        with pg_schema() as url:
            yield url


@pytest.fixture
def outbox(backend: str, tmp_path: Path) -> Iterator[OutboxUnderTest]:
    """A fresh outbox of this run's backend: a SQLite path, a PostgreSQL URL, a MemoryOutbox."""
    yield from _outbox_for(backend, tmp_path, "outbox")


@pytest.fixture
def another_outbox(backend: str, tmp_path: Path) -> Iterator[OutboxUnderTest]:
    """A second, separate outbox of the same backend (another system)."""
    yield from _outbox_for(backend, tmp_path, "another")


def stored_intent(spec: OutboxUnderTest, intent: str) -> tuple[postonce.IntentRecord, list[str]]:
    """The intent and its attempts' outcomes, read by a store of its own."""
    store = open_store(spec)
    try:
        record = store.get(intent)
        assert record is not None
        return record, [a.outcome.value for a in store.attempts(intent)]
    finally:
        store.close()


def outbox_bytes(spec: OutboxUnderTest) -> bytes:
    """Everything an outbox holds at rest, as bytes, to search for what must not be there."""
    if isinstance(spec, MemoryOutbox):
        # Every stored row in full: the request, the answer, the attempts.
        return "\n".join(repr(row) for row in spec._rows.values()).encode()
    if not spec.startswith("postgresql://"):
        path = Path(spec)
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    url, schema = split_schema(spec)
    with psycopg.connect(url) as conn:
        dump = []
        for table in ("intents", "attempts"):
            query = sql.SQL("SELECT t::text FROM {}.{} t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            dump += [row[0] for row in conn.execute(query)]
    return "\n".join(dump).encode()


ClientFactory = Callable[..., postonce.Client]


class AsyncDriven:
    """An AsyncClient driven from synchronous test code, on an event loop of its own.

    It answers the calls ``Client`` answers, so one test body specifies the
    behaviour of both clients; every call really runs ``await`` on the
    AsyncClient, with its writer thread and group commits.
    """

    def __init__(self, client: postonce.AsyncClient) -> None:
        self.client = client
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def request_once(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self._run(self.client.request_once(method, url, **kwargs))

    def post_once(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._run(self.client.post_once(url, **kwargs))

    def put_once(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._run(self.client.put_once(url, **kwargs))

    def patch_once(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._run(self.client.patch_once(url, **kwargs))

    def delete_once(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._run(self.client.delete_once(url, **kwargs))

    def lookup(self, intent: str) -> postonce.IntentRecord | None:
        return self._run(self.client.lookup(intent))

    def drain(self, **kwargs: Any) -> postonce.DrainReport:
        return self._run(self.client.drain(**kwargs))

    @property
    def outbox(self) -> postonce.Store:
        return self.client.outbox

    @property
    def sender(self) -> str:
        return self.client.sender

    @property
    def origins(self) -> frozenset[str] | None:
        return self.client.origins

    def adopt(self, previous: str) -> int:
        return self.client.adopt(previous)

    def wait(self, intent: str, **kwargs: Any) -> httpx.Response:
        return self._run(self.client.wait(intent, **kwargs))

    def resolve(self, intent: str, state: postonce.State, **kwargs: Any) -> postonce.IntentRecord:
        return self._run(self.client.resolve(intent, state, **kwargs))

    def cancel(self, intent: str, **kwargs: Any) -> postonce.IntentRecord:
        return self._run(self.client.cancel(intent, **kwargs))

    def close(self) -> None:
        if self._thread.is_alive():
            self._run(self.client.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


@pytest.fixture(params=["sync", "async"])
def client_kind(request: pytest.FixtureRequest) -> str:
    """Each test that builds clients runs once with Client and once with AsyncClient."""
    return str(request.param)


# POSTONCE_TEST_HTTP=httpx2 runs every factory-made client on httpx2 (CI runs
# the suite both ways). Tests keep writing httpx mock handlers: they are
# adapted, so the client itself only ever sees httpx2 objects.


def _as_httpx2(transport: Any, kind: str) -> Any:
    """An httpx transport the test built, as the httpx2 transport that does the same."""
    import httpx2

    if transport is None:
        return default_transport(kind)
    if not isinstance(transport, httpx.MockTransport):
        return transport  # e.g. a third-party httpx transport: kept as the test chose
    handler = transport.handler

    def request_of(request: Any) -> httpx.Request:
        return httpx.Request(
            request.method,
            str(request.url),
            headers=request.headers.raw,  # raw: names keep their case on the wire
            content=request.content,
            extensions=request.extensions,
        )

    def response_of(response: httpx.Response) -> Any:
        return httpx2.Response(
            response.status_code,
            headers=response.headers.raw,
            content=response.read(),
        )

    def error_of(exc: Exception) -> Exception:
        twin = (
            getattr(httpx2, type(exc).__name__, None) if isinstance(exc, httpx.HTTPError) else None
        )
        return twin(str(exc)) if twin is not None else exc

    if asyncio.iscoroutinefunction(handler):

        async def async_adapted(request: Any) -> Any:
            try:
                return response_of(await handler(request_of(request)))
            except Exception as exc:
                raise error_of(exc) from exc

        return httpx2.MockTransport(async_adapted)

    def adapted(request: Any) -> Any:
        try:
            answer = handler(request_of(request))
            if asyncio.iscoroutine(answer):  # an async handler that is not a coroutine function

                async def finish() -> Any:
                    try:
                        return response_of(await answer)
                    except Exception as exc:
                        raise error_of(exc) from exc

                return finish()
            return response_of(answer)
        except Exception as exc:
            raise error_of(exc) from exc

    return httpx2.MockTransport(adapted)


def _factory(
    outbox: OutboxUnderTest | Path, kind: str, made: list[Any]
) -> Callable[..., postonce.Client]:
    def factory(base_url: str = "http://api.test", **kwargs: Any) -> postonce.Client:
        kwargs.setdefault("outbox", outbox)
        kwargs.setdefault("retry", FAST)
        if HTTP_LIBRARY == "httpx2" and "http" not in kwargs:
            kwargs["transport"] = _as_httpx2(kwargs.get("transport"), kind)
        if kind == "sync":
            client: Any = postonce.Client(base_url, **kwargs)
        else:
            client = AsyncDriven(postonce.AsyncClient(base_url, **kwargs))
        made.append(client)
        return client  # type: ignore[no-any-return]

    return factory


@pytest.fixture
def make_client(outbox: OutboxUnderTest, client_kind: str) -> Iterator[ClientFactory]:
    """Build clients (sync or async, per run) on this test's outbox with fast retries."""
    made: list[Any] = []
    yield _factory(outbox, client_kind, made)
    for client in made:
        client.close()


@pytest.fixture
def make_async_client(outbox: OutboxUnderTest) -> Iterator[ClientFactory]:
    """Build AsyncClients only (driven from sync code), for tests of AsyncClient's own surface."""
    made: list[Any] = []
    yield _factory(outbox, "async", made)
    for client in made:
        client.close()


@pytest.fixture
def make_sync_client(outbox: OutboxUnderTest) -> Iterator[ClientFactory]:
    """Build sync clients only, for tests of Client's own surface."""
    made: list[Any] = []
    yield _factory(outbox, "sync", made)
    for client in made:
        client.close()


def drain_env(
    server: LoopbackServer, outbox: str | Path, worker: str, lease: float = 10
) -> dict[str, str]:
    """The environment tests/drain_app.py reads: server, outbox, worker name, lease."""
    return {
        **os.environ,
        "POSTONCE_TEST_BASE_URL": server.base_url,
        "POSTONCE_TEST_OUTBOX": str(outbox),
        "POSTONCE_TEST_WORKER": worker,
        "POSTONCE_TEST_LEASE": str(lease),
    }
