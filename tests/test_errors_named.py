"""Errors name what the user wrote: the method and option, the field, the part that differs."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import postonce
from tests.conftest import FAST, AsyncDriven, ClientFactory, OutboxUnderTest, stored_intent
from tests.test_bad_input import Never, stored_references

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

ONCE = ["request_once", "post_once", "put_once", "patch_once", "delete_once"]


def call(client: Any, method: str, **options: Any) -> httpx.Response:
    """Call ``method`` of a client (request_once with POST) on /charge."""
    if method == "request_once":
        return client.request_once("POST", "/charge", **options)  # type: ignore[no-any-return]
    return getattr(client, method)("/charge", **options)  # type: ignore[no-any-return]


def kind_of(client: Any) -> str:
    """The public class a test's client is: Client, or AsyncClient behind its driver."""
    return type(getattr(client, "client", client)).__name__


# -- 1. a misspelt per-call option -------------------------------------------------


@pytest.mark.parametrize("backend", ["memory"])
@pytest.mark.parametrize("method", ONCE)
@pytest.mark.parametrize(
    ("wrote", "meant"),
    [
        pytest.param("intnet", "intent=", id="typo"),
        pytest.param("metadata", "meta=", id="stripe-word"),
        pytest.param("idempotency_key", "key=", id="idempotency-key"),
        pytest.param("Json", "json=", id="case"),
    ],
)
def test_a_misspelt_option_names_the_method_and_the_option_meant(
    make_client: ClientFactory, outbox: OutboxUnderTest, method: str, wrote: str, meant: str
) -> None:
    """A misspelt option: TypeError naming Client.post_once() (or AsyncClient's) and the fix."""
    never = Never()
    client = make_client(transport=httpx.MockTransport(never))
    with pytest.raises(TypeError) as exc:
        call(client, method, intent="order-1/charge", json={"a": 1}, **{wrote: "x"})
    said = str(exc.value)
    assert said.startswith(
        f"{kind_of(client)}.{method}() got an unexpected keyword argument {wrote!r} "
        f"(did you mean {meant}?)"
    ), said
    assert "_plan" not in said
    assert never.sent == []
    assert stored_references(outbox) == []


@pytest.mark.parametrize("backend", ["memory"])
def test_an_option_nothing_resembles_lists_the_options(make_client: ClientFactory) -> None:
    """An unknown option with no close match: no guess, and the valid options listed."""
    client = make_client(transport=httpx.MockTransport(Never()))
    with pytest.raises(TypeError) as exc:
        # mypy refuses it too; the test is what a caller without mypy sees.
        client.post_once("/charge", intent="o-1", json={}, zzzzz=1)  # type: ignore[call-arg]
    said = str(exc.value)
    assert "'zzzzz'" in said
    assert "did you mean" not in said
    assert "its options are intent, key, json" in said


def test_both_clients_share_one_check() -> None:
    """Client and AsyncClient name a bad option through the same function, not two copies."""
    import inspect

    from postonce import _async_client, _base, _client

    for module in (_client, _async_client):
        source = inspect.getsource(module)
        assert "refuse_unknown" not in source  # both go through BaseClient._begin_once
        assert "get_close_matches" not in source
    assert inspect.getsource(_base).count("refuse_unknown(self, called, options)") == 1
    said = []
    for client in (postonce.Client("http://api.test"), postonce.AsyncClient("http://api.test")):
        with pytest.raises(TypeError) as raised:
            client._begin_once("POST", "/c", {"intnet": "x"}, "post_once")  # type: ignore[typeddict-unknown-key]
        said.append(str(raised.value).split(".", 1)[1])  # past "Client" / "AsyncClient"
    assert said[0] == said[1]


# -- 2 and 3. an IntentConflict says what differs, and how to go on ---------------------


def test_a_conflict_names_the_fields_that_differ_never_their_values(
    make_client: ClientFactory,
) -> None:
    """The same intent with another body: the JSON field paths that differ, no values."""
    client = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(201)))
    client.post_once(
        "/charge",
        intent="order-2/charge",
        json={"amount": 100, "card": "tok_SECRET_A", "items": [{"qty": 1}]},
    )
    with pytest.raises(postonce.IntentConflict) as exc:
        client.post_once(
            "/charge",
            intent="order-2/charge",
            json={"amount": 100, "card": "tok_SECRET_B", "items": [{"qty": 2}], "note": "n"},
        )
    said = str(exc.value)
    assert "JSON fields: card, items[0].qty changed; note added" in said
    assert "SECRET" not in said
    assert 'qty": 2' not in said


def test_a_corrected_request_after_a_failure_says_how_to_go_on(
    make_client: ClientFactory,
) -> None:
    """A 404 from a wrong path, then the right path: the message says to use a new intent name."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404 if request.url.path == "/charges" else 201)

    client = make_client(transport=httpx.MockTransport(handler))
    assert client.post_once("/charges", intent="order-3/charge", json={"a": 1}).status_code == 404
    with pytest.raises(postonce.IntentConflict) as exc:
        client.post_once("/v1/charges", intent="order-3/charge", json={"a": 1})
    said = str(exc.value)
    assert "this call differs in the path." in said
    assert "It ended failed (HTTP 404), so it is done" in said
    assert "new intent= name" in said
    assert "purge" not in said  # tombstones keep every finished name from running again


def test_another_applications_intent_gives_the_one_step_fix(make_client: ClientFactory) -> None:
    """Two applications on one outbox: an outbox each (outbox=, POSTONCE_OUTBOX), or adopt()."""
    first = make_client(
        name="billing", transport=httpx.MockTransport(lambda r: httpx.Response(201))
    )
    first.post_once("/charge", intent="order-4/charge", json={"a": 1})
    second = make_client(name="shop", transport=httpx.MockTransport(Never()))
    with pytest.raises(postonce.IntentConflict) as exc:
        second.post_once("/charge", intent="order-4/charge", json={"a": 1})
    said = str(exc.value)
    assert "belongs to sender 'billing', not to this client ('shop')" in said
    assert "an outbox of its own: outbox= or the POSTONCE_OUTBOX variable" in said
    assert "client.adopt('billing')" in said


# -- 4. RetryPolicy in postonce's words --------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        pytest.param({"attempts": 0}, "RetryPolicy: attempts=0 must be at least 1", id="ge"),
        pytest.param({"timeout": 0}, "RetryPolicy: timeout=0 must be greater than 0", id="gt"),
        pytest.param(
            {"horizon_margin": 1.0}, "RetryPolicy: horizon_margin=1.0 must be less than 1", id="lt"
        ),
        pytest.param(
            {"attempts": 2.5}, "RetryPolicy: attempts=2.5 must be a whole number", id="int"
        ),
        pytest.param(
            {"wait_max": "soon"}, "RetryPolicy: wait_max='soon' must be a number", id="num"
        ),
        pytest.param(
            {"timeout": float("nan")},
            "RetryPolicy: timeout=nan must be a number, not NaN",
            id="nan",
        ),
        pytest.param(
            {"wait_initial": 10.0},
            "RetryPolicy: wait_initial=10.0 is greater than wait_max=8.0",
            id="ordered",
        ),
        pytest.param(
            {"retries": 3},
            "RetryPolicy: it has no field 'retries' (did you mean attempts?); its fields are "
            "attempts, timeout",
            id="alias",
        ),
        pytest.param(
            {"atempts": 3}, "it has no field 'atempts' (did you mean attempts?)", id="typo"
        ),
        pytest.param(
            {"attempts": 0, "wait_max": -1},
            "RetryPolicy: attempts=0 must be at least 1; wait_max=-1 must be at least 0",
            id="two",
        ),
    ],
)
def test_retry_policy_errors_are_worded_by_postonce(fields: dict[str, Any], said: str) -> None:
    """RetryPolicy(...) raises a ConfigurationError naming field and rule, no pydantic dump."""
    with pytest.raises(postonce.ConfigurationError) as exc:
        postonce.RetryPolicy(**fields)
    assert said in str(exc.value)
    assert "pydantic" not in str(exc.value)
    assert "validation error" not in str(exc.value)
    assert exc.value.__cause__ is None
    assert exc.value.__suppress_context__


# -- 5. text no outbox can store -----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        pytest.param({"intent": "order-5\x00/charge"}, False, id="intent-nul"),
        pytest.param({"intent": "order-5\ud800/charge"}, False, id="intent-surrogate"),
        pytest.param({"intent": "order-5/charge", "key": "key\x00-0001"}, True, id="key-nul"),
        pytest.param(
            {"intent": "order-5/charge", "key": "key\ud800-0001"}, True, id="key-surrogate"
        ),
        pytest.param(
            {"intent": "order-5/charge", "meta": {"note": "a\ud800b"}}, True, id="meta-surrogate"
        ),
        pytest.param(
            {"intent": "order-5/charge", "meta": {"a\udc80": 1}}, True, id="meta-surrogate-name"
        ),
    ],
)
def test_text_no_outbox_can_store_is_refused_alike_on_every_backend(
    make_client: ClientFactory, outbox: OutboxUnderTest, options: dict[str, Any], named: bool
) -> None:
    """A NUL or a lone surrogate: InvalidRequest before anything is stored, on every backend."""
    never = Never()
    client = make_client(transport=httpx.MockTransport(never))
    with pytest.raises(postonce.InvalidRequest) as exc:
        client.post_once("/charge", json={"a": 1}, **options)
    if named:
        assert exc.value.intent == "order-5/charge"
    else:
        assert exc.value.intent is None  # its own text is what cannot be kept or shown
        assert "at index 7" in str(exc.value)
    str(exc.value).encode()  # the message itself is storable, printable text
    assert never.sent == []
    assert stored_references(outbox) == []


def test_a_nul_in_meta_is_kept_alike_on_every_backend(
    make_client: ClientFactory, outbox: OutboxUnderTest
) -> None:
    """meta= is JSON, which spells a NUL as \\u0000: every backend keeps it and gives it back."""
    client = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(201)))
    client.post_once("/charge", intent="order-6/charge", json={"a": 1}, meta={"n\x00": "a\x00b"})
    record, _ = stored_intent(outbox, "order-6/charge")
    assert record.meta == {"n\x00": "a\x00b"}


# -- 6. wait() and the operator calls on an unknown intent ------------------------------------


def test_wait_on_an_unknown_intent_is_unknown_intent(make_client: ClientFactory) -> None:
    """wait() of a name never stored raises UnknownIntent, a PostonceError and a KeyError."""
    client = make_client(transport=httpx.MockTransport(Never()))
    with pytest.raises(postonce.UnknownIntent) as exc:
        client.wait("order-7/charge", timeout=0.1)
    assert isinstance(exc.value, postonce.PostonceError)
    assert isinstance(exc.value, KeyError)
    assert exc.value.intent == "order-7/charge"
    assert str(exc.value).startswith("no intent of this name is stored")  # not KeyError's quotes


def test_wait_on_another_senders_intent_names_that_sender(make_client: ClientFactory) -> None:
    """Another sender's intent is not this client's to wait for: UnknownIntent naming it."""
    first = make_client(
        name="billing", transport=httpx.MockTransport(lambda r: httpx.Response(201))
    )
    first.post_once("/charge", intent="order-8/charge", json={"a": 1})
    second = make_client(name="shop", transport=httpx.MockTransport(Never()))
    with pytest.raises(postonce.UnknownIntent, match="belongs to sender 'billing'"):
        second.wait("order-8/charge", timeout=0.1)


@pytest.mark.parametrize("operation", ["cancel", "resolve"])
def test_cancel_or_resolve_of_an_unknown_intent_is_unknown_intent(
    make_client: ClientFactory, operation: str
) -> None:
    """cancel() and resolve() of a name never stored raise UnknownIntent, not a bare KeyError."""
    client = make_client(transport=httpx.MockTransport(Never()))
    args = (postonce.State.FAILED,) if operation == "resolve" else ()
    with pytest.raises(postonce.UnknownIntent) as exc:
        getattr(client, operation)("order-9/charge", *args)
    assert exc.value.intent == "order-9/charge"


def in_thread(work: Callable[[], object], seconds: float = 10.0) -> BaseException | None:
    """What ``work`` raised in a thread of its own; fails the test if it is still running."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            raised.append(exc)
        else:
            raised.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert raised, f"still running after {seconds} s"
    return raised[0]


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    "timeout",
    [pytest.param(float("nan"), id="nan"), pytest.param(float("inf"), id="inf"), -1.0],
)
def test_wait_refuses_a_timeout_that_is_not_finite_seconds(
    outbox_path: Path, kind: str, timeout: float
) -> None:
    """wait(timeout=nan | inf | -1) on a pending intent: InvalidRequest at once (nan spun forever).

    The client is closed only when the wait came back: close() waits for a call
    under way, and a wait that spins would hold the test forever.
    """
    options: dict[str, Any] = {
        "outbox": outbox_path,
        "retry": FAST.model_copy(update={"attempts": 1}),
        "transport": httpx.MockTransport(lambda r: httpx.Response(503)),
    }
    client: Any = (
        postonce.Client("http://api.test", **options)
        if kind == "sync"
        else AsyncDriven(postonce.AsyncClient("http://api.test", **options))
    )
    with pytest.raises(postonce.IntentPending):
        client.post_once("/charge", intent="order-10/charge", json={"a": 1})
    raised = in_thread(lambda: client.wait("order-10/charge", timeout=timeout))
    client.close()
    assert isinstance(raised, postonce.InvalidRequest), raised
    assert raised.intent == "order-10/charge"


@pytest.mark.parametrize("backend", ["memory"])
def test_wait_refuses_a_name_no_outbox_can_hold(make_client: ClientFactory) -> None:
    """wait() of a name holding a NUL: InvalidRequest, not a backend's own error."""
    client = make_client(transport=httpx.MockTransport(Never()))
    with pytest.raises(postonce.InvalidRequest, match="NUL"):
        client.wait("order\x00", timeout=0.1)


def test_unknown_intent_is_exported_and_in_the_tree() -> None:
    """postonce.UnknownIntent is public and drawn in the exception tree."""
    from postonce import _exceptions

    assert "UnknownIntent" in postonce.__all__
    assert "UnknownIntent" in (_exceptions.__doc__ or "")


# -- 7. log lines say which attempts they count -------------------------------------------------


def test_log_lines_say_their_attempt_counts_are_the_intents_whole_life(
    make_sync_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The attempt and give-up log lines count every call and drain, and say so."""
    client = make_sync_client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    once = FAST.model_copy(update={"attempts": 1})
    with caplog.at_level(logging.DEBUG, logger="postonce"):
        for _ in range(2):
            with pytest.raises(postonce.IntentPending):
                client.post_once("/charge", intent="order-11/charge", json={}, retry=once)
    attempts = [r.getMessage() for r in caplog.records if "attempt 2" in r.getMessage()]
    assert attempts
    assert "attempt 2 of its life (every call and drain)" in attempts[0]
    gave_up = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "pending after 2 attempt(s) in its life (every call and drain)" in m for m in gave_up
    )


# -- 8. AsyncClient runs a plain handler off the event loop --------------------------------------


def test_a_slow_plain_on_settled_does_not_block_the_event_loop(outbox_path: Path) -> None:
    """A plain on_settled runs on a worker thread: the loop runs a task while it waits."""
    handled: list[tuple[str, bool]] = []
    loop_ran = threading.Event()  # set by a task of the event loop, and only by it
    started = threading.Event()  # the handler has begun

    def slow(settlement: postonce.Settlement) -> None:
        # On the loop's own thread this wait would block the task that sets the event.
        started.set()
        handled.append((threading.current_thread().name, loop_ran.wait(timeout=5)))

    async def main() -> None:
        async def on_the_loop() -> None:
            # Only once the handler is waiting, so the event proves the loop ran meanwhile.
            while not handled:
                if started.is_set():
                    loop_ran.set()
                await anyio.sleep(0.01)

        async with (
            postonce.AsyncClient(
                "http://api.test",
                outbox=outbox_path,
                retry=FAST,
                on_settled=slow,
                transport=httpx.MockTransport(lambda r: httpx.Response(201)),
            ) as client,
            anyio.create_task_group() as group,
        ):
            group.start_soon(on_the_loop)
            await client.post_once("/charge", intent="order-12/charge", json={"a": 1})

    loop_thread = threading.current_thread().name
    anyio.run(main)
    assert len(handled) == 1
    thread, saw_the_loop_run = handled[0]
    assert thread != loop_thread
    assert saw_the_loop_run


def test_a_coroutine_on_settled_is_still_awaited_on_the_loop(outbox_path: Path) -> None:
    """An async def on_settled is awaited on the event loop's own thread, as before."""
    handled: list[str] = []

    async def settled(settlement: postonce.Settlement) -> None:
        await anyio.sleep(0)
        handled.append(threading.current_thread().name)

    async def main() -> str:
        async with postonce.AsyncClient(
            "http://api.test",
            outbox=outbox_path,
            retry=FAST,
            on_settled=settled,
            transport=httpx.MockTransport(lambda r: httpx.Response(201)),
        ) as client:
            await client.post_once("/charge", intent="order-13/charge", json={"a": 1})
        return threading.current_thread().name

    assert anyio.run(main) == handled[0]


def test_option_names_match_the_documented_options() -> None:
    """The options the check accepts are exactly those OnceOptions documents."""
    from postonce._arguments import option_names
    from postonce._base import BaseClient, OnceOptions

    assert set(option_names(BaseClient._plan)) == set(OnceOptions.__annotations__)
    assert re.search(r"\bmeta\b", OnceOptions.__doc__ or "")
