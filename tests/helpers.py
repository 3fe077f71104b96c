"""Spec and batch builders shared by the test suite.

``make_batch`` encodes the item number in every field, so a test can tell which item a
row came from: for item ``i`` (``start <= i < start + n``) and the ``e``-th element of a
field (in row-major order), the value is

* ``v = i + e`` for fields whose first key part is not ``"next"``, ``v = i + 1 + e`` for
  ``("next", ...)`` fields (the next observation of item ``i`` is item ``i + 1``'s),
* cast to the field's dtype: exact for floats and wide ints; ``uint8``/``int8`` wrap
  modulo 256/128; ``bfloat16`` is exact for ``v <= 256``,
* for the ``j``-th bool field of the spec (``j = 0, 1, ...``): ``v % (j + 2) == 0``.

So for :func:`transition_spec`: ``obs[:, 0] == i``, ``action == i``, ``reward == i``,
``terminated == (i % 2 == 0)``, ``truncated == (i % 3 == 0)``,
``("next", "obs")[:, 0] == i + 1``. :func:`item_numbers` reads ``i`` back.
"""

from __future__ import annotations

import os

import torch

from xpbank import Field, Spec
from xpbank.spec.spec import NestedKey

__all__ = ["child_env", "item_numbers", "make_batch", "transition_spec"]


def transition_spec(obs_shape: tuple[int, ...] = (3,), obs_dtype: torch.dtype = torch.float32) -> Spec:
    """A one-step transition: obs, action, reward, terminated, truncated, next obs."""
    return Spec(
        {
            "obs": Field(obs_shape, obs_dtype),
            "action": Field((), torch.int64),
            "reward": Field((), torch.float32),
            "terminated": Field((), torch.bool),
            "truncated": Field((), torch.bool),
            ("next", "obs"): Field(obs_shape, obs_dtype),
        }
    )


def _values(field: Field, items: torch.Tensor) -> torch.Tensor:
    """``items[:, None] + arange(numel)`` reshaped to ``[n, *field.shape]`` (int64)."""
    elems = torch.arange(field.numel, dtype=torch.int64)
    return (items[:, None] + elems[None, :]).reshape(items.shape[0], *field.shape)


def make_batch(spec: Spec, n: int, start: int = 0) -> dict[NestedKey, torch.Tensor]:
    """A flat ``{key: tensor}`` batch of items ``start .. start + n - 1`` (see module doc)."""
    items = torch.arange(start, start + n, dtype=torch.int64)
    out: dict[NestedKey, torch.Tensor] = {}
    n_bool = 0
    for key, field in spec.items():
        first = key if isinstance(key, str) else key[0]
        values = _values(field, items + 1 if first == "next" else items)
        if field.dtype == torch.bool:
            out[key] = values % (n_bool + 2) == 0
            n_bool += 1
        elif field.dtype == torch.uint8:
            out[key] = (values % 256).to(torch.uint8)
        elif field.dtype == torch.int8:
            out[key] = (values % 128).to(torch.int8)
        else:
            out[key] = values.to(field.dtype)
    return out


def item_numbers(batch: object, key: NestedKey = "action") -> torch.Tensor:
    """The item numbers of a batch made by :func:`make_batch`, read from an int/float ``key``."""
    values = batch[key]  # type: ignore[index]
    return values.reshape(values.shape[0], -1)[:, 0].to(torch.int64)


def child_env(*paths: str, **extra: str) -> dict[str, str]:
    """The environment for a Python subprocess: ``paths`` put in front of this process's
    ``PYTHONPATH`` (kept, not replaced: a machine whose packages come from ``PYTHONPATH``
    would lose them), and ``extra`` set."""
    path = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, **extra}
