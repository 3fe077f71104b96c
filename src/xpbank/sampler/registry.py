"""Samplers by name, so a saved bank can rebuild its sampler without importing code.

A sampler class registers under a name with :func:`register_sampler` and provides
``config() -> dict`` of JSON-able constructor keyword arguments. A bank stores
``{"name": ..., "config": ...}`` (see :func:`sampler_config`) and :func:`make_sampler`
rebuilds it by looking the name up in :data:`SAMPLERS` only: a name that is not
registered is an error, never an import.

Example:
    >>> from xpbank.sampler import UniformSampler, make_sampler, sampler_config
    >>> sampler_config(UniformSampler())
    {'name': 'uniform', 'config': {}}
    >>> make_sampler({"name": "uniform", "config": {}})
    UniformSampler()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from xpbank.errors import SpecError

__all__ = ["SAMPLERS", "register_sampler", "sampler_config", "make_sampler"]

SAMPLERS: dict[str, type] = {}

T = TypeVar("T", bound=type)


def register_sampler(name: str) -> Callable[[T], T]:
    """Class decorator: make a sampler rebuildable from ``{"name": name, "config": ...}``.

    Raises:
        SpecError: ``name`` is already taken by another class.
    """

    def register(cls: T) -> T:
        if SAMPLERS.get(name, cls) is not cls:
            raise SpecError(f"sampler name {name!r} is already registered by {SAMPLERS[name].__name__}")
        SAMPLERS[name] = cls
        cls.registered_name = name  # type: ignore[attr-defined]
        return cls

    return register


def sampler_config(sampler: Any) -> dict[str, Any]:
    """``{"name": <registered name>, "config": sampler.config()}``.

    Raises:
        SpecError: the sampler's class is not registered.
    """
    name = getattr(type(sampler), "registered_name", None)
    if name is None or SAMPLERS.get(name) is not type(sampler):
        raise SpecError(
            f"sampler {type(sampler).__name__} is not registered; decorate its class with "
            "@xpbank.sampler.register_sampler('<name>') and give it a config() method"
        )
    config = cast(Any, sampler).config()
    return {"name": name, "config": dict(config)}


def make_sampler(description: Mapping[str, Any]) -> Any:
    """A sampler from a :func:`sampler_config` description (registered names only).

    Raises:
        SpecError: unknown name or a malformed description.
    """
    name, config = description.get("name"), description.get("config")
    if not isinstance(name, str) or not isinstance(config, Mapping):
        raise SpecError(f"sampler: expected {{'name': str, 'config': dict}}, got {dict(description)!r}")
    cls = SAMPLERS.get(name)
    if cls is None:
        raise SpecError(f"sampler {name!r} is not registered here; known: {sorted(SAMPLERS)}")
    try:
        return cls(**config)
    except TypeError as exc:
        raise SpecError(f"sampler {name!r}: bad config {dict(config)!r} ({exc})") from exc
