"""Drain throughput: due intents finished per second, against raw httpx and the drain floor.

Run from the repository root::

    python benchmarks/bench_drain.py                               # SQLite, c=1,4,8
    python benchmarks/bench_drain.py --backend postgres            # PostgreSQL (--pg URL)
    python benchmarks/bench_drain.py --intents 200 --concurrency 4 --repeats 1   # a smoke run

For each concurrency C, each repeat times, in a seeded shuffled order:

* ``drain``: ``postonce.Client.drain(concurrency=C)`` finishing ``--intents`` due
  intents in a fresh outbox (filled untimed, as a crashed sender leaves them:
  leased by a dead owner, lease expired);
* ``floor``: ``floor.drain_floor``, the least Python doing a drain's durable work
  (claim under a lease, raw send, fenced record), on an outbox filled the same way;
* ``raw``: ``httpx.Client.post`` of as many requests from C threads sharing one client.

``--shell async`` times ``AsyncClient.drain`` against raw ``httpx.AsyncClient``
from C tasks (no floor). Prints intents/s per arm (min/median/max over the
repeats), drain/raw and drain/floor within each repeat, and each arm's client
CPU per intent (user + system, every thread of this process) beside its wall
time: an arm whose CPU is near its wall time is bound by the client's one
interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Protocol

import httpx
from _harness import Spread, common_args, pinned_server, print_facts, run_main
from floor import drain_floor

import postonce
from postonce._outbox.base import NewIntent
from postonce._outbox.locate import open_store, split_schema

BODY = json.dumps({"amount": 1250, "currency": "eur", "customer": "cus_1"}).encode()


class Used(NamedTuple):
    """What the client process spent on a run, per intent."""

    cpu_us: float  # user + system CPU, every thread of this process
    waits: float  # voluntary context switches: a thread blocked (a socket, a lock, the GIL)
    preempted: float  # involuntary ones: a thread taken off the CPU while it could run


class Rusage(Protocol):
    """The fields of ``resource.getrusage`` a run is charged from."""

    @property
    def ru_utime(self) -> float: ...
    @property
    def ru_stime(self) -> float: ...
    @property
    def ru_nvcsw(self) -> int: ...
    @property
    def ru_nivcsw(self) -> int: ...


def client_usage() -> Rusage:
    """This process's use so far: CPU (user, system) and context switches, all its threads."""
    return resource.getrusage(resource.RUSAGE_SELF)


class Timed:
    """One timed run: its wall time, and what the client spent over the very same span.

    Entered where a timer starts its clock and left where it stops it, so an
    arm is charged neither for building or closing its client nor for opening
    its outbox, none of which its wall time holds.
    """

    def __init__(
        self,
        count: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
        usage: Callable[[], Rusage] = client_usage,
    ) -> None:
        self.count = count
        self._clock = clock
        self._usage = usage

    def __enter__(self) -> Timed:
        self._before = self._usage()
        self._started = self._clock()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.elapsed = self._clock() - self._started
        after, before = self._usage(), self._before
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        self.used = Used(
            cpu / self.count * 1e6,
            (after.ru_nvcsw - before.ru_nvcsw) / self.count,
            (after.ru_nivcsw - before.ru_nivcsw) / self.count,
        )

    @property
    def rate(self) -> float:
        """Intents (or requests) per second."""
        return self.count / self.elapsed


def cpu_line(rates: dict[str, list[float]], used: dict[str, list[Used]]) -> str:
    """Each arm's client CPU per intent beside its wall time per intent, and its switches.

    Medians over the repeats. The wall time is the median rate's inverse;
    "busy" is CPU over wall, the share of the run the client's interpreter was
    working (each a median of its own, so it can pass 100%). The client is
    pinned to one CPU: a thread preempted there gave the CPU to another of its
    threads or to a process woken beside it (a PostgreSQL backend, say).
    """
    parts = []
    for arm, runs in used.items():
        wall = 1e6 / statistics.median(rates[arm])
        spent = statistics.median(run.cpu_us for run in runs)
        waits = statistics.median(run.waits for run in runs)
        preempted = statistics.median(run.preempted for run in runs)
        parts.append(
            f"{arm} {spent:.0f} of {wall:.0f} (busy {spent / wall:.0%}, "
            f"switches {waits:.1f} waiting + {preempted:.1f} preempted)"
        )
    return "client CPU per intent, us of wall: " + "   ".join(parts)


def sender_of(url: str) -> str:
    """The sender a drain client with ``base_url`` at ``url``'s origin sends as."""
    return postonce.Client(outbox=":memory:", base_url=origin_of(url)).sender


def open_call(
    reference: str, url: str, *, owner: str, now: float, lease_for: float, sender: str
) -> tuple[str, dict[str, object]]:
    """The store call that writes one benchmark intent ahead, leased to ``owner``."""
    new = NewIntent(
        reference=reference,
        key=str(uuid.uuid4()),
        key_given=False,
        provider="ietf_draft",
        method="POST",
        url=url,
        headers=(("content-type", "application/json"),),
        body=BODY,
        fingerprint=hashlib.sha256(reference.encode()).hexdigest(),
        deadline_at=None,
        sender=sender,
        origin=origin_of(url),
    )
    return "open_intent", {"new": new, "owner": owner, "now": now, "lease_for": lease_for}


def fill(path: Path | str, url: str, count: int) -> None:
    """Write ``count`` due intents, leased by a dead owner whose lease has run out."""
    store = open_store(str(path), durability="normal")
    long_ago, sender = time.time() - 3600, sender_of(url)
    calls = [
        open_call(f"bench-{i}", url, owner="dead/0", now=long_ago, lease_for=1.0, sender=sender)
        for i in range(count)
    ]
    run_batch = getattr(store, "run_batch")  # noqa: B009 (both stores have it)
    for start in range(0, count, 1000):
        for ok, result in run_batch(calls[start : start + 1000]):
            if not ok:
                raise result
    store.close()


def fresh_postgres(base: str) -> str:
    """A PostgreSQL outbox URL in a new schema (dropped by drop_postgres)."""
    return f"{base}?schema=bench_{uuid.uuid4().hex[:10]}"


def drop_postgres(url: str) -> None:
    import psycopg
    from psycopg import sql

    base, schema = split_schema(url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``: the drain client's base_url (it sends only there)."""
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port}"


def time_drain(path: Path | str, url: str, concurrency: int, count: int) -> Timed:
    with postonce.Client(outbox=path, durability="full", base_url=origin_of(url)) as client:
        client.outbox  # noqa: B018 (opened before the clock starts, as raw's pool)
        with Timed(count) as timed:
            report = client.drain(concurrency=concurrency)
    if report.succeeded != count:
        raise RuntimeError(f"drain finished {report.succeeded} of {count}: {report}")
    return timed


def time_floor(path: Path | str, url: str, concurrency: int, count: int) -> Timed:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(limits=limits) as http, Timed(count) as timed:
        done = drain_floor(str(path), http, concurrency)
    if done != count:
        raise RuntimeError(f"the floor finished {done} of {count}")
    return timed


def time_raw(url: str, concurrency: int, count: int) -> Timed:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(limits=limits) as http:

        def one(_: int) -> None:
            response = http.post(
                url,
                content=BODY,
                headers={"content-type": "application/json", "Idempotency-Key": str(uuid.uuid4())},
            )
            response.raise_for_status()

        with Timed(count) as timed:
            if concurrency == 1:
                for i in range(count):
                    one(i)
            else:
                with ThreadPoolExecutor(concurrency) as pool:
                    list(pool.map(one, range(count)))
        return timed


def time_drain_async(path: Path | str, url: str, concurrency: int, count: int) -> Timed:
    async def run() -> Timed:
        async with postonce.AsyncClient(
            outbox=path, durability="full", base_url=origin_of(url)
        ) as client:
            await client.lookup("opened before the clock starts")  # opens the outbox
            with Timed(count) as timed:
                report = await client.drain(concurrency=concurrency)
        if report.succeeded != count:
            raise RuntimeError(f"drain finished {report.succeeded} of {count}: {report}")
        return timed

    return asyncio.run(run())


def time_raw_async(url: str, concurrency: int, count: int) -> Timed:
    async def run() -> Timed:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits) as http:
            left = iter(range(count))

            async def worker() -> None:
                for _ in left:
                    response = await http.post(
                        url,
                        content=BODY,
                        headers={
                            "content-type": "application/json",
                            "Idempotency-Key": str(uuid.uuid4()),
                        },
                    )
                    response.raise_for_status()

            with Timed(count) as timed:
                await asyncio.gather(*(worker() for _ in range(concurrency)))
            return timed

    return asyncio.run(run())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--intents", type=int, default=3000, help="per run (default 3000)")
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated (default 1,4,8)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--shell", choices=["sync", "async"], default="sync")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    common_args(parser, seed=7)
    args = parser.parse_args(argv)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    if args.intents < 1 or args.repeats < 1 or min(args.levels) < 1:
        parser.error("--intents, --repeats and every concurrency must be >= 1")
    return args


def time_arm(arm: str, args: argparse.Namespace, url: str, outbox: Path | str, c: int) -> Timed:
    """One timed run of ``arm``; a PostgreSQL outbox is dropped after it."""
    if arm == "raw":
        return (time_raw if args.shell == "sync" else time_raw_async)(url, c, args.intents)
    fill(outbox, url, args.intents)
    timer = {"drain": time_drain, "floor": time_floor}[arm]
    try:
        return (time_drain_async if args.shell == "async" else timer)(outbox, url, c, args.intents)
    finally:
        if args.backend == "postgres":
            drop_postgres(str(outbox))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    arms = ["drain", "raw"] + (["floor"] if args.shell == "sync" else [])
    results: dict[int, dict[str, list[float]]] = {}
    with pinned_server(".tmp-drain-", args.dir) as pinned:
        print_facts(
            pinned,
            f"backend {args.backend}, shell {args.shell}, {args.intents} intents per run, "
            f"{args.repeats} repeats, seed {args.seed}",
        )
        url = pinned.server.url
        for c in args.levels:
            runs: dict[str, list[float]] = {arm: [] for arm in arms}
            cpu: dict[str, list[Used]] = {arm: [] for arm in arms}
            for repeat in range(args.repeats):
                order = list(arms)
                rng.shuffle(order)
                for arm in order:
                    outbox: Path | str = (
                        pinned.workdir / f"{arm}-c{c}-r{repeat}.sqlite3"
                        if args.backend == "sqlite"
                        else fresh_postgres(args.pg)
                    )
                    timed = time_arm(arm, args, url, outbox, c)
                    runs[arm].append(timed.rate)
                    cpu[arm].append(timed.used)
            results[c] = runs
            print(f"concurrency {c}: intents/s min/median/max over the repeats")
            for arm, rates in runs.items():
                print(f"  {arm:<6}{Spread.of(rates).text():>28}")
            print(f"  drain/raw {paired(runs, 'raw').text('.2f')}", end="")
            if "floor" in runs:
                print(
                    f"   drain/floor {paired(runs, 'floor').text('.2f')}   "
                    f"floor/raw {paired(runs, 'raw', 'floor').text('.2f')}",
                    end="",
                )
            print(f"   (within each repeat)\n  {cpu_line(runs, cpu)}")
            sys.stdout.flush()
    parts = []
    for c, runs in results.items():
        part = (
            f"c={c}: {statistics.median(runs['drain']):.0f}/s x{paired(runs, 'raw').median:.2f} raw"
        )
        if "floor" in runs:
            part += f", x{paired(runs, 'floor').median:.2f} floor"
        parts.append(part)
    unstable = [
        f"{arm} c={c}" for c, r in results.items() for arm in r if Spread.of(r[arm]).unstable
    ]
    print(
        f"SUMMARY drain {args.backend} {args.shell}: {'  '.join(parts)}; "
        f"unstable: {', '.join(unstable) or 'none'}"
    )
    return 0


def paired(runs: dict[str, list[float]], bottom: str, top: str = "drain") -> Spread:
    """``top / bottom`` intents per second, within each repeat (they ran side by side)."""
    return Spread.of(t / b for t, b in zip(runs[top], runs[bottom], strict=True))


if __name__ == "__main__":
    run_main(main)
