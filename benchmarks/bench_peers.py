"""postonce against its peers: one POST per intent, concurrency 1, no failures.

Run from the repository root::

    .venv-bench/bin/python benchmarks/bench_peers.py

Six candidates make the same POST (the JSON body ``BODY`` of ``bench_sync.py``)
to one loopback server, interleaved: every cycle calls each candidate once,
in an order shuffled by a seeded RNG (``bench_sync.run_rounds``), so drift hits
all of them alike. ``--rounds`` rounds of ``--n`` cycles are measured after
``--warmup`` uncounted cycles.

1. ``raw httpx``: ``httpx.Client.post`` with a fresh ``Idempotency-Key``
   (``bench_sync.raw_candidate``). The yardstick: every ratio is to its median
   in the same run.
2. ``postonce``: ``postonce.Client().post_once(url, json=BODY, intent=...)``
   with the default ``durability="full"`` on a fresh outbox; one new intent
   (``order-<i>/charge``) per call.
3. ``DBOS``: DBOS (``dbos`` 3.x) with a SQLite system database in the same
   directory; one workflow per intent (``SetWorkflowID("order-<i>/charge")``)
   whose single ``@DBOS.step()`` makes the POST with a shared ``httpx.Client``,
   sending the workflow id as its ``Idempotency-Key``.
4. ``stripe-python``: ``stripe.StripeClient(...).v1.payment_intents.create``
   with its ``HTTPXClient``, ``base_addresses`` pointed at the loopback server,
   and its own retry loop (``max_network_retries=2``: it mints the
   ``Idempotency-Key`` itself). Stripe's v1 API is form-encoded, so this one
   sends the same fields as ``application/x-www-form-urlencoded``, not JSON.
   The loopback server answers every POST ``201`` with a small JSON object,
   which stripe-python accepts as the created object.
5. ``stamina``: ``httpx.Client.post`` + ``raise_for_status`` under
   ``@stamina.retry(on=httpx.HTTPError, attempts=5)``, one key per call.
6. ``floor FULL``: ``benchmarks/floor.py``, the least Python doing postonce's
   durable work (write-ahead commit with ``synchronous=FULL``, raw httpx send,
   answer commit), so the table shows what durability itself costs.

Every candidate gets p50, p99 and max, ratios to raw for each, the ratio of its
p50 to the floor's, and the spread of its p50 over the rounds (min/median/max,
``UNSTABLE`` when they differ by more than 30%).

Each candidate has its own ``httpx.Client`` (its own keep-alive connection).
The server is ``bench_sync.py``'s raw asyncio HTTP/1.1 server, in its own
process pinned to the second CPU; this process runs on the first. The
outbox and the DBOS database live in a fresh directory under ``benchmarks/``
(``--dir`` picks another parent), deleted at the end. The garbage collector
stays on. Nothing is asserted about the timings: the script only prints.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import itertools
import os
import random
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import httpx
import stamina
from dbos import DBOS, SetWorkflowID

import postonce

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sync import (
    BODY,
    Candidate,
    Stats,
    _check,
    floor_candidate,
    open_stripe,
    pinned_server,
    print_facts,
    raw_candidate,
    run_main,
    run_rounds,
    stats_of,
    stripe_candidate,
)
from floor import Floor
from spread import Spread

DBOS_TARGET = 5.0  # postonce should be at least this many times faster per intent

# -- DBOS: registered at import, launched by dbos_candidate ----------------------

_dbos_http: dict[str, httpx.Client] = {}


@DBOS.step()
def _dbos_post(url: str, body: dict[str, object]) -> int:
    """The one step: the POST, keyed by the workflow (intent) id."""
    response = _dbos_http["client"].post(
        url, json=body, headers={"Idempotency-Key": str(DBOS.workflow_id)}
    )
    return response.status_code


@DBOS.workflow()
def _dbos_charge(url: str, body: dict[str, object]) -> int:
    """One workflow per intent."""
    return _dbos_post(url, body)


# -- candidates ------------------------------------------------------------------


def postonce_candidate(client: postonce.Client, url: str) -> Candidate:
    numbers = itertools.count()

    def call() -> None:
        intent = f"order-{next(numbers)}/charge"
        _check(client.post_once(url, json=BODY, intent=intent), "postonce")

    return Candidate("postonce", call)


def dbos_candidate(http: httpx.Client, url: str, database: Path) -> Candidate:
    """Launch DBOS on a SQLite system database; DBOS.destroy() is the caller's."""
    _dbos_http["client"] = http
    DBOS(
        config={
            "name": "postonce-bench-peers",
            "system_database_url": f"sqlite:///{database}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    numbers = itertools.count()

    def call() -> None:
        with SetWorkflowID(f"order-{next(numbers)}/charge"):
            status = _dbos_charge(url, BODY)
        if status != 201:
            raise RuntimeError(f"DBOS: expected 201 from the loopback server, got {status}")

    return Candidate("DBOS", call)


def stamina_candidate(http: httpx.Client, url: str) -> Candidate:
    @stamina.retry(on=httpx.HTTPError, attempts=5)
    def post(key: str) -> httpx.Response:
        response = http.post(url, json=BODY, headers={"Idempotency-Key": key})
        response.raise_for_status()
        return response

    def call() -> None:
        _check(post(str(uuid.uuid4())), "stamina")  # one key for all of this call's tries

    return Candidate("stamina", call)


# -- report ------------------------------------------------------------------------


def report(candidates: Sequence[Candidate]) -> None:
    table: dict[str, Stats] = {c.name: stats_of(c.all_samples()) for c in candidates}
    by_name = {c.name: c for c in candidates}
    raw, floor = table["raw httpx"], table["floor FULL"]
    print()
    print(
        f"{'candidate':<15}{'n':>6}{'p50':>8}{'p99':>8}{'max':>9}"
        f"{'p50/raw':>9}{'p99/raw':>9}{'max/raw':>9}{'p50/floor':>11}   p50 per round"
    )
    for name, s in table.items():
        rounds = Spread.of(stats_of(r).p50_us for r in by_name[name].repeats)
        print(
            f"{name:<15}{s.n:>6}{s.p50_us:>8.0f}{s.p99_us:>8.0f}{s.max_us:>9.0f}"
            f"{s.p50_us / raw.p50_us:>8.2f}x{s.p99_us / raw.p99_us:>8.2f}x"
            f"{s.max_us / raw.max_us:>8.2f}x{s.p50_us / floor.p50_us:>10.2f}x   {rounds.text()}"
        )
    print("(us; floor FULL: benchmarks/floor.py with synchronous=FULL, postonce's default)")
    ours, dbos = table["postonce"], table["DBOS"]
    faster = dbos.p50_us / ours.p50_us
    verdict = "met" if faster >= DBOS_TARGET else "MISSED"
    print()
    print(
        f"p50(DBOS) / p50(postonce) = x{faster:.2f}  "
        f"(p99: x{dbos.p99_us / ours.p99_us:.2f}; target >= x{DBOS_TARGET:.0f}: {verdict})"
    )
    unstable = [
        c.name for c in candidates if Spread.of(stats_of(r).p50_us for r in c.repeats).unstable
    ]
    if unstable:
        print(f"UNSTABLE (rounds differ by > 30% in p50): {', '.join(unstable)}")
    parts = " ".join(
        f"{name}={s.p50_us:.0f}us(x{s.p50_us / raw.p50_us:.2f})"
        for name, s in table.items()
        if name != "raw httpx"
    )
    print(
        f"SUMMARY peers c=1: raw={raw.p50_us:.0f}us {parts}; p50 ratios to raw; "
        f"postonce vs DBOS: {faster:.1f}\u00d7 faster per intent; "
        f"unstable: {', '.join(unstable) or 'none'}"
    )


# -- main --------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=400, help="cycles per round (default 400)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=50, help="uncounted cycles (default 50)")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: --n 50 --rounds 2 --warmup 10"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=600.0,
        help="start no new round after this many seconds (default 600)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    parser.add_argument("--seed", type=int, default=2024, help="seed of the call order")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.rounds, args.warmup = 50, 2, 10
    if args.n < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--n and --rounds must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with pinned_server(".tmp-bench-peers-", args.dir) as pinned, ExitStack() as closing:
        workdir, server = pinned.workdir, pinned.server
        print_facts(workdir, pinned.cpus, pinned.pinning, server)
        versions = ", ".join(
            f"{name} {importlib.metadata.version(name)}" for name in ("dbos", "stripe", "stamina")
        )
        print(f"peers: {versions}; load average at start: {os.getloadavg()}")
        print(
            f"cycles: {args.rounds} rounds x {args.n} measured + {args.warmup} warm-up, "
            f"seed {args.seed}"
        )
        sys.stdout.flush()

        base = server.url.rsplit("/v1/", 1)[0]
        raw_http = httpx.Client()
        closing.callback(raw_http.close)
        ours = postonce.Client(outbox=workdir / "outbox.sqlite3")
        closing.callback(ours.close)
        dbos_http = httpx.Client()
        closing.callback(dbos_http.close)
        stripe_client = open_stripe(base, closing)
        if stripe_client is None:
            raise SystemExit("bench_peers needs stripe-python: install the bench extra")
        floor_http = httpx.Client()
        closing.callback(floor_http.close)
        floor = Floor(workdir / "floor.sqlite3", "FULL", floor_http)
        closing.callback(floor.close)
        stamina_http = httpx.Client()
        closing.callback(stamina_http.close)
        closing.callback(DBOS.destroy)

        candidates = [
            raw_candidate(raw_http, server.url),
            postonce_candidate(ours, server.url),
            dbos_candidate(dbos_http, server.url, workdir / "dbos.sqlite3"),
            stripe_candidate(stripe_client),
            floor_candidate(floor, server.url),
            stamina_candidate(stamina_http, server.url),
        ]
        rng = random.Random(args.seed)
        run_rounds(candidates, args.warmup, rng, keep=False)
        gc.collect()
        started = time.monotonic()
        for number in range(1, args.rounds + 1):
            run_rounds(candidates, args.n, rng, keep=True)
            for candidate in candidates:
                candidate.end_repeat()
            elapsed = time.monotonic() - started
            print(f"round {number}/{args.rounds} done at {elapsed:.1f} s")
            sys.stdout.flush()
            if elapsed > args.time_limit and number < args.rounds:
                print(f"time limit {args.time_limit:.0f} s reached: stopping early")
                break
        print(f"load average at end: {os.getloadavg()}")
        report(candidates)
    return 0


if __name__ == "__main__":
    run_main(main)
