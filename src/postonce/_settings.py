"""A client's configuration: one typed object, validated once when the client is built.

``Client`` and ``AsyncClient`` take the same options; :func:`settings` checks
them, each by a short named rule, and returns the frozen :class:`Settings`
the client then reads (``client.settings``). A wrong option fails here, where
the client is built, with a ``ConfigurationError`` that names it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

from ._budget import RetryBudget
from ._exceptions import ConfigurationError
from ._intent import IntentRecord
from ._observe import Hooks, coroutine_hooks, is_coroutine_function
from ._outbox.sqlite import Durability
from ._policy import RetryPolicy
from ._sender import DEFAULT_SECRET_PARAMS, check_name
from ._wire import DEFAULT_SECRET_HEADERS
from .providers import Provider, get_provider

__all__ = ["Setting", "Settings", "settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """What a client was configured with, checked (see ``Client`` for each option)."""

    provider: Provider
    retry: RetryPolicy
    durability: Durability
    lease_seconds: float
    #: Seconds between renewals of a lease while its send is in flight (None: off).
    heartbeat: float | None
    clock: Callable[[], float]
    hooks: tuple[Hooks, ...]
    #: The client-wide retry budget (None: retries are never held back).
    retry_budget: RetryBudget | None
    name: str | None
    origins: Collection[str] | None  # as given; the client resolves them with its base URL
    #: Header names never stored (lower case): the defaults, the profile's, the client's own.
    secret_names: frozenset[str]
    #: Query parameter names never stored (lower case).
    secret_params: frozenset[str]
    #: Called once (at least) per intent this client's sender ends: see ``Settlement``.
    on_settled: Callable[..., Any] | None
    #: Asked by drains about expired intents: a ``Resolution``, or None to leave it.
    reconcile: Callable[[IntentRecord], Any] | None
    reconcile_every: float
    #: Asked by drains for the secrets of an intent sent with credentials of its own call.
    credentials_for: Callable[[IntentRecord], Any] | None


T = TypeVar("T")


class Setting(Generic[T]):
    """A client attribute that is a field of its ``settings``: read there, set by a new one.

    ``client.retry = policy`` replaces ``client.settings`` with a copy that has
    the new policy: the settings stay one frozen object, and the next call
    sends by them.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, client: None, owner: type) -> Setting[T]: ...
    @overload
    def __get__(self, client: object, owner: type | None = None) -> T: ...
    def __get__(self, client: object, owner: type | None = None) -> T | Setting[T]:
        if client is None:
            return self
        value: T = getattr(client.settings, self.name)  # type: ignore[attr-defined]
        return value

    def __set__(self, client: object, value: T) -> None:
        settings = client.settings  # type: ignore[attr-defined]
        client.settings = dataclasses.replace(settings, **{self.name: value})  # type: ignore[attr-defined]


def settings(
    *,
    awaits: bool,
    provider: str | Provider,
    retry: RetryPolicy | None,
    durability: Durability,
    secret_headers: Collection[str],
    lease_seconds: float,
    heartbeat: float | Literal["auto"] | None = "auto",
    clock: Callable[[], float] | None = None,
    hooks: Hooks | Sequence[Hooks] | None = None,
    retry_budget: RetryBudget | bool = True,
    name: str | None = None,
    origins: Collection[str] | None = None,
    secret_params: Collection[str] = (),
    on_settled: Callable[..., Any] | None = None,
    reconcile: Callable[[IntentRecord], Any] | None = None,
    reconcile_every: float = 3600.0,
    credentials_for: Callable[[IntentRecord], Any] | None = None,
) -> Settings:
    """The checked settings of a client; ``awaits``: the client awaits coroutine callbacks."""
    profile = get_provider(provider)
    callbacks = {
        "on_settled": on_settled,
        "reconcile": reconcile,
        "credentials_for": credentials_for,
    }
    hooks_given = _hooks(hooks, awaits)
    if not awaits:
        _refuse_coroutines(callbacks)
    lease = _positive("lease_seconds", lease_seconds)
    return Settings(
        provider=profile,
        retry=retry if retry is not None else RetryPolicy(),
        durability=durability,
        lease_seconds=lease,
        heartbeat=_heartbeat(heartbeat, lease),
        clock=clock if clock is not None else time.time,
        hooks=hooks_given,
        retry_budget=_retry_budget(retry_budget),
        name=_name(name),
        origins=origins,
        secret_names=frozenset(
            {
                *DEFAULT_SECRET_HEADERS,
                *profile.credential_headers,
                *(header.lower() for header in secret_headers),
            }
        ),
        secret_params=frozenset(
            {*DEFAULT_SECRET_PARAMS, *(param.lower() for param in secret_params)}
        ),
        on_settled=on_settled,
        reconcile=reconcile,
        reconcile_every=_positive("reconcile_every", reconcile_every),
        credentials_for=credentials_for,
    )


def _positive(option: str, value: float) -> float:
    if not value > 0:
        raise ConfigurationError(f"{option} must be positive (seconds), not {value!r}")
    return float(value)


def _heartbeat(heartbeat: float | Literal["auto"] | None, lease_seconds: float) -> float | None:
    """Seconds between lease renewals: three a lease by default; each lease renewed twice."""
    if heartbeat == "auto":
        return lease_seconds / 3  # 5 s for the 15 s default
    if heartbeat is not None and not 0 < heartbeat <= lease_seconds / 2:
        raise ConfigurationError(
            f"heartbeat= must renew a lease at least twice before it runs out: between 0 and "
            f"lease_seconds / 2 ({lease_seconds / 2:g} s), not {heartbeat!r}"
        )
    return None if heartbeat is None else float(heartbeat)


def _hooks(hooks: Hooks | Sequence[Hooks] | None, awaits: bool) -> tuple[Hooks, ...]:
    given = () if hooks is None else (hooks,) if isinstance(hooks, Hooks) else tuple(hooks)
    if not all(isinstance(h, Hooks) for h in given):
        raise ConfigurationError("hooks= takes a postonce.Hooks or a sequence of them")
    if not awaits:
        for registered in given:
            for field, hook in coroutine_hooks(registered):
                raise ConfigurationError(
                    f"hook {field}={getattr(hook, '__qualname__', hook)!r} is a coroutine "
                    "function: postonce.Client calls hooks without awaiting them; use a "
                    "plain function, or postonce.AsyncClient, which awaits them"
                )
    return given


def _refuse_coroutines(callbacks: dict[str, Callable[..., Any] | None]) -> None:
    """Client calls its callbacks without awaiting them: a coroutine function is refused."""
    for role, fn in callbacks.items():
        if fn is not None and is_coroutine_function(fn):
            raise ConfigurationError(
                f"{role}= is a coroutine function: postonce.Client calls it without "
                "awaiting it; use a plain function, or postonce.AsyncClient"
            )


def _retry_budget(retry_budget: RetryBudget | bool) -> RetryBudget | None:
    if retry_budget is True:
        return RetryBudget()
    return None if retry_budget is False else retry_budget


def _name(name: str | None) -> str | None:
    try:
        return None if name is None else check_name(name)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
