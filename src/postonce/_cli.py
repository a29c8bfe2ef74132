"""The ``postonce`` command: run the drain, and inspect or tend an outbox."""

from __future__ import annotations

import asyncio
import csv
import importlib
import inspect
import io
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import anyio
import click
from tabulate import tabulate

from ._async_client import AsyncClient
from ._client import Client
from ._drain import FOREIGN_MARK, DrainReport, foreign_message, outbox_name
from ._exceptions import PostonceError
from ._intent import IllegalMove, IntentRecord, State
from ._outbox.base import Store
from ._outbox.locate import ENV_VAR, open_store
from ._version import __version__

__all__ = [
    "EXIT_FAILED",
    "EXIT_FOREIGN",
    "EXIT_HANDLERS",
    "EXIT_OK",
    "EXIT_UNSENDABLE",
    "exit_status",
    "main",
    "parse_duration",
]

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> timedelta:
    """``500ms``, ``5s``, ``10m``, ``12h``, ``30d``, ``2w``, or plain seconds."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30s, 10m, 12h or 30d")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> timedelta | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat()


def _summary(record: IntentRecord) -> dict[str, Any]:
    return {
        "reference": record.reference,
        "key": record.key,
        "state": record.state.value,
        "provider": record.provider,
        "method": record.method,
        "url": record.url,
        "attempts": record.attempts,
        "last_outcome": record.last_outcome.value if record.last_outcome else None,
        "status": record.response.status if record.response else None,
        "created_at": _iso(record.created_at),
        "due_at": _iso(record.due_at),
        "note": record.note,
        "sender": record.sender,
        "meta": record.meta,
        "settlement": _settlement(record),
    }


def _settlement(record: IntentRecord) -> str | None:
    """Where the intent's settlement stands: owed, failing (with why), delivered, or none."""
    if record.settled_at is not None:
        return f"delivered {_iso(record.settled_at)}"
    if record.settle_due_at is None:
        return None
    if record.settle_attempts:
        return (
            f"failing ({record.settle_attempts}x: {record.settle_error}); "
            f"next {_iso(record.settle_due_at)}"
        )
    return f"owed from {_iso(record.settle_due_at)}"


def _output(rows: list[dict[str, Any]], fmt: str | None, *, one: bool = False) -> None:
    """JSON by default, a table on a terminal; --nl, --csv and -t on request.

    ``one``: the command reports one thing (stats), so JSON is an object, not a list of one.
    """
    if fmt is None:
        fmt = "table" if sys.stdout.isatty() else "json"
    if fmt == "json":
        click.echo(json.dumps(rows[0] if one else rows, indent=2))
    elif fmt == "nl":
        for row in rows:
            click.echo(json.dumps(row))
    elif fmt == "csv":
        buffer = io.StringIO()
        if rows:
            writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        click.echo(buffer.getvalue(), nl=False)
    else:
        click.echo(tabulate(rows, headers="keys") if rows else "(none)")


def _formats(command: Callable[..., Any]) -> Callable[..., Any]:
    for flag, value, text in reversed(
        [
            ("--json", "json", "JSON (the default when not on a terminal)"),
            ("--nl", "nl", "newline-delimited JSON"),
            ("--csv", "csv", "CSV with a header row"),
            ("-t", "table", "a table (the default on a terminal)"),
        ]
    ):
        decls = [flag, "--table"] if flag == "-t" else [flag]
        command = click.option(*decls, "fmt", flag_value=value, help=text)(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="postonce")
def main() -> None:
    """postonce: finish durable intents and inspect the outbox.

    Example: postonce drain --app myapp.payments:client
    """


# -- drain ---------------------------------------------------------------------------


_FRAMEWORKS = {"fastapi", "starlette", "flask", "django", "litestar", "quart", "sanic"}


def _what(target: object) -> str:
    """What an --app attribute is, for the message that refuses it."""
    kind = type(target)
    if kind.__module__.split(".")[0] in _FRAMEWORKS:
        return f"a {kind.__name__} application"
    if isinstance(target, AsyncClient):
        return "a postonce.AsyncClient (the drain command runs a postonce.Client)"
    return f"a {kind.__name__}"


def _raised(exc: BaseException) -> str:
    """An exception on one line; a KeyError is most often an unset environment variable."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, KeyError):
        text += " (an environment variable that is not set?)"
    return " ".join(text.split())


AnyClient = Client | AsyncClient


def _load_client(spec: str) -> AnyClient | Coroutine[Any, Any, Any]:
    """The client --app names (a coroutine, for an async factory); each failure is one line."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.ClickException(f"--app takes MODULE:ATTRIBUTE, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.ClickException(f"cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:
        # The user's module raised while it was imported (configuration read at import).
        raise click.ClickException(f"importing {module_name!r} raised {_raised(exc)}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise click.ClickException(f"{module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    # Only a function is a factory: an ASGI app or other callable object is not called.
    if inspect.isroutine(target):
        try:
            target = target()
        except Exception as exc:
            raise click.ClickException(f"{spec}() raised {_raised(exc)}") from exc
        if inspect.iscoroutine(target):
            return target  # an async factory: awaited on the drain's own loop
        if not isinstance(target, AnyClient):
            raise click.ClickException(f"{spec}() returned {_what(target)}, not a postonce.Client")
    if not isinstance(target, AnyClient):
        raise click.ClickException(
            f"{spec} is {_what(target)}, not a postonce.Client or AsyncClient "
            "(or a function returning one)"
        )
    return target


async def _drain_async(
    made: AsyncClient | Coroutine[Any, Any, Any],
    spec: str,
    store: Store | None,
    options: dict[str, Any],
    adopt: tuple[str, ...] = (),
) -> DrainReport:
    """Drain an AsyncClient on this command's own event loop; SIGTERM/SIGINT stop it cleanly."""
    try:
        client = await made if inspect.iscoroutine(made) else made
    except Exception as exc:
        raise click.ClickException(f"{spec}() raised {_raised(exc)}") from exc
    if not isinstance(client, AsyncClient):
        raise click.ClickException(f"{spec}() returned {_what(client)}, not a postonce.AsyncClient")
    if store is not None:
        client.use_outbox(store)
    try:
        _adopt(client, adopt)
    except BaseException:
        await client.aclose()
        raise
    stop = anyio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        return await client.drain(stop=stop, **options)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await client.aclose()


def _close_unused(made: AnyClient | Coroutine[Any, Any, Any]) -> None:
    """Let go of a loaded client the command will not run."""
    if isinstance(made, Client):
        made.close()
    elif inspect.iscoroutine(made):
        made.close()  # never awaited: close it so Python does not warn


def _interactive() -> bool:
    """Whether a person watches stderr (then the drain shows a progress line)."""
    return sys.stderr.isatty()


def _progress_line(report: DrainReport) -> None:
    """The TTY progress line, rewritten in place after each batch and once with the report."""
    click.echo(
        f"\rclaimed {report.claimed}  succeeded {report.succeeded}  "
        f"failed {report.failed}  expired {report.expired}  pending {report.pending}  "
        f"paused {report.paused}",
        nl=False,
        err=True,
    )


@main.command()
@click.option(
    "--app",
    "app",
    required=True,
    metavar="MODULE:ATTR",
    help="A configured postonce.Client or AsyncClient (or a function returning one).",
)
@click.option(
    "--outbox",
    "outbox",
    default=None,
    metavar="PATH|URL",
    help="Drain this outbox instead of the client's own.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Intents sent at once.",
)
@click.option("--forever", is_flag=True, help="Keep draining until SIGTERM or SIGINT.")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="PER_SECOND",
    help="At most this many sends a second to each origin (default: no cap). A 429 or "
    "503 with Retry-After pauses its origin whatever this says.",
)
@click.option(
    "--interval",
    callback=_duration,
    metavar="DURATION",
    default=None,
    help="With --forever only: how often to look for due intents.  [default: 5s]",
)
@click.option(
    "--accept-foreign",
    is_flag=True,
    help="Due intents of other clients (another sender or origin) are expected here: "
    "they do not make the exit status 3.",
)
@click.option(
    "--adopt",
    "adopt",
    multiple=True,
    metavar="SENDER",
    help="First make the intents of this sender (to the client's origins) the client's own, "
    "as client.adopt(SENDER) does: this client under old credentials or an old name=. "
    "Repeatable.",
)
def drain(
    app: str,
    outbox: str | None,
    concurrency: int,
    forever: bool,
    rate: float | None,
    interval: timedelta | None,
    accept_foreign: bool,
    adopt: tuple[str, ...],
) -> None:
    """Send every due intent once with its stored key, then exit with what it found.

    Due intents are pending ones whose time has come and ones whose sender
    died. Prints a DrainReport as JSON (with the outbox it drained, and this
    client's sender). The client named by --app supplies the credentials: the
    outbox holds none, so it sends only its own sender's intents to its own
    origins, and names the senders of the due intents it had to leave.

    \b
    Exit status (the first that applies):
      0  all well
      1  an intent failed, expired or was left indeterminate, or the drain
         broke (and any error the command prints as "Error:")
      4  a settlement handler (on_settled) or reconciler (reconcile) failed,
         or a settlement is still owed after its handler raised
      5  due intents of this client's sender that it cannot send (a profile
         it does not know, credentials of their own call not supplied) were
         handed back, due again in a minute
      3  due intents of other clients were left unsent (see --accept-foreign)
      2  the command line was wrong

    Example: postonce drain --app myapp.payments:client --concurrency 8 --rate 50
    """
    if interval is not None and not forever:
        raise click.UsageError(
            "--interval applies to --forever only: a drain without --forever sends what is "
            "due once and exits"
        )
    client = _load_client(app)
    store = None
    if outbox is not None:
        try:
            store = open_store(_resolved(outbox), create=False)
        except PostonceError as exc:
            _close_unused(client)
            raise click.ClickException(str(exc)) from exc
    progress: Callable[[DrainReport], None] | None = None
    if _interactive():
        progress = _progress_line
    options: dict[str, Any] = {
        "forever": forever,
        "interval": 5.0 if interval is None else interval.total_seconds(),
        "concurrency": concurrency,
        "progress": progress,
        "rate": rate,
    }
    try:
        with _said_at_the_end():
            report = _run_drain(client, app, store, options, adopt)
    except PostonceError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if store is not None:
            store.close()
    if progress is not None:
        # The last batch's line can trail the report (releases, late outcomes): end on its counts.
        progress(report)
        click.echo(err=True)
    click.echo(report.model_dump_json(indent=2))
    code = exit_status(report, accept_foreign=accept_foreign)
    _say_why(code, report)
    sys.exit(code)


def _say_why(code: int, report: DrainReport) -> None:
    """On stderr, why the drain exits with ``code`` (4, 5 and 3: what to do about it)."""
    if code == EXIT_HANDLERS:
        click.echo(
            f"postonce drain: exit {code}: settlement handlers or reconcilers are failing: "
            f"{report.settle_failed} handler call(s) failed, {report.reconcile_failed} "
            f"reconciler call(s) failed, {report.settle_failing} settlement(s) of this client "
            "still owed after their handler raised. The log says why; postonce outbox list "
            "shows each intent's settlement. Each is tried again by the next drain.",
            err=True,
        )
    elif code == EXIT_UNSENDABLE:
        click.echo(
            f"postonce drain: exit {code}: {report.unsendable} intent(s) of this client's sender "
            "could not be sent by it (a provider profile it does not know, or credentials of "
            "their own call it has no credentials_for= to supply) and were handed back, due "
            "again in a minute. The log names each intent and why: give the drain (--app) "
            "the client the application wrote them with.",
            err=True,
        )
    elif code == EXIT_FOREIGN:
        click.echo(f"postonce drain: exit {code}: {foreign_message(report)}", err=True)


@contextmanager
def _said_at_the_end() -> Iterator[None]:
    """Hold back the drain's log record of others' intents: the command says it when it exits."""

    def unmarked(record: logging.LogRecord) -> bool:
        return not getattr(record, FOREIGN_MARK, False)

    log = logging.getLogger("postonce")
    log.addFilter(unmarked)
    try:
        yield
    finally:
        log.removeFilter(unmarked)


def _run_drain(
    client: AnyClient | Coroutine[Any, Any, Any],
    app: str,
    store: Store | None,
    options: dict[str, Any],
    adopt: tuple[str, ...] = (),
) -> DrainReport:
    """Run the loaded client's drain (on an event loop of its own, for an AsyncClient)."""
    if isinstance(client, Client):
        if store is not None:
            client.use_outbox(store)
        try:
            _adopt(client, adopt)
            return client.drain(**options)
        finally:
            client.close()
    return asyncio.run(_drain_async(client, app, store, options, adopt))


def _adopt(client: AnyClient, senders: tuple[str, ...]) -> None:
    """``--adopt``: make each sender's intents to the client's origins its own, and say how many."""
    for sender in senders:
        adopted = client.adopt(sender)
        click.echo(
            f"postonce drain: adopted {adopted} intent(s) of sender {sender!r}: they are "
            f"{client.sender!r}'s now",
            err=True,
        )


#: ``postonce drain``'s exit statuses (2 is click's, for a wrong command line).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_FOREIGN = 3
EXIT_HANDLERS = 4
EXIT_UNSENDABLE = 5


def exit_status(report: DrainReport, *, accept_foreign: bool = False) -> int:
    """What a drain's report means for its exit status: the first that applies.

    1 before 4 before 5 before 3: an intent's own outcome first, then what the
    application was not told, then what this client could not send at all: its
    own sender's intents, then other clients'.
    """
    if report.failed or report.expired or report.indeterminate or report.errors:
        return EXIT_FAILED
    if report.handlers_failing:
        return EXIT_HANDLERS
    if report.unsendable:
        return EXIT_UNSENDABLE
    if report.not_ours and not accept_foreign:
        return EXIT_FOREIGN
    return EXIT_OK


def _resolved(spec: str) -> str:
    """An outbox spec with a relative path made absolute: what every message then shows.

    A ``sqlite:///`` URL keeps its options (``?create=0``).
    """
    if spec.startswith(("postgresql://", "postgres://")):
        return spec
    if spec.startswith("sqlite:///"):
        path, mark, query = spec.removeprefix("sqlite:///").partition("?")
        resolved = os.path.abspath(os.path.expanduser(path))
        return f"sqlite:///{resolved}{mark}{query}" if mark else resolved
    return os.path.abspath(os.path.expanduser(spec))


# -- outbox ----------------------------------------------------------------------------


@main.group()
@click.option(
    "--outbox",
    "outbox",
    envvar=ENV_VAR,
    default=None,
    metavar="PATH|URL",
    help=f"The outbox to inspect: a path or postgresql:// URL (default: ${ENV_VAR}, "
    "else the user data dir).",
)
@click.pass_context
def outbox(ctx: click.Context, outbox: str | None) -> None:
    """Inspect and tend an outbox. These commands never create one.

    list, show, stats and export only read: they never migrate an outbox of an
    older schema, and refuse a file that holds no outbox (another
    application's database) without writing to it.

    --outbox is taken here or after the command, as by postonce drain.

    Example: postonce outbox stats --outbox ./outbox.sqlite3
    """
    ctx.obj = outbox


def _outbox_here(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``postonce outbox COMMAND --outbox X`` means ``postonce outbox --outbox X COMMAND``."""
    if value is None:
        return
    group = ctx.parent
    if (
        group is not None
        and group.get_parameter_source("outbox") is click.core.ParameterSource.COMMANDLINE
        and group.params.get("outbox") != value
    ):
        given = group.params.get("outbox")
        raise click.UsageError(f"--outbox is given twice, as {given!r} and {value!r}: give it once")
    ctx.obj = value  # given with the command, it wins over POSTONCE_OUTBOX


def _with_outbox(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every ``outbox`` command takes ``--outbox`` after its name too."""
    return click.option(
        "--outbox",
        "outbox_here",
        default=None,
        metavar="PATH|URL",
        expose_value=False,
        is_eager=True,
        callback=_outbox_here,
        help=f"The outbox: a path or postgresql:// URL (default: ${ENV_VAR}, else the user "
        "data dir).",
    )(command)


def _store(ctx: click.Context, *, read_only: bool = False) -> Store:
    """The outbox the command names; never created, and never migrated by one that only reads."""
    spec = ctx.obj
    try:
        store = open_store(
            None if spec is None else _resolved(spec), create=False, migrate=not read_only
        )
    except PostonceError as exc:
        raise click.ClickException(str(exc)) from exc
    ctx.call_on_close(store.close)
    return store


def _get(store: Store, reference: str) -> IntentRecord:
    record = store.get(reference)
    if record is None:
        raise click.ClickException(f"no intent {reference!r} in this outbox")
    return record


@outbox.command("list")
@_with_outbox
@click.option(
    "--state",
    type=click.Choice([s.value for s in State]),
    default=None,
    help="Only intents in this state.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many.")
@_formats
@click.pass_context
def list_(ctx: click.Context, state: str | None, limit: int | None, fmt: str | None) -> None:
    """List intents, newest first.

    Example: postonce outbox list --state pending -t
    """
    store = _store(ctx, read_only=True)
    records = store.list_intents(state=State(state) if state else None, limit=limit)
    _output([_summary(r) for r in records], fmt)


@outbox.command()
@_with_outbox
@click.argument("reference")
@click.option("--json", "fmt", flag_value="json", help="JSON (the default when not on a terminal).")
@click.option(
    "-t", "--table", "fmt", flag_value="table", help="tables (the default on a terminal)."
)
@click.pass_context
def show(ctx: click.Context, reference: str, fmt: str | None) -> None:
    """Show one intent, its key and every attempt: JSON, or tables with -t.

    Times are ISO 8601 in UTC.

    Example: postonce outbox show order-1234/charge -t
    """
    store = _store(ctx, read_only=True)
    record = _get(store, reference)
    attempts = [
        {
            "started_at": _iso(a.started_at),
            "duration": round(a.duration, 6),
            "outcome": a.outcome.value,
            "status": a.status,
            "error_type": a.error_type,
            "replayed": a.replayed,
        }
        for a in store.attempts(reference)
    ]
    detail = _summary(record) | {
        "headers": [list(h) for h in record.headers],
        "body": record.body.decode("utf-8", "replace"),
        "first_delivery_at": _iso(record.first_delivery_at),
        "deadline_at": _iso(record.deadline_at),
        "lease_owner": record.lease_owner,
        "lease_expires_at": _iso(record.lease_expires_at),
        "purged_at": _iso(record.purged_at),
    }
    if fmt is None:
        fmt = "table" if sys.stdout.isatty() else "json"
    if fmt == "json":
        click.echo(json.dumps(detail | {"attempts": attempts}, indent=2))
        return
    detail["headers"] = "\n".join(f"{name}: {value}" for name, value in record.headers)
    click.echo(tabulate(list(detail.items()), tablefmt="plain"))
    click.echo()
    click.echo(tabulate(attempts, headers="keys") if attempts else "(no attempts)")


@outbox.command()
@_with_outbox
@_formats
@click.pass_context
def stats(ctx: click.Context, fmt: str | None) -> None:
    """Counts per state, oldest pending, next due, and expired intents needing attention.

    Prints one JSON object (one row with --nl, --csv or -t). Times are ISO 8601 in UTC.

    Example: postonce outbox stats --json
    """
    data = _store(ctx, read_only=True).stats(now=time.time())
    row = {**data.pop("states"), **data}
    for name in ("oldest_pending_created_at", "next_due_at", "next_lease_expiry"):
        row[name] = _iso(row[name])
    _output([row], fmt, one=True)


def _operator(ctx: click.Context, reference: str, to: State, note: str, app: str | None) -> None:
    """Make an operator's move; with --app, through that client, whose settlement handler runs."""
    store = _store(ctx)
    _get(store, reference)
    try:
        if app is None:
            record = store.operator_move(reference, to, now=time.time(), note=note)
        else:
            record = _operator_through(app, store, reference, to, note)
    except IllegalMove as exc:
        raise click.ClickException(f"cannot make {reference!r} {to.value}: {exc}") from exc
    except PostonceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(_summary(record)))


def _operator_through(app: str, store: Store, reference: str, to: State, note: str) -> IntentRecord:
    made = _load_client(app)
    if isinstance(made, Client):
        made.use_outbox(store)
        try:
            return made.resolve(reference, to, note=note)
        finally:
            made.close()

    async def through_async() -> IntentRecord:
        client = await made if inspect.iscoroutine(made) else made
        if not isinstance(client, AsyncClient):
            raise click.ClickException(f"{app}() returned {_what(client)}, not a postonce client")
        client.use_outbox(store)
        try:
            return await client.resolve(reference, to, note=note)
        finally:
            await client.aclose()

    return asyncio.run(through_async())


_APP_OPTION = click.option(
    "--app",
    "app",
    default=None,
    metavar="MODULE:ATTR",
    help="Make the move through this client, so its settlement handler (on_settled) runs.",
)


@outbox.command()
@_with_outbox
@click.argument("reference")
@click.option(
    "--note", default="cancelled by an operator", show_default=True, help="Why, for the record."
)
@_APP_OPTION
@click.pass_context
def cancel(ctx: click.Context, reference: str, note: str, app: str | None) -> None:
    """Cancel an intent that was never delivered; refused if it may have been.

    Example: postonce outbox cancel order-1234/charge --note "customer left"
    """
    _operator(ctx, reference, State.CANCELLED, note, app)


@outbox.command()
@_with_outbox
@click.argument("reference")
@click.option("--succeeded", is_flag=True, help="The provider executed it.")
@click.option("--failed", is_flag=True, help="The provider did not.")
@click.option("--note", required=True, help="What you checked, for the record.")
@_APP_OPTION
@click.pass_context
def resolve(
    ctx: click.Context, reference: str, succeeded: bool, failed: bool, note: str, app: str | None
) -> None:
    """Record the outcome of an expired intent after checking with the provider.

    Example: postonce outbox resolve order-1234/charge --succeeded --note "ch_123 in dashboard"
    """
    if succeeded == failed:
        raise click.UsageError("say either --succeeded or --failed")
    _operator(ctx, reference, State.SUCCEEDED if succeeded else State.FAILED, note, app)


@outbox.command()
@_with_outbox
@click.option(
    "--older-than",
    "older_than",
    callback=_duration,
    metavar="DURATION",
    required=True,
    help="Age since the intent last changed, e.g. 30d.",
)
@click.option(
    "--tombstones",
    is_flag=True,
    help="Delete tombstones of that age instead (the reference may then run again).",
)
@click.pass_context
def purge(ctx: click.Context, older_than: timedelta, tombstones: bool) -> None:
    """Forget finished intents, keeping a tombstone that refuses a second execution.

    Only succeeded, failed and cancelled intents are purged. Expired intents are
    kept until an operator resolves them (postonce outbox resolve), and so are
    indeterminate ones: they still need reconciling with the provider. An intent
    whose settlement is still owed (its on_settled handler has not returned) is
    kept too, and counted as kept_for_settlement: a drain of its client delivers it.

    Example: postonce outbox purge --older-than 30d
    """
    now = time.time()
    store = _store(ctx)
    count = store.purge(before=now - older_than.total_seconds(), tombstones=tombstones, now=now)
    click.echo(
        json.dumps(
            {
                "purged": int(count),
                "tombstones": tombstones,
                # None: a custom store that does not say (it returned a plain int).
                "kept_for_settlement": getattr(count, "kept_owed", None),
                "outbox": outbox_name(store),
            }
        )
    )


@outbox.command("purge-receipts")
@_with_outbox
@click.option(
    "--older-than",
    "older_than",
    callback=_duration,
    metavar="DURATION",
    required=True,
    help="Age since the notification was received, e.g. 90d.",
)
@click.pass_context
def purge_receipts(ctx: click.Context, older_than: timedelta) -> None:
    """Forget the receipts of notifications received longer ago than --older-than.

    A receipt is what makes a redelivered notification a duplicate
    (postonce.receive_once): after it is purged, a redelivery of that
    notification applies again. Keep receipts longer than the longest a
    provider retries (Stripe: 3 days; PayPal: 3 days), and keep a uniqueness
    constraint of your own on the effect (one payment per order, say): no
    retention window is longer than an operator's memory.

    Example: postonce outbox purge-receipts --older-than 90d
    """
    store = _store(ctx)
    purge = getattr(store, "purge_receipts", None)
    if purge is None:
        raise click.ClickException(f"{outbox_name(store)} keeps no notification receipts")
    count = purge(before=time.time() - older_than.total_seconds())
    click.echo(json.dumps({"purged_receipts": int(count), "outbox": outbox_name(store)}))


@outbox.command()
@_with_outbox
@click.option("--jsonl", is_flag=True, default=True, help="One JSON object per line (default).")
@click.pass_context
def export(ctx: click.Context, jsonl: bool) -> None:
    """Export every intent with its attempts as JSON lines; times are ISO 8601 in UTC.

    Example: postonce outbox export --jsonl > outbox.jsonl
    """
    rows: Iterable[dict[str, Any]] = _store(ctx, read_only=True).export_rows()
    for row in rows:
        click.echo(json.dumps(_iso_times(row)))


def _iso_times(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its Unix-time fields (``*_at``) as ISO 8601, as every command prints them."""
    out: dict[str, Any] = {}
    for name, value in row.items():
        if name.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = _iso(value)
        elif isinstance(value, list):
            out[name] = [_iso_times(v) if isinstance(v, dict) else v for v in value]
        else:
            out[name] = value
    return out
