"""A fixture that runs a test module once with the sum-tree's compiled kernels (numba)
and once with its NumPy path, so that CI covers both (``numba`` is skipped without numba).

Use: ``from sumtree_paths import sumtree_path  # noqa: F401`` (autouse).
"""

from __future__ import annotations

from collections.abc import Iterator

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
