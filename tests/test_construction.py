"""What is checked when a client is built, not at its first charge: the outbox spec and hooks."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest

import postonce
from postonce._outbox.locate import open_store, split_schema
from postonce.testing import MemoryOutbox
from tests.conftest import PG_URL

CLIENTS = [postonce.Client, postonce.AsyncClient]


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json={"id": "ch_1"})


@pytest.mark.parametrize("kind", CLIENTS)
def test_unknown_outbox_scheme_fails_at_construction(kind: Any) -> None:
    """postgress:// is refused when the client is built, naming every accepted form."""
    with pytest.raises(postonce.ConfigurationError) as info:
        kind("http://api.test", outbox="postgress://u:secret@db/app")
    message = str(info.value)
    assert "postgress://" in message
    assert "a path" in message
    assert "sqlite:///" in message
    assert "postgresql://" in message
    assert "secret" not in message


def test_unknown_scheme_in_the_environment_fails_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """POSTONCE_OUTBOX is checked at construction like the argument."""
    monkeypatch.setenv("POSTONCE_OUTBOX", "mysql://db/app")
    with pytest.raises(postonce.ConfigurationError, match="unknown outbox URL"):
        postonce.Client("http://api.test")


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("form", ["{}", "sqlite:///{}"])
def test_outbox_in_a_missing_directory_is_refused(kind: Any, form: str, tmp_path: Path) -> None:
    """A typo'd directory is a ConfigurationError and no outbox is created anywhere."""
    path = tmp_path / "no-such-dir" / "outbox.sqlite3"
    with pytest.raises(postonce.ConfigurationError, match="does not exist"):
        kind("http://api.test", outbox=form.format(path))
    assert not path.parent.exists()


def test_outbox_in_a_missing_directory_is_refused_by_open_store(tmp_path: Path) -> None:
    """open_store (the CLI's door) refuses a missing directory too."""
    with pytest.raises(postonce.ConfigurationError, match="does not exist"):
        open_store(tmp_path / "typo" / "outbox.sqlite3")
    assert not (tmp_path / "typo").exists()


def test_use_outbox_checks_the_spec(tmp_path: Path) -> None:
    """Pointing a client at another outbox checks that spec at once."""
    client = postonce.Client("http://api.test", outbox=tmp_path / "outbox.sqlite3")
    with pytest.raises(postonce.ConfigurationError, match="unknown outbox URL"):
        client.use_outbox("postgress://db/app")
    client.close()


def test_default_outbox_location_is_still_created(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With no outbox given, the default directory is created on first use."""
    monkeypatch.delenv("POSTONCE_OUTBOX", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    default = postonce.default_outbox_path()
    assert str(default).startswith(str(tmp_path))
    with postonce.Client("http://api.test", transport=httpx.MockTransport(ok)) as client:
        client.post_once("/charges", json={"amount": 1}, intent="default-1")
    assert default.exists()


def test_postgres_database_that_does_not_exist_fails_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A missing database is one line naming it and the cause, with no pool retries logged."""
    url = PG_URL.rsplit("/", 1)[0] + "/postonce_no_such_db"
    with caplog.at_level(logging.DEBUG), pytest.raises(postonce.OutboxError) as info:
        open_store(url)
    message = str(info.value)
    assert "\n" not in message
    assert "'postonce_no_such_db'" in message
    assert 'database "postonce_no_such_db" does not exist' in message
    assert not [r for r in caplog.records if r.name.startswith("psycopg.pool")]


def test_postgres_role_that_is_refused_fails_in_one_line() -> None:
    """A role the server refuses is one line naming the database and the cause."""
    url = PG_URL.replace("postgres@", "postonce_no_such_role@", 1)
    with pytest.raises(postonce.OutboxError) as info:
        open_store(url)
    message = str(info.value)
    assert "\n" not in message
    assert "'test'" in message
    assert 'role "postonce_no_such_role" does not exist' in message


def test_postgres_url_parameters_keep_their_spaces() -> None:
    """application_name='web 1' reaches the server as 'web 1' (%20, never '+')."""
    url, schema = split_schema(f"{PG_URL}?application_name=web%201&schema=s1")
    assert schema == "s1"
    assert "+" not in url
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting('application_name')").fetchone()
    assert row == ("web 1",)


# -- hooks -------------------------------------------------------------------------------


async def _async_hook(detail: object) -> None:
    """An async hook for the refusal test."""


def test_client_refuses_a_coroutine_function_hook() -> None:
    """Client cannot await a hook, so an async def hook is refused when it is built."""
    with pytest.raises(postonce.ConfigurationError, match=r"on_attempt.*coroutine function"):
        postonce.Client(
            "http://api.test",
            outbox=MemoryOutbox(),
            hooks=postonce.Hooks(on_attempt=_async_hook),
        )


def test_client_refuses_an_object_with_an_async_call() -> None:
    """A callable object whose __call__ is async is refused like a coroutine function."""

    class Recorder:
        async def __call__(self, detail: object) -> None:
            """Never awaited by Client."""

    with pytest.raises(postonce.ConfigurationError, match="on_end"):
        postonce.Client(
            "http://api.test", outbox=MemoryOutbox(), hooks=[postonce.Hooks(on_end=Recorder())]
        )


def test_async_client_awaits_coroutine_hooks() -> None:
    """AsyncClient awaits async hooks, each before the call returns, in event order."""
    seen: list[str] = []

    async def on_attempt(detail: postonce.AttemptDetail) -> None:
        await anyio.sleep(0)
        seen.append(f"attempt {detail.attempt} {detail.status}")

    async def on_end(detail: postonce.EndDetail) -> None:
        await anyio.sleep(0)
        seen.append(f"end {detail.state}")

    def on_start(detail: postonce.StartDetail) -> None:
        seen.append("start")

    async def main() -> None:
        async with postonce.AsyncClient(
            "http://api.test",
            outbox=MemoryOutbox(),
            transport=httpx.MockTransport(ok),
            hooks=postonce.Hooks(on_attempt=on_attempt, on_end=on_end, on_start=on_start),
        ) as client:
            await client.post_once("/charges", json={"amount": 1}, intent="h-1")
            assert seen == ["start", "attempt 1 201", "end State.SUCCEEDED"]

    anyio.run(main)


def test_async_hook_that_raises_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A failing async hook is logged and changes nothing, like a failing plain hook."""

    async def on_attempt(detail: postonce.AttemptDetail) -> None:
        raise RuntimeError("hook bug")

    async def main() -> int:
        async with postonce.AsyncClient(
            "http://api.test",
            outbox=MemoryOutbox(),
            transport=httpx.MockTransport(ok),
            hooks=postonce.Hooks(on_attempt=on_attempt),
        ) as client:
            response = await client.post_once("/charges", json={"amount": 1}, intent="h-2")
            return response.status_code

    assert anyio.run(main) == 201
    assert any("hook on_attempt failed" in r.getMessage() for r in caplog.records)
