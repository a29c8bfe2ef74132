"""WAL pages written per first-try 2xx intent: postonce against the durable floor.

Run from the repository root::

    python benchmarks/bench_wal.py            # 3 repeats x 300 intents, ~30 s
    python benchmarks/bench_wal.py --intents 20 --warmup 20 --repeats 1   # a smoke run

Nothing is timed: the ``-wal`` file is parsed after ``--intents`` intents (a reader
pins the snapshot so no frame is copied back) and each page named through ``dbstat``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
from _harness import BODY, Spread, check, pinned_server, print_facts, run_main
from floor import Floor

import postonce

_WAL_HEADER = 32
_FRAME_HEADER = 24

Arm = tuple[Callable[[], None], Callable[[], None]]  # call, settle


@dataclass
class Result:
    frames: list[float] = field(default_factory=list)  # per intent, one per repeat
    commits: list[float] = field(default_factory=list)
    by_btree: collections.Counter[str] = field(default_factory=collections.Counter)
    intents: int = 0


def count_wal(wal: Path) -> tuple[list[int], int]:
    """The page of every frame in a ``-wal`` file that was never restarted, and its commits."""
    data = wal.read_bytes()
    if len(data) < _WAL_HEADER:
        return [], 0
    frame_size = _FRAME_HEADER + int.from_bytes(data[8:12], "big")
    pages: list[int] = []
    commits = 0
    for at in range(_WAL_HEADER, len(data) - frame_size + 1, frame_size):
        if data[at + 8 : at + 16] != data[16:24]:
            raise RuntimeError(f"{wal}: a frame from another WAL generation (restarted?)")
        pages.append(int.from_bytes(data[at : at + 4], "big"))
        commits += int.from_bytes(data[at + 4 : at + 8], "big") != 0  # a commit's last frame
    return pages, commits


def btree_of_pages(path: Path) -> dict[int, str]:
    """Page number -> B-tree (table or index) name, from ``dbstat``; empty without it."""
    conn = sqlite3.connect(path)
    try:
        return {
            int(page): str(name) for name, page in conn.execute("SELECT name, pageno FROM dbstat")
        }
    except sqlite3.OperationalError:
        return {}  # SQLite built without SQLITE_ENABLE_DBSTAT_VTAB
    finally:
        conn.close()


def open_arm(name: str, path: Path, url: str, durability: str, closing: ExitStack) -> Arm:
    http = closing.enter_context(httpx.Client())
    numbers = itertools.count()

    def reference() -> str | None:
        return f"order-{next(numbers)}/charge" if name.endswith("intent=") else None

    if name.startswith("floor"):
        floor = Floor(path, "FULL" if durability == "full" else "NORMAL", http)
        closing.callback(floor.close)
        return (
            lambda: check(floor.post_once(url, BODY, reference()), name),
            lambda: None,
        )
    level: Literal["full", "normal"] = "full" if durability == "full" else "normal"
    client = postonce.Client(outbox=path, durability=level, http=http)

    def call() -> None:
        check(client.post_once(url, json=BODY, intent=reference() or postonce.ONE_OFF), name)

    def settle() -> None:
        client.outbox  # noqa: B018 - reading the property commits the write-behind queue

    closing.callback(client.close)
    return call, settle


def measure(name: str, path: Path, url: str, args: argparse.Namespace, result: Result) -> None:
    with ExitStack() as closing:
        call, settle = open_arm(name, path, url, args.durability, closing)
        for _ in range(args.warmup):
            call()
        settle()
        side = sqlite3.connect(path, isolation_level=None)
        closing.callback(side.close)
        busy, _, _ = side.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        wal = path.with_name(path.name + "-wal")
        if busy or wal.stat().st_size:
            raise RuntimeError(f"{name}: could not empty the WAL before counting")
        side.execute("BEGIN")
        side.execute("SELECT count(*) FROM sqlite_master").fetchone()  # pins the snapshot
        for _ in range(args.intents):
            call()
        settle()
        pages, commits = count_wal(wal)
        side.execute("ROLLBACK")
    result.frames.append(len(pages) / args.intents)
    result.commits.append(commits / args.intents)
    result.intents += args.intents
    names = btree_of_pages(path)
    result.by_btree.update(names.get(page, "?") for page in pages)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--intents", type=int, default=300, help="counted intents per repeat")
    parser.add_argument("--warmup", type=int, default=1000, help="uncounted intents first")
    parser.add_argument("--repeats", type=int, default=3, help="repeats, each on a fresh file")
    parser.add_argument("--durability", choices=("full", "normal"), default="full")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    args = parser.parse_args(argv)
    if args.intents < 1 or args.warmup < 1 or args.repeats < 1:
        parser.error("--intents, --warmup and --repeats must be >= 1")
    return args


ARMS = ("postonce", "postonce intent=", "floor", "floor intent=")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = {name: Result() for name in ARMS}
    with pinned_server(".tmp-bench-wal-", args.dir) as pinned:
        print_facts(
            pinned,
            f"counting: {args.repeats} repeats x {args.intents} intents (+{args.warmup} warm-up), "
            f"durability {args.durability}, a fresh file per arm and repeat",
        )
        started = time.monotonic()
        for repeat in range(args.repeats):
            for number, name in enumerate(ARMS):
                path = pinned.workdir / f"r{repeat}-{number}.sqlite3"
                measure(name, path, pinned.server.url, args, results[name])
        print(f"counted in {time.monotonic() - started:.1f} s")
    print(
        f"\n{'arm':<18}{'WAL pages/intent':>18}{'bytes/intent':>14}{'commits/intent':>16}"
        "   pages/intent per repeat (min/median/max)"
    )
    summary: list[str] = []
    for name, result in results.items():
        pages = Spread.of(result.frames)
        commits = Spread.of(result.commits)
        print(
            f"{name:<18}{pages.median:>18.2f}{pages.median * (4096 + _FRAME_HEADER):>14.0f}"
            f"{commits.median:>16.2f}   {pages.text('.2f')}"
        )
        summary.append(f"{name}={pages.median:.2f}")
    print("(bytes: frames of 24 + 4096 bytes; median over repeats)\n")
    print("WAL pages per intent by B-tree (all repeats; from dbstat, '?' = unknown page):")
    for name, result in results.items():
        parts = ", ".join(
            f"{btree} {count / result.intents:.2f}"
            for btree, count in result.by_btree.most_common()
        )
        print(f"  {name}: {parts}")
    unstable = [name for name, r in results.items() if Spread.of(r.frames).unstable]
    print(
        f"SUMMARY wal pages per first-try 2xx intent: {' '.join(summary)}; "
        f"unstable: {', '.join(unstable) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
