"""Nested keys: strings or tuples of strings for nested entries, TorchRL style.

``("next", "obs")`` is a nested key; a one-element tuple is the same key as its string.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from xpbank.errors import SpecError

__all__ = ["NestedKey", "is_next_key", "key_str", "normalize_key"]

NestedKey: TypeAlias = "str | tuple[str, ...]"


def normalize_key(key: Any) -> NestedKey:
    """Return ``key`` as a str, or a tuple of two or more strs."""
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and key and all(isinstance(part, str) for part in key):
        return key[0] if len(key) == 1 else key
    raise SpecError(f"a key must be a str or a non-empty tuple of str, got {key!r}")


def key_str(key: NestedKey) -> str:
    """A key as people read it: ``'obs'``, ``'next.obs'``."""
    return key if isinstance(key, str) else ".".join(key)


_FLAT_NEXT = frozenset(("terminated", "truncated", "done"))


def is_next_key(key: NestedKey) -> bool:
    """Whether a field belongs to the step's outcome (the next step) by its name: with
    TorchRL keys everything under ``"next"``; with flat keys ``next_*`` and
    ``terminated``, ``truncated``, ``done`` (a flat ``reward`` is the step's own).

    Example:
        >>> [is_next_key(k) for k in ("obs", "next_obs", "done", ("next", "reward"))]
        [False, True, True, True]
    """
    if isinstance(key, tuple):
        return key[0] == "next"
    return key.startswith("next_") or key in _FLAT_NEXT
