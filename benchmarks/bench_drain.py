"""Drain throughput: due intents finished per second, against raw httpx sending the same.

Run from the repository root::

    .venv/bin/python benchmarks/bench_drain.py --intents 3000 --concurrency 1,4,8

For each concurrency, each repeat fills a fresh SQLite outbox with ``--intents``
due intents (as a crashed sender leaves them: leased by a dead owner, lease
expired; the filling is not timed), then times, in an order shuffled by a
seeded RNG:

* ``drain``: ``postonce.Client.drain(concurrency=C)`` finishing all of them;
* ``raw``: ``httpx.Client.post`` of the same number of requests with an
  ``Idempotency-Key`` each, from a pool of C threads sharing one client.

* ``floor`` (the sync shell only): ``drain_floor.drain_floor``, the least Python
  doing a drain's durable work (claim under a lease, raw httpx send, fenced
  record), on an outbox filled the same way, with C threads; ``drain / floor``
  is the price of what postonce's drain does besides.

With ``--shell async`` the arms are ``postonce.AsyncClient.drain`` and raw
``httpx.AsyncClient.post`` from C tasks sharing one client (a pool of C
connections), each run in its own ``asyncio.run``.

Both talk to the loopback server of ``bench_sync.py`` (a raw asyncio HTTP/1.1
server in its own process, pinned to the second CPU). Prints medians of the
repeats in intents per second and the drain/raw ratio, and each arm's client
CPU per intent (user + system time of this process, all its threads; not the
HTTP server's or PostgreSQL's) beside its wall time per intent: an arm whose CPU
is near its wall time is bound by the client's one interpreter, and its ratio
follows the work it does per intent. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Protocol

import httpx

import postonce
from postonce._outbox.base import NewIntent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sync import available_cpus, filesystem_of, start_server
from drain_floor import drain_floor
from spread import Spread

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


def open_call(
    reference: str, url: str, *, owner: str, now: float, lease_for: float
) -> tuple[str, dict[str, object]]:
    """The store call that writes one benchmark intent ahead, leased to ``owner``."""
    return (
        "open_intent",
        {
            "new": NewIntent(
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
            ),
            "owner": owner,
            "now": now,
            "lease_for": lease_for,
        },
    )


def fill(path: Path | str, url: str, count: int) -> None:
    """Write ``count`` due intents, leased by a dead owner whose lease has run out."""
    from postonce._outbox.locate import open_store

    store = open_store(str(path), durability="normal")
    long_ago = time.time() - 3600
    calls = [
        open_call(f"bench-{i}", url, owner="dead/0", now=long_ago, lease_for=1.0)
        for i in range(count)
    ]
    run_batch = getattr(store, "run_batch")  # noqa: B009 (both stores have it)
    for start in range(0, count, 1000):
        run_batch(calls[start : start + 1000])
    store.close()


_DRAIN_PROCESS = (
    "import postonce, sys\n"
    "client = postonce.Client(outbox=sys.argv[1], base_url=sys.argv[3])\n"
    "print(client.drain(concurrency=int(sys.argv[2])).succeeded)\n"
    "client.close()\n"
)


def time_processes(outbox: str, url: str, processes: int, concurrency: int, count: int) -> float:
    """Intents/s with ``processes`` drain processes sharing one outbox."""
    adopt(outbox, url)
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _DRAIN_PROCESS, outbox, str(concurrency), origin_of(url)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    done = sum(int(p.communicate(timeout=600)[0].strip() or 0) for p in procs)
    elapsed = time.perf_counter() - started
    if done != count:
        raise RuntimeError(f"{processes} drains finished {done} of {count}")
    return count / elapsed


def fresh_postgres(base: str) -> str:
    """A PostgreSQL outbox URL in a new schema (dropped by drop_postgres)."""
    return f"{base}?schema=bench_{uuid.uuid4().hex[:10]}"


def drop_postgres(url: str) -> None:
    import psycopg
    from psycopg import sql

    from postonce._outbox.locate import split_schema

    base, schema = split_schema(url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``: the drain client's base_url (it sends only there)."""
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port}"


def adopt(path: Path | str, url: str) -> None:
    """Give the filled intents (written with no sender) to the drain client's sender, untimed."""
    with postonce.Client(outbox=path, base_url=origin_of(url)) as client:
        client.outbox  # noqa: B018 (opening the outbox adopts the intents of no sender)


def time_drain(path: Path | str, url: str, concurrency: int, count: int) -> Timed:
    with postonce.Client(outbox=path, durability="full", base_url=origin_of(url)) as client:
        client.outbox  # noqa: B018 (opened and adopted before the clock starts, as raw's pool)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intents", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated, e.g. 1,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument(
        "--processes",
        default="",
        help="comma-separated drain process counts (e.g. 1,2,4): measure scaling instead",
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--shell",
        choices=["sync", "async"],
        default="sync",
        help="Client.drain against httpx.Client, or AsyncClient.drain against httpx.AsyncClient",
    )
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.processes and args.shell == "async":
        raise SystemExit("--processes times sync drain processes only; leave out --shell async")
    levels = [int(c) for c in args.concurrency.split(",")]
    rng = random.Random(args.seed)
    cpus = available_cpus()
    if len(cpus) >= 2:
        import os

        os.sched_setaffinity(0, {cpus[0]})
    server = start_server(cpus[1] if len(cpus) >= 2 else None)
    workdir = Path(tempfile.mkdtemp(prefix=".tmp-drain-", dir=args.dir))
    try:
        print(f"command: {' '.join(sys.argv)}")
        print(f"python {sys.version.split()[0]}, cpus {cpus}, outbox fs {filesystem_of(workdir)}")
        print(f"{args.intents} intents per run, {args.repeats} repeats, server {server.url}")
        if args.processes:
            scaling: dict[int, float] = {}
            for processes in [int(p) for p in args.processes.split(",")]:
                rates: list[float] = []
                for repeat in range(args.repeats):
                    if args.backend == "sqlite":
                        outbox = str(workdir / f"p{processes}-r{repeat}.sqlite3")
                    else:
                        outbox = fresh_postgres(args.pg)
                    fill(outbox, server.url, args.intents)
                    try:
                        rates.append(
                            time_processes(outbox, server.url, processes, levels[0], args.intents)
                        )
                    finally:
                        if args.backend == "postgres":
                            drop_postgres(outbox)
                scaling[processes] = statistics.median(rates)
                print(
                    f"{args.backend} {processes} process(es) x concurrency {levels[0]}: "
                    f"{scaling[processes]:8.0f} intents/s"
                )
            base = scaling[min(scaling)]
            print(
                f"SUMMARY drain {args.backend} processes: "
                + "  ".join(f"{p}: {v:.0f}/s (x{v / base:.2f})" for p, v in scaling.items())
            )
            return 0
        results: dict[int, dict[str, list[float]]] = {}
        for concurrency in levels:
            arms = ["drain", "raw"] + (["floor"] if args.shell == "sync" else [])
            runs: dict[str, list[float]] = {arm: [] for arm in arms}
            cpu: dict[str, list[Used]] = {arm: [] for arm in arms}
            for repeat in range(args.repeats):
                order = list(arms)
                rng.shuffle(order)
                for name in order:
                    if name == "raw":
                        raw_timer = time_raw if args.shell == "sync" else time_raw_async
                        timed = raw_timer(server.url, concurrency, args.intents)
                    else:
                        path: Path | str = (
                            workdir / f"{name}-c{concurrency}-r{repeat}.sqlite3"
                            if args.backend == "sqlite"
                            else fresh_postgres(args.pg)
                        )
                        fill(path, server.url, args.intents)
                        timer = {"drain": time_drain, "floor": time_floor}[name]
                        if args.shell == "async":
                            timer = time_drain_async
                        try:
                            timed = timer(path, server.url, concurrency, args.intents)
                        finally:
                            if args.backend == "postgres":
                                drop_postgres(str(path))
                    runs[name].append(timed.rate)
                    cpu[name].append(timed.used)
            results[concurrency] = runs
            drain, raw = statistics.median(runs["drain"]), statistics.median(runs["raw"])
            # Each repeat's drain over the raw of the same repeat: the spread.
            paired = sorted(d / r for d, r in zip(runs["drain"], runs["raw"], strict=True))
            print(
                f"concurrency {concurrency:>2}: drain {drain:8.0f} intents/s   "
                f"raw httpx {raw:8.0f} requests/s   ratio {drain / raw:.2f}   "
                f"per repeat {' '.join(f'{p:.2f}' for p in paired)}"
            )
            if "floor" in runs:
                floor = statistics.median(runs["floor"])
                to_floor = sorted(d / f for d, f in zip(runs["drain"], runs["floor"], strict=True))
                print(
                    f"               floor {floor:8.0f} intents/s   floor/raw {floor / raw:.2f}   "
                    f"drain/floor {drain / floor:.2f}   "
                    f"per repeat {' '.join(f'{p:.2f}' for p in to_floor)}"
                )
            print(
                "               min/median/max: "
                + "   ".join(f"{arm} {Spread.of(values).text()}" for arm, values in runs.items())
            )
            print(f"               {cpu_line(runs, cpu)}")

        def against(r: dict[str, list[float]]) -> str:
            drain = statistics.median(r["drain"])
            text = f"x{drain / statistics.median(r['raw']):.2f} raw"
            if "floor" in r:
                text += f", x{drain / statistics.median(r['floor']):.2f} floor"
            return text

        summary = "  ".join(
            f"c={c}: {statistics.median(r['drain']):.0f}/s ({against(r)})"
            for c, r in results.items()
        )
        unstable = [
            f"{arm} c={c}" for c, r in results.items() for arm in r if Spread.of(r[arm]).unstable
        ]
        shaky = f"; UNSTABLE: {', '.join(unstable)}" if unstable else ""
        print(f"SUMMARY drain {args.backend} {args.shell}: {summary}{shaky}")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
