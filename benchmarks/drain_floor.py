"""The drain floor: the least Python that does a drain's durable work.

``bench_drain.py`` sets ``postonce.Client.drain`` beside raw httpx; raw httpx
writes nothing down, so "x raw" mixes what a durable drain must cost with what
postonce adds. :func:`drain_floor` does the durable work and nothing else, on
the very outbox postonce would drain (the rows ``bench_drain.fill`` writes):

1. claim a batch of due intents in one durable transaction: lock them
   (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite),
   write a fresh claim token and lease on each, commit;
2. send each with raw httpx, its stored key in the ``Idempotency-Key`` header;
3. record its answer with one ``UPDATE`` fenced by the claim token, committed
   (not fsync'd, as postonce's record of a 2xx) before the next send.

``concurrency`` threads send at once, sharing one ``httpx.Client`` (a pool of
``concurrency`` connections); the thread that finds no claimed intent left
claims the next batch (64) while the others wait. Each thread has its own
database connection (SQLite: one connection for claims, ``synchronous=FULL``,
and one for records, ``NORMAL``, used under a lock: SQLite has one writer).

What it leaves out, on purpose: retries and their due times, classification,
the horizon and deadline checks, the attempts table (PostgreSQL keeps an
attempts row per send), NOTIFY, lease renewal, sender and origin filters,
settlements, reports. ``drain / floor`` is the price of those.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx

__all__ = ["drain_floor"]

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
    """Drain every due intent of ``outbox`` (a SQLite path or ``postgresql://…?schema=``).

    Returns how many it finished.
    """
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
