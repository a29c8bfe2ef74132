"""Round trips to PostgreSQL per drained intent, counted from libpq's protocol trace.

Run from the repository root (PostgreSQL reachable at ``--pg``)::

    .venv/bin/python benchmarks/count_round_trips.py --intents 200 --concurrency 1

Fills a fresh schema with due intents (as ``bench_drain.py`` does), drains
them with ``postonce.Client.drain`` while every pooled connection traces its
protocol messages to a file of its own, then counts, per connection, the
round trips: each turn from messages the client sent (``F``) to messages the
server answered (``B``) is one wait for the server. Also counts the
statements by their first word. Opening the outbox (migration, adoption) is
not counted; the census at the end of the drain is.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
from pathlib import Path

import postonce

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_drain import drop_postgres, fill, fresh_postgres, origin_of
from bench_sync import start_server


def count(trace_dir: Path) -> tuple[int, collections.Counter[str]]:
    trips = 0
    statements: collections.Counter[str] = collections.Counter()
    for path in trace_dir.iterdir():
        last = "B"
        named: dict[str, str] = {}
        bound = "?"
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            direction, message = parts[0], parts[2].strip()
            quoted = re.findall(r'"((?:[^"]|"")*)"', parts[3] if len(parts) > 3 else "")
            if direction == "F" and message == "Parse" and len(quoted) > 1:
                named[quoted[0]] = quoted[1]
            elif direction == "F" and message == "Bind" and len(quoted) > 1:
                bound = named.get(quoted[1], "?")
            elif direction == "F" and message in ("Query", "Execute"):
                text = quoted[0] if message == "Query" and quoted else bound
                for one in text.split(";"):
                    words = one.split()
                    statements[" ".join(words[:2]).upper() if words else "(pool check)"] += 1
            if direction == "B" and last == "F":
                trips += 1
            if direction in ("F", "B"):
                last = direction
    return trips, statements


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intents", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    server = start_server(None)
    url = fresh_postgres(args.pg)
    trace_dir = Path(tempfile.mkdtemp(prefix="pg-trace-"))
    try:
        fill(url, server.url, args.intents)
        with postonce.Client(outbox=url, durability="full", base_url=origin_of(server.url)) as c:
            store = c.outbox
            pool = store._pool  # type: ignore[attr-defined]
            traced: dict[int, object] = {}
            real = pool.getconn

            def getconn(*a: object, **k: object) -> object:
                conn = real(*a, **k)
                if id(conn) not in traced:
                    f = open(trace_dir / f"conn-{id(conn)}.trace", "w")  # noqa: SIM115
                    traced[id(conn)] = f
                    conn.pgconn.trace(f.fileno())
                    conn.pgconn.set_trace_flags(__import__("psycopg").pq.Trace.SUPPRESS_TIMESTAMPS)
                return conn

            pool.getconn = getconn
            report = c.drain(concurrency=args.concurrency)
            for conn in list(pool._pool):
                conn.pgconn.untrace()
        for f in traced.values():
            f.close()  # type: ignore[attr-defined]
        trips, statements = count(trace_dir)
        print(f"drained {report.succeeded} of {args.intents} at concurrency {args.concurrency}")
        print(f"round trips: {trips} ({trips / args.intents:.2f} per intent)")
        for word, n in statements.most_common():
            print(f"  {word:<10} {n:6d} ({n / args.intents:.2f} per intent)")
    finally:
        server.stop()
        drop_postgres(url)
        for path in trace_dir.iterdir():
            os.unlink(path)
        trace_dir.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
