"""Bad input gets a typed error naming the intent; nothing is sent and no row is left."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce._outbox.locate import open_store
from tests.conftest import ClientFactory


class Never:
    """A transport that records any request that should never have been sent."""

    def __init__(self) -> None:
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return httpx.Response(201)


def stored_references(spec: str | postonce.Store) -> list[str]:
    """The references in an outbox, or none if the call never created it."""
    if isinstance(spec, str) and not spec.startswith("postgresql://") and not Path(spec).exists():
        return []
    store = open_store(spec)
    try:
        return [r.reference for r in store.list_intents()]
    finally:
        store.close()


class Unserialisable:
    pass


@pytest.mark.parametrize(
    ("provider", "kwargs", "error"),
    [
        pytest.param("ietf_draft", {"key": '"quoted-key"'}, postonce.InvalidKey, id="quoted-key"),
        pytest.param("adyen", {"key": "k" * 300}, postonce.InvalidKey, id="300-chars-adyen"),
        pytest.param("ietf_draft", {"key": "schlüssel-1"}, postonce.InvalidKey, id="non-ascii"),
        pytest.param("ietf_draft", {"key": "two words"}, postonce.InvalidKey, id="space"),
        pytest.param("ietf_draft", {"key": "tab\there"}, postonce.InvalidKey, id="control"),
        pytest.param(
            "ietf_draft", {"provider": "stripee"}, postonce.UnknownProvider, id="unknown-provider"
        ),
        pytest.param(
            "ietf_draft", {"json": {"when": Unserialisable()}}, postonce.InvalidRequest, id="json"
        ),
        pytest.param(
            "ietf_draft", {"json": {"x": float("nan")}}, postonce.InvalidRequest, id="json-nan"
        ),
        pytest.param(
            "ietf_draft",
            {"content": iter([b"a"])},
            postonce.InvalidRequest,
            id="stream-body",
        ),
        pytest.param(
            "ietf_draft",
            {"deadline": datetime(2030, 1, 1)},
            postonce.ConfigurationError,
            id="naive-deadline",
        ),
        pytest.param(
            "ietf_draft",
            {"json": {"a": 1}, "content": b"x"},
            postonce.InvalidRequest,
            id="two-bodies",
        ),
        pytest.param(
            "stripe",
            {"data": {"amount": 1, "metadata": {"order_id": "N1"}}},
            postonce.InvalidRequest,
            id="form-nested-dict",
        ),
        pytest.param(
            "stripe",
            {"data": {"items": [{"price": "p_1"}]}},
            postonce.InvalidRequest,
            id="form-list-of-dicts",
        ),
    ],
)
def test_bad_call_is_refused_before_anything_is_stored(
    make_client: ClientFactory,
    outbox: str,
    provider: str,
    kwargs: dict[str, Any],
    error: type[postonce.PostonceError],
) -> None:
    """Each bad call raises its typed error naming the intent; nothing sent, no row."""
    never = Never()
    client = make_client(provider=provider, transport=httpx.MockTransport(never))
    if not {"json", "content", "data"} & kwargs.keys():
        kwargs["json"] = {"amount": 1}
    with pytest.raises(error) as exc:
        client.post_once("/charge", intent="order-9/charge", **kwargs)
    assert isinstance(exc.value, postonce.PostonceError)
    assert exc.value.intent == "order-9/charge"
    assert "order-9/charge" in str(exc.value)
    assert never.sent == []
    assert stored_references(outbox) == []


def test_unknown_provider_at_construction_is_a_configuration_error() -> None:
    """Client(provider=...) with an unknown name fails at once, listing the known ones."""
    with pytest.raises(postonce.UnknownProvider, match="stripe"):
        postonce.Client("http://api.test", provider="strip")


def test_profile_that_rejects_minted_keys_says_so(make_sync_client: ClientFactory) -> None:
    """A custom profile no UUIDv4 satisfies: a ConfigurationError that says pass key=."""
    strict = postonce.Provider(
        name="ledger", key_field="X-Key", key_pattern=r"req_[a-z0-9]+", retention=timedelta(days=1)
    )
    never = Never()
    client = make_sync_client(provider=strict, transport=httpx.MockTransport(never))
    with pytest.raises(postonce.ConfigurationError, match="pass key=") as exc:
        client.post_once("https://api.test/c", json={}, intent="order-7/charge")
    assert exc.value.intent == "order-7/charge"
    assert never.sent == []


def test_outbox_that_is_not_sqlite(make_sync_client: ClientFactory, tmp_path: Path) -> None:
    """A file that is not SQLite: OutboxError naming the intent; the file is left as it was."""
    bogus = tmp_path / "notes.txt"
    original = b"these are my notes, not a database\n" * 100
    bogus.write_bytes(original)
    never = Never()
    client = make_sync_client(outbox=bogus, transport=httpx.MockTransport(never))
    with pytest.raises(postonce.OutboxError) as exc:
        client.post_once("/charge", json={"a": 1}, intent="order-10/charge")
    assert exc.value.intent == "order-10/charge"
    assert "order-10/charge" in str(exc.value)
    assert never.sent == []
    assert bogus.read_bytes() == original


@pytest.fixture
def readonly_dir() -> Iterator[Path]:
    """A directory nobody but root may write to, reachable by an unprivileged user."""
    base = Path(tempfile.mkdtemp(prefix="postonce-ro-", dir="/tmp"))
    base.chmod(0o755)
    ro = base / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    yield ro
    ro.chmod(0o755)
    shutil.rmtree(base)


_READONLY_PROBE = textwrap.dedent(
    """
    import sys, httpx, postonce
    sent = []
    def handler(request):
        sent.append(request)
        return httpx.Response(201)
    client = postonce.Client("http://api.test", outbox=sys.argv[1],
                             transport=httpx.MockTransport(handler))
    try:
        client.post_once("/charge", json={"a": 1}, intent="order-11/charge")
    except postonce.OutboxError as exc:
        assert exc.intent == "order-11/charge", exc
        assert not sent
        print("OutboxError:", exc)
    else:
        print("no error")
    """
)


def test_outbox_in_a_read_only_directory(readonly_dir: Path) -> None:
    """An outbox path in a read-only directory: OutboxError naming the intent, nothing sent.

    Root ignores directory modes, so under root the probe runs without
    CAP_DAC_OVERRIDE (util-linux setpriv), like any unprivileged process.
    """
    target = readonly_dir / "outbox.sqlite3"
    command = [sys.executable, "-c", _READONLY_PROBE, str(target)]
    if os.geteuid() == 0:
        drop = "-dac_override,-dac_read_search"
        command = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *command]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd="/", check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OutboxError:"), result.stdout + result.stderr
    assert "order-11/charge" in result.stdout
    assert not target.exists()


def test_unknown_outbox_url_is_refused_clearly(make_sync_client: ClientFactory) -> None:
    """An outbox URL no backend serves is a ConfigurationError when the client is built."""
    with pytest.raises(postonce.ConfigurationError, match="unknown outbox URL 'mysql://"):
        make_sync_client(outbox="mysql://app@db/payments")


def test_unreachable_postgres_is_an_outbox_error(make_sync_client: ClientFactory) -> None:
    """A PostgreSQL outbox nobody answers for: OutboxError naming the intent, nothing sent."""
    never = Never()
    client = make_sync_client(
        outbox="postgresql://postgres@127.0.0.1:1/test?connect_timeout=1",
        transport=httpx.MockTransport(never),
    )
    with pytest.raises(postonce.OutboxError) as exc:
        client.post_once("/charge", json={"a": 1}, intent="order-13/charge")
    assert exc.value.intent == "order-13/charge"
    assert never.sent == []


def test_nested_form_value_names_the_bracket_spelling(make_sync_client: ClientFactory) -> None:
    """The refusal of a nested data= value shows the provider's bracket notation to use."""
    client = make_sync_client(provider="stripe", transport=httpx.MockTransport(Never()))
    with pytest.raises(postonce.InvalidRequest, match=re.escape("metadata[order_id]")):
        client.post_once("/v1/charges", data={"metadata": {"order_id": "N1"}}, intent="o-14")
