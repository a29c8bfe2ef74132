"""The SQLite outbox's schema, one function per version, applied with sqlite-utils.

``MIGRATIONS[n]`` takes a database at schema version n (``PRAGMA user_version``)
to n + 1; :class:`~postonce._outbox.sqlite.SQLiteStore` applies the missing ones
in one transaction when it opens a file. The PostgreSQL outbox keeps its
migrations as SQL files beside this module, in ``postgres/``.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]


def _v1(db: sqlite_utils.Database) -> None:
    db.table("intents").create(
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
    db.table("intents").create_index(["reference"], index_name="intents_reference", unique=True)
    db.table("intents").create_index(["key"], index_name="intents_key", unique=True)
    # Partial indexes: only the few rows a claim looks for are in them, so a
    # call that succeeds touches one of them twice (in, then out of "sending")
    # and the claim stays as fast at a million finished rows as at ten thousand.
    # claim_due spells these states as literals so the planner can use them.
    # (purge and stats scan: they are operator commands, not the hot path.)
    db.execute("CREATE INDEX intents_due ON intents (due_at) WHERE state = 'pending'")
    db.execute("CREATE INDEX intents_touched ON intents (updated_at) WHERE state = 'pending'")
    db.execute("CREATE INDEX intents_lease ON intents (lease_expires_at) WHERE state = 'sending'")
    # WITHOUT ROWID, keyed by (intent, number): one B-tree per attempt written,
    # not a table and an index.
    db.execute(
        "CREATE TABLE attempts ("
        " intent_id INTEGER NOT NULL REFERENCES intents (id),"
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


def _v2(db: sqlite_utils.Database) -> None:
    """Sender identity: who may send an intent (``sender``) and where it goes (``origin``).

    Rows written before this version have neither; the first client whose
    origins include a row's origin adopts it (``Store.adopt``). Claims read
    one sender's due rows, so the claim indexes lead with the sender.
    """
    db.execute("ALTER TABLE intents ADD COLUMN sender TEXT")
    db.execute("ALTER TABLE intents ADD COLUMN origin TEXT")
    db.execute("DROP INDEX intents_due")
    db.execute("DROP INDEX intents_lease")
    db.execute("CREATE INDEX intents_due ON intents (sender, due_at) WHERE state = 'pending'")
    db.execute(
        "CREATE INDEX intents_lease ON intents (sender, lease_expires_at) WHERE state = 'sending'"
    )
    db.execute("CREATE INDEX intents_unowned ON intents (id) WHERE sender IS NULL")


def _v3(db: sqlite_utils.Database) -> None:
    """Outcomes reach the application: ``meta``, settlements owed and delivered, reconciling.

    ``settle_due_at`` is set while a settlement handler owes a call (from when);
    ``settled_at`` once it returned. ``reconcile_at`` is when a drain may next
    ask the reconciler about an expired intent.
    """
    for column in (
        "meta TEXT",
        "settle_due_at REAL",
        "settle_attempts INTEGER NOT NULL DEFAULT 0",
        "settle_error TEXT",
        "settled_at REAL",
        "reconcile_at REAL",
    ):
        db.execute(f"ALTER TABLE intents ADD COLUMN {column}")
    db.execute(
        "CREATE INDEX intents_settle ON intents (sender, settle_due_at)"
        " WHERE settle_due_at IS NOT NULL"
    )
    db.execute(
        "CREATE INDEX intents_expired ON intents (sender, reconcile_at) WHERE state = 'expired'"
    )


def _v4(db: sqlite_utils.Database) -> None:
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
    db.execute("DROP INDEX intents_key")
    db.execute("CREATE UNIQUE INDEX intents_key ON intents (key) WHERE key != reference")
    db.execute(
        "CREATE TRIGGER intents_key_unnamed BEFORE INSERT ON intents"
        " WHEN NEW.key = NEW.reference AND EXISTS"
        " (SELECT 1 FROM intents WHERE key = NEW.key AND key != reference)"
        " BEGIN SELECT RAISE(IGNORE); END"
    )
    db.execute(
        "CREATE TRIGGER intents_key_named BEFORE INSERT ON intents"
        " WHEN NEW.key != NEW.reference AND EXISTS"
        " (SELECT 1 FROM intents WHERE reference = NEW.key AND key = reference)"
        " BEGIN SELECT RAISE(IGNORE); END"
    )


def _v5(db: sqlite_utils.Database) -> None:
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
    db.execute("DROP INDEX intents_lease")
    db.execute(
        "CREATE INDEX intents_lease ON intents (sender, lease_expires_at)"
        " WHERE lease_expires_at IS NOT NULL"
    )


def _v6(db: sqlite_utils.Database) -> None:
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
    db.execute("ALTER TABLE intents ADD COLUMN fresh INTEGER")
    # One row, for good: a missing watermark would hide the tail from every claim.
    db.execute(
        "CREATE TABLE intents_swept (one INTEGER PRIMARY KEY CHECK (one = 1),"
        " upto INTEGER NOT NULL)"
    )
    db.execute("INSERT INTO intents_swept (one, upto) SELECT 1, coalesce(max(id), 0) FROM intents")
    db.execute(
        "CREATE TRIGGER intents_swept_stays BEFORE DELETE ON intents_swept"
        " BEGIN SELECT RAISE(ABORT, 'the outbox needs its sweep watermark'); END"
    )
    db.execute("DROP INDEX intents_lease")
    db.execute(
        "CREATE INDEX intents_lease ON intents (sender, lease_expires_at)"
        " WHERE lease_expires_at IS NOT NULL AND fresh IS NULL"
    )
    db.execute(
        "CREATE TRIGGER intents_fresh_leased AFTER UPDATE OF lease_expires_at ON intents"
        " WHEN NEW.fresh IS NOT NULL AND NEW.state = 'sending'"
        " BEGIN UPDATE intents SET fresh = NULL WHERE id = NEW.id; END"
    )
    db.execute(
        "CREATE TRIGGER intents_swept_back AFTER DELETE ON intents"
        " WHEN OLD.id >= coalesce((SELECT upto FROM intents_swept), 0)"
        " BEGIN UPDATE intents_swept"
        " SET upto = min(upto, (SELECT coalesce(max(id), 0) FROM intents)); END"
    )


def _v7(db: sqlite_utils.Database) -> None:
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
    db.execute("DROP INDEX intents_expired")
    db.execute(
        "CREATE INDEX intents_unresolved ON intents (sender, reconcile_at)"
        " WHERE state IN ('expired', 'indeterminate')"
    )


def _v8(db: sqlite_utils.Database) -> None:
    """An intent sent with a call's own secrets says which: ``needs``.

    A JSON list of their names (headers in lower case, query parameters as
    ``?name``), never a value; NULL for an intent whose sends need only the
    client's own credentials, as every row written before this version. A
    process of an older release neither writes nor reads it.
    """
    db.execute("ALTER TABLE intents ADD COLUMN needs TEXT")


#: MIGRATIONS[n] takes a database at schema version n to n + 1.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _v1,
    _v2,
    _v3,
    _v4,
    _v5,
    _v6,
    _v7,
    _v8,
]
SCHEMA_VERSION = len(MIGRATIONS)
