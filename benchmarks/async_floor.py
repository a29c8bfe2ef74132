"""The async durable floor: the least Python that does ``AsyncClient.post_once``'s durable work.

``async_throughput.py`` measures ``AsyncClient`` against raw ``httpx.AsyncClient``;
raw writes nothing down, so its ratio mixes what durability must cost with what
postonce adds. :class:`AsyncFloor` does the durable work an async client must
do, on the same event loop and the same one CPU, and nothing else:

1. mint a canonical UUIDv4 key and encode the body;
2. the write-ahead: ``INSERT`` the intent (``floor.SCHEMA``) and wait for its
   commit, ``synchronous`` = the arm's setting, before the first byte is sent;
3. send it with the caller's ``httpx.AsyncClient``, the key in ``Idempotency-Key``;
4. ``UPDATE`` the answer (status, body) and wait for its commit before returning.

The event loop must not block on a commit, so every write goes to ONE writer
thread (SQLite takes one writer at a time anyway), and the writer commits all
writes waiting for it in one transaction: group commit, one fsync for many
intents. It batches as postonce's store thread does: the writes of one loop
turn are handed over together at the turn's end, and the callers of a turn
are woken with one ``call_soon_threadsafe`` once their transaction has
committed. A transaction holding any write-ahead is committed with the arm's
``synchronous``; one of answers only with ``NORMAL`` (a lost answer is
repaired by re-sending the same key, as for postonce). ``batches`` and
``writes`` count the transactions and the writes in them.

It serves one event loop (the benchmark's).

What it leaves out, on purpose: references and their conflicts (every call is
its own intent), retries, classification, leases, horizons, fingerprints,
secret scrubbing, hooks, cancellation clean-up, and anyio (it runs on asyncio
only). Those are postonce's features; ``postonce / floor`` is their price.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
from floor import Synchronous, open_floor

__all__ = ["AsyncFloor"]

_INSERT = "INSERT INTO intents (key, method, url, body) VALUES (?, 'POST', ?, ?)"
_ANSWER = "UPDATE intents SET status = ?, response = ? WHERE id = ?"

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
    """A minimal durable async client: group-committed write-ahead, raw send, answer commit."""

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
        row = await self._write(_INSERT, (key, url, content), ahead=True)
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
            first = self._queue.get()
            if first is None:
                return
            turns = [first]
            stop = False
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                turns.append(more)
            batch = [write for _, writes in turns for write in writes]
            results = self._commit(batch)
            self.batches += 1
            self.writes += len(batch)
            # One wake-up per turn handed over (the floor runs on one loop).
            at = 0
            for loop, writes in turns:
                loop.call_soon_threadsafe(_settle, writes, results[at : at + len(writes)])
                at += len(writes)
            if stop:
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
