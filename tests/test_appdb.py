"""The statements enqueue runs on the application's connection, and what it makes of their rows.

Sans-I/O: ``enqueue_steps`` is driven here by hand, one table row per case.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import postonce
from postonce._appdb import Rows, Statement, _spelled, enqueue_steps, other_database
from postonce._intent import IntentInfo, NewIntent, State
from postonce._outbox import decide
from postonce._outbox.base import Target
from postonce._outbox.rows import COLUMN_NAMES, decode_row

NEW = NewIntent(
    reference="order-1/charge", key="k-1", key_given=False, provider="ietf_draft",
    method="POST", url="https://api.test/v1/charges",
    headers=(("content-type", "application/json"),), body=b'{"a":1}', fingerprint="f" * 64,
    deadline_at=None, sender="s#1", origin="https://api.test:443",
)  # fmt: skip
SQLITE = Target("sqlite", "postonce_intents", "/srv/shop.db")
POSTGRES = Target("postgres", '"postonce".intents', "shop", "postonce_due_postonce")


def drive(steps: Any, answers: list[Rows]) -> tuple[list[Statement], IntentInfo]:
    """Run ``steps``, answering each statement with the next rows; the statements seen."""
    seen, rows = [], None
    try:
        while True:
            statement = steps.send(rows) if rows is not None else next(steps)
            seen.append(statement)
            rows = answers.pop(0)
    except StopIteration as done:
        return seen, done.value


def stored_row(**changes: Any) -> tuple[Any, ...]:
    row = {**decide.enqueued_row(NEW, 10.0), "id": 7, **changes}
    return tuple(row.get(name) for name in COLUMN_NAMES)


@pytest.mark.parametrize(
    ("target", "seen", "refused"),
    [
        (SQLITE, [("/srv/shop.db",)], False),  # (a real path compare: see the next case)
        (SQLITE, [("",)], True),  # an in-memory database
        (POSTGRES, [("shop", True)], False),
        (POSTGRES, [("postgres", True)], True),  # another database
        (POSTGRES, [("shop", False)], True),  # the outbox's table not visible there
    ],
)
def test_the_connection_must_reach_the_outboxs_database(
    target: Target, seen: Rows, refused: bool, tmp_path: Any
) -> None:
    if target.dialect == "sqlite" and seen[0][0]:
        path = tmp_path / "shop.db"
        path.touch()
        target, seen = target._replace(database=str(path)), [(str(path),)]
    assert (other_database(target, seen) is not None) is refused


def test_a_new_intent_is_checked_then_inserted_with_a_notify_on_postgres() -> None:
    statements, info = drive(enqueue_steps(POSTGRES, NEW, 10.0), [[("shop", True)], [(7, None)]])
    check, insert = statements
    assert "current_database()" in check.sql
    assert "ON CONFLICT DO NOTHING" in insert.sql
    assert insert.params[-1] == POSTGRES.channel  # pg_notify's channel
    assert "pg_notify" in insert.sql
    assert (info.key, info.state, info.from_outbox) == ("k-1", State.PENDING, False)


def test_a_connection_checked_before_goes_straight_to_the_insert() -> None:
    statements, _ = drive(enqueue_steps(SQLITE, NEW, 10.0, checked=True), [[(7,)]])
    (insert,) = statements
    assert insert.sql.startswith("INSERT INTO postonce_intents")
    assert "pg_notify" not in insert.sql


def test_a_refused_connection_raises_before_any_write() -> None:
    steps = enqueue_steps(POSTGRES, NEW, 10.0)
    next(steps)
    with pytest.raises(postonce.InvalidRequest, match="nothing was written"):
        steps.send([("postgres", True)])


@pytest.mark.parametrize(
    ("stored", "outcome"),
    [
        ([stored_row()], "the same"),
        ([stored_row(fingerprint="0" * 64)], postonce.IntentConflict),
        ([stored_row(state="succeeded", attempts=1)], "the same"),
        ([], postonce.IntentConflict),  # the key is another intent's
    ],
)
def test_an_insert_that_wrote_nothing_reads_what_is_stored(stored: Rows, outcome: Any) -> None:
    steps = enqueue_steps(SQLITE, NEW, 10.0, checked=True)
    insert = next(steps)
    assert insert.sql.startswith("INSERT")
    read = steps.send([])
    assert read.params == (NEW.reference,)
    if outcome == "the same":
        with pytest.raises(StopIteration) as done:
            steps.send(stored)
        info = done.value.value
        record = decode_row(stored[0])
        assert dataclasses.astuple(info)[:4] == (
            NEW.reference,
            NEW.key,
            record.state,
            record.attempts,
        )
        assert info.from_outbox
    else:
        with pytest.raises(outcome, match="nothing was written"):
            steps.send(stored)


def test_statements_are_spelled_in_each_drivers_placeholders() -> None:
    """A schema may be named with a ``%``: psycopg would read it as a placeholder."""
    statement = Statement('INSERT INTO "50%_off".intents (a) VALUES (?)', (1,))
    assert _spelled(statement, "sqlite") == statement
    assert _spelled(statement, "postgres") == Statement(
        'INSERT INTO "50%%_off".intents (a) VALUES (%s)', (1,)
    )
