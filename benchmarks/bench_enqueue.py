"""What ``enqueue`` adds to the application's own transaction, on SQLite and PostgreSQL.

Run from the repository root::

    python benchmarks/bench_enqueue.py                       # both backends, ~1 min
    python benchmarks/bench_enqueue.py --transactions 20 --repeats 1   # a smoke run

Arms ``tx`` (insert, commit) and ``tx + enqueue``; then, on PostgreSQL, the delay from
an enqueue's commit to its send by a worker drain (woken by the commit's NOTIFY).
"""

from __future__ import annotations

import argparse
import math
import random
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import psycopg
from _harness import Spread, common_args, percentile, pinned_server, print_facts, run_main
from bench_drain import drop_postgres, fresh_postgres

import postonce


class App(NamedTuple):
    """The application's connection, its orders table, the outbox inside its database."""

    conn: Any
    orders: str
    outbox: str
    clean_up: Callable[[], None]


def open_app(backend: str, args: argparse.Namespace, workdir: Path) -> App:
    orders = f"bench_orders_{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        path = workdir / f"app-{uuid.uuid4().hex[:8]}.db"
        conn: Any = sqlite3.connect(path)
        conn.execute(f"CREATE TABLE {orders} (id TEXT PRIMARY KEY, state TEXT)")
        conn.commit()
        return App(conn, orders, f"sqlite:///{path}?create=1", conn.close)
    spec = fresh_postgres(args.pg)
    conn = psycopg.connect(args.pg)
    conn.execute(f"CREATE TABLE {orders} (id text PRIMARY KEY, state text)")
    conn.commit()

    def clean_up() -> None:
        conn.execute(f"DROP TABLE {orders}")
        conn.commit()
        conn.close()
        drop_postgres(spec)

    return App(conn, orders, spec, clean_up)


def arms(app: App, client: postonce.Client, mark: str) -> dict[str, Callable[[int], None]]:
    conn, insert = app.conn, f"INSERT INTO {app.orders} (id, state) VALUES ({mark}, 'new')"

    def plain(n: int) -> None:
        conn.execute(insert, (f"plain-{n}",))
        conn.commit()

    def with_enqueue(n: int) -> None:
        conn.execute(insert, (f"order-{n}",))
        client.enqueue("/v1/charges", connection=conn, intent=f"order-{n}/charge", json={"n": n})
        conn.commit()

    return {"tx": plain, "tx + enqueue": with_enqueue}


def run_backend(backend: str, args: argparse.Namespace, pinned: Any) -> float:
    app = open_app(backend, args, pinned.workdir)
    rng, added = random.Random(args.seed), []
    try:
        with postonce.Client(pinned.server.origin, outbox=app.outbox) as client:
            client.outbox  # noqa: B018 (opened, its tables created, before any transaction)
            timed = arms(app, client, "?" if backend == "sqlite" else "%s")
            for n in range(args.warmup):
                for arm in timed.values():
                    arm(-1 - n)
            for repeat in range(args.repeats):
                samples: dict[str, list[float]] = {name: [] for name in timed}
                for n in range(args.transactions):
                    for name in rng.sample(list(timed), len(timed)):
                        started = time.perf_counter()
                        timed[name](repeat * args.transactions + n)
                        samples[name].append((time.perf_counter() - started) * 1e6)
                p50 = {name: statistics.median(s) for name, s in samples.items()}
                added.append(p50["tx + enqueue"] - p50["tx"])
                print(
                    f"  {backend} repeat {repeat + 1}: "
                    + "   ".join(
                        f"{name} p50 {p50[name]:.0f} us p99 {percentile(s, 99):.0f} us"
                        for name, s in samples.items()
                    )
                    + f"   added p50 {added[-1]:.0f} us"
                )
    finally:
        app.clean_up()
    spread = Spread.of(added)
    print(f"{backend}: enqueue adds {spread.text('.0f')} us to the transaction's p50")
    return spread.median


class Sent(httpx.BaseTransport):
    """The drain's transport: notes when each request leaves, by key."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner, self.at = inner, dict[str, float]()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.at[request.headers["idempotency-key"]] = time.perf_counter()
        return self.inner.handle_request(request)


def wake_delays(args: argparse.Namespace, pinned: Any) -> list[float]:
    """PostgreSQL: ms from an enqueue's commit to its send by a worker drain (interval 5 s)."""
    app, sent = open_app("postgres", args, pinned.workdir), Sent(httpx.HTTPTransport())
    stop, delays = threading.Event(), []
    try:
        with postonce.Client(pinned.server.origin, outbox=app.outbox, transport=sent) as client:
            worker = threading.Thread(
                target=client.drain, kwargs={"forever": True, "interval": 5.0, "stop": stop}
            )
            worker.start()
            time.sleep(1.0)  # the worker is listening
            for n in range(args.wakes):
                info = client.enqueue(
                    "/v1/charges", connection=app.conn, intent=f"wake-{n}", json={"n": n}
                )
                committed = time.perf_counter()
                app.conn.commit()
                while info.key not in sent.at and time.perf_counter() - committed < 10:
                    time.sleep(0.0005)
                delays.append((sent.at.get(info.key, math.inf) - committed) * 1e3)
            stop.set()
            worker.join()
    finally:
        stop.set()
        app.clean_up()
    print(
        f"postgres: commit to first send by a worker drain, {args.wakes} intents: "
        f"p50 {statistics.median(delays):.1f} ms, p99 {percentile(delays, 99):.1f} ms, "
        f"max {max(delays):.1f} ms (its interval: 5000 ms)"
    )
    return delays


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--transactions", type=int, default=500, help="per arm and repeat")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--wakes", type=int, default=50, help="PostgreSQL commit-to-send samples")
    common_args(parser, seed=3)
    args = parser.parse_args(argv)
    with pinned_server(".tmp-enqueue-", args.dir) as pinned:
        print_facts(pinned, f"{args.transactions} transactions per arm and repeat")
        added = {b: run_backend(b, args, pinned) for b in args.backends.split(",")}
        woken = wake_delays(args, pinned) if "postgres" in added and args.wakes else [math.nan]
    print(
        "SUMMARY enqueue: "
        + "; ".join(f"{b} +{us:.0f} us p50" for b, us in added.items())
        + f"; commit to first send p50 {statistics.median(woken):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
