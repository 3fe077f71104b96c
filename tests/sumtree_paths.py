"""A fixture that runs a test module once with the sum-tree's compiled kernels (numba)
and once with its NumPy path, so that CI covers both (``numba`` is skipped without numba).

Use: ``from sumtree_paths import sumtree_path  # noqa: F401`` (autouse).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from xpbank.sampler import sumtree_numba


@pytest.fixture(autouse=True, params=["numba", "numpy"])
def sumtree_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``"numba"`` or ``"numpy"``: which path ``sumtree.set_leaves``/``find_prefix_sum`` take."""
    kernels = sumtree_numba.load()
    if request.param == "numba":
        if kernels is None:
            pytest.skip("numba is missing (the fast extra) or XPBANK_NO_NUMBA=1")
    else:
        monkeypatch.setattr(sumtree_numba, "_loaded", None)
    yield request.param


@pytest.fixture(name="kernels")
def kernels_fixture() -> object:
    """``kernels``: the compiled kernels (skips the test without numba); a module that
    imports ``kernels_fixture`` can ask for it."""
    loaded = sumtree_numba.load()
    if loaded is None:
        pytest.skip("numba is missing (the fast extra) or XPBANK_NO_NUMBA=1")
    return loaded


def numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the sum-tree kernels off for ``monkeypatch``'s scope (the NumPy path)."""
    monkeypatch.setattr(sumtree_numba, "_loaded", None)


def random_slots(rng: np.random.Generator, capacity: int, n: int, newest: bool, repeat: bool) -> np.ndarray:
    """``n`` random leaves: anywhere, or (``newest``) among the last 20 (the newest items of
    a full ring: duplicates); ``repeat``: the first five again at the end (the last wins)."""
    low = max(0, capacity - 20) if newest else 0
    slots = rng.integers(low, capacity, n)
    return np.concatenate([slots, slots[:5]]) if repeat else slots
