"""``quick_init``: a frozen dataclass's ``__init__`` made cheap, and nothing else changed."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import pickle
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any, Generic, TypeVar

import pytest

from postonce._engine import Budget, Step
from postonce._flow import Callback, Send, Sender, Sleep, StoreCall, _Tried, _Wire
from postonce._frozen import TWIN_FROM, maker, quick_init, replacer
from postonce._intent import IntentInfo, IntentRecord, State, StoredResponse
from postonce._outbox.base import AttemptRecord, Lease, NewIntent, Opened
from postonce._wire import Prepared


@dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str
    c: float | None = None
    d: tuple[int, ...] = ()


@quick_init
@dataclass(frozen=True, slots=True)
class Quick:
    a: int
    b: str
    c: float | None = None
    d: tuple[int, ...] = ()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        pytest.param((1, "x"), {}, id="defaults"),
        pytest.param((1, "x", 2.5, (3,)), {}, id="positional"),
        pytest.param((), {"b": "x", "a": 1, "d": (4, 5)}, id="keywords"),
        pytest.param((1,), {"b": "x", "c": None}, id="mixed"),
    ],
)
def test_a_quick_init_record_is_the_plain_one(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Same fields, repr, equality, hash and replace as the dataclass's own __init__ gives."""
    plain, quick = Plain(*args, **kwargs), Quick(*args, **kwargs)
    assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
    assert repr(quick) == repr(plain).replace("Plain", "Quick")
    assert quick == Quick(*args, **kwargs)
    assert hash(quick) == hash(Quick(*args, **kwargs))
    assert dataclasses.replace(quick, a=9).a == 9


def test_a_quick_init_record_stays_frozen() -> None:
    """Setting a field still raises FrozenInstanceError; there is still no __dict__."""
    quick = Quick(1, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.a = 2  # type: ignore[misc]
    assert not hasattr(quick, "__dict__")


@dataclass(frozen=True, slots=True)
class PlainWide:
    a: int
    b: str
    c: float | None
    d: tuple[int, ...]
    e: bytes = b""
    f: object = None


@quick_init
@dataclass(frozen=True, slots=True)
class QuickWide:
    a: int
    b: str
    c: float | None
    d: tuple[int, ...]
    e: bytes = b""
    f: object = None


class QuickWideChild(QuickWide):
    """A plain subclass: it has a ``__dict__``, so it cannot take the twin's layout."""


def test_a_wide_record_built_through_its_twin_is_the_plain_one() -> None:
    """From TWIN_FROM fields on, the record is built as a twin and switched back: nothing shows.

    Same fields, repr, equality, hash, type and immutability; copies and
    pickles come back equal; no ``__dict__``.
    """
    assert len(dataclasses.fields(QuickWide)) >= TWIN_FROM
    assert "_twin" in QuickWide.__init__.__code__.co_names  # built the twin's way
    plain, quick = PlainWide(1, "x", 2.5, (3,), f=[1]), QuickWide(1, "x", 2.5, (3,), f=[1])
    assert type(quick) is QuickWide
    assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
    assert repr(quick) == repr(plain).replace("PlainWide", "QuickWide")
    assert quick == QuickWide(1, "x", 2.5, (3,), f=[1]) != QuickWide(1, "x", 2.5, (3,), f=[2])
    assert hash(QuickWide(1, "x", None, ())) == hash(QuickWide(1, "x", None, ()))
    assert copy.copy(quick) == quick == pickle.loads(pickle.dumps(quick))  # noqa: S301  # our own bytes
    assert dataclasses.replace(quick, a=9).a == 9
    assert not hasattr(quick, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.a = 2  # type: ignore[misc]
    # Nor is its class to be changed, as with the plain record (dataclasses refuses both).
    for record, other in ((plain, QuickWide), (quick, PlainWide)):
        with pytest.raises(TypeError):
            record.__class__ = other
    with pytest.raises(TypeError):
        QuickWide(1, "x", 2.5)  # type: ignore[call-arg]


def test_a_subclass_of_a_wide_record_is_built_through_its_descriptors() -> None:
    """A subclass keeps its own type and fields (it has another layout than the twin)."""
    child = QuickWideChild(1, "x", None, (), f="y")
    assert type(child) is QuickWideChild
    assert (child.a, child.b, child.f) == (1, "x", "y")
    with pytest.raises(dataclasses.FrozenInstanceError):
        child.a = 2  # type: ignore[misc]


def test_wrong_calls_fail_as_before() -> None:
    """A missing or unknown argument is a TypeError, as with the dataclass's own __init__."""
    with pytest.raises(TypeError):
        Quick(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, "x", e=3)  # type: ignore[call-arg]


def _noop(self: object) -> None:
    pass


_make = functools.partial(dataclasses.make_dataclass, "Refused")
_frozen_slotted = functools.partial(_make, frozen=True, slots=True)

#: Classes quick_init cannot copy exactly, each built by dataclasses itself.
_REFUSED: dict[str, Callable[[], type]] = {
    "mutable": lambda: _make([("a", int)], slots=True),
    "unslotted": lambda: _make([("a", int)], frozen=True),
    "factory": lambda: _frozen_slotted([("a", list, field(default_factory=list))]),
    "post-init": lambda: _frozen_slotted([("a", int)], namespace={"__post_init__": _noop}),
    "kw-only": lambda: _frozen_slotted([("a", int)], kw_only=True),
    "init-var": lambda: _frozen_slotted([("a", int), ("b", InitVar[int])]),
    "self-field": lambda: _frozen_slotted([("self", int)]),
    "underscore-field": lambda: _frozen_slotted([("_cls", int)]),
}


@pytest.mark.parametrize("make", _REFUSED.values(), ids=list(_REFUSED))
def test_a_class_it_cannot_copy_exactly_is_refused(make: Callable[[], type]) -> None:
    """quick_init refuses what its __init__ would not reproduce."""
    cls = make()  # dataclasses itself builds it: the refusal below is quick_init's
    with pytest.raises(TypeError):
        quick_init(cls)


@pytest.mark.parametrize(
    "cls",
    [
        StoredResponse, IntentRecord, IntentInfo, NewIntent, Lease, Opened, AttemptRecord,
        Prepared, Step, Budget, StoreCall, Send, Sleep, Sender, Callback, _Wire, _Tried,
    ],
)  # fmt: skip
def test_the_hot_records_take_their_fields_as_declared(cls: type) -> None:
    """Each record the hot path makes has one parameter per field, with the field's default."""
    params = list(inspect.signature(cls).parameters.values())
    declared = [
        (f.name, inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(cls)
    ]
    assert [(p.name, p.default) for p in params] == declared
    init = cls.__dict__["__init__"]
    assert init.__qualname__ == f"{cls.__qualname__}.__init__"
    assert init.__module__ == cls.__module__
    annotated = {name: kind for name, kind in init.__annotations__.items() if name != "return"}
    assert list(annotated) == [f.name for f in dataclasses.fields(cls)]  # help() shows types
    assert any(name.startswith("_set_") for name in init.__code__.co_names)  # quick_init's


@pytest.mark.parametrize("cls", [Quick, QuickWide], ids=["descriptors", "twin"])
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        pytest.param((1, "x", None, ()), {}, id="positional"),
        pytest.param((), {"d": (4,), "c": 0.5, "b": "x", "a": 1}, id="keywords"),
        pytest.param((1, "x"), {"c": None, "d": ()}, id="mixed"),
    ],
)
def test_a_maker_builds_the_record_the_class_builds(
    cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """maker(cls)(...) is cls(...): same type, fields, defaults and equality, still frozen."""
    made, called = maker(cls)(*args, **kwargs), cls(*args, **kwargs)
    assert type(made) is cls
    assert made == called
    assert hash(made) == hash(called)
    assert dataclasses.astuple(made) == dataclasses.astuple(called)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.a = 2
    with pytest.raises(TypeError):
        maker(cls)(1)  # a required field missing, as with the class
    with pytest.raises(TypeError):
        maker(cls)(1, "x", None, (), zz=1)  # an unknown one


def test_only_a_quick_init_record_has_a_maker() -> None:
    """maker() refuses a class quick_init did not build (it would have no maker)."""
    with pytest.raises(TypeError):
        maker(Plain)


def test_a_subclass_quick_init_did_not_build_has_no_maker() -> None:
    """maker() refuses a subclass: it would inherit its parent's maker and build the parent."""
    with pytest.raises(TypeError):
        maker(QuickWideChild)


_Value = TypeVar("_Value")


@quick_init
@dataclass(frozen=True, slots=True)
class GenericWide(Generic[_Value]):
    """A generic record: Python refuses a twin of it, so it keeps the descriptor stores."""

    a: _Value
    b: _Value
    c: _Value
    d: _Value
    e: _Value


@quick_init
@dataclass(frozen=True, slots=True)
class GenericWideInts(Generic[_Value]):
    """The shape of Quick, generic: no twin, so its replacer stores through descriptors."""

    a: int
    b: str
    c: float | None
    d: tuple[int, ...]
    e: _Value | None = None


def test_a_record_python_will_not_twin_is_built_as_before() -> None:
    """A record no twin can be made for (a generic one) is still decorated, and builds right."""
    assert "_twin" not in GenericWide.__init__.__code__.co_names
    for built in (GenericWide(1, 2, 3, 4, 5), maker(GenericWide)(1, 2, 3, 4, e=5)):
        assert type(built) is GenericWide
        assert dataclasses.astuple(built) == (1, 2, 3, 4, 5)


@pytest.mark.parametrize(
    "cls", [Quick, QuickWide, GenericWideInts], ids=["descriptors", "twin", "generic"]
)
@pytest.mark.parametrize(
    "changes",
    [{}, {"a": 9}, {"b": "y", "d": (7,)}, {"a": 2, "b": "z", "c": 1.5, "d": ()}],
    ids=["none", "one", "two", "all"],
)
def test_a_replacer_copies_as_dataclasses_replace(cls: Any, changes: dict[str, Any]) -> None:
    """replacer(cls)(record, **changes) is dataclasses.replace(record, **changes), and is new."""
    record = cls(1, "x", None, (3,))
    copied, replaced = replacer(cls)(record, **changes), dataclasses.replace(record, **changes)
    assert type(copied) is cls
    assert copied == replaced
    assert dataclasses.astuple(copied) == dataclasses.astuple(replaced)
    assert copied is not record
    assert record == cls(1, "x", None, (3,))  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        copied.a = 2
    with pytest.raises(TypeError):
        replacer(cls)(record, zz=1)  # not a field, as with replace()
    with pytest.raises(TypeError):
        replacer(cls)(record, 5)  # fields by keyword only, as with replace()


def test_a_replacer_keeps_a_subclass_instance_of_its_class() -> None:
    """A subclass instance is copied as replace() does: still the subclass."""
    child = QuickWideChild(1, "x", None, (), f="y")
    copied = replacer(QuickWide)(child, a=5)
    assert type(copied) is QuickWideChild
    assert (copied.a, copied.b, copied.f) == (5, "x", "y")


def test_only_a_quick_init_record_has_a_replacer() -> None:
    """replacer() refuses a plain dataclass and a subclass quick_init did not build."""
    for cls in (Plain, QuickWideChild):
        with pytest.raises(TypeError):
            replacer(cls)


def test_the_hot_records_replace_as_dataclasses_does() -> None:
    """A claim's copies of the intent record and its lease, by replacer and by replace()."""
    record = IntentRecord(
        *(3, "r", "k", "p", "POST", "http://x/", (("a", "b"),), b"{}", "f", State.PENDING),
        *(1.0, None, 2.0, None, 1, None, None, None, None, None),
    )
    copied = replacer(IntentRecord)(
        record, state=State.SENDING, first_delivery_at=2.0, lease_owner="o"
    )
    assert copied == dataclasses.replace(
        record, state=State.SENDING, first_delivery_at=2.0, lease_owner="o"
    )
    lease = Lease(0, "t", "o", 5.0)
    assert replacer(Lease)(lease, intent_id=3) == dataclasses.replace(lease, intent_id=3)
