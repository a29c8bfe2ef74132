"""The intent life cycle: which state moves are legal."""

from __future__ import annotations

import contextlib
import itertools

import pytest

from postonce._intent import TERMINAL, IllegalMove, State, move

# The life cycle, written out independently of the implementation's table.
LEGAL: frozenset[tuple[State, State]] = frozenset(
    {
        (State.PENDING, State.SENDING),
        (State.PENDING, State.CANCELLED),
        (State.PENDING, State.EXPIRED),
        (State.SENDING, State.SENDING),
        (State.SENDING, State.PENDING),
        (State.SENDING, State.SUCCEEDED),
        (State.SENDING, State.FAILED),
        (State.SENDING, State.EXPIRED),
        (State.SENDING, State.INDETERMINATE),
        (State.SENDING, State.CANCELLED),
        (State.EXPIRED, State.SUCCEEDED),
        (State.EXPIRED, State.FAILED),
        (State.INDETERMINATE, State.SUCCEEDED),
        (State.INDETERMINATE, State.FAILED),
    }
)

ALL_PAIRS = [
    pytest.param(current, to, id=f"{current.value}->{to.value}")
    for current, to in itertools.product(State, State)
]


@pytest.mark.parametrize(("current", "to"), ALL_PAIRS)
def test_move(current: State, to: State) -> None:
    """A legal move returns the target state; any other raises IllegalMove naming both."""
    if (current, to) in LEGAL:
        assert move(current, to) is to
    else:
        with pytest.raises(IllegalMove) as info:
            move(current, to)
        assert current.value in str(info.value)
        assert to.value in str(info.value)


def _targets(current: State) -> set[State]:
    allowed: set[State] = set()
    for to in State:
        with contextlib.suppress(IllegalMove):
            allowed.add(move(current, to))
    return allowed


@pytest.mark.parametrize(
    "current",
    [
        pytest.param(State.SUCCEEDED, id="succeeded"),
        pytest.param(State.FAILED, id="failed"),
        pytest.param(State.CANCELLED, id="cancelled"),
    ],
)
def test_nothing_leaves_final_states(current: State) -> None:
    """SUCCEEDED, FAILED and CANCELLED have no way out, not even to themselves."""
    assert _targets(current) == set()


def test_expired_only_resolves_to_an_answer() -> None:
    """EXPIRED moves only to SUCCEEDED or FAILED (operator resolution)."""
    assert _targets(State.EXPIRED) == {State.SUCCEEDED, State.FAILED}


def test_indeterminate_only_resolves_to_an_answer() -> None:
    """INDETERMINATE moves only to SUCCEEDED or FAILED (a reconciler's or a person's resolution)."""
    assert _targets(State.INDETERMINATE) == {State.SUCCEEDED, State.FAILED}


def test_terminal_states() -> None:
    """TERMINAL is exactly the five states a sender never leaves on its own."""
    assert (
        frozenset(
            {State.SUCCEEDED, State.FAILED, State.EXPIRED, State.INDETERMINATE, State.CANCELLED}
        )
        == TERMINAL
    )
    assert all(State.SENDING not in _targets(state) for state in TERMINAL)
    assert all(State.PENDING not in _targets(state) for state in TERMINAL)


def test_illegal_move_is_value_error() -> None:
    """IllegalMove is a ValueError."""
    with pytest.raises(ValueError, match="cannot move"):
        move(State.SUCCEEDED, State.PENDING)
