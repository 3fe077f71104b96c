"""Seeded frequency tests of uniform sampling, with their tolerances stated.

Every test uses fixed seeds, so it is deterministic: a tolerance says how unlikely a
failure would be for a correct sampler, not how often the test flakes.

* Frequencies over ``N`` items (or over ordered tuples) are checked with Pearson's
  chi-square test: the p-value must exceed ``P_MIN = 1e-4``.
* Per-item inclusion counts of ``B`` batches drawn without replacement are
  Binomial(B, k/N); each must be within 5 standard deviations of its mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import permutations
from typing import Any

import numpy as np
import pytest
import torch

from helpers import item_numbers, make_batch, transition_spec
from xpbank import ReplayBuffer
from xpbank.sampler.uniform import sample_distinct

BufferFactory = Callable[..., ReplayBuffer]

SPEC = transition_spec()
P_MIN = 1e-4  # smallest acceptable chi-square p-value
SIGMAS = 5.0  # tolerance of a binomial count, in standard deviations

# chi-square critical values at p = 1e-4 (scipy.stats.chi2.isf(1e-4, df)); a statistic
# above them has p < 1e-4. (For df=49 it is 94.597; 95.75 is sometimes quoted, which is
# the p ~ 7.4e-5 point.) Used to check chi2_sf below, which stands in for scipy.
CHI2_CRIT_1E4 = {4: 23.5127, 9: 33.7199, 19: 50.7955, 49: 94.5967}


def chi2_sf(stat: float, df: int) -> float:
    """P(X >= stat) for X ~ chi-square(df): scipy when installed, else a series.

    The fallback is the regularized upper incomplete gamma ``Q(df/2, stat/2)`` from the
    power series of the lower one; exact to ~1e-12 for the df and stat used here.
    """
    try:
        from scipy.stats import chi2
    except ImportError:
        pass
    else:
        return float(chi2.sf(stat, df))
    if stat <= 0:
        return 1.0
    a, x = df / 2.0, stat / 2.0
    term = total = 1.0 / a
    n = 0
    while term > 1e-17 * total:
        n += 1
        term *= x / (a + n)
        total += term
    lower = total * math.exp(-x + a * math.log(x) - math.lgamma(a))
    return max(0.0, 1.0 - lower)


def chi2_pvalue(counts: Any, expected: float | np.ndarray) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``expected`` (df = cells - 1)."""
    counts = np.asarray(counts, dtype=np.float64)
    stat = float(((counts - expected) ** 2 / expected).sum())
    return chi2_sf(stat, counts.size - 1)


def assert_uniform(counts: Any, what: str) -> None:
    counts = np.asarray(counts)
    p = chi2_pvalue(counts, counts.sum() / counts.size)
    assert p > P_MIN, f"{what}: chi-square p = {p:.2e} <= {P_MIN} (counts {counts.tolist()})"


def written(
    make: BufferFactory, capacity: int, chunks: list[int], seed: int, clear_after: int = -1
) -> ReplayBuffer:
    """A buffer with ``chunks`` of items written, cleared after chunk ``clear_after``.

    Each stored item's ``action`` is set to its id, so ``item_numbers(batch)`` must
    equal ``batch["index"]``.
    """
    rb = make(capacity, SPEC, seed=seed)
    for c, n in enumerate(chunks):
        ids = torch.as_tensor(rb.extend(make_batch(SPEC, n)))[-capacity:]  # the ones still stored
        rb.update(ids, {"action": ids})
        if c == clear_after:
            rb.clear()
    return rb


def test_chi2_sf_matches_known_critical_values() -> None:
    for df, crit in CHI2_CRIT_1E4.items():
        assert chi2_sf(crit, df) == pytest.approx(1e-4, rel=1e-3), df
    for x in (0.5, 3.0, 10.0):  # df = 2 has the closed form exp(-x / 2)
        assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
    assert chi2_pvalue([100, 100, 100], 100.0) == pytest.approx(1.0)
    assert chi2_pvalue([200, 50, 50], 100.0) < P_MIN


# -- (1) with replacement ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("capacity", "chunks", "clear_after", "live"),
    [
        (50, [50], -1, range(0, 50)),  # exactly full
        (64, [20, 30], -1, range(0, 50)),  # not full: slots 50 .. 63 must never be drawn
        (50, [7, 41, 50, 32], -1, range(80, 130)),  # 130 written: wrapped, cursor at 30
        (50, [70, 13, 37], 0, range(100, 150)),  # cleared at id 70, ids restart at 100
    ],
    ids=["full", "partly-filled", "wrapped", "cleared-and-refilled"],
)
def test_sampling_with_replacement_is_uniform_over_live_items(
    buffer_factory: BufferFactory, capacity: int, chunks: list[int], clear_after: int, live: range
) -> None:
    rb = written(buffer_factory, capacity, chunks, seed=20240, clear_after=clear_after)
    assert len(rb) == len(live) == 50
    counts = np.zeros(len(live), dtype=np.int64)
    for _ in range(200):  # 200 x 1000 = 200k draws, ~4000 per item
        batch = rb.sample(1000)
        ids = batch["index"]
        assert int(ids.min()) >= live.start and int(ids.max()) < live.stop, "a non-live id was drawn"
        assert torch.equal(item_numbers(batch), ids)  # the row's data is that id's
        counts += np.bincount(ids.numpy() - live.start, minlength=len(live))
    assert counts.sum() == 200_000
    assert counts.min() > 0
    assert_uniform(counts, "item frequencies")


# -- (2) without replacement --------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "k", "path"),
    [(4, 2, "rejection"), (9, 3, "rejection"), (5, 3, "randperm"), (4, 4, "randperm"), (6, 1, "rejection")],
)
def test_sample_distinct_is_uniform_over_ordered_tuples(
    monkeypatch: pytest.MonkeyPatch, n: int, k: int, path: str
) -> None:
    calls = {"randperm": 0}
    randperm = torch.randperm

    def counting_randperm(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["randperm"] += 1
        return randperm(*args, **kwargs)

    monkeypatch.setattr(torch, "randperm", counting_randperm)
    cells = {t: i for i, t in enumerate(permutations(range(n), k))}
    draws = 200 * len(cells)  # 200 expected per ordered tuple
    gen = torch.Generator().manual_seed(7 * n + k)
    counts = np.zeros(len(cells), dtype=np.int64)
    for _ in range(draws):
        out = sample_distinct(n, k, gen)
        assert out.dtype == torch.int64 and out.shape == (k,)
        counts[cells[tuple(out.tolist())]] += 1  # KeyError: a repeat or an out-of-range value
    # k * k <= n takes the rejection path (randint), else a permutation: both are checked
    assert (calls["randperm"] == draws) == (path == "randperm")
    assert (calls["randperm"] == 0) == (path == "rejection")
    assert_uniform(counts, f"ordered {k}-tuples of {n}")


@pytest.mark.parametrize(
    ("k", "path"), [(5, "rejection"), (7, "rejection"), (8, "randperm"), (30, "randperm")]
)
def test_sampling_without_replacement_includes_each_item_at_rate_k_over_n(
    buffer_factory: BufferFactory, k: int, path: str
) -> None:
    # 80 written into capacity 50: live ids 30 .. 79; 7 * 7 <= 50 < 8 * 8 splits the paths
    rb = written(buffer_factory, 50, [80], seed=1000 + k)
    n, batches = 50, 4000
    assert (k * k <= n) == (path == "rejection")
    inclusion = np.zeros(n, dtype=np.int64)
    first = np.zeros(n, dtype=np.int64)
    for _ in range(batches):
        batch = rb.sample(k, replace=False)
        ids = batch["index"].numpy() - 30
        assert len(np.unique(ids)) == k, "a repeated item within one batch"
        assert ids.min() >= 0 and ids.max() < n
        assert torch.equal(item_numbers(batch), batch["index"])
        inclusion[ids] += 1
        first[ids[0]] += 1
    p = k / n
    mean, sd = batches * p, math.sqrt(batches * p * (1 - p))
    worst = np.abs(inclusion - mean).max()
    assert worst <= SIGMAS * sd, f"an inclusion count is {worst / sd:.1f} sd from {mean} (k={k})"
    assert inclusion.sum() == batches * k
    assert_uniform(first, "first item of a batch drawn without replacement")


# -- (3) epochs ----------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [20, 7])
def test_epoch_shuffle_puts_every_item_first_equally_often(
    buffer_factory: BufferFactory, batch_size: int
) -> None:
    rb = written(buffer_factory, 20, [33], seed=77 + batch_size)  # live ids 13 .. 32
    n, n_epochs = 20, 4000
    per_epoch = -(-n // batch_size)
    first = np.zeros(n, dtype=np.int64)
    last = np.zeros(n, dtype=np.int64)
    epoch: list[int] = []
    for b, batch in enumerate(rb.epochs(batch_size, n_epochs=n_epochs, shuffle=True)):
        epoch += (batch["index"] - 13).tolist()
        if (b + 1) % per_epoch == 0:
            assert sorted(epoch) == list(range(n)), "an epoch is not a permutation of the items"
            first[epoch[0]] += 1
            last[epoch[-1]] += 1
            epoch = []
    assert first.sum() == last.sum() == n_epochs
    assert_uniform(first, "first position of an epoch")
    assert_uniform(last, "last position of an epoch")
