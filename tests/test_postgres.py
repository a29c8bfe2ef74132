"""What only the PostgreSQL outbox has to prove: migrations, schemas, faults, many hosts.

The client, outbox, drain and end-to-end suites already run on PostgreSQL too
(the ``backend`` fixture); these are the PostgreSQL-specific properties.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import postonce
from postonce import State
from postonce._outbox.base import NewIntent
from postonce._outbox.locate import split_schema
from postonce._outbox.postgres import MIGRATIONS, SCHEMA_VERSION, PostgresStore
from tests.conftest import FAST, PG_URL, LoopbackServer, drain_env, pg_schema

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pg_outbox() -> Iterator[str]:
    """A PostgreSQL outbox URL in a fresh schema."""
    with pg_schema() as url:
        yield url


def shape(schema: str) -> dict[str, Any]:
    """Columns, indexes and constraints of a schema, for comparing two of them."""
    with psycopg.connect(PG_URL) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default"
            " FROM information_schema.columns WHERE table_schema = %s ORDER BY 1, 2",
            (schema,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, replace(indexdef, %s, 'S')"
            " FROM pg_indexes WHERE schemaname = %s ORDER BY 1, 2",
            (f"{schema}.", schema),
        ).fetchall()
        constraints = conn.execute(
            "SELECT conname, contype FROM pg_constraint c JOIN pg_namespace n"
            " ON n.oid = c.connamespace WHERE n.nspname = %s ORDER BY 1",
            (schema,),
        ).fetchall()
    defaults = [(t, c, d, n, (x or "").replace(f"{schema}.", "S.")) for t, c, d, n, x in columns]
    return {"columns": defaults, "indexes": indexes, "constraints": constraints}


def test_migrating_step_by_step_equals_a_fresh_schema() -> None:
    """Applying each SQL migration in turn gives exactly the schema a fresh outbox creates."""
    with pg_schema() as fresh_url, pg_schema() as stepped_url:
        fresh, stepped = split_schema(fresh_url)[1], split_schema(stepped_url)[1]
        PostgresStore(PG_URL, schema=fresh).close()
        name = sql.Identifier(stepped)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(name))
            conn.execute(sql.SQL("CREATE TABLE {}.postonce_meta (version integer)").format(name))
            conn.execute(sql.SQL("INSERT INTO {}.postonce_meta VALUES (0)").format(name))
            for number, text in MIGRATIONS:
                conn.execute(sql.SQL(text).format(schema=name))
                conn.execute(
                    sql.SQL("UPDATE {}.postonce_meta SET version = %s").format(name), (number,)
                )
        # Opening the stepped schema finds it current and changes nothing.
        PostgresStore(PG_URL, schema=stepped).close()
        assert shape(stepped) == shape(fresh)
        with psycopg.connect(PG_URL) as conn:
            row = conn.execute(sql.SQL("SELECT version FROM {}.postonce_meta").format(name))
            assert row.fetchall() == [(SCHEMA_VERSION,)]


def test_a_newer_schema_is_refused(pg_outbox: str) -> None:
    """An outbox written by a newer postonce is refused with a message saying so."""
    url, schema = split_schema(pg_outbox)
    PostgresStore(url, schema=schema).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.postonce_meta SET version = %s").format(sql.Identifier(schema)),
            (SCHEMA_VERSION + 1,),
        )
    with pytest.raises(postonce.OutboxError, match="newer postonce"):
        PostgresStore(url, schema=schema)


def test_schemas_keep_outboxes_apart(pg_outbox: str) -> None:
    """Two schemas in one database are two outboxes: neither sees the other's intents."""
    import httpx

    with pg_schema() as other:
        answers = httpx.MockTransport(lambda r: httpx.Response(201))
        with postonce.Client("http://api.test", outbox=pg_outbox, transport=answers) as a:
            a.post_once("/c", json={}, intent="mine")
        with postonce.Client("http://api.test", outbox=other, transport=answers) as b:
            assert b.lookup("mine") is None
            b.post_once("/c", json={}, intent="theirs")
        url, schema = split_schema(other)
        assert schema.startswith("t_")
        with psycopg.connect(url) as conn:
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (schema,),
                )
            }
        assert tables == {"intents", "attempts", "receipts", "postonce_meta"}


def test_missing_schema_is_not_created_by_inspection(pg_outbox: str) -> None:
    """create=False (the inspect commands) refuses a schema with no outbox in it."""
    url, schema = split_schema(pg_outbox)
    with pytest.raises(postonce.OutboxError, match="no outbox in schema"):
        PostgresStore(url, schema=schema, create=False)


def fill(url: str, server: LoopbackServer, count: int, prefix: str, body: bytes) -> list[str]:
    """Write ``count`` due intents in one transaction (as a crashed host leaves them)."""
    base, schema = split_schema(url)
    store = PostgresStore(base, schema=schema)
    keys = [f"{prefix}-{uuid.uuid4()}" for _ in range(count)]
    calls = [
        (
            "open_intent",
            {
                "new": NewIntent(
                    reference=f"{prefix}-{i}",
                    key=key,
                    key_given=True,
                    provider="ietf_draft",
                    method="POST",
                    url=f"{server.base_url}/ietf/v1/charges",
                    headers=(("content-type", "application/json"),),
                    body=body,
                    fingerprint=f"{i:064d}",
                    deadline_at=None,
                ),
                "owner": "crashed-host/1",
                "now": time.time() - 60,
                "lease_for": 1.0,
            },
        )
        for i, key in enumerate(keys)
    ]
    results = store.run_batch(calls)
    store.close()
    assert all(ok for ok, _ in results)
    return keys


def test_a_dropped_connection_is_a_clear_outbox_error_then_reconnects(pg_outbox: str) -> None:
    """Backends terminated under an idle pool: one clear OutboxError, then it works again."""
    app_name = f"postonce-drop-{uuid.uuid4().hex[:8]}"
    base, schema = split_schema(f"{pg_outbox}&application_name={app_name}")
    store = PostgresStore(base, schema=schema, min_size=1, max_size=1, check_connections=False)
    assert store.get("nothing") is None
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app_name,),
        ).fetchall()
    assert killed
    with pytest.raises(
        postonce.OutboxError, match=re.escape("PostgreSQL outbox at 127.0.0.1:5432/test")
    ):
        store.get("nothing")
    assert store.get("nothing") is None  # the pool reconnected
    store.close()


def test_connections_dropped_during_a_drain_lose_nothing(
    server: LoopbackServer, pg_outbox: str
) -> None:
    """pg_terminate_backend again and again during a drain: every intent charged once."""
    app_name = f"postonce-fault-{uuid.uuid4().hex[:8]}"
    url = f"{pg_outbox}&application_name={app_name}"
    keys = fill(url, server, 200, "fault", b'{"amount":1,"_test":{"delay":0.01}}')
    client = postonce.Client(server.base_url, outbox=url, retry=FAST, lease_seconds=1.0)
    # Opened before the faults begin: this test is about a drain that loses connections,
    # not one that cannot open its outbox (that fails fast, as it should).
    client.outbox  # noqa: B018
    stop, done = threading.Event(), threading.Event()
    reports: list[postonce.DrainReport] = []
    worker = threading.Thread(
        target=lambda: reports.append(
            client.drain(forever=True, interval=0.1, concurrency=4, stop=stop)
        )
    )
    killed = 0

    def killer() -> None:
        nonlocal killed
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            while not done.wait(0.01):
                killed += len(
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name = %s",
                        (app_name,),
                    ).fetchall()
                )

    chaos = threading.Thread(target=killer)
    worker.start()
    chaos.start()
    try:
        time.sleep(1.5)
        done.set()
        chaos.join()
        deadline = time.monotonic() + 60
        while client.outbox.stats(now=time.time())["states"]["succeeded"] < 200:
            assert time.monotonic() < deadline, client.outbox.stats(now=time.time())
            time.sleep(0.1)
    finally:
        done.set()
        stop.set()
        worker.join(timeout=30)
        client.close()
    assert killed > 0
    print(f"terminated {killed} backends; drain report: {reports}")
    ledger = server.ledger()
    for key in keys:
        assert len([e for e in ledger["effects"] if e["key"] == key]) == 1
        assert ledger["max_concurrent"][key] == 1


def app_name_of(url: str, name: str) -> str:
    """The application_name of a drain process's connections: its name, and its schema."""
    return f"{name}-{split_schema(url)[1]}"


def drain_process(url: str, server: LoopbackServer, name: str) -> subprocess.Popen[str]:
    # Each its own host (POSTONCE_HOST): a dead one's leases must run out before the
    # others take its intents, as across real hosts (on one host they would at once).
    # Its connections carry its name in pg_stat_activity (the URL's application_name).
    named = f"{url}&application_name={app_name_of(url, name)}"
    env = {**drain_env(server, named, name, lease=2), "POSTONCE_HOST": name}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "postonce",
            "drain",
            "--app",
            "tests.drain_app:client",
            "--forever",
            "--interval",
            "100ms",
            "--concurrency",
            "8",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_three_hosts_one_killed_every_intent_once(server: LoopbackServer, pg_outbox: str) -> None:
    """3 host processes share 2,000 intents; one is SIGKILLed; the others finish its leases."""
    keys = fill(pg_outbox, server, 2000, "hosts", b'{"amount":1,"_test":{"delay":0.005}}')
    hosts = [drain_process(pg_outbox, server, f"host{n}") for n in range(3)]
    try:
        deadline = time.monotonic() + 60
        while sum(1 for r in server.ledger()["requests"] if r["worker"] == "host0") < 150:
            assert time.monotonic() < deadline, "host0 never got going"
            assert hosts[0].poll() is None, hosts[0].communicate()
            time.sleep(0.02)
        base, schema = split_schema(pg_outbox)
        store = PostgresStore(base, schema=schema)

        def held_by_host0() -> list[str]:
            return [
                r.reference
                for r in store.list_intents(state=State.SENDING)
                if r.lease_owner is not None and f"/{hosts[0].pid}/" in r.lease_owner
            ]

        def host0_busy_on_the_server(conn: psycopg.Connection[Any]) -> bool:
            """Is the server still running a statement host0 sent (its COMMIT, say)?

            Not if the backend waits to read from host0 (mid-pipeline it stays
            'active' in ClientRead) or on a lock only host0 holds: neither moves
            while host0 is stopped.
            """
            host0 = app_name_of(pg_outbox, "host0")
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE a.state = 'active'"
                " AND a.wait_event IS DISTINCT FROM 'ClientRead'"
                " AND NOT (cardinality(pg_blocking_pids(a.pid)) > 0"
                " AND pg_blocking_pids(a.pid) <@ ARRAY("
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s)))"
                " FROM pg_stat_activity AS a WHERE a.application_name = %s",
                (host0, host0),
            ).fetchone()
            assert row is not None
            named, busy = row
            assert named > 0, "host0's connections are not named: this check would see none"
            return bool(busy > 0)

        # Killed while it holds leases (between two batches it holds none). Looked
        # at with host0 stopped, once the server has finished whatever host0 sent
        # (its last commit may release every lease it holds): a host looked at while
        # it runs can release its leases before the kill lands (CI saw exactly that).
        # Stopped and quiet, it can change nothing the kill does not roll back.
        # One connection watches the server's activity for every look. Autocommit:
        # each look is its own transaction, so pg_stat_activity is read afresh.
        with psycopg.connect(base, autocommit=True) as watcher:
            while True:
                assert time.monotonic() < deadline, "host0 never held a lease"
                hosts[0].send_signal(signal.SIGSTOP)
                time.sleep(0.05)  # bytes it sent just before the stop reach the server
                while host0_busy_on_the_server(watcher):
                    assert time.monotonic() < deadline, "host0's last statement never ended"
                    time.sleep(0.01)
                # The leases it dies with: the intents the others must take over (on
                # other hosts, after the leases run out: they cannot see the process).
                orphaned = held_by_host0()
                if orphaned:
                    break
                hosts[0].send_signal(signal.SIGCONT)
                time.sleep(0.005)
        hosts[0].send_signal(signal.SIGKILL)
        hosts[0].wait(timeout=10)
        deadline = time.monotonic() + 120
        while store.stats(now=time.time())["states"]["succeeded"] < 2000:
            assert time.monotonic() < deadline, store.stats(now=time.time())
            time.sleep(0.2)
        store.close()
    finally:
        # host0 is dead by now, unless the test failed first: a host0 left stopped
        # mid-transaction would hold its locks, and the schema's DROP would wait.
        hosts[0].kill()
        hosts[0].communicate(timeout=60)
        for host in hosts[1:]:
            host.send_signal(signal.SIGTERM)
        outputs = [host.communicate(timeout=60) for host in hosts[1:]]
    reports = [json.loads(out) for out, _ in outputs]
    assert all(host.returncode == 0 for host in hosts[1:]), outputs
    ledger = server.ledger()
    mine = set(keys)
    effects: dict[str, int] = {}
    for effect in ledger["effects"]:
        if effect["key"] in mine:
            effects[effect["key"]] = effects.get(effect["key"], 0) + 1
    assert effects == dict.fromkeys(keys, 1)
    assert all(ledger["max_concurrent"][k] == 1 for k in keys)
    workers = {r["worker"] for r in ledger["requests"] if r["key"] in mine}
    assert workers == {"host0", "host1", "host2"}
    assert sum(r["succeeded"] for r in reports) > 0
    # The dead host's leased intents were finished by the others, with their own keys.
    assert orphaned
    store = PostgresStore(base, schema=schema)
    finished = [store.get(ref) for ref in orphaned]
    store.close()
    assert all(r is not None and r.state is State.SUCCEEDED for r in finished)


def test_cli_inspects_a_postgres_outbox(pg_outbox: str) -> None:
    """postonce outbox works on a PostgreSQL URL as on a file."""
    import httpx

    with postonce.Client(
        "http://api.test",
        outbox=pg_outbox,
        transport=httpx.MockTransport(lambda r: httpx.Response(201)),
    ) as client:
        client.post_once("/c", json={}, intent="pg-cli")
    result = subprocess.run(
        [sys.executable, "-m", "postonce", "outbox", "--outbox", pg_outbox, "stats", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)  # stats --json prints one object
    assert row[State.SUCCEEDED.value] == 1
    show = subprocess.run(
        [sys.executable, "-m", "postonce", "outbox", "--outbox", pg_outbox, "show", "pg-cli"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert json.loads(show.stdout)["state"] == "succeeded"


def test_a_role_with_run_time_grants_only_uses_a_current_outbox(pg_outbox: str) -> None:
    """Once migrated by its owner, an outbox works for a role that cannot CREATE anything."""
    import httpx

    url, schema = split_schema(pg_outbox)
    PostgresStore(url, schema=schema).close()  # the owner migrates
    role = f"app_{uuid.uuid4().hex[:8]}"
    ident, name = sql.Identifier(role), sql.Identifier(schema)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(name, ident))
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
                name, ident
            )
        )
        conn.execute(sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(name, ident))
    try:
        app_url = f"postgresql://{role}@127.0.0.1:5432/test?schema={schema}"
        with postonce.Client(
            "http://api.test",
            outbox=app_url,
            transport=httpx.MockTransport(lambda r: httpx.Response(201)),
        ) as client:
            assert client.post_once("/c", json={}, intent="granted").status_code == 201
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            conn.execute(sql.SQL("DROP ROLE {}").format(ident))


def test_a_one_shot_drain_reports_a_lost_database(pg_outbox: str) -> None:
    """drain() without forever raises the OutboxError of a failed claim; it does not hide it."""
    app_name = f"postonce-once-{uuid.uuid4().hex[:8]}"
    base, schema = split_schema(f"{pg_outbox}&application_name={app_name}")
    store = PostgresStore(base, schema=schema, min_size=1, max_size=1, check_connections=False)
    client = postonce.Client("http://api.test", outbox=store)
    client.outbox  # noqa: B018  # opened (and unowned intents adopted) before the loss
    store.get("warm")  # the pool's one connection is open and idle
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app_name,),
        )
    with pytest.raises(postonce.OutboxError):
        client.drain()
    assert client.drain().claimed == 0  # reconnected
    client.close()
    store.close()


class _Explaining:
    """A connection that runs ``EXPLAIN (ANALYZE, FORMAT JSON)`` of the first statement it is
    given (the claim's candidates) before running it."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.plan = conn, None

    def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
        if self.plan is None:
            explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {query}"
            self.plan = self.conn.execute(explain, params).fetchone()[0][0]["Plan"]
        return self.conn.execute(query, params, **options)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_a_claim_reads_about_its_batch_through_its_indexes_whatever_the_backlog(
    pg_outbox: str,
) -> None:
    """30,000 rows: 10,000 due, 10,000 expired leases, 10,000 finished. The claim's
    candidates come from the partial indexes, each arm reading at most its few rows
    ahead of the batch: no sequential scan of the intents, no sort of the due set."""
    from postonce._outbox.store import Mine

    url, schema = split_schema(pg_outbox)
    store = PostgresStore(url, schema=schema)
    table = sql.Identifier(schema)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for state, offset in (("pending", 0), ("sending", 10_000), ("succeeded", 20_000)):
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.intents (reference, key, provider, method, url, headers,"
                        " body, fingerprint, state, created_at, updated_at, due_at,"
                        " lease_expires_at, lease_owner, attempts, sender, origin)"
                        " SELECT 'r' || n, 'k' || n, 'ietf_draft', 'POST', 'https://api.test/c',"
                        " '[]', '', 'f', %s, 1000 + n, 1000 + n, CASE WHEN %s = 'pending'"
                        " THEN 1000 + n END, CASE WHEN %s = 'sending' THEN 1000 + n END,"
                        " CASE WHEN %s = 'sending' THEN 'dead/1' END, 0, 's#plan',"
                        " 'https://api.test:443' FROM generate_series(%s::int, %s::int) AS n"
                    ).format(table),
                    (state, state, state, state, offset + 1, offset + 10_000),
                )
            conn.execute(sql.SQL("ANALYZE {}.intents").format(table))
        explaining = None
        with store._pool.connection() as conn:
            explaining = _Explaining(conn)
            rows = store._due_rows(
                explaining,  # type: ignore[arg-type]
                due_by=time.time(),
                now=time.time(),
                limit=32,
                mine=Mine("s#plan", ("https://api.test:443",)),
            )
            conn.rollback()
        assert len(rows) == 32
        ahead = 32 * 2 + 8
        plan = explaining.plan
        assert plan is not None
        scans = [node for node in _nodes(plan) if node.get("Relation Name") == "intents"]
        assert {node.get("Index Name") for node in scans} >= {"intents_due", "intents_lease"}
        for node in _nodes(plan):
            if node.get("Relation Name") == "intents":
                assert node["Node Type"] != "Seq Scan", node
                assert node["Actual Rows"] * node["Actual Loops"] <= ahead, node
            if node["Node Type"] == "Sort":
                assert node["Actual Rows"] <= 3 * ahead, node
    finally:
        store.close()
