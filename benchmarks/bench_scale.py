"""How the outbox scales with the rows it holds: claim and lookup time.

Run from the repository root::

    python benchmarks/bench_scale.py                       # SQLite, 10k / 100k / 1M rows
    python benchmarks/bench_scale.py --backend postgres    # PostgreSQL (--pg URL)
    python benchmarks/bench_scale.py --sizes 5k,10k --backlogs 100,1k --backlog-rows 5k \\
        --samples 50 --claim-samples 10 --due 100          # a smoke run

Part 1 times ``claim_due``, ``open_intent`` (existing and new) and ``get`` on bulk-filled
outboxes of each size; part 2 grows the due backlog at ``--backlog-rows``. Targets
(<= 1.5x from the smallest to the largest) are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from _harness import (
    common_args,
    percentile,
    pinned_server,
    print_facts,
    run_main,
    target_line,
)
from bench_drain import BODY, make_intent, origin_of, release_all, scratch_outbox, sender_of

from postonce._outbox.base import NewIntent
from postonce._outbox.locate import open_store, split_schema

TARGET = 1.5
INFO_OPS = frozenset({"open new"})  # shown, not judged: a durable commit dominates it
HEADERS = json.dumps([["content-type", "application/json"]])
ANSWER = b'{"id":"ch_0000000000000001","status":"succeeded"}'
OWNER = "bench-scale/1"
COLUMNS = (  # noqa: SIM905 - one string is shorter to read
    "reference key provider method url headers body fingerprint state created_at updated_at"
    " first_delivery_at due_at deadline_at attempts last_outcome lease_owner lease_expires_at"
    " claim_token response_status response_headers response_body response_truncated"
    " response_sha256 note purged_at sender origin"
).split()


def reference_of(i: int) -> str:
    return f"order-{i:08d}/charge"


def plan_kinds(rows: int, due: int, rng: random.Random) -> list[str]:
    """A kind for every row: ``due`` due ones spread evenly, the rest mostly finished."""
    if due > rows:
        raise ValueError(f"{due} due intents do not fit in {rows} rows")
    kinds = ["finished"] * rows
    for n in range(due):
        kinds[int(n * rows / due)] = "due-sending" if n % 10 == 9 else "due-pending"
    free = [i for i, kind in enumerate(kinds) if kind == "finished"]
    rng.shuffle(free)
    at = 0
    for kind, count in (
        ("later", min(1000, rows // 100)),  # a retry scheduled ahead
        ("live", min(20, rows // 1000)),  # a sender holds it right now
        ("expired", rows // 1000),
        ("cancelled", rows // 500),
        ("failed", rows // 50),
    ):
        for i in free[at : at + count]:
            kinds[i] = kind
        at += count
    return [
        ("tombstone" if i < rows // 3 else "succeeded") if k == "finished" else k
        for i, k in enumerate(kinds)
    ]


def make_rows(
    kinds: list[str], now: float, url: str, rng: random.Random
) -> Iterator[tuple[Any, ...]]:
    """One tuple per row, in ``COLUMNS`` order; oldest first over 60 days."""
    sender, origin = sender_of(url), origin_of(url)
    for i, kind in enumerate(kinds):
        created = now - 60 * 86400.0 * (len(kinds) - i) / len(kinds)
        row: dict[str, Any] = dict(
            state="succeeded", attempts=1, last_outcome="final", first_delivery_at=created,
            due_at=None, lease_owner=None, lease_expires_at=None, claim_token=None,
            response_status=201, response_headers=HEADERS, response_body=ANSWER,
            response_truncated=0, response_sha256="0" * 64, note=None, purged_at=None,
            body=BODY, headers=HEADERS, created_at=created,
        )  # fmt: skip
        if kind == "tombstone":
            row.update(body=b"", headers="[]", response_headers=None, response_body=None)
            row.update(purged_at=created + 30 * 86400)
        elif kind == "failed":
            row.update(state="failed", response_status=402)
        elif kind in ("expired", "cancelled"):
            row.update(state=kind, last_outcome="ambiguous", response_status=None, note=kind)
        elif kind in ("due-pending", "later"):
            row.update(state="pending", first_delivery_at=None, last_outcome="not_sent")
            row.update(response_status=None, created_at=now - rng.uniform(60, 3600))
            ahead = -rng.uniform(1, 3600) if kind == "due-pending" else rng.uniform(7200, 86400)
            row.update(due_at=now + ahead)
        elif kind in ("due-sending", "live"):
            started = now - rng.uniform(200, 3600)
            row.update(state="sending", attempts=0, last_outcome=None, response_status=None)
            row.update(
                created_at=started, first_delivery_at=started, claim_token=os.urandom(12).hex()
            )
            row.update(lease_owner=f"other-host/1/{kind}")
            row.update(
                lease_expires_at=now - rng.uniform(1, 60) if kind == "due-sending" else now + 86400
            )
        if row["response_status"] is None:
            row.update(response_headers=None, response_body=None)
            row.update(response_truncated=None, response_sha256=None)
        row.update(
            reference=reference_of(i), key=str(uuid.uuid4()), provider="ietf_draft",
            method="POST", url=url, fingerprint=f"{i:064x}", updated_at=row["created_at"] + 0.4,
            deadline_at=None, sender=sender, origin=origin,
        )  # fmt: skip
        yield tuple(row[column] for column in COLUMNS)


def create(spec: str, rows: Iterator[tuple[Any, ...]]) -> None:
    """Migrate a fresh outbox with the store itself, then bulk-insert ``rows``."""
    open_store(spec).close()
    columns = ", ".join(COLUMNS)
    if not spec.startswith("postgresql://"):
        with sqlite3.connect(spec, isolation_level=None) as conn:
            conn.execute("PRAGMA synchronous = OFF")
            conn.execute("BEGIN IMMEDIATE")
            marks = ", ".join("?" for _ in COLUMNS)
            conn.executemany(f"INSERT INTO intents ({columns}) VALUES ({marks})", rows)
            # The stores that wrote these rows would have swept their tails as they went.
            conn.execute(
                "UPDATE intents_swept SET upto = (SELECT coalesce(max(id), 0) FROM intents)"
            )
            conn.execute("COMMIT")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        conn.close()
        return
    import psycopg
    from psycopg import sql

    base, schema = split_schema(spec)
    table = sql.SQL("{}.intents").format(sql.Identifier(schema))
    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(columns))
    with psycopg.connect(base) as pg, pg.cursor() as cur, cur.copy(copy_sql) as copy:
        for row in rows:
            copy.write_row(row)
    with psycopg.connect(base, autocommit=True) as pg:
        pg.execute(sql.SQL("VACUUM ANALYZE {}").format(table))


def timed(samples: int, call: Callable[[int], object]) -> list[float]:
    """``samples`` calls of ``call(n)``, each one's time in microseconds."""
    out = []
    for n in range(samples):
        started = time.perf_counter()
        call(n)
        out.append((time.perf_counter() - started) * 1e6)
    return out


def new_intent(i: int) -> NewIntent:
    return make_intent(reference_of(i), "https://api.example.com/v1/charges", f"{i:064x}")


def measure(
    args: argparse.Namespace, rows: int, due: int, url: str, spec: str, claims_only: bool
) -> dict[str, list[float]]:
    rng = random.Random(args.seed + rows + due)
    kinds = plan_kinds(rows, due, rng)
    started = time.perf_counter()
    create(spec, make_rows(kinds, time.time(), url, rng))
    print(f"{rows:>11,} rows, {due:,} due: filled in {time.perf_counter() - started:.1f} s")
    finished = [i for i, kind in enumerate(kinds) if kind == "succeeded"]
    del kinds
    store = open_store(spec)
    ops: dict[str, list[float]] = {}
    try:
        # As a drain claims: its own sender's intents, to its own origins.
        sender, origins = sender_of(url), [origin_of(url)]

        def claim(n: int) -> None:
            claimed = store.claim_due(
                owner=OWNER,
                now=time.time(),
                limit=args.limit,
                lease_for=120.0,
                sender=sender,
                origins=origins,
            )
            if len(claimed) != min(args.limit, due):
                raise RuntimeError(f"claimed {len(claimed)} of {min(args.limit, due)}")
            release_all(store, claimed, as_before=True)

        claim(0)  # untimed: a first claim reads what it needs into the caches
        ops["claim_due"] = timed(args.claim_samples, claim)
        if claims_only:
            return ops
        picks = [rng.choice(finished) for _ in range(args.samples)]

        def open_existing(n: int) -> None:
            got = store.open_intent(new_intent(picks[n]), owner=OWNER, now=time.time(), lease_for=1)
            if got.created or got.lease is not None:
                raise RuntimeError(f"not a finished intent: {got!r}")

        def open_new(n: int) -> None:
            got = store.open_intent(
                new_intent(rows + 1 + n), owner=OWNER, now=time.time(), lease_for=1
            )
            if not got.created:
                raise RuntimeError(f"not created: {got!r}")

        ops["open existing"] = timed(args.samples, open_existing)
        ops["get"] = timed(args.samples, lambda n: store.get(reference_of(picks[n])))
        ops["open new"] = timed(args.samples, open_new)
    finally:
        store.close()
    return ops


def line(name: str, samples: list[float]) -> str:
    p50, p99 = statistics.median(samples), percentile(samples, 99)
    return f"  {name:<14} p50 {p50:>9.1f} us   p99 {p99:>9.1f} us"


def parse_sizes(text: str) -> list[int]:
    scale = {"k": 1_000, "m": 1_000_000}
    return [
        int(float(p.strip().lower().rstrip("km")) * scale.get(p.strip()[-1:].lower(), 1))
        for p in text.split(",")
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--sizes", default="10k,100k,1m", help="rows per outbox (10k,100k,1m)")
    parser.add_argument("--due", type=int, default=2000, help="due intents in each (2000)")
    parser.add_argument("--limit", type=int, default=32, help="claim_due batch (32)")
    parser.add_argument("--samples", type=int, default=1000, help="lookups per size (1000)")
    parser.add_argument("--claim-samples", type=int, default=200, help="claims per size (200)")
    parser.add_argument("--backlogs", default="1k,10k,100k", help="due counts, part 2")
    parser.add_argument("--backlog-rows", default="200k", help="table size, part 2 (200k)")
    common_args(parser, repeats=1, seed=11)
    args = parser.parse_args(argv)
    args.size_list, args.backlog_list = parse_sizes(args.sizes), parse_sizes(args.backlogs)
    args.backlog_total = parse_sizes(args.backlog_rows)[0]
    if min(args.size_list) < args.due or max(args.backlog_list) > args.backlog_total:
        parser.error("every size must hold --due rows, and --backlog-rows every backlog")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with pinned_server(".tmp-scale-", args.dir) as pinned:
        print_facts(pinned, f"backend {args.backend}; claim limit {args.limit}; seed {args.seed}")
        url = pinned.server.url

        sizes: dict[int, dict[str, list[float]]] = {}
        for rows in args.size_list:
            with scratch_outbox(args, pinned.workdir, "outbox") as spec:
                sizes[rows] = measure(args, rows, args.due, url, spec, claims_only=False)
            for name, samples in sizes[rows].items():
                print(line(name, samples))
            sys.stdout.flush()
        print(f"\nbacklog: claim_due with more due intents, {args.backlog_total:,} rows")
        backlog: dict[int, list[float]] = {}
        for due in args.backlog_list:
            with scratch_outbox(args, pinned.workdir, "outbox") as spec:
                backlog[due] = measure(args, args.backlog_total, due, url, spec, True)["claim_due"]
            print(line("claim_due", backlog[due]))

    small, large = min(sizes), max(sizes)
    print(f"\n{'op':<18}" + "".join(f"{f'p50 @{r:,}':>16}" for r in sizes))
    for name in sizes[small]:
        cells = "".join(f"{statistics.median(sizes[r][name]):>13.1f} us" for r in sizes)
        print(f"{name:<18}{cells}")
    targets = []
    for name in ("claim_due", "open existing", "get"):
        ratio = statistics.median(sizes[large][name]) / statistics.median(sizes[small][name])
        targets.append(target_line(f"{name} p50 @{large:,} rows / @{small:,}", ratio, TARGET))
    low, high = min(backlog), max(backlog)
    growth = statistics.median(backlog[high]) / statistics.median(backlog[low])
    targets.append(target_line(f"claim_due p50 @{high:,} due / @{low:,} due", growth, TARGET))
    print("\n" + "\n".join(targets))
    print(f"SUMMARY scale {args.backend}: {'; '.join(t.removeprefix('target ') for t in targets)}")
    return 0


if __name__ == "__main__":
    run_main(main)
