"""``quick_init``: a frozen dataclass's ``__init__``, without its per-field lookups.

One ``post_once`` makes about sixteen frozen records (the intent and its
lease, the attempt, its step, the answer's info...), some 120 fields in all. A
frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (its own ``__setattr__`` refuses), which looks the slot up
again for every field: 28 fields cost ten times a mutable dataclass's
``__init__``. :func:`quick_init` swaps in an ``__init__`` that calls each slot's
descriptor, found once per class: about a third of the cost, and nothing else
changes (signature, defaults, equality, hashing, immutability, ``replace``).

A descriptor's ``__set__`` is still a call that builds an argument tuple
(~600 CPU instructions a field, against ~60 for a plain attribute store). So
a record of :data:`TWIN_FROM` fields or more is built another way: for the
length of its ``__init__`` the new instance is made an instance of a *twin*, a
plain class with the same slots and no ``__setattr__`` of its own; the fields
are stored as plain attributes, and the instance is made the record again.
Each switch costs about two fields' worth of descriptor calls, so it pays
from five fields on (the intent record has 28). Only an instance of the class
itself is switched: a subclass may have another layout, and takes the
descriptors. Each switch raises the ``object.__setattr__`` audit event (twelve
per ``post_once``): an audit hook that refuses ``__class__`` assignment refuses
postonce's calls.
"""

from __future__ import annotations

import dataclasses
import inspect
import sysconfig
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["TWIN_FROM", "maker", "quick_init", "replacer"]

_T = TypeVar("_T")
_P = ParamSpec("_P")

#: The fewest fields for which the twin pays (see the module's docstring).
TWIN_FROM = 5


def _shape(init: Any) -> list[tuple[str, Any, Any]]:
    """An ``__init__``'s parameters as (name, kind, default), ``self`` left out."""
    params = list(inspect.signature(init).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in params]


def quick_init(cls: _T) -> _T:
    """Give ``cls``, a ``dataclass(frozen=True, slots=True)``, an ``__init__`` of slot stores.

    Refuses (``TypeError``) a class it cannot copy exactly: not frozen or not
    slotted, or with a default factory, an init-only, keyword-only or non-init
    field, a field named ``self`` or starting with ``_``, or a ``__post_init__``.
    """
    assert isinstance(cls, type)
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a dataclass(frozen=True, slots=True)")
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or any(
        f.default_factory is not dataclasses.MISSING
        or not f.init
        or f.kw_only
        or f.name == "self"
        or f.name.startswith("_")  # the generated code's own names (_cls, _set_a...) start so
        for f in fields
    ):
        raise TypeError(f"{cls.__name__}: quick_init copies plain fields only")
    namespace: dict[str, Any] = {}
    signature = []
    for f in fields:
        namespace[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is dataclasses.MISSING:
            signature.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")

    def lines(template: str, indent: str) -> str:
        return "".join(f"{indent}{template.format(f.name)}\n" for f in fields)

    # Each field stored through its descriptor, or (on a twin) as a plain attribute.
    descriptors, stores = "_set_{0}(self, {0})", "self.{0} = {0}"
    twin = _twin(cls) if len(fields) >= TWIN_FROM else None
    namespace.update(_cls=cls, _twin=twin, _new=object.__new__, _switch=object.__setattr__)
    if twin is None:
        body = lines(descriptors, "    ") or "    pass\n"
        made = "    self = _new(_cls)\n" + lines(descriptors, "    ")
    else:
        body = (
            "    if type(self) is _cls:\n"
            "        _switch(self, '__class__', _twin)\n"
            f"{lines(stores, '        ')}"
            "        self.__class__ = _cls\n"
            "    else:\n"
            f"{lines(descriptors, '        ')}"
        )
        made = f"    self = _new(_twin)\n{lines(stores, '    ')}    self.__class__ = _cls\n"
    # The maker: the same record without the class call (see :func:`maker`).
    made += "    return self\n"
    # The replacer: the record with some fields changed (see :func:`replacer`).
    keep = "{0}=_keep"
    kept = "_self.{0} if {0} is _keep else {0}"
    if twin is None:
        copied = "    self = _new(_cls)\n" + lines(f"_set_{{0}}(self, {kept})", "    ")
    else:
        copied = f"    self = _new(_twin)\n{lines(f'self.{{0}} = {kept}', '    ')}"
        copied += "    self.__class__ = _cls\n"
    given = ", ".join(f"({f.name!r}, {f.name})" for f in fields)
    copied = (
        "    if type(_self) is not _cls:  # a subclass: its own class call, as replace() does\n"
        f"        return _replace(_self, **{{n: v for n, v in ({given},) if v is not _keep}})\n"
        f"{copied}    return self\n"
    )
    namespace.update(_keep=_KEEP, _replace=dataclasses.replace)
    # Generated once per class, from its own field names, as dataclasses does.
    exec(f"def __init__(self, {', '.join(signature)}):\n{body}", namespace)  # noqa: S102
    exec(f"def make({', '.join(signature)}):\n{made}", namespace)  # noqa: S102
    changes = ", ".join(keep.format(f.name) for f in fields)
    exec(f"def replace(_self, *, {changes}):\n{copied}", namespace)  # noqa: S102
    for name, attribute in (("make", "_quick_make"), ("replace", "_quick_replace")):
        function = namespace[name]
        function.__qualname__ = f"{cls.__qualname__}.{name}"
        function.__module__ = cls.__module__
        setattr(cls, attribute, staticmethod(function))  # read by maker() and replacer()
    init = namespace["__init__"]
    generated = cls.__dict__["__init__"]
    if _shape(init) != _shape(generated):  # an InitVar, or a change in dataclasses
        raise TypeError(f"{cls.__name__}: quick_init would change the signature")
    # What help() and inspect.signature() show: the dataclass's own annotations.
    init.__qualname__ = generated.__qualname__
    init.__module__ = cls.__module__
    init.__annotations__ = dict(generated.__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls


def maker(cls: Callable[_P, _T]) -> Callable[_P, _T]:
    """A function that builds ``cls``'s records as ``cls(...)`` does, for the hot path.

    A class call with keywords goes through a dict (the class packs the
    keywords, its ``__init__`` unpacks them) and then ``__init__``; a plain
    function takes the keywords as they are and builds the record itself:
    ~3.6k CPU instructions for a 6-field record built with keywords, against
    ~7.9k for the class call (callgrind). The same parameters, defaults and
    errors; typed as ``cls`` is. ``cls`` must be a :func:`quick_init` record.
    """
    made = cls.__dict__.get("_quick_make") if isinstance(cls, type) else None
    if made is None:  # not quick_init's: a subclass of one inherits its parent's maker
        raise TypeError(f"{cls!r} is not a quick_init record")
    built: Callable[_P, _T] = made.__func__
    return built


def replacer(cls: type[_T]) -> Callable[..., _T]:
    """A function that copies a ``cls`` record with some fields changed, as ``dataclasses.replace``.

    ``dataclasses.replace`` reads every field into a dict of keywords and calls
    the class with them; this one stores each field once, the given value or
    the record's own (a drain's claim copies each intent it takes). The same
    record, the same errors for a field that is not one; an instance of a
    subclass is copied by ``dataclasses.replace`` itself, keeping its class
    (but only ``cls``'s fields can be changed: the parameters are ``cls``'s).
    """
    made = cls.__dict__.get("_quick_replace")
    if made is None:  # not quick_init's (a subclass inherits its parent's)
        raise TypeError(f"{cls!r} is not a quick_init record")
    copy: Callable[..., _T] = made.__func__
    return copy


#: A field the replacer was not given: the record's own value is kept.
_KEEP: Any = object()


def _twin(cls: type) -> type | None:
    """A plain class with ``cls``'s slots that an instance can be switched to and back; or None.

    Tried once on a blank instance: where Python refuses the twin or the switch
    (another layout, a generic base), the record keeps the descriptor stores.
    So it does on a free-threaded Python, where a class switch may stop every
    thread.
    """
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    try:
        slots = cls.__dict__["__slots__"]
        twin = type(f"{cls.__name__}Unfrozen", cls.__bases__, {"__slots__": slots})
        probe: Any = object.__new__(cls)
        object.__setattr__(probe, "__class__", twin)
        probe.__class__ = cls
    except TypeError:
        return None
    return twin
