"""The durable floors: the least Python doing postonce's durable work, and nothing else.

``postonce / floor`` is the price of postonce's features on the same path.
``Floor`` (bench_latency, bench_wal): write-ahead commit, raw httpx send, answer
commit. ``AsyncFloor`` (bench_async): the same, group-committed on one writer
thread. ``drain_floor`` (bench_drain): claim under a lease, send, fenced record.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx

__all__ = ["AsyncFloor", "Floor", "Synchronous", "drain_floor", "open_floor"]

Synchronous = Literal["NORMAL", "FULL"]

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS intents (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE,"
    " reference TEXT, method TEXT NOT NULL, url TEXT NOT NULL, body BLOB NOT NULL,"
    " status INTEGER, response BLOB)",
    "CREATE UNIQUE INDEX IF NOT EXISTS intents_reference ON intents (reference)"
    " WHERE reference IS NOT NULL",
)

_INSERT = "INSERT INTO intents (key, reference, method, url, body) VALUES (?, ?, 'POST', ?, ?)"
_ANSWER = "UPDATE intents SET status = ?, response = ? WHERE id = ?"


def open_floor(path: Path, synchronous: Synchronous) -> sqlite3.Connection:
    """The floor's outbox at ``path`` (created 0600, as postonce's), schema in place."""
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL").fetchone()
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA busy_timeout = 5000")
    for statement in SCHEMA:
        conn.execute(statement)
    return conn


class Floor:
    """A minimal durable client: write-ahead commit, raw httpx send, answer commit."""

    def __init__(self, path: Path, synchronous: Synchronous, http: httpx.Client) -> None:
        self.path = path
        self.synchronous = synchronous
        self.http = http
        self._ahead = open_floor(path, synchronous)
        # The answer may be a NORMAL commit: a lost one is repaired by re-sending
        # the same key (the provider replays), as for postonce.
        self._answer = self._ahead if synchronous == "NORMAL" else open_floor(path, "NORMAL")

    def post_once(self, url: str, body: Any, reference: str | None = None) -> httpx.Response:
        """POST ``body`` as JSON to ``url`` as a new intent (``reference``: the caller's)."""
        key = str(uuid.uuid4())
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        # Every benchmark intent is new: a known reference would fail here (unique index).
        row = self._ahead.execute(_INSERT, (key, reference, url, content)).lastrowid
        response = self.http.post(
            url,
            content=content,
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        self._answer.execute(_ANSWER, (response.status_code, response.content, row))
        return response

    def close(self) -> None:
        if self._answer is not self._ahead:
            self._answer.close()
        self._ahead.close()


_ASYNC_INSERT = "INSERT INTO intents (key, method, url, body) VALUES (?, 'POST', ?, ?)"

# (statement, parameters, write-ahead?, the caller's future)
_Write = tuple[str, tuple[Any, ...], bool, "asyncio.Future[int]"]
# one loop turn's writes, and the loop to wake
_Turn = tuple[asyncio.AbstractEventLoop, list[_Write]]


def _settle(batch: list[_Write], results: list[int | BaseException]) -> None:
    for (_, _, _, future), result in zip(batch, results, strict=True):
        if future.done():  # the caller was cancelled meanwhile
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


class AsyncFloor:
    """``Floor`` on one event loop: each loop turn's writes group-committed on a writer thread
    (with ``synchronous`` if one is a write-ahead, else NORMAL)."""

    def __init__(self, path: Path, synchronous: Synchronous, http: httpx.AsyncClient) -> None:
        self.synchronous = synchronous
        self.http = http
        self._conn = open_floor(path, "NORMAL")
        self._sync: str = "NORMAL"
        self._pending: list[_Write] = []  # this loop turn's writes, not yet handed over
        self._queue: queue.SimpleQueue[_Turn | None] = queue.SimpleQueue()
        self.batches = 0  # transactions committed: group commit at work when < writes
        self.writes = 0
        self._writer = threading.Thread(target=self._write_loop, name="floor-writer", daemon=True)
        self._writer.start()

    async def post_once(self, url: str, body: Any) -> httpx.Response:
        """POST ``body`` as JSON to ``url`` once (each call is its own intent)."""
        key = str(uuid.uuid4())
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        row = await self._write(_ASYNC_INSERT, (key, url, content), ahead=True)
        response = await self.http.post(
            url,
            content=content,
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        await self._write(_ANSWER, (response.status_code, response.content, row), ahead=False)
        return response

    def _write(self, sql: str, params: tuple[Any, ...], *, ahead: bool) -> asyncio.Future[int]:
        """Queue a write; this loop turn's writes reach the writer together, at the turn's end."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((sql, params, ahead, future))
        if len(self._pending) == 1:
            loop.call_soon(self._hand_over, loop)
        return future

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        turn, self._pending = self._pending, []
        self._queue.put((loop, turn))

    def _write_loop(self) -> None:
        while True:
            got = [self._queue.get()]
            while not self._queue.empty():  # this thread alone takes from the queue
                got.append(self._queue.get_nowait())
            turns = [turn for turn in got if turn is not None]
            batch = [write for _, writes in turns for write in writes]
            results = self._commit(batch) if batch else []
            self.batches += bool(batch)
            self.writes += len(batch)
            at = 0  # one wake-up per turn handed over
            for loop, writes in turns:
                loop.call_soon_threadsafe(_settle, writes, results[at : at + len(writes)])
                at += len(writes)
            if len(turns) < len(got):  # close() was called
                return

    def _commit(self, batch: list[_Write]) -> list[int | BaseException]:
        """Run ``batch`` in one transaction, FULL if it holds a write-ahead; one result each."""
        conn = self._conn
        wanted = self.synchronous if any(write[2] for write in batch) else "NORMAL"
        results: list[int | BaseException] = []
        try:
            if wanted != self._sync:
                conn.execute(f"PRAGMA synchronous = {wanted}")
                self._sync = wanted
            conn.execute("BEGIN IMMEDIATE")
            for sql, params, _, _ in batch:
                try:
                    results.append(conn.execute(sql, params).lastrowid or 0)
                except sqlite3.Error as exc:  # that statement alone is undone
                    results.append(exc)
            conn.execute("COMMIT")
        except BaseException as exc:  # the batch fails as one; never a waiter left hanging
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [RuntimeError(f"the floor's commit failed: {exc!r}") for _ in batch]
        return results

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join()
        self._conn.close()


BATCH = 64
LEASE_SECONDS = 15.0

_CLAIM = (
    "SELECT id, key, url, body FROM {t} WHERE state = 'sending' AND lease_expires_at <= {p}"
    " ORDER BY lease_expires_at, id LIMIT {p}"
)
_TAKE = (
    "UPDATE {t} SET lease_owner = {p}, lease_expires_at = {p}, claim_token = {p}"
    " WHERE id IN ({ids})"
)
_RECORD = (
    "UPDATE {t} SET state = 'succeeded', response_status = {p}, response_body = {p},"
    " lease_owner = NULL, lease_expires_at = NULL, claim_token = NULL, attempts = attempts + 1"
    " WHERE id = {p} AND claim_token = {p}"
)

Row = tuple[int, str, str, bytes, str]  # id, key, url, body, the claim's token
Claim = Callable[[], list[Row]]
Record = Callable[[int, bytes, int, str], bool]


def drain_floor(outbox: str, http: httpx.Client, concurrency: int) -> int:
    """Drain every due intent of ``outbox`` (SQLite or ``postgresql://…?schema=``): how many."""
    if outbox.startswith(("postgresql://", "postgres://")):
        claim, record, close = _postgres(outbox)
    else:
        claim, record, close = _sqlite(outbox)
    queue: deque[Row] = deque()
    lock = threading.Lock()
    done = [0]

    def next_row() -> Row | None:
        with lock:
            if not queue:
                queue.extend(claim())
            return queue.popleft() if queue else None

    def work(_: int) -> None:
        sent = 0
        while (row := next_row()) is not None:
            intent_id, key, url, body, token = row
            response = http.post(
                url,
                content=body,
                headers={"content-type": "application/json", "Idempotency-Key": key},
            )
            if not 200 <= response.status_code < 300:
                raise RuntimeError(f"the floor got {response.status_code}")
            if not record(response.status_code, response.content, intent_id, token):
                raise RuntimeError(f"intent {intent_id} was taken over")
            sent += 1
        with lock:
            done[0] += sent

    try:
        if concurrency == 1:
            work(0)
        else:
            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(work, range(concurrency)))
    finally:
        close()
    return done[0]


def _postgres(outbox: str) -> tuple[Claim, Record, Callable[[], None]]:
    import psycopg

    parts = urlsplit(outbox)
    schema = parse_qs(parts.query)["schema"][0]
    url = urlunsplit(parts._replace(query=""))
    table = '"' + schema.replace('"', '""') + '".intents'
    claimer = psycopg.connect(url, autocommit=True)
    local = threading.local()
    opened: list[psycopg.Connection[Any]] = [claimer]
    claim_sql = _CLAIM.format(t=table, p="%s") + " FOR UPDATE SKIP LOCKED"
    take_sql = _TAKE.format(t=table, p="%s", ids="SELECT unnest(%s::bigint[])")
    record_sql = _RECORD.format(t=table, p="%s")

    def claim() -> list[Row]:
        now, token = time.time(), os.urandom(12).hex()
        with claimer.transaction():
            claimer.execute("SET LOCAL synchronous_commit = on")  # durable, as postonce's claim
            rows = claimer.execute(claim_sql, (now, BATCH)).fetchall()
            if rows:
                ids = [row[0] for row in rows]
                claimer.execute(take_sql, ("floor", now + LEASE_SECONDS, token, ids))
        return [(int(i), str(k), str(u), bytes(b), token) for i, k, u, b in rows]

    def record(status: int, body: bytes, intent_id: int, token: str) -> bool:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = psycopg.connect(url, autocommit=True)
            conn.execute("SET synchronous_commit = off")  # as postonce's record of a 2xx
            opened.append(conn)
        return conn.execute(record_sql, (status, body, intent_id, token)).rowcount == 1

    def close() -> None:
        for conn in opened:
            conn.close()

    return claim, record, close


def _sqlite(path: str) -> tuple[Claim, Record, Callable[[], None]]:
    def connect(synchronous: str) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        return conn

    claimer, recorder = connect("FULL"), connect("NORMAL")
    lock = threading.Lock()  # one writer at a time, as in postonce's SQLite store
    claim_sql = _CLAIM.format(t="intents", p="?")
    record_sql = _RECORD.format(t="intents", p="?")

    def claim() -> list[Row]:
        now, token = time.time(), os.urandom(12).hex()
        with lock:
            claimer.execute("BEGIN IMMEDIATE")
            try:
                rows = claimer.execute(claim_sql, (now, BATCH)).fetchall()
                if rows:
                    marks = ", ".join("?" for _ in rows)
                    claimer.execute(
                        _TAKE.format(t="intents", p="?", ids=marks),
                        ("floor", now + LEASE_SECONDS, token, *(row[0] for row in rows)),
                    )
                claimer.execute("COMMIT")
            except BaseException:
                claimer.execute("ROLLBACK")
                raise
        return [(int(i), str(k), str(u), bytes(b), token) for i, k, u, b in rows]

    def record(status: int, body: bytes, intent_id: int, token: str) -> bool:
        with lock:
            cursor = recorder.execute(record_sql, (status, body, intent_id, token))
            return cursor.rowcount == 1

    def close() -> None:
        claimer.close()
        recorder.close()

    return claim, record, close
