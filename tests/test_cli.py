"""The postonce command: drain, inspect, tend; bad input gives one line and a non-zero exit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import postonce
from postonce import SQLiteStore, State
from postonce._cli import main, parse_duration
from postonce.testing import MemoryOutbox
from tests.conftest import FAST, LoopbackServer, drain_env, loopback_intent
from tests.unread_transport import UnreadMock

ROOT = Path(__file__).resolve().parent.parent
ONE = FAST.model_copy(update={"attempts": 1})


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def seeded_outbox(path: Path) -> None:
    """An outbox with one succeeded, one pending (maybe delivered) and one never-sent intent."""
    answers = iter([httpx.Response(201, json={"id": "ok"}), httpx.Response(503)])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/never":
            raise httpx.ConnectError("refused", request=request)
        return next(answers)

    with postonce.Client(
        "http://api.test", outbox=path, retry=ONE, transport=UnreadMock(handler)
    ) as client:
        client.post_once("/ok", json={"a": 1}, intent="done")
        for path_, ref in (("/p", "maybe"), ("/never", "never")):
            with pytest.raises(postonce.IntentPending):
                client.post_once(path_, json={"a": 1}, intent=ref)


def test_every_command_has_help_with_an_example() -> None:
    """Each command answers --help, and its help shows an example."""
    commands = [(), ("drain",), ("outbox",)] + [
        ("outbox", name)
        for name in ("list", "show", "stats", "cancel", "resolve", "purge", "export")
    ]
    for words in commands:
        code, out = cli(*words, "--help")
        assert code == 0, words
        assert "Example:" in out, words


def test_version() -> None:
    """--version prints the package version."""
    code, out = cli("--version")
    assert code == 0
    assert postonce.__version__ in out


def test_list_and_filter_by_state(outbox_path: Path) -> None:
    """list prints JSON by default off a terminal, and filters by state."""
    seeded_outbox(outbox_path)
    code, out = cli("outbox", "--outbox", str(outbox_path), "list")
    assert code == 0
    assert {row["reference"] for row in json.loads(out)} == {"done", "maybe", "never"}
    code, out = cli("outbox", "--outbox", str(outbox_path), "list", "--state", "succeeded")
    assert [row["reference"] for row in json.loads(out)] == ["done"]


@pytest.mark.parametrize("flag", ["--nl", "--csv", "-t"])
def test_list_formats(outbox_path: Path, flag: str) -> None:
    """--nl, --csv and -t print the same intents in their own shapes."""
    seeded_outbox(outbox_path)
    code, out = cli("outbox", "--outbox", str(outbox_path), "list", flag)
    assert code == 0
    assert all(ref in out for ref in ("done", "maybe", "never"))
    if flag == "--nl":
        assert len([json.loads(line) for line in out.splitlines()]) == 3
    if flag == "--csv":
        assert out.splitlines()[0].startswith("reference,key,state")


def test_outbox_env_var_chooses_the_outbox(outbox_path: Path) -> None:
    """POSTONCE_OUTBOX names the outbox for the inspect commands."""
    seeded_outbox(outbox_path)
    code, out = cli("outbox", "stats", "--json", env={"POSTONCE_OUTBOX": str(outbox_path)})
    assert code == 0
    row = json.loads(out)
    assert isinstance(row, dict), "stats --json prints one object, not a list of one"
    assert (row["succeeded"], row["pending"]) == (1, 2)
    assert row["expired_needing_attention"] == 0


def test_show_prints_the_key_and_every_attempt(outbox_path: Path) -> None:
    """show gives the intent, its key and its attempts."""
    seeded_outbox(outbox_path)
    code, out = cli("outbox", "--outbox", str(outbox_path), "show", "maybe")
    assert code == 0
    detail = json.loads(out)
    assert detail["key"] == SQLiteStore(outbox_path).get("maybe").key  # type: ignore[union-attr]
    assert [a["status"] for a in detail["attempts"]] == [503]


def test_cancel_resolve_purge_export(outbox_path: Path) -> None:
    """cancel a never-sent intent, refuse to cancel a maybe-delivered one, purge, export."""
    seeded_outbox(outbox_path)
    base = ("outbox", "--outbox", str(outbox_path))
    code, out = cli(*base, "cancel", "never", "--note", "customer left")
    assert code == 0
    assert json.loads(out)["state"] == "cancelled"
    code, out = cli(*base, "cancel", "maybe")
    assert code == 1
    assert "may have been delivered" in out
    code, out = cli(*base, "resolve", "maybe", "--succeeded", "--note", "x")
    assert code == 1
    assert "only an expired" in out
    code, out = cli(*base, "purge", "--older-than", "0s")
    assert code == 0
    assert json.loads(out)["purged"] == 2
    code, out = cli(*base, "export", "--jsonl")
    assert code == 0
    rows = {json.loads(line)["reference"]: json.loads(line) for line in out.splitlines()}
    assert set(rows) == {"done", "maybe", "never"}
    assert rows["done"]["purged_at"] is not None
    assert rows["maybe"]["attempts"][0]["status"] == 503
    assert_iso_utc(rows["maybe"]["created_at"])
    assert_iso_utc(rows["maybe"]["attempts"][0]["started_at"])
    assert_iso_utc(rows["done"]["purged_at"])


def assert_iso_utc(value: object) -> None:
    """The one way every command prints a time: ISO 8601 in UTC."""
    assert isinstance(value, str), value
    assert datetime.fromisoformat(value).utcoffset() == timedelta(0)


def test_every_command_prints_times_alike(outbox_path: Path) -> None:
    """list, show, stats and export print the same intent's times as the same ISO 8601 UTC text."""
    seeded_outbox(outbox_path)
    base = ("outbox", "--outbox", str(outbox_path))
    listed = {r["reference"]: r for r in json.loads(cli(*base, "list", "--json")[1])}
    shown = json.loads(cli(*base, "show", "maybe", "--json")[1])
    exported = {
        json.loads(line)["reference"]: json.loads(line)
        for line in cli(*base, "export")[1].splitlines()
    }
    stats = json.loads(cli(*base, "stats", "--json")[1])
    assert listed["maybe"]["created_at"] == shown["created_at"] == exported["maybe"]["created_at"]
    assert shown["attempts"][0]["started_at"] == exported["maybe"]["attempts"][0]["started_at"]
    for value in (shown["created_at"], stats["oldest_pending_created_at"]):
        assert_iso_utc(value)


def test_show_takes_t_for_tables(outbox_path: Path) -> None:
    """show -t prints the intent as a two-column table and its attempts as a table."""
    seeded_outbox(outbox_path)
    code, out = cli("outbox", "--outbox", str(outbox_path), "show", "maybe", "-t")
    assert code == 0
    key = SQLiteStore(outbox_path).get("maybe").key  # type: ignore[union-attr]
    assert any(line.split() == ["key", key] for line in out.splitlines())
    assert "started_at" in out
    assert "503" in out


def test_purge_help_says_expired_intents_are_kept() -> None:
    """purge --help tells the operator expired intents are not purged."""
    code, out = cli("outbox", "purge", "--help")
    assert code == 0
    assert "Expired intents are kept" in " ".join(out.split())


def test_progress_line_ends_on_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a TTY the drain's last progress line shows the report's counts."""
    from postonce import _cli

    lines: list[postonce.DrainReport] = []
    final = postonce.DrainReport(claimed=3, sent=3, succeeded=2, pending=1, duration=0.1)

    class FakeClient(postonce.Client):
        def drain(self, **kwargs: Any) -> postonce.DrainReport:
            progress = kwargs["progress"]
            assert callable(progress)
            progress(final.model_copy(update={"pending": 0, "succeeded": 1}))
            return final

    fake = FakeClient("http://api.test", outbox=MemoryOutbox())
    monkeypatch.setattr(_cli, "_load_client", lambda spec: fake)
    monkeypatch.setattr(_cli, "_progress_line", lines.append)
    monkeypatch.setattr(_cli, "_interactive", lambda: True)
    code, _ = cli("drain", "--app", "x:y")
    assert code == 0
    assert lines[-1] == final


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("drain", "--app", "no_such_module_x:client"), "cannot import", id="module"),
        pytest.param(
            ("drain", "--app", "tests.drain_app:not_a_client"),
            "not a postonce.Client",
            id="not-client",
        ),
        pytest.param(
            ("drain", "--app", "tests.cli_app_unset_env:client"),
            "importing 'tests.cli_app_unset_env' raised KeyError: 'POSTONCE_TEST_NEVER_SET' "
            "(an environment variable that is not set?)",
            id="import-raises",
        ),
        pytest.param(
            ("drain", "--app", "tests.cli_apps:broken_factory"),
            "tests.cli_apps:broken_factory() raised RuntimeError: STRIPE_API_KEY is empty",
            id="factory-raises",
        ),
        pytest.param(
            ("drain", "--app", "tests.cli_apps:not_a_factory"),
            "not_a_factory() returned a int, not a postonce.Client",
            id="factory-returns-other",
        ),
        pytest.param(
            ("drain", "--app", "tests.cli_apps:app"),
            "tests.cli_apps:app is a FastAPI application, not a postonce.Client",
            id="fastapi-app",
        ),
        pytest.param(
            ("drain", "--app", "tests.cli_apps:broken_async_factory"),
            "broken_async_factory() raised RuntimeError: ADYEN_API_KEY is empty",
            id="async-factory-raises",
        ),
        pytest.param(("drain", "--app", "tests.drain_app"), "MODULE:ATTRIBUTE", id="no-colon"),
        pytest.param(("drain", "--app", "tests.drain_app:nothing"), "no attribute", id="attr"),
        pytest.param(("outbox", "--outbox", "{missing}", "stats"), "no outbox at", id="missing"),
        pytest.param(
            ("outbox", "--outbox", "{outbox}", "show", "nope"),
            "no intent 'nope'",
            id="unknown-show",
        ),
        pytest.param(
            ("outbox", "--outbox", "{outbox}", "cancel", "nope"),
            "no intent 'nope'",
            id="unknown-cancel",
        ),
        pytest.param(
            ("outbox", "--outbox", "{outbox}", "resolve", "nope", "--failed", "--note", "x"),
            "no intent 'nope'",
            id="unknown-resolve",
        ),
        pytest.param(
            ("outbox", "--outbox", "{outbox}", "purge", "--older-than", "soon"),
            "not a duration",
            id="older-than",
        ),
        pytest.param(
            (
                "outbox",
                "--outbox",
                "{outbox}",
                "resolve",
                "maybe",
                "--succeeded",
                "--failed",
                "--note",
                "x",
            ),
            "either --succeeded or --failed",
            id="resolve-both",
        ),
        pytest.param(
            ("drain", "--app", "tests.drain_app:client", "--outbox", "{missing}"),
            "no outbox at",
            id="drain-missing-outbox",
        ),
        pytest.param(
            ("drain", "--app", "tests.drain_app:client", "--forever", "--interval", "0s"),
            "interval > 0",
            id="interval-zero",
        ),
        pytest.param(
            ("outbox", "--outbox", "{outbox}", "cancel", "maybe"),
            "may have been delivered",
            id="cancel-delivered",
        ),
    ],
)
def test_bad_input_is_one_line_and_non_zero(
    outbox_path: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """Each bad input prints a one-line error with no traceback and exits non-zero."""
    seeded_outbox(outbox_path)
    missing = tmp_path / "absent" / "outbox.sqlite3"
    argv = [a.format(outbox=outbox_path, missing=missing) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "postonce", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert message in error
    assert not missing.exists()
    assert not missing.parent.exists()


def test_parse_duration_table() -> None:
    """Durations read as people write them."""
    assert parse_duration("500ms").total_seconds() == 0.5
    assert parse_duration("5s").total_seconds() == 5
    assert parse_duration("10m").total_seconds() == 600
    assert parse_duration("30d").days == 30
    assert parse_duration("2w").days == 14
    assert parse_duration("7").total_seconds() == 7
    for bad in ("", "d", "5x", "-5s", "1e3s"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


# -- the drain as a process ------------------------------------------------------------


def due_intents(
    server: LoopbackServer, outbox: Path, count: int, prefix: str, body: Callable[[int], bytes]
) -> list[str]:
    """Write ``count`` intents straight into the outbox, due at once (as after a crash)."""
    store = SQLiteStore(outbox, durability="normal")
    keys = []
    for i in range(count):
        key = f"{prefix}-{i:05d}-{'k' * 8}"
        store.open_intent(
            loopback_intent(
                server, f"{prefix}-{i}", key=key, body=body(i), fingerprint=f"{i:064d}"
            ),
            owner="crashed-host/1",
            now=time.time() - 60,
            lease_for=1,
        )
        keys.append(key)
    store.close()
    return keys


@pytest.mark.parametrize(
    "app",
    [
        "tests.drain_app:make_client",
        "tests.drain_app:async_client",
        "tests.drain_app:make_async_client",
    ],
)
def test_drain_command_finishes_due_intents(
    server: LoopbackServer, outbox_path: Path, app: str
) -> None:
    """postonce drain --app (a Client, an AsyncClient, or a factory) sends due intents, exits 0."""
    prefix = f"cmd-{app.rpartition(':')[2]}"  # this run's keys: the server outlives the test
    keys = due_intents(server, outbox_path, 5, prefix, lambda i: b'{"amount":1}')
    result = subprocess.run(
        [sys.executable, "-m", "postonce", "drain", "--app", app],
        cwd=ROOT,
        env=drain_env(server, outbox_path, "cmd"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["claimed"], report["succeeded"]) == (5, 5)
    for key in keys:
        assert len(server.effects_for(key)) == 1


def test_drain_exits_1_when_something_failed(server: LoopbackServer, outbox_path: Path) -> None:
    """A final 402 in the drain makes the exit code 1."""
    due_intents(server, outbox_path, 1, "fail", lambda i: b'{"amount":1,"_test":{"status":402}}')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "postonce",
            "drain",
            "--app",
            "tests.drain_app:client",
            "--outbox",
            str(outbox_path),
        ],
        cwd=ROOT,
        # The app's own outbox is one --outbox replaces: an unused file beside the real one.
        env=drain_env(server, outbox_path.with_name("unused.sqlite3"), "fail"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["failed"] == 1


@pytest.mark.parametrize("app", ["tests.drain_app:client", "tests.drain_app:async_client"])
def test_sigterm_stops_drain_forever_cleanly(
    server: LoopbackServer, outbox_path: Path, app: str
) -> None:
    """SIGTERM mid-send: the attempt finishes and is recorded, no lease is held, exit 0."""
    worker = f"term-{app.rpartition(':')[2]}"  # this run's keys and requests, not an earlier one's
    due_intents(server, outbox_path, 3, worker, lambda i: b'{"amount":1,"_test":{"delay":1.0}}')
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "postonce",
            "drain",
            "--app",
            app,
            "--forever",
            "--interval",
            "100ms",
        ],
        cwd=ROOT,
        env=drain_env(server, outbox_path, worker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not any(r["worker"] == worker for r in server.ledger()["requests"]):
        assert time.monotonic() < deadline, "the drain never sent"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["succeeded"] == 1
    assert report["pending"] == 2
    store = SQLiteStore(outbox_path)
    records = store.list_intents()
    store.close()
    assert sorted(r.state.value for r in records) == ["pending", "pending", "succeeded"]
    assert all(r.lease_owner is None for r in records)
    assert len(server.ledger()["effects"]) >= 1


def test_four_drain_processes_share_one_outbox(server: LoopbackServer, tmp_path: Path) -> None:
    """4 drain processes, 1,000 due intents: all succeed, each key sent once, never at once."""
    outbox = tmp_path / "shared.sqlite3"
    keys = due_intents(server, outbox, 1000, "many", lambda i: b'{"amount":%d}' % i)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "postonce",
                "drain",
                "--app",
                "tests.drain_app:client",
                "--concurrency",
                "4",
            ],
            cwd=ROOT,
            env=drain_env(server, outbox, f"w{n}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    assert sum(r["succeeded"] for r in reports) == 1000
    assert sum(1 for r in reports if r["claimed"] > 0) >= 2  # the work really was shared
    ledger = server.ledger()
    mine = set(keys)
    requests = [r for r in ledger["requests"] if r["key"] in mine]
    assert len(requests) == 1000
    assert {r["key"] for r in requests} == mine
    assert all(ledger["max_concurrent"][k] == 1 for k in keys)
    assert len([e for e in ledger["effects"] if e["key"] in mine]) == 1000
    store = SQLiteStore(outbox)
    assert store.stats(now=time.time())["states"][State.SUCCEEDED.value] == 1000
    store.close()


@pytest.mark.parametrize("app", ["tests.drain_app:client", "tests.drain_app:async_client"])
def test_drain_command_leaves_another_senders_intents(
    server: LoopbackServer, outbox_path: Path, app: str
) -> None:
    """The CLI drain sends only its client's sender's intents, and exits 3 naming whose the
    rest are, this client's identity and the way out; --accept-foreign makes that exit 0."""
    store = SQLiteStore(outbox_path, durability="normal")
    store.open_intent(
        loopback_intent(server, "theirs", sender="another-service"),
        owner="crashed-host/1",
        now=time.time() - 60,
        lease_for=1,
    )
    store.close()

    def drain(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "postonce", "drain", "--app", app, *extra],
            cwd=ROOT,
            env=drain_env(server, outbox_path, "mine"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    result = drain()
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)
    assert (report["claimed"], report["not_ours"]) == (0, 1)
    origin = server.base_url  # http://127.0.0.1:PORT: already an origin
    (left,) = report["foreign_senders"]
    assert left.pop("waiting_since") <= time.time() - 58  # its lease ran out a minute ago
    assert left == {"sender": "another-service", "origin": origin, "due": 1, "orphaned": False}
    assert report["outbox"] == str(outbox_path.resolve())
    assert report["origins"] == [origin]
    (verdict,) = [line for line in result.stderr.splitlines() if "exit 3" in line]
    assert f"This client is sender {report['sender']!r} (provider 'ietf_draft', no name=" in verdict
    assert "1 of sender 'another-service' (name='another-service') to " + origin in result.stderr
    assert "client.adopt(" in result.stderr
    assert "--accept-foreign" in result.stderr
    assert result.stderr.count("were not sent") == 1  # the log's record is not said twice
    assert server.requests_for("theirs-key-0001") == []
    accepted = drain("--accept-foreign")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["not_ours"] == 1


# -- what the drain's exit status and output tell ------------------------------------------


def test_exit_status_says_the_first_that_applies_and_the_help_lists_each() -> None:
    """1 (an intent's outcome) before 4 (handlers failing) before 5 (its own intents it cannot
    send) before 3 (others' intents); 0 else."""
    from postonce._cli import exit_status

    report = postonce.DrainReport
    assert exit_status(report()) == 0
    assert exit_status(report(expired=1, settle_failed=1, not_ours=1)) == 1
    assert exit_status(report(indeterminate=1)) == 1
    assert exit_status(report(settle_failing=1, not_ours=1)) == 4
    assert exit_status(report(reconcile_failed=1)) == 4
    assert exit_status(report(unsendable=1, settle_failing=1)) == 4
    assert exit_status(report(unsendable=1, not_ours=1), accept_foreign=True) == 5
    assert exit_status(report(not_ours=2)) == 3
    assert exit_status(report(not_ours=2), accept_foreign=True) == 0
    code, out = cli("drain", "--help")
    assert code == 0
    for line in (
        "0  all well",
        "1  an intent failed",
        "4  a settlement handler",
        "5  due intents of this client's sender",
        "3  due intents",
    ):
        assert line in out
    assert "--accept-foreign" in out


def drain_with(
    monkeypatch: pytest.MonkeyPatch, client: postonce.Client, *args: str
) -> tuple[int, dict[str, Any], str]:
    """Run ``postonce drain`` in this process on ``client``: exit code, report, stderr."""
    from postonce import _cli

    monkeypatch.setattr(_cli, "_load_client", lambda spec: client)
    result = CliRunner().invoke(main, ["drain", "--app", "x:y", *args], catch_exceptions=False)
    assert result.stdout, result.stderr
    return result.exit_code, json.loads(result.stdout), result.stderr


def test_drain_exits_4_while_a_settlement_handler_keeps_failing(
    monkeypatch: pytest.MonkeyPatch, outbox_path: Path
) -> None:
    """A settlement owed after its handler raised makes the drain exit 4, and say why."""

    def handler(settlement: postonce.Settlement) -> None:
        raise RuntimeError("the orders database is down")

    client = postonce.Client(
        "http://api.test",
        outbox=outbox_path,
        on_settled=handler,
        transport=httpx.MockTransport(lambda request: httpx.Response(201)),
    )
    client.post_once("/c", json={}, intent="paid")  # the handler raises; retried with backoff
    code, report, err = drain_with(monkeypatch, client)
    assert code == 4, err
    assert (report["settle_failing"], report["failed"]) == (1, 0)
    assert "exit 4: settlement handlers or reconcilers are failing" in err


def test_drain_refuses_interval_without_forever() -> None:
    """--interval means nothing to a one-shot drain: refused as a usage error (exit 2)."""
    result = CliRunner().invoke(main, ["drain", "--app", "x:y", "--interval", "1s"])
    assert result.exit_code == 2
    assert "--interval applies to --forever only" in result.output


@pytest.mark.parametrize(
    "words",
    [
        ("list",),
        ("show", "maybe"),
        ("stats",),
        ("cancel", "never"),
        ("resolve", "nope", "--failed", "--note", "x"),
        ("purge", "--older-than", "0s"),
        ("export",),
    ],
    ids=lambda words: words[0],
)
def test_every_outbox_command_takes_outbox_after_its_name(
    outbox_path: Path, tmp_path: Path, words: tuple[str, ...]
) -> None:
    """``outbox CMD --outbox X`` is ``outbox --outbox X CMD``, as ``drain --outbox X`` is;
    given both ways with two outboxes, it is refused."""
    twin = tmp_path / "twin.sqlite3"  # a second cancel or purge would have less to do
    for path in (outbox_path, twin):
        seeded_outbox(path)
    after = cli("outbox", *words, "--outbox", str(outbox_path), env={"POSTONCE_OUTBOX": ""})
    before = cli("outbox", "--outbox", str(twin), *words, env={"POSTONCE_OUTBOX": ""})
    assert after[0] == before[0]
    assert after[1].replace(str(outbox_path), str(twin)).count("\n") == before[1].count("\n")
    assert "no outbox at" not in after[1]
    if words[0] not in ("cancel", "resolve", "purge"):
        assert after == cli("outbox", "--outbox", str(outbox_path), *words)
    other = tmp_path / "other.sqlite3"
    code, out = cli("outbox", "--outbox", str(other), *words, "--outbox", str(outbox_path))
    assert code == 2
    assert "--outbox is given twice" in out


def test_a_relative_outbox_is_shown_resolved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A relative --outbox is named by its absolute path: in errors, purge's and drain's output."""
    monkeypatch.chdir(tmp_path)
    code, out = cli("outbox", "stats", "--outbox", "absent/outbox.sqlite3")
    assert code == 1
    assert f"no outbox at {tmp_path / 'absent' / 'outbox.sqlite3'}" in out
    seeded_outbox(tmp_path / "outbox.sqlite3")
    time.sleep(0.06)  # FAST's waits are at most 50 ms: the seeded pending intents are due
    code, out = cli("outbox", "purge", "--older-than", "0s", "--outbox", "outbox.sqlite3")
    assert code == 0
    assert json.loads(out)["outbox"] == str(tmp_path / "outbox.sqlite3")
    client = postonce.Client(
        "http://api.test",
        outbox=tmp_path / "its-own.sqlite3",  # replaced by --outbox
        transport=httpx.MockTransport(lambda request: httpx.Response(201)),
    )
    code, report, err = drain_with(monkeypatch, client, "--outbox", "./outbox.sqlite3")
    assert code == 0, err
    assert report["outbox"] == str(tmp_path / "outbox.sqlite3")
    assert report["succeeded"] >= 1  # the seeded pending intents, sent from that outbox


def test_purge_keeps_and_counts_intents_whose_settlement_is_owed(
    outbox_path: Path,
) -> None:
    """purge keeps a finished intent its handler has not yet heard of, and says how many."""

    def handler(settlement: postonce.Settlement) -> None:
        raise RuntimeError("the orders database is down")

    with postonce.Client(
        "http://api.test",
        outbox=outbox_path,
        on_settled=handler,
        transport=httpx.MockTransport(lambda request: httpx.Response(201)),
    ) as client:
        client.post_once("/c", json={}, intent="owed")
    code, out = cli("outbox", "purge", "--older-than", "0s", "--outbox", str(outbox_path))
    assert code == 0
    assert json.loads(out) | {"outbox": None} == {
        "purged": 0,
        "tombstones": False,
        "kept_for_settlement": 1,
        "outbox": None,
    }
    code, out = cli("outbox", "purge", "--help")
    assert "settlement is still owed" in " ".join(out.split())
