"""How specs combine: ``Spec.merge`` (:class:`SpecMerge`), spelled either way.

``Spec.merge(a, b)`` was once only a classmethod, so ``a.merge(b)`` silently merged
``b`` alone and dropped every field of ``a``. The descriptor here makes both spellings
the union (``a`` first). It works on whatever class it is set on (``Spec``), so this
module needs no import of :mod:`xpbank.spec.spec`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from xpbank.errors import SpecError
from xpbank.spec.keys import NestedKey, key_str

__all__ = ["SpecMerge", "merge_specs"]


def merge_specs(base: type, cls: type, specs: Sequence[Any], names: Sequence[str] | None) -> Any:
    """The union of ``specs`` (each a ``base`` instance) as a ``cls``.

    Raises:
        SpecError: a spec that is no ``base``, a wrong number of ``names``, or a key with
            different fields in two specs (naming both).
    """
    labels = list(names) if names is not None else [f"spec {i}" for i in range(len(specs))]
    if len(labels) != len(specs):
        raise SpecError(f"merge: expected {len(specs)} names, got {len(labels)}")
    merged: dict[NestedKey, Any] = {}
    origin: dict[NestedKey, str] = {}
    for label, spec in zip(labels, specs, strict=True):
        if not isinstance(spec, base) or not isinstance(spec, Mapping):
            raise SpecError(f"merge: {label} is a {type(spec).__name__}, expected {base.__name__}")
        for key, field in spec.items():
            if key in merged and merged[key] != field:
                raise SpecError(
                    f"field {key_str(key)!r} is {merged[key].describe()} in {origin[key]} "
                    f"but {field.describe()} in {label}; rename one or make them agree"
                )
            merged.setdefault(key, field)
            origin.setdefault(key, label)
    return cls(merged)


class SpecMerge:
    """The union of specs: ``Spec.merge(a, b, ...)`` merges the specs given,
    ``a.merge(b, ...)`` merges ``a`` with them (``a`` first; both give the same spec).

    A key present in several must have the same field in each. ``names=``: a name per
    spec for error messages (default ``"spec 0"``, ...; with ``a.merge``, ``a`` is the
    first and is named too).

    Raises:
        SpecError: the same key with a different shape or dtype, naming both sources (a
            later spec never silently wins), or a wrong number of names.
    """

    _base: type = object

    def __set_name__(self, owner: type, name: str) -> None:
        self._base = owner

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        base = self._base
        if obj is None:

            def merge(*specs: Any, names: Sequence[str] | None = None) -> Any:
                return merge_specs(base, owner, specs, names)

        else:

            def merge(*specs: Any, names: Sequence[str] | None = None) -> Any:
                return merge_specs(base, type(obj), (obj, *specs), names)

        merge.__doc__ = SpecMerge.__doc__
        return merge
