"""The durable floor: the least Python that does ``post_once``'s durable work.

``post_once`` is measured against this, not only against raw httpx: raw httpx
writes nothing down, so "x times raw" mixes what durability must cost with what
postonce adds on top. ``Floor.post_once`` does exactly the durable work the
design asks for and nothing else:

1. mint a canonical UUIDv4 key;
2. one write-ahead transaction: ``INSERT`` the intent (key, reference, method,
   URL, request body) and commit it, with ``synchronous`` = the arm's setting
   (``NORMAL`` or ``FULL``), before the first byte is sent (DESIGN rule 1);
3. send it with raw httpx, the key in the ``Idempotency-Key`` header;
4. commit the answer (status, body) with ``synchronous=NORMAL`` before
   returning (DESIGN rule 11: an answer returned is an answer kept).

The schema is the least that keeps the lookups a client needs indexed: a rowid
table (new rows append at its right edge, so a fat row never splits a page in
the middle), a unique index on the key, and a unique index on the caller's
reference holding only rows that have one (a call without ``reference`` is
its own intent). A first-try 2xx without a reference therefore writes the
table's last leaf and one key-index leaf ahead, and the table's leaf again
with the answer: about three WAL pages; a reference adds one. (A first
version keyed a ``WITHOUT ROWID`` table by the random UUID: every insert
landed mid-tree and the page splits of ~250-byte rows cost 1.5 extra pages
per intent; ``bench_wal.py`` measures it.)

What it leaves out, on purpose: retries, classification, leases, horizons,
fingerprints, secret scrubbing and a drain index. Those are postonce's
features; the floor is what the durable write itself costs, so that
``post_once / floor`` is the price of those features on the hot path.

The file is WAL mode, ``isolation_level=None`` (each ``INSERT``/``UPDATE`` is
its own transaction: one statement, one commit). With ``synchronous="FULL"``
the write-ahead goes through a FULL connection and the answer through a
second, NORMAL one on the same file, so no ``PRAGMA`` is switched per call.
SQLite's automatic checkpoint (1000 pages) stays on and runs inside the call
that crosses it, as it does for postonce: the checkpoint tail is counted.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import httpx

__all__ = ["SCHEMA", "Floor", "SchemaFloor", "Synchronous", "open_floor"]

Synchronous = Literal["NORMAL", "FULL"]

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS intents ("
    " id INTEGER PRIMARY KEY,"
    " key TEXT NOT NULL UNIQUE,"
    " reference TEXT,"
    " method TEXT NOT NULL,"
    " url TEXT NOT NULL,"
    " body BLOB NOT NULL,"
    " status INTEGER,"
    " response BLOB"
    ")",
    "CREATE UNIQUE INDEX IF NOT EXISTS intents_reference ON intents (reference)"
    " WHERE reference IS NOT NULL",
)

_INSERT = "INSERT INTO intents (key, reference, method, url, body) VALUES (?, ?, 'POST', ?, ?)"
_ANSWER = "UPDATE intents SET status = ?, response = ? WHERE id = ?"
_LOOKUP = "SELECT id, key, status, response FROM intents WHERE reference = ?"


def _connect(path: Path, synchronous: Synchronous) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL").fetchone()
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA busy_timeout = 5000")
    return conn


def open_floor(path: Path, synchronous: Synchronous) -> sqlite3.Connection:
    """The floor's outbox at ``path`` (created 0600, as postonce's), schema in place."""
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    conn = _connect(path, synchronous)
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
        self._answer = self._ahead if synchronous == "NORMAL" else _connect(path, "NORMAL")

    def post_once(self, url: str, body: Any, reference: str | None = None) -> httpx.Response:
        """POST ``body`` as JSON to ``url`` once per ``reference`` (default: the call itself)."""
        key = str(uuid.uuid4())
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        try:
            row = self._ahead.execute(_INSERT, (key, reference, url, content)).lastrowid
        except sqlite3.IntegrityError:
            # The reference is known: return its answer, or resume with its key.
            # (Off the measured path: every benchmark intent is new.)
            row, key, status, stored = self._ahead.execute(_LOOKUP, (reference,)).fetchone()
            if status is not None:
                return httpx.Response(status, content=stored)
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


# -- the floor on postonce's schema ---------------------------------------------------------

#: ``post_once``'s write-ahead, as its SQLite store spells it for a call with no options
#: (every column bound, as there). ``tests/test_benchmarks.py`` holds every statement
#: here, and the rows they leave, to what postonce executes.
SCHEMA_INSERT = (
    "INSERT INTO intents (reference, key, provider, method, url, headers, body, fingerprint,"
    " state, created_at, updated_at, first_delivery_at, deadline_at, attempts, lease_owner,"
    " lease_expires_at, claim_token, sender, origin, meta, fresh)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)"
)
#: ... and its record of a first-try 2xx, fenced by the lease's token.
SCHEMA_ANSWER = (
    "UPDATE intents SET state = ?, last_outcome = ?, first_delivery_at = ?, due_at = ?,"
    " lease_owner = ?, claim_token = ?, updated_at = ?, response_status = ?,"
    " response_headers = ?, response_body = ?, response_truncated = ?, response_sha256 = ?,"
    " attempts = 1 WHERE id = ? AND claim_token = ? AND attempts = 0"
)
#: ... and the sweep it runs once per ``SCHEMA_SWEEP`` new intents, in one transaction:
#: the ended intents' leases (none of a first-try 2xx is in the lease index, so it
#: changes no row), then the tail's rows still sending, then the watermark.
SCHEMA_SWEEP_ENDED = (
    "UPDATE intents SET lease_expires_at = NULL WHERE id IN ({marks})"
    " AND lease_expires_at IS NOT NULL AND fresh IS NULL"
    " AND state IN ('cancelled', 'expired', 'failed', 'indeterminate', 'succeeded')"
    " AND lease_owner IS NULL"
)
SCHEMA_SWEEP_TAIL = (
    "UPDATE intents SET fresh = NULL WHERE id > coalesce((SELECT upto FROM intents_swept), 0)"
    " AND fresh IS NOT NULL AND state = 'sending'",
    "UPDATE intents_swept SET upto = (SELECT coalesce(max(id), 0) FROM intents)"
    " WHERE upto < (SELECT coalesce(max(id), 0) FROM intents)",
)
SCHEMA_SWEEP = 32


class SchemaFloor:
    """The floor's Python doing ``post_once``'s SQL on ``post_once``'s own outbox schema.

    It splits ``post_once``'s cost over the floor in two. ``SchemaFloor / Floor`` is
    what postonce's stored row costs: the columns a drain, a lease, a sender and a
    settlement need, their indexes and triggers, and the values they hold (the
    request's fingerprint, the answer's digest). ``post_once / SchemaFloor`` is
    what the rest of postonce costs on top: planning, the flow, classification,
    hooks, and the store's Python around its statements.

    Each call does the least that fills those columns: a UUIDv4 key (also the
    reference, as for a call with no ``intent=``) and compact JSON, as the floor
    makes them; the SHA-256 of canonical JSON as the fingerprint and a lease
    token; the write-ahead ``INSERT``; the send; the answer's ``UPDATE`` (its
    headers, less the transport's, as JSON, its body and SHA-256), fenced by the
    token; and the store's sweep once per ``SCHEMA_SWEEP`` ended intents. The
    values have the lengths postonce's have: its lease owner and sender string
    (read once from a client on the same file), and the URL's origin.

    Its writes go through one connection as the store's do, ``synchronous``
    switched as the store switches it: with ``FULL``, to ``FULL`` before the
    write-ahead and back to ``NORMAL`` before the answer (two ``PRAGMA``
    statements a call), never with ``NORMAL``. Not a correct client: nothing is
    checked but that each statement wrote its row.
    """

    def __init__(self, path: Path, synchronous: Synchronous, http: httpx.Client) -> None:
        import postonce  # to lay out its schema and read its identities: nothing per call

        with postonce.Client(outbox=path) as client:
            client.outbox  # noqa: B018  # opening the outbox migrates the file
            self._owner, self._sender = client.owner, client.sender
        self.synchronous = synchronous
        self.http = http
        self._conn = _connect(path, "NORMAL")
        self._sync: str = "NORMAL"
        self._origins: dict[str, str] = {}
        self._ended: list[int] = []
        self._sweep_ended = SCHEMA_SWEEP_ENDED.format(marks=", ".join("?" * SCHEMA_SWEEP))

    def _synced(self, wanted: str) -> sqlite3.Connection:
        if wanted != self._sync:
            self._conn.execute(f"PRAGMA synchronous = {wanted}")
            self._sync = wanted
        return self._conn

    def post_once(self, url: str, body: Any) -> httpx.Response:
        """POST ``body`` as JSON to ``url``, as ``post_once`` would store and record it."""
        key = str(uuid.uuid4())
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        fingerprint = hashlib.sha256(_FINGERPRINTED + _CANONICAL.encode(body).encode()).hexdigest()
        now, token = time.time(), secrets.token_hex(12)
        origin = self._origins.get(url) or self._origin(url)
        row = self._synced(self.synchronous).execute(
            SCHEMA_INSERT,
            (
                key, key, "ietf_draft", "POST", url, _JSON_HEADERS, content, fingerprint,
                "sending", now, now, now, None, 0, self._owner, now + 15.0, token,
                self._sender, origin, None,
            ),
        ).lastrowid  # fmt: skip
        if row is None:
            raise RuntimeError("the write-ahead wrote no row")
        response = self.http.post(
            url,
            content=content,
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        answer = response.content
        kept = [[n, v] for n, v in response.headers.multi_items() if n not in _NOT_KEPT]
        recorded = self._synced("NORMAL").execute(
            SCHEMA_ANSWER,
            (
                "succeeded", "final", now, None, None, None, time.time(),
                response.status_code, _COMPACT.encode(kept), answer, 0,
                hashlib.sha256(answer).hexdigest(), row, token,
            ),
        )  # fmt: skip
        if recorded.rowcount != 1:
            raise RuntimeError("the answer's record matched no row")
        self._ended.append(row)
        if len(self._ended) >= SCHEMA_SWEEP:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(self._sweep_ended, self._ended)
            for statement in SCHEMA_SWEEP_TAIL:
                self._conn.execute(statement)
            self._conn.execute("COMMIT")
            self._ended = []
        return response

    def _origin(self, url: str) -> str:
        parsed = httpx.URL(url)
        origin = f"{parsed.scheme}://{parsed.host}" + (f":{parsed.port}" if parsed.port else "")
        self._origins[url] = origin
        return origin

    def close(self) -> None:
        self._conn.close()


_JSON_HEADERS = '[["content-type","application/json"]]'
#: Made once, as postonce's are (``json.dumps`` with options makes an encoder a call).
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_CANONICAL = json.JSONEncoder(
    sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False
)
#: What postonce hashes before the body (method, target, kind), for the benchmarks'
#: one target: the cost is the hashing, whatever the path.
_FINGERPRINTED = b"POST\n/v1/charges\njson\n"
#: The answer's headers the outbox does not keep (httpx gives names in lower case).
_NOT_KEPT = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "set-cookie", "connection"}
)
