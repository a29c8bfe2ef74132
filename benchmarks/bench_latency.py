"""What one ``Client.post_once`` costs, against raw httpx, the durable floor and the peers.

Run from the repository root::

    python benchmarks/bench_latency.py                      # 3 repeats x 200 rounds, ~2 min
    python benchmarks/bench_latency.py --rounds 5 --repeats 1 --warmup 1   # a smoke run

Arms run one call at a time, interleaved in seeded shuffled rounds: raw httpx, the
floors and postonce (NORMAL, FULL), and the peers when installed (stripe-python,
tenacity, stamina, DBOS; ``--no-peers`` leaves them out).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import uuid
import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import httpx
from _harness import (
    BODY,
    Candidate,
    check,
    common_args,
    latency_report,
    measure,
    pinned_server,
    print_facts,
    run_main,
)
from floor import Floor

import postonce

FLOOR_OF = {
    "postonce NORMAL": "floor NORMAL",
    "postonce FULL": "floor FULL",
    "floor FULL": "floor NORMAL",
}
PEERS = ("stripe", "tenacity", "stamina", "dbos")


def _optional(name: str) -> Any | None:
    """A peer's module if installed (typed Any: their decorators are untyped)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def raw_arm(http: httpx.Client, url: str) -> Candidate:
    def call() -> None:
        check(http.post(url, json=BODY, headers={"Idempotency-Key": str(uuid.uuid4())}), "raw")

    return Candidate("raw httpx", call)


def floor_arm(floor: Floor, url: str) -> Candidate:
    name = f"floor {floor.synchronous}"
    return Candidate(name, lambda: check(floor.post_once(url, BODY), name))


def postonce_arm(client: postonce.Client, url: str, name: str) -> Candidate:
    def call() -> None:
        check(client.post_once(url, json=BODY, intent=postonce.ONE_OFF), name)

    def settle() -> None:
        client.outbox  # noqa: B018 - commits anything a call left behind

    return Candidate(name, call, settle)


def stripe_arm(stripe: Any, origin: str, closing: ExitStack) -> Candidate:
    # httpx warns on every str ``data=``, which stripe-python's HTTPXClient passes.
    warnings.filterwarnings("ignore", message="Use 'content=", category=DeprecationWarning)
    http = stripe.HTTPXClient(allow_sync_methods=True)
    closing.callback(http.close)
    client = stripe.StripeClient(
        "sk_test_postonce_bench",
        base_addresses={"api": origin},
        http_client=http,
        max_network_retries=2,
    )

    def call() -> None:
        if not client.v1.payment_intents.create(params=BODY).id:
            raise RuntimeError("stripe-python: no id in the answer")

    return Candidate("stripe-python", call)


def retry_arm(name: str, retry: Any, http: httpx.Client, url: str) -> Candidate:
    """``retry`` wraps a function: the peer's decorator, 5 attempts on an httpx error."""

    def send(key: str) -> httpx.Response:
        response = http.post(url, json=BODY, headers={"Idempotency-Key": key})
        response.raise_for_status()
        return response

    post = retry(send)
    return Candidate(name, lambda: check(post(str(uuid.uuid4())), name))


def dbos_arm(dbos: Any, http: httpx.Client, url: str, database: Path) -> Candidate:
    """Launch DBOS on a SQLite system database; ``DBOS.destroy`` is the caller's."""
    DBOS = dbos.DBOS

    def post(key: str) -> int:
        return http.post(url, json=BODY, headers={"Idempotency-Key": key}).status_code

    send = DBOS.step()(post)  # decorators called, not applied: theirs are untyped

    def workflow() -> int:
        return int(send(str(DBOS.workflow_id)))

    charge = DBOS.workflow()(workflow)

    system = f"sqlite:///{database}"
    DBOS(config={"name": "postonce-bench", "system_database_url": system, "log_level": "WARNING"})
    DBOS.launch()
    numbers = itertools.count()

    def call() -> None:
        with dbos.SetWorkflowID(f"order-{next(numbers)}/charge"):
            if charge() != 201:
                raise RuntimeError("DBOS: expected 201 from the loopback server")

    return Candidate("DBOS", call, block=1)  # ~100x raw: one call a round


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="rounds per repeat (200)")
    parser.add_argument("--warmup", type=int, default=30, help="uncounted rounds (30)")
    parser.add_argument("--block", type=int, default=10, help="calls in a row per arm (10)")
    parser.add_argument("--no-peers", action="store_true", help="leave out every peer")
    common_args(parser)
    args = parser.parse_args(argv)
    if min(args.rounds, args.repeats, args.block) < 1 or args.warmup < 0:
        parser.error("--rounds, --repeats and --block must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    peers = {name: None if args.no_peers else _optional(name) for name in PEERS}
    versions = ", ".join(
        f"{name} {metadata.version(name) if module else 'not run'}"
        for name, module in peers.items()
    )
    with pinned_server(".tmp-latency-", args.dir) as pinned, ExitStack() as closing:
        print_facts(
            pinned,
            f"peers: {versions}",
            f"{args.repeats} repeats x {args.rounds} rounds (+{args.warmup} warm-up) x "
            f"{args.block} calls in a row per arm, seed {args.seed}",
        )
        url, workdir = pinned.server.url, pinned.workdir

        def http() -> httpx.Client:
            return closing.enter_context(httpx.Client())

        arms = [raw_arm(http(), url)]
        for level in ("NORMAL", "FULL"):
            floor = Floor(workdir / f"floor-{level}.sqlite3", level, http())
            closing.callback(floor.close)
            arms.append(floor_arm(floor, url))
        durabilities: tuple[Literal["normal", "full"], ...] = ("normal", "full")
        for level in durabilities:
            client = postonce.Client(outbox=workdir / f"{level}.sqlite3", durability=level)
            arms.append(
                postonce_arm(closing.enter_context(client), url, f"postonce {level.upper()}")
            )
        if peers["stripe"]:
            arms.append(stripe_arm(peers["stripe"], pinned.server.origin, closing))
        if tenacity := peers["tenacity"]:
            retry = tenacity.retry(
                stop=tenacity.stop_after_attempt(5),
                wait=tenacity.wait_exponential(multiplier=0.1, max=2),
                retry=tenacity.retry_if_exception_type(httpx.HTTPError),
                reraise=True,
            )
            arms.append(retry_arm("tenacity", retry, http(), url))
        if stamina := peers["stamina"]:
            arms.append(
                retry_arm("stamina", stamina.retry(on=httpx.HTTPError, attempts=5), http(), url)
            )
        if dbos := peers["dbos"]:
            closing.callback(dbos.DBOS.destroy)
            arms.append(dbos_arm(dbos, http(), url, workdir / "dbos.sqlite3"))
        measure(arms, args)
        summary = latency_report(arms, FLOOR_OF)
    print("SUMMARY latency c=1, p50/raw: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    run_main(main)
