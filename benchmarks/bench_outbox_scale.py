"""How the outbox's hot queries scale with the number of rows it holds.

Run from the repository root::

    .venv-bench/bin/python benchmarks/bench_outbox_scale.py
    .venv-bench/bin/python benchmarks/bench_outbox_scale.py --backend postgres

For each size (default 10k, 100k and 1M rows) a fresh outbox is migrated by
the store itself, then filled in one bulk transaction straight into its
``intents`` table (SQLite ``executemany``, PostgreSQL ``COPY``): mostly
finished intents (succeeded, a third of them purged to tombstones; failed,
cancelled, expired), a few scheduled retries and live leases, and ``--due``
(default 2,000) due intents spread through the table: pending ones whose due
time has passed and sending ones whose lease ran out. PostgreSQL gets
``VACUUM ANALYZE`` after the fill, as autovacuum would; SQLite gets nothing,
as postonce runs no ``ANALYZE``; its sweep watermark is set to the table's end,
where the sweeps of the stores that wrote the rows would have left it (rows
that bypass the store are not swept, and a first claim would walk them all
once). The attempts table stays empty: none of the
timed calls reads it. Then it times, through the store's own API:

* ``claim_due``: what each drain batch calls (``limit=--limit``, default 32,
  the batch of a ``concurrency=8`` drain); the claimed intents are released
  after each sample, untimed, so every sample finds the same due set;
* ``claim query``: the claim's SELECT alone (as captured from ``claim_due``),
  re-run on a connection of its own: the query without the commit;
* ``open existing``: ``open_intent`` of a finished intent under a freshly
  minted key, as ``post_once`` does when called again with a known
  ``intent=``: the insert hits the reference, the stored row is read back;
* ``get``: ``Store.get(reference)``, what ``Client.lookup`` calls;
* ``open new``: ``open_intent`` of a new intent, the write-ahead itself;
  shown, not judged: its durable commit (an fsync) dominates it.

The SQL each call runs is captured (SQLite's trace callback; a wrapper around
``psycopg.Connection.execute``) and its plan printed with ``EXPLAIN QUERY PLAN``
(SQLite) or ``EXPLAIN (ANALYZE, BUFFERS)`` in a rolled-back transaction
(PostgreSQL); a plan step that scans the table or a whole index is flagged.

A second part holds the table size at ``--backlog-rows`` and grows the number
of due intents (``--backlogs``): the claim's cost with a backlog.

The files live in a fresh directory under ``benchmarks/`` (``--dir`` picks
another parent), PostgreSQL tables in a fresh schema per outbox; all are
removed at the end. The script only prints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import postonce
from postonce._outbox.base import NewIntent, Store
from postonce._outbox.locate import open_store, split_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_drain import BODY, drop_postgres, fresh_postgres
from bench_sync import available_cpus, filesystem_of, run_main

TARGET = 1.5  # p50 at the largest size / p50 at the smallest
INFO_OPS = frozenset({"open new"})  # shown, not judged: a durable commit dominates it
URL = "https://api.example.com/v1/charges"
HEADERS = json.dumps([["content-type", "application/json"]])
RESPONSE_HEADERS = json.dumps([["content-type", "application/json"]])
RESPONSE_BODY = b'{"id":"ch_0000000000000001","status":"succeeded"}'
PROVIDER = "ietf_draft"
OWNER = "bench-scale/1"
COLUMNS = (
    "reference",
    "key",
    "provider",
    "method",
    "url",
    "headers",
    "body",
    "fingerprint",
    "state",
    "created_at",
    "updated_at",
    "first_delivery_at",
    "due_at",
    "deadline_at",
    "attempts",
    "last_outcome",
    "lease_owner",
    "lease_expires_at",
    "claim_token",
    "response_status",
    "response_headers",
    "response_body",
    "response_truncated",
    "response_sha256",
    "note",
    "purged_at",
)
FULL_SCAN_MARKS = ("Seq Scan", "SCAN ")  # a plan step whose work grows with the table
SORT_MARKS = ("USE TEMP B-TREE FOR ORDER BY", "Sort Method", "Sort Key")  # sorts all matches
_LITERALS = re.compile(r"'[^']*'|\b\d[\d.e+-]*\b")


# -- the rows ------------------------------------------------------------------------


@dataclass
class Layout:
    """What a filled outbox holds: its size, and the references the timings use."""

    rows: int
    due: int
    now: float
    finished: list[int] = field(default_factory=list)  # indexes of live succeeded rows
    counts: dict[str, int] = field(default_factory=dict)


def reference_of(i: int) -> str:
    return f"order-{i:08d}/charge"


def fingerprint_of(i: int) -> str:
    return f"{i:064x}"


def plan_layout(rows: int, due: int, now: float, rng: random.Random) -> tuple[Layout, list[str]]:
    """A state for every row: ``due`` due ones spread evenly, the rest mostly finished."""
    if due > rows:
        raise ValueError(f"{due} due intents do not fit in {rows} rows")
    kinds = ["finished"] * rows
    step = rows / due if due else 0.0
    for n in range(due):
        kinds[int(n * step)] = "due-sending" if n % 10 == 9 else "due-pending"
    free = [i for i, kind in enumerate(kinds) if kind == "finished"]
    rng.shuffle(free)
    extras = [
        ("later", min(1000, rows // 100)),  # a retry scheduled ahead
        ("live", min(20, rows // 1000)),  # a sender holds it right now
        ("expired", rows // 1000),
        ("cancelled", rows // 500),
        ("failed", rows // 50),
    ]
    at = 0
    for kind, count in extras:
        for i in free[at : at + count]:
            kinds[i] = kind
        at += count
    layout = Layout(rows=rows, due=due, now=now)
    for i, kind in enumerate(kinds):
        if kind == "finished":
            kinds[i] = "tombstone" if i < rows // 3 else "succeeded"
            if kinds[i] == "succeeded":
                layout.finished.append(i)
    for kind in kinds:
        layout.counts[kind] = layout.counts.get(kind, 0) + 1
    return layout, kinds


def make_rows(kinds: list[str], now: float, rng: random.Random) -> Iterator[tuple[Any, ...]]:
    """One tuple per row, in ``COLUMNS`` order; oldest first over 60 days."""
    span = 60 * 86400.0
    n = len(kinds)
    for i, kind in enumerate(kinds):
        created = now - span * (n - i) / n
        updated = created + 0.4
        state, attempts = "succeeded", 1
        outcome: str | None = "final"
        first: float | None = created
        due_at: float | None = None
        owner: str | None = None
        expires: float | None = None
        token: str | None = None
        status: int | None = 201
        r_headers: str | None = RESPONSE_HEADERS
        r_body: bytes | None = RESPONSE_BODY
        r_trunc: int | None = 0
        r_sha: str | None = "0" * 64
        note: str | None = None
        purged: float | None = None
        body, headers = BODY, HEADERS
        if kind == "tombstone":
            body, headers, r_headers, r_body, purged = b"", "[]", None, None, updated + 30 * 86400
        elif kind == "failed":
            state, status = "failed", 402
        elif kind == "expired":
            state, outcome, status, note = "expired", "ambiguous", None, "past the retry horizon"
        elif kind == "cancelled":
            state, first, outcome, status = "cancelled", None, "not_sent", None
            note = "deadline passed"
        elif kind in ("due-pending", "later"):
            state, first, outcome, status = "pending", None, "not_sent", None
            created = updated = now - rng.uniform(60, 3600)
            if kind == "due-pending":
                due_at = now - rng.uniform(1, 3600)
            else:
                due_at = now + rng.uniform(600, 86400)
        elif kind in ("due-sending", "live"):
            state, attempts, outcome, status = "sending", 0, None, None
            created = updated = first = now - rng.uniform(200, 3600)
            owner, token = f"other-host/1/{kind}", os.urandom(12).hex()
            expires = now - rng.uniform(1, 60) if kind == "due-sending" else now + 120
        if status is None:
            r_headers, r_body, r_trunc, r_sha = None, None, None, None
        yield (
            reference_of(i),
            str(uuid.uuid4()),
            PROVIDER,
            "POST",
            URL,
            headers,
            body,
            fingerprint_of(i),
            state,
            created,
            updated,
            first,
            due_at,
            None,
            attempts,
            outcome,
            owner,
            expires,
            token,
            status,
            r_headers,
            r_body,
            r_trunc,
            r_sha,
            note,
            purged,
        )


# -- backends ---------------------------------------------------------------------------


class Backend:
    name = "?"

    def create(self, rows: Iterator[tuple[Any, ...]]) -> str:
        """Migrate a fresh outbox with the store, bulk-insert ``rows``; return its spec."""
        raise NotImplementedError

    def discard(self, spec: str) -> None:
        raise NotImplementedError

    @contextmanager
    def capture(self, store: Store) -> Iterator[list[tuple[Any, Any]]]:
        """Collect (statement, params) of every statement the store runs meanwhile."""
        raise NotImplementedError
        yield []  # pragma: no cover

    def explain(self, spec: str, statement: Any, params: Any) -> list[str]:
        raise NotImplementedError

    @contextmanager
    def runner(self, spec: str, statement: Any, params: Any) -> Iterator[Callable[[], object]]:
        """A callable that runs one captured statement on a connection of its own."""
        raise NotImplementedError
        yield lambda: None  # pragma: no cover


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def create(self, rows: Iterator[tuple[Any, ...]]) -> str:
        path = self.workdir / f"outbox-{uuid.uuid4().hex[:8]}.sqlite3"
        open_store(str(path)).close()  # the store makes (and migrates) the file
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous = OFF")
            conn.execute("BEGIN IMMEDIATE")
            marks = ", ".join("?" for _ in COLUMNS)
            conn.executemany(
                f"INSERT INTO intents ({', '.join(COLUMNS)}) VALUES ({marks})",  # noqa: S608
                rows,
            )
            # The stores that wrote these rows would have swept their tails as they
            # went (schema v6): the watermark stands at the table's end.
            conn.execute("UPDATE intents_swept SET upto = (SELECT max(id) FROM intents)")
            conn.execute("COMMIT")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.close()
        return str(path)

    def discard(self, spec: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(spec + suffix).unlink(missing_ok=True)

    @contextmanager
    def capture(self, store: Store) -> Iterator[list[tuple[Any, Any]]]:
        seen: list[tuple[Any, Any]] = []
        conn: sqlite3.Connection = store._conn  # type: ignore[attr-defined]
        conn.set_trace_callback(lambda text: seen.append((text, None)))
        try:
            yield seen
        finally:
            conn.set_trace_callback(None)

    def explain(self, spec: str, statement: Any, params: Any) -> list[str]:
        conn = sqlite3.connect(f"file:{spec}?mode=ro", uri=True)
        try:
            rows = conn.execute("EXPLAIN QUERY PLAN " + str(statement)).fetchall()
        finally:
            conn.close()
        depth: dict[int, int] = {0: -1}
        lines = []
        for node, parent, _, detail in rows:
            depth[node] = depth.get(parent, -1) + 1
            lines.append("  " * depth[node] + str(detail))
        return lines

    @contextmanager
    def runner(self, spec: str, statement: Any, params: Any) -> Iterator[Callable[[], object]]:
        conn = sqlite3.connect(f"file:{spec}?mode=ro", uri=True)
        try:
            yield lambda: conn.execute(str(statement)).fetchall()
        finally:
            conn.close()


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str) -> None:
        self.url = url

    def create(self, rows: Iterator[tuple[Any, ...]]) -> str:
        import psycopg
        from psycopg import sql

        spec = fresh_postgres(self.url)
        open_store(spec).close()  # the store makes (and migrates) the schema
        base, schema = split_schema(spec)
        with psycopg.connect(base) as conn:
            copy_sql = sql.SQL("COPY {}.intents ({}) FROM STDIN").format(
                sql.Identifier(schema), sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
            )
            with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}.intents").format(sql.Identifier(schema)))
        return spec

    def discard(self, spec: str) -> None:
        drop_postgres(spec)

    @contextmanager
    def capture(self, store: Store) -> Iterator[list[tuple[Any, Any]]]:
        import psycopg

        seen: list[tuple[Any, Any]] = []
        original = psycopg.Connection.execute

        def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            seen.append((query, params))
            return original(self, query, params, **kwargs)

        psycopg.Connection.execute = execute  # type: ignore[method-assign]
        try:
            yield seen
        finally:
            psycopg.Connection.execute = original  # type: ignore[method-assign]

    def explain(self, spec: str, statement: Any, params: Any) -> list[str]:
        import psycopg
        from psycopg import sql

        base, _ = split_schema(spec)
        head = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) ")
        query = head + (statement if isinstance(statement, sql.Composable) else sql.SQL(statement))
        with psycopg.connect(base) as conn:
            try:
                rows = conn.execute(query, params).fetchall()
            finally:
                conn.rollback()  # EXPLAIN ANALYZE ran it: undo
        return [str(r[0]) for r in rows]

    @contextmanager
    def runner(self, spec: str, statement: Any, params: Any) -> Iterator[Callable[[], object]]:
        import psycopg

        base, _ = split_schema(spec)
        with psycopg.connect(base) as conn:

            def run() -> object:
                try:
                    return conn.execute(statement, params).fetchall()
                finally:
                    conn.rollback()  # let go of the FOR UPDATE locks

            yield run


# -- timing ---------------------------------------------------------------------------


@dataclass
class Op:
    name: str
    samples: list[float] = field(default_factory=list)  # microseconds

    def p(self, q: float) -> float:
        if len(self.samples) < 2:
            return self.samples[0]
        return statistics.quantiles(self.samples, n=100, method="inclusive")[int(q) - 1]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)


def new_intent(i: int, *, key: str | None = None) -> NewIntent:
    return NewIntent(
        reference=reference_of(i),
        key=key or str(uuid.uuid4()),
        key_given=False,
        provider=PROVIDER,
        method="POST",
        url=URL,
        headers=(("content-type", "application/json"),),
        body=BODY,
        fingerprint=fingerprint_of(i),
        deadline_at=None,
    )


def release_all(store: Store, claimed: Sequence[Any]) -> None:
    """Hand claims back as the drain does when stopping: pending, due as before."""
    now = time.time()
    calls = [
        (
            "release",
            {
                "lease": o.lease,
                "now": now,
                "due_at": o.record.due_at,
                "anchor": o.anchor_before,
            },
        )
        for o in claimed
    ]
    batch: Callable[[list[tuple[str, dict[str, Any]]]], list[tuple[bool, Any]]]
    batch = getattr(store, "run_batch")  # noqa: B009 (both stores have it, not the protocol)
    for ok, result in batch(calls):
        if not ok or result is not True:
            raise RuntimeError(f"release failed: {result!r}")


def time_claims(store: Store, op: Op, samples: int, limit: int, expect: int) -> None:
    clock = time.perf_counter
    for _ in range(samples):
        started = clock()
        claimed = store.claim_due(owner=OWNER, now=time.time(), limit=limit, lease_for=120.0)
        op.samples.append((clock() - started) * 1e6)
        if len(claimed) != min(limit, expect):
            raise RuntimeError(f"claimed {len(claimed)}, expected {min(limit, expect)}")
        release_all(store, claimed)


def time_calls(op: Op, samples: int, call: Callable[[int], object]) -> None:
    clock = time.perf_counter
    for n in range(samples):
        started = clock()
        call(n)
        op.samples.append((clock() - started) * 1e6)


@dataclass
class Plan:
    op: str
    statement: str
    lines: list[str]
    raw: Any = None
    params: Any = None

    @property
    def scans(self) -> list[str]:
        return [
            line.strip()
            for line in self.lines
            if any(line.strip().startswith(m) or f"> {m}" in line for m in FULL_SCAN_MARKS)
            and "CONSTANT ROW" not in line
            and "(subquery" not in line  # a co-routine's own rows, not the table
            and line.strip() != "SCAN intents_swept"  # one row: the sweep's watermark
        ]

    @property
    def sorts(self) -> list[str]:
        return [line.strip() for line in self.lines if any(m in line for m in SORT_MARKS)]


def plans_of(
    backend: Backend, spec: str, store: Store, op: str, call: Callable[[], object]
) -> list[Plan]:
    """Run ``call`` once, capturing its statements; EXPLAIN each distinct read or insert."""
    with backend.capture(store) as seen:
        call()
    plans: list[Plan] = []
    done: set[str] = set()
    for statement, params in seen:
        text = statement.as_string() if hasattr(statement, "as_string") else str(statement)
        verb = text.lstrip().split(" ", 1)[0].upper()
        shape = _LITERALS.sub("?", text)  # SQLite's trace has the values inlined
        if verb not in ("SELECT", "INSERT", "UPDATE", "DELETE") or shape in done:
            continue
        done.add(shape)
        plans.append(Plan(op, text, backend.explain(spec, statement, params), statement, params))
    return plans


@dataclass
class SizeResult:
    rows: int
    fill_seconds: float
    ops: dict[str, Op]
    plans: list[Plan]


def measure_size(
    backend: Backend,
    rows: int,
    due: int,
    args: argparse.Namespace,
    rng: random.Random,
    *,
    claims_only: bool = False,
) -> SizeResult:
    now = time.time()
    layout, kinds = plan_layout(rows, due, now, rng)
    started = time.perf_counter()
    spec = backend.create(make_rows(kinds, now, rng))
    fill = time.perf_counter() - started
    del kinds
    store = open_store(spec)
    try:
        names = ("claim_due", "claim query", "open existing", "get", "open new")
        ops = {name: Op(name) for name in names}
        plans = plans_of(
            backend,
            spec,
            store,
            "claim_due",
            lambda: release_all(
                store,
                store.claim_due(owner=OWNER, now=time.time(), limit=args.limit, lease_for=120.0),
            ),
        )
        time_claims(store, ops["claim_due"], args.claim_samples, args.limit, due)
        select = next(p for p in plans if p.statement.lstrip().upper().startswith("SELECT"))
        with backend.runner(spec, select.raw, select.params) as run:
            time_calls(ops["claim query"], args.claim_samples, lambda n: run())
        if not claims_only:
            picks = [rng.choice(layout.finished) for _ in range(args.samples)]

            def open_existing(n: int) -> None:
                opened = store.open_intent(
                    new_intent(picks[n]), owner=OWNER, now=time.time(), lease_for=120.0
                )
                if opened.created or opened.lease is not None or opened.conflict is not None:
                    raise RuntimeError(f"not a finished intent: {opened!r}")

            def get(n: int) -> None:
                if store.get(reference_of(picks[n])) is None:
                    raise RuntimeError("missing intent")

            def open_new(n: int) -> None:
                opened = store.open_intent(
                    new_intent(rows + 1 + n), owner=OWNER, now=time.time(), lease_for=120.0
                )
                if not opened.created:
                    raise RuntimeError(f"not created: {opened!r}")

            plans += plans_of(backend, spec, store, "open existing", lambda: open_existing(0))
            plans += plans_of(backend, spec, store, "get", lambda: get(0))
            time_calls(ops["open existing"], args.samples, open_existing)
            time_calls(ops["get"], args.samples, get)
            time_calls(ops["open new"], args.samples, open_new)
        return SizeResult(rows, fill, {k: v for k, v in ops.items() if v.samples}, plans)
    finally:
        store.close()
        backend.discard(spec)


# -- main --------------------------------------------------------------------------------


def parse_sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1:], 1)
        out.append(int(float(part.rstrip("km")) * scale))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--sizes", default="10k,100k,1m", help="rows per outbox (default 10k,100k,1m)"
    )
    parser.add_argument("--due", type=int, default=2000, help="due intents in each (default 2000)")
    parser.add_argument("--limit", type=int, default=32, help="claim_due batch (default 32)")
    parser.add_argument("--samples", type=int, default=2000, help="lookups per size")
    parser.add_argument("--claim-samples", type=int, default=300, help="claims per size")
    parser.add_argument("--backlogs", default="1k,10k,100k", help="due counts for part 2")
    parser.add_argument("--backlog-rows", default="200k", help="table size for part 2")
    parser.add_argument("--backlog-samples", type=int, default=40, help="claims per backlog")
    parser.add_argument("--quick", action="store_true", help="sizes 10k,100k; fewer samples")
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.samples, args.claim_samples = "10k,100k", 300, 60
        args.backlogs, args.backlog_rows, args.backlog_samples = "1k,10k", "20k", 20
    args.size_list = parse_sizes(args.sizes)
    args.backlog_list = parse_sizes(args.backlogs)
    args.backlog_total = parse_sizes(args.backlog_rows)[0]
    if min(args.size_list) < args.due or max(args.backlog_list) > args.backlog_total:
        parser.error("every size must hold --due rows, and --backlog-rows every backlog")
    return args


def print_plans(plans: Sequence[Plan], rows: int) -> list[Plan]:
    flagged = []
    print(f"\nquery plans at {rows:,} rows:")
    for plan in plans:
        statement = " ".join(plan.statement.split())
        print(f"  [{plan.op}] {statement[:150]}{' ...' if len(statement) > 150 else ''}")
        for line in plan.lines:
            print(f"      {line}")
        if plan.scans:
            flagged.append(plan)
            print(f"      ^ FLAG: scan that grows with the table: {plan.scans}")
        if plan.sorts:
            print("      ^ note: sorts every matching row (grows with the due backlog)")
    return flagged


def verdict(ratio: float) -> str:
    return "met" if ratio <= TARGET else "MISSED"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    cpus = available_cpus()
    if len(cpus) >= 2 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpus[0]})
    workdir = Path(tempfile.mkdtemp(prefix=".tmp-outbox-scale-", dir=args.dir))
    backend: Backend = (
        SQLiteBackend(workdir) if args.backend == "sqlite" else PostgresBackend(args.pg)
    )
    try:
        print(f"command: {' '.join([sys.executable, *sys.argv])}")
        print(f"python {sys.version.split()[0]}, postonce {postonce.__version__}, cpus {cpus}")
        print(f"load average at start: {os.getloadavg()}")
        if args.backend == "sqlite":
            print(f"sqlite {sqlite3.sqlite_version}, outbox fs {filesystem_of(workdir)}")
        else:
            print(f"postgres {args.pg} (a fresh schema per outbox)")
        print(
            f"backend {args.backend}; sizes {args.size_list}; {args.due} due per size; "
            f"claim limit {args.limit}; {args.samples} lookups, {args.claim_samples} claims"
        )
        results: list[SizeResult] = []
        for rows in args.size_list:
            result = measure_size(backend, rows, args.due, args, rng)
            results.append(result)
            print(f"\n{rows:>9,} rows (filled in {result.fill_seconds:.1f} s)")
            for op in result.ops.values():
                print(f"  {op.name:<14} p50 {op.p50:>9.1f} us   p99 {op.p(99):>9.1f} us")
            sys.stdout.flush()
        flagged = print_plans(results[-1].plans, results[-1].rows)

        small, large = results[0], results[-1]
        print(f"\n{'op':<14}" + "".join(f"{f'p50@{r.rows:,}':>16}" for r in results), end="")
        print(f"{'ratio':>9}")
        ratios: dict[str, float] = {}
        for name in small.ops:
            ratios[name] = large.ops[name].p50 / small.ops[name].p50
            cells = "".join(f"{r.ops[name].p50:>13.1f} us" for r in results)
            judged = "info: fsync-bound" if name in INFO_OPS else f"target <= {TARGET}: "
            judged += "" if name in INFO_OPS else verdict(ratios[name])
            print(f"{name:<14}{cells}   x{ratios[name]:.2f}  ({judged})")

        print(f"\nclaim_due (limit {args.limit}) with a backlog, {args.backlog_total:,} rows:")
        backlog: dict[int, Op] = {}
        backlog_plans: list[Plan] = []
        saved = args.claim_samples
        args.claim_samples = args.backlog_samples
        try:
            for due in args.backlog_list:
                result = measure_size(backend, args.backlog_total, due, args, rng, claims_only=True)
                backlog[due] = result.ops["claim_due"]
                backlog_plans = result.plans
                print(
                    f"  {due:>9,} due   p50 {backlog[due].p50:>10.1f} us   "
                    f"p99 {backlog[due].p(99):>10.1f} us   "
                    f"({backlog[due].p50 / due * 1000:.0f} ns per due row)"
                )
                sys.stdout.flush()
        finally:
            args.claim_samples = saved
        low, high = min(backlog), max(backlog)
        growth = backlog[high].p50 / backlog[low].p50
        print(f"  p50@{high:,} due / p50@{low:,} due = x{growth:.1f}")
        flagged += print_plans(backlog_plans, args.backlog_total)

        print(f"\nload average at end: {os.getloadavg()}")
        if flagged:
            print("\nFLAGGED plans (scans that grow with rows):")
            for plan in flagged:
                print(f"  [{plan.op}] {plan.scans}")
        summary = "  ".join(f"{n}: x{r:.2f}" for n, r in ratios.items() if n not in INFO_OPS)
        print(
            f"SUMMARY outbox scale {args.backend} p50@{large.rows:,}/p50@{small.rows:,}: "
            f"{summary}; claim_due {low:,}->{high:,} due: x{growth:.1f}; "
            f"flagged plans: {len(flagged)}"
        )
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
