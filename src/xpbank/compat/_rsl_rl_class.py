"""The class a :mod:`xpbank.compat.rsl_rl` storage has before and after its layout is fixed.

rsl_rl's PPO reads the storage's tensor attributes ~150 times per ``compute_returns``.
CPython (3.11 and 3.12) does not specialize an attribute read on a class that defines
``__getattr__`` or holds a class attribute of the same name: such a read costs ~26 ns
against ~7 ns on rsl_rl's own plain class (a few % of the returns loop at 16 envs). So a
storage changes class once: before its first step it is a :func:`pending` class whose
``__getattr__`` answers for rsl_rl's attributes (``None``, or
:class:`~xpbank.NotReadyError`); once laid out it is a :func:`laid_out` class, the
user's own class where the layout has every field, else a subclass whose only extra
members are :class:`_Absent` descriptors for the fields this layout lacks
(:class:`~xpbank.SpecError` when read). Both kinds are made once per (user class,
absent fields) and named as the user's class; ``isinstance`` with the user's class holds
throughout, and pickling records the user's class (the dynamic classes are never pickled).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from xpbank.compat._rsl_rl_views import ATTRIBUTES, missing

__all__ = ["pending", "laid_out", "user_class", "restore", "absent_fields", "class_for"]

_USER = "_xpbank_user_class"  # set in a dynamic class's own dict: the class it stands for


def user_class(cls: type) -> type:
    """The class a user made the storage with (``cls`` itself unless ``cls`` is dynamic)."""
    return vars(cls).get(_USER, cls)


class _Pending:
    """rsl_rl's tensor attributes before the layout is fixed (mixed in first)."""

    def __getattr__(self, name: str) -> Any:
        """``None`` where rsl_rl's attribute is ``None`` too, else an xpbank error
        (:func:`~xpbank.compat._rsl_rl_views.missing`); not called once laid out."""
        return missing(name, self.__dict__.get("_views") is not None)


class _Absent:
    """A field this storage's layout lacks: reading it raises :class:`~xpbank.SpecError`.
    A non-data descriptor, so a field the layout gains later (its instance attribute)
    takes its place."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return missing(self.name, True)


def _dynamic(cls: type, bases: tuple[type, ...], members: dict[str, Any]) -> type:
    names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    return type(cls.__name__, bases, {**names, **members, _USER: cls})


@cache
def pending(cls: type) -> type:
    """``cls`` with ``__getattr__`` answering for rsl_rl's attributes: a storage's class
    until its first step is stored."""
    return _dynamic(cls, (_Pending, cls), {})


@cache
def laid_out(cls: type, absent: frozenset[str]) -> type:
    """``cls`` once laid out: itself, or with a :class:`_Absent` per field in ``absent``."""
    if not absent:
        return cls
    return _dynamic(cls, (cls,), {name: _Absent(name) for name in sorted(absent)})


def restore(cls: type, state: dict[str, Any]) -> Any:
    """Unpickle a storage of user class ``cls`` (its class chosen from its state)."""
    obj: Any = object.__new__(pending(cls))
    obj.__dict__.update(state)
    views = state.get("_views")
    if views is not None:
        obj.__class__ = class_for(cls, views.attributes())
    return obj


def class_for(cls: type, attributes: dict[str, Any]) -> type:
    """The laid-out class of a storage of user class ``cls`` holding ``attributes``."""
    return laid_out(cls, absent_fields(set(attributes)))


def absent_fields(present: set[str]) -> frozenset[str]:
    """rsl_rl's attributes (of either training type) that a layout with ``present`` lacks."""
    return frozenset(name for name, none in ATTRIBUTES.items() if not none and name not in present)
