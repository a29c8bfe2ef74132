"""postonce: make a non-idempotent HTTP call happen once.

One idempotency key per intent, written ahead to a durable outbox, carried by
every retry, and never re-sent after the provider may have forgotten it.
"""

import typing as _typing

from ._async_client import AsyncClient
from ._base import ONE_OFF, OnceOptions
from ._budget import RetryBudget
from ._client import Client
from ._drain import DrainReport
from ._exceptions import (
    ConfigurationError,
    IdempotencyKeyMismatch,
    IntentCancelled,
    IntentConflict,
    IntentError,
    IntentExpired,
    IntentIndeterminate,
    IntentPending,
    IntentPurged,
    IntentResolved,
    InvalidKey,
    InvalidRequest,
    OutboxError,
    PostonceError,
    UnknownIntent,
    UnknownProvider,
)
from ._intent import AttemptRecord, IntentInfo, IntentRecord, Outcome, State, StoredResponse
from ._notify import NotificationIds, Notified, notification_ids
from ._observe import (
    AttemptDetail,
    EndDetail,
    ExpiryDetail,
    GiveUpDetail,
    Hooks,
    OnceInfo,
    ReplayDetail,
    RetryDetail,
    SendDetail,
    StartDetail,
    info,
)
from ._outbox import SQLiteStore, Store, default_outbox_path
from ._policy import RetryPolicy
from ._receive import receive_once, receive_once_async
from ._settle import Resolution, Settlement
from ._version import __version__
from .providers import BUILTIN_PROVIDERS, Provider, StatusRule, get_provider

if _typing.TYPE_CHECKING:
    from ._outbox.postgres import PostgresStore as PostgresStore

__all__ = [
    "BUILTIN_PROVIDERS",
    "ONE_OFF",
    "AsyncClient",
    "AttemptDetail",
    "AttemptRecord",
    "Client",
    "ConfigurationError",
    "DrainReport",
    "EndDetail",
    "ExpiryDetail",
    "GiveUpDetail",
    "Hooks",
    "IdempotencyKeyMismatch",
    "IntentCancelled",
    "IntentConflict",
    "IntentError",
    "IntentExpired",
    "IntentIndeterminate",
    "IntentInfo",
    "IntentPending",
    "IntentPurged",
    "IntentRecord",
    "IntentResolved",
    "InvalidKey",
    "InvalidRequest",
    "NotificationIds",
    "Notified",
    "OnceInfo",
    "OnceOptions",
    "OutboxError",
    "Outcome",
    "PostonceError",
    "Provider",
    "ReplayDetail",
    "Resolution",
    "RetryBudget",
    "RetryDetail",
    "RetryPolicy",
    "SQLiteStore",
    "SendDetail",
    "Settlement",
    "StartDetail",
    "State",
    "StatusRule",
    "Store",
    "StoredResponse",
    "UnknownIntent",
    "UnknownProvider",
    "__version__",
    "default_outbox_path",
    "get_provider",
    "info",
    "notification_ids",
    "receive_once",
    "receive_once_async",
]


def __getattr__(name: str) -> object:
    """``postonce.PostgresStore``, imported on first use: psycopg is the ``postgres`` extra.

    Left out of ``__all__``, so ``from postonce import *`` works without it.
    """
    if name == "PostgresStore":
        try:
            from ._outbox.postgres import PostgresStore
        except ImportError as exc:
            raise ImportError(
                "postonce.PostgresStore needs psycopg 3: pip install 'postonce[postgres]'"
            ) from exc
        return PostgresStore
    raise AttributeError(f"module 'postonce' has no attribute {name!r}")
