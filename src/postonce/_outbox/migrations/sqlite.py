"""The SQLite outbox's schema, one function per version, applied with sqlite-utils.

``MIGRATIONS[n](db, prefix)`` takes a database at schema version n to n + 1;
:class:`~postonce._outbox.sqlite.SQLiteStore` applies the missing ones in one
transaction when it opens a file. The PostgreSQL outbox keeps its migrations
as SQL files beside this module, in ``postgres/``.

``prefix`` starts the name of every table, index and trigger the schema
creates, and every reference to one inside it (never a column's name):

- ``""`` in an outbox file of its own: ``intents``, ``attempts``,
  ``intents_swept``, ``intents_due``, ... as every earlier release named them,
  so an outbox stays readable by the older releases still running against it.
  Its version is ``PRAGMA user_version``.
- :data:`PREFIX` (``postonce_``) in another application's database, whose own
  tables may well be called ``intents``: ``postonce_intents``,
  ``postonce_attempts``, ``postonce_intents_swept``, ``postonce_intents_due``,
  ... Its version lives in the one-row table :data:`META`, since the
  application keeps ``PRAGMA user_version`` for its own schema.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import sqlite_utils

__all__ = ["META", "MIGRATIONS", "PREFIX", "SCHEMA_VERSION", "set_version"]

#: The prefix of every name of an outbox inside another application's database.
PREFIX = "postonce_"
#: The one-row table holding the schema version of an outbox named with :data:`PREFIX`.
META = f"{PREFIX}meta"


def set_version(conn: sqlite3.Connection, prefix: str, version: int) -> None:
    """Record the schema version where an outbox of ``prefix`` keeps it (in the caller's
    transaction): ``PRAGMA user_version`` for an outbox of its own, :data:`META` otherwise."""
    if not prefix:
        conn.execute(f"PRAGMA user_version = {int(version)}")
        return
    # One row, for good, as the sweep's watermark (_v6).
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {META} (one INTEGER PRIMARY KEY CHECK (one = 1),"
        " version INTEGER NOT NULL)"
    )
    conn.execute(f"INSERT OR REPLACE INTO {META} (one, version) VALUES (1, ?)", (version,))


def _v1(db: sqlite_utils.Database, prefix: str) -> None:
    intents = f"{prefix}intents"
    db.table(intents).create(
        {
            "id": int,
            "reference": str,
            "key": str,
            "provider": str,
            "method": str,
            "url": str,
            "headers": str,  # JSON list of [name, value]; never a secret header
            "body": bytes,
            "fingerprint": str,
            "state": str,
            "created_at": float,
            "updated_at": float,
            "first_delivery_at": float,  # retry-horizon anchor; NULL while never sent
            "due_at": float,
            "deadline_at": float,
            "attempts": int,
            "last_outcome": str,
            "lease_owner": str,
            "lease_expires_at": float,
            "claim_token": str,
            "response_status": int,
            "response_headers": str,
            "response_body": bytes,
            "response_truncated": int,
            "response_sha256": str,
            "note": str,
            "purged_at": float,  # set when purge keeps only a tombstone
        },
        pk="id",
        not_null=[
            "reference",
            "key",
            "provider",
            "method",
            "url",
            "headers",
            "body",
            "fingerprint",
            "state",
            "created_at",
            "updated_at",
            "attempts",
        ],
        defaults={"attempts": 0},
    )
    db.table(intents).create_index(["reference"], index_name=f"{intents}_reference", unique=True)
    db.table(intents).create_index(["key"], index_name=f"{intents}_key", unique=True)
    # Partial indexes: only the few rows a claim looks for are in them, so a
    # call that succeeds touches one of them twice (in, then out of "sending")
    # and the claim stays as fast at a million finished rows as at ten thousand.
    # claim_due spells these states as literals so the planner can use them.
    # (purge and stats scan: they are operator commands, not the hot path.)
    db.execute(f"CREATE INDEX {intents}_due ON {intents} (due_at) WHERE state = 'pending'")
    db.execute(f"CREATE INDEX {intents}_touched ON {intents} (updated_at) WHERE state = 'pending'")
    db.execute(
        f"CREATE INDEX {intents}_lease ON {intents} (lease_expires_at) WHERE state = 'sending'"
    )
    # WITHOUT ROWID, keyed by (intent, number): one B-tree per attempt written,
    # not a table and an index.
    db.execute(
        f"CREATE TABLE {prefix}attempts ("
        f" intent_id INTEGER NOT NULL REFERENCES {intents} (id),"
        " number INTEGER NOT NULL,"
        " started_at FLOAT NOT NULL,"
        " duration FLOAT NOT NULL,"
        " outcome TEXT NOT NULL,"
        " status INTEGER,"
        " error_type TEXT,"
        " replayed INTEGER,"
        " owner TEXT,"
        " PRIMARY KEY (intent_id, number)"
        ") WITHOUT ROWID"
    )


def _v2(db: sqlite_utils.Database, prefix: str) -> None:
    """Sender identity: who may send an intent (``sender``) and where it goes (``origin``).

    Rows written before this version have neither; the first client whose
    origins include a row's origin adopts it (``Store.adopt``). Claims read
    one sender's due rows, so the claim indexes lead with the sender.
    """
    intents = f"{prefix}intents"
    db.execute(f"ALTER TABLE {intents} ADD COLUMN sender TEXT")
    db.execute(f"ALTER TABLE {intents} ADD COLUMN origin TEXT")
    db.execute(f"DROP INDEX {intents}_due")
    db.execute(f"DROP INDEX {intents}_lease")
    db.execute(f"CREATE INDEX {intents}_due ON {intents} (sender, due_at) WHERE state = 'pending'")
    db.execute(
        f"CREATE INDEX {intents}_lease ON {intents} (sender, lease_expires_at)"
        " WHERE state = 'sending'"
    )
    db.execute(f"CREATE INDEX {intents}_unowned ON {intents} (id) WHERE sender IS NULL")


def _v3(db: sqlite_utils.Database, prefix: str) -> None:
    """Outcomes reach the application: ``meta``, settlements owed and delivered, reconciling.

    ``settle_due_at`` is set while a settlement handler owes a call (from when);
    ``settled_at`` once it returned. ``reconcile_at`` is when a drain may next
    ask the reconciler about an expired intent.
    """
    intents = f"{prefix}intents"
    for column in (
        "meta TEXT",
        "settle_due_at REAL",
        "settle_attempts INTEGER NOT NULL DEFAULT 0",
        "settle_error TEXT",
        "settled_at REAL",
        "reconcile_at REAL",
    ):
        db.execute(f"ALTER TABLE {intents} ADD COLUMN {column}")
    db.execute(
        f"CREATE INDEX {intents}_settle ON {intents} (sender, settle_due_at)"
        " WHERE settle_due_at IS NOT NULL"
    )
    db.execute(
        f"CREATE INDEX {intents}_expired ON {intents} (sender, reconcile_at)"
        " WHERE state = 'expired'"
    )


def _v4(db: sqlite_utils.Database, prefix: str) -> None:
    """The key index holds only intents named apart from their key.

    A call without ``intent=`` is its own intent: its reference is its key,
    and the reference index already keeps that value unique. Indexing it a
    second time cost every such call a page of a random B-tree position per
    write-ahead. The one clash neither index sees, a key that the other kind
    of intent holds, is refused by the schema itself: two triggers look it up
    (through those two indexes, writing nothing) and drop the INSERT, which
    the writer reads as "this key belongs to another intent". In the schema,
    not in Python, so it also holds against a process of an older release
    that opened the file before this migration and keeps writing.
    """
    intents = f"{prefix}intents"
    db.execute(f"DROP INDEX {intents}_key")
    db.execute(f"CREATE UNIQUE INDEX {intents}_key ON {intents} (key) WHERE key != reference")
    db.execute(
        f"CREATE TRIGGER {intents}_key_unnamed BEFORE INSERT ON {intents}"
        " WHEN NEW.key = NEW.reference AND EXISTS"
        f" (SELECT 1 FROM {intents} WHERE key = NEW.key AND key != reference)"
        " BEGIN SELECT RAISE(IGNORE); END"
    )
    db.execute(
        f"CREATE TRIGGER {intents}_key_named BEFORE INSERT ON {intents}"
        " WHEN NEW.key != NEW.reference AND EXISTS"
        f" (SELECT 1 FROM {intents} WHERE reference = NEW.key AND key = reference)"
        " BEGIN SELECT RAISE(IGNORE); END"
    )


def _v5(db: sqlite_utils.Database, prefix: str) -> None:
    """The lease index holds every row with a lease expiry, not only the sending ones.

    An intent enters it with its write-ahead. Before this version its answer
    took it out again (the state left ``'sending'``), which wrote the index's
    page in the answer's commit too. Now the answer leaves the expiry in the
    row, and the store takes ended intents out later, many in one statement
    (``decide.lease_exit_deferred``); a claim takes out those it walks past.
    Every query of the index still asks for ``state = 'sending'``, and a
    comparison on ``lease_expires_at`` lets SQLite use the partial index.
    A process of an older release keeps clearing the expiry with each answer:
    its rows simply leave the index at once.
    """
    intents = f"{prefix}intents"
    db.execute(f"DROP INDEX {intents}_lease")
    db.execute(
        f"CREATE INDEX {intents}_lease ON {intents} (sender, lease_expires_at)"
        " WHERE lease_expires_at IS NOT NULL"
    )


def _v6(db: sqlite_utils.Database, prefix: str) -> None:
    """A new intent enters the lease index only if it is still in flight at a sweep.

    The write-ahead marks its row ``fresh``: out of the lease index, so that
    commit writes one index page fewer. A claim finds a fresh row (a send
    whose process died) in the table's tail instead: the rows past the
    watermark in ``intents_swept``, a range of the table's own key. A sweep
    (every few dozen intents, at close, and in every claim) takes the
    still-sending fresh rows of the tail into the index and moves the
    watermark to the table's end. So a sending row is either in the index or
    past the watermark; the two triggers keep that true whoever writes:

    - ``intents_fresh_leased``: a fresh sending row given a lease by any later
      write (a heartbeat, a retry, a claim: every move to sending sets one)
      joins the index at once;
    - ``intents_swept_back``: deleting the rows at the table's end lowers the
      watermark with it, since SQLite gives the next row the end's id + 1.

    The watermark's table keeps its one row (a ``CHECK`` and a trigger that
    refuses its deletion). A process of an older release inserts rows that
    are not fresh (NULL), so they are indexed as before; its queries cannot
    say ``fresh IS NULL``, so they cannot use the new index and read the
    whole table, which finds a fresh row at once but costs O(table) per
    claim until every process is upgraded.
    """
    intents = f"{prefix}intents"
    db.execute(f"ALTER TABLE {intents} ADD COLUMN fresh INTEGER")
    # One row, for good: a missing watermark would hide the tail from every claim.
    db.execute(
        f"CREATE TABLE {intents}_swept (one INTEGER PRIMARY KEY CHECK (one = 1),"
        " upto INTEGER NOT NULL)"
    )
    db.execute(
        f"INSERT INTO {intents}_swept (one, upto) SELECT 1, coalesce(max(id), 0) FROM {intents}"
    )
    db.execute(
        f"CREATE TRIGGER {intents}_swept_stays BEFORE DELETE ON {intents}_swept"
        " BEGIN SELECT RAISE(ABORT, 'the outbox needs its sweep watermark'); END"
    )
    db.execute(f"DROP INDEX {intents}_lease")
    db.execute(
        f"CREATE INDEX {intents}_lease ON {intents} (sender, lease_expires_at)"
        " WHERE lease_expires_at IS NOT NULL AND fresh IS NULL"
    )
    db.execute(
        f"CREATE TRIGGER {intents}_fresh_leased AFTER UPDATE OF lease_expires_at ON {intents}"
        " WHEN NEW.fresh IS NOT NULL AND NEW.state = 'sending'"
        f" BEGIN UPDATE {intents} SET fresh = NULL WHERE id = NEW.id; END"
    )
    db.execute(
        f"CREATE TRIGGER {intents}_swept_back AFTER DELETE ON {intents}"
        f" WHEN OLD.id >= coalesce((SELECT upto FROM {intents}_swept), 0)"
        f" BEGIN UPDATE {intents}_swept"
        f" SET upto = min(upto, (SELECT coalesce(max(id), 0) FROM {intents})); END"
    )


def _v7(db: sqlite_utils.Database, prefix: str) -> None:
    """A reconciler is asked about indeterminate intents as about expired ones.

    ``indeterminate`` is a new state (an answer that leaves the effect
    unknown, e.g. a 5xx the provider stored and replays); the index a drain
    walks for its reconciler now holds both. Rows written before keep their
    state: an intent that ended ``failed`` on such an answer stays failed
    (its settlement was delivered as such). A process of an older release
    asks only about ``expired`` rows, which it still finds, without the index;
    but it cannot read an ``indeterminate`` row (the state is new to it), so
    its listing and its settlement pass fail on one: upgrade every process
    before relying on the new state.
    """
    intents = f"{prefix}intents"
    db.execute(f"DROP INDEX {intents}_expired")
    db.execute(
        f"CREATE INDEX {intents}_unresolved ON {intents} (sender, reconcile_at)"
        " WHERE state IN ('expired', 'indeterminate')"
    )


def _v8(db: sqlite_utils.Database, prefix: str) -> None:
    """An intent sent with a call's own secrets says which: ``needs``.

    A JSON list of their names (headers in lower case, query parameters as
    ``?name``), never a value; NULL for an intent whose sends need only the
    client's own credentials, as every row written before this version. A
    process of an older release neither writes nor reads it.
    """
    db.execute(f"ALTER TABLE {prefix}intents ADD COLUMN needs TEXT")


def _v9(db: sqlite_utils.Database, prefix: str) -> None:
    """Receipts of the notifications an application received (``postonce.receive_once``).

    Written in the application's own transaction with the effect they caused;
    ``(source, event_id)`` is the sender's own operation identifier, its primary
    key (so a duplicate inserts nothing), ``delivery_id`` kept for the audit log
    only. Purged only on request. A process of an older release never reads it.
    """
    db.execute(
        f"CREATE TABLE {prefix}receipts (source TEXT NOT NULL, event_id TEXT NOT NULL,"
        " delivery_id TEXT, received_at REAL NOT NULL, PRIMARY KEY (source, event_id))"
        " WITHOUT ROWID"
    )
    db.execute(f"CREATE INDEX {prefix}receipts_received ON {prefix}receipts (received_at)")


#: MIGRATIONS[n](db, prefix) takes a database at schema version n to n + 1.
MIGRATIONS: list[Callable[[sqlite_utils.Database, str], None]] = [
    _v1,
    _v2,
    _v3,
    _v4,
    _v5,
    _v6,
    _v7,
    _v8,
    _v9,
]
SCHEMA_VERSION = len(MIGRATIONS)
