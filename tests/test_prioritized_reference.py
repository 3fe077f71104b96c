"""A prioritized DQN loop's small calls (``sample(32)``, ``update_priority`` of 32) on
CartPole-sized items, through the compiled small-call paths and the general path, both
against a brute-force NumPy reference written here: one priority per slot, a flat
cumulative sum searched for each stratified draw, the weights by their formula.

Given the same uniforms (a copy of the buffer's generator), both paths must draw the
reference's ids and rows exactly and its weights within float32 rounding, and leave its
priorities (within a few ulps: the reference raises with Python's ``**``, the sampler
with NumPy's power, two routines). Bad updates raise the same errors on both paths and
leave everything as it was.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sumtree_paths import kernels_fixture  # noqa: F401 (the kernels fixture)
from xpbank import PrioritizedSampler, PriorityError, ReplayBuffer, StaleIndexError, XpbankIndexError
from xpbank.replay import writing
from xpbank.sampler import prioritized_fast

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
CAPACITY, BATCH = 300, 32


def cartpole(rng: np.random.Generator, n: int) -> dict[str, torch.Tensor]:
    obs = rng.standard_normal((n, 4), dtype=np.float32)
    return {
        "obs": torch.from_numpy(obs),
        "action": torch.from_numpy(rng.integers(0, 2, n)),
        "reward": torch.ones(n),
        "terminated": torch.from_numpy(rng.random(n) < 0.05),
        "next_obs": torch.from_numpy(obs + np.float32(0.01)),
    }


class Reference:
    """The prioritized sampler by brute force over a flat array of priorities."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.leaf = np.zeros(capacity)  # (p + eps) ** alpha per slot; 0: never written
        self.rows: dict[str, np.ndarray] = {}
        self.first = self.next = 0
        self.largest = 1.0

    def extend(self, items: dict[str, torch.Tensor]) -> None:
        n = next(iter(items.values())).shape[0]
        slots = np.arange(self.next, self.next + n) % self.capacity
        for key, value in items.items():
            if key not in self.rows:
                self.rows[key] = np.zeros((self.capacity, *value.shape[1:]), dtype=value.numpy().dtype)
            self.rows[key][slots] = value.numpy()
        self.leaf[slots] = self.largest**ALPHA
        self.next += n
        self.first = max(self.first, self.next - self.capacity)

    def update(self, ids: np.ndarray, prio: np.ndarray, stale: str = "raise") -> None:
        for i, p in zip(ids.tolist(), prio.tolist(), strict=True):
            if stale == "skip" and i < self.first:
                continue
            assert self.first <= i < self.next and math.isfinite(p) and p >= 0  # checked by the caller
            self.leaf[i % self.capacity] = (p + EPS) ** ALPHA
            self.largest = max(self.largest, p + EPS)

    def sample(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, slots, weights)`` of the stratified draw of uniforms ``u``."""
        b = u.shape[0]
        cums = np.cumsum(self.leaf)
        slots = np.searchsorted(cums, (np.arange(b) + u) / b * cums[-1], side="right")
        low = self.leaf[self.leaf > 0].min()
        weights = (self.leaf[slots] / low) ** -BETA
        return self.first + (slots - self.first) % self.capacity, slots, weights


def uniforms(rb: ReplayBuffer, b: int) -> np.ndarray:
    """The uniforms ``rb``'s next sample of ``b`` draws (from a copy of its generator)."""
    g = torch.Generator()
    g.set_state(rb.generator.get_state())
    return torch.rand(b, generator=g, dtype=torch.float64).numpy()


def assert_like_reference(rb: ReplayBuffer, ref: Reference) -> None:
    sampler = rb.sampler
    leaves = sampler._sum[0][: ref.capacity]  # type: ignore[attr-defined]
    np.testing.assert_allclose(leaves, ref.leaf, rtol=1e-14, atol=0)
    total, smallest = sampler.totals()  # type: ignore[attr-defined]
    np.testing.assert_allclose(total, ref.leaf.sum(), rtol=1e-12)
    np.testing.assert_allclose(smallest, ref.leaf[ref.leaf > 0].min(), rtol=1e-14)
    np.testing.assert_allclose(sampler.max_priority, ref.largest, rtol=1e-15)  # type: ignore[attr-defined]


def assert_batch(batch: object, ref: Reference, u: np.ndarray) -> None:
    ids, slots, weights = ref.sample(u)
    np.testing.assert_array_equal(batch["index"].numpy(), ids)  # type: ignore[index]
    np.testing.assert_allclose(batch["weight"].numpy(), weights, rtol=2e-7)  # float32 rounding
    assert batch["weight"].dtype == torch.float32  # type: ignore[index]
    for key, rows in ref.rows.items():
        np.testing.assert_array_equal(batch[key].numpy(), rows[slots])  # type: ignore[index]


def general(monkeypatch: pytest.MonkeyPatch) -> None:
    """The general update path for ``monkeypatch``'s scope."""
    monkeypatch.setattr(writing, "update_ids", lambda *args: False)


def make() -> tuple[ReplayBuffer, ReplayBuffer, Reference]:
    fast, slow = (
        ReplayBuffer(CAPACITY, sampler=PrioritizedSampler(alpha=ALPHA, beta=BETA), seed=3) for _ in "ab"
    )
    slow._fast_read = False
    return fast, slow, Reference(CAPACITY)


def test_a_dqn_loop_is_the_reference(kernels: object, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow, ref = make()
    taken: list[bool] = []
    real = prioritized_fast.update_ids
    monkeypatch.setattr(writing, "update_ids", lambda *a: taken.append(real(*a)) or taken[-1])
    rng = np.random.default_rng(7)
    for step in range(120):
        if step % 10 == 0:  # new items at the largest priority; the ring wraps at step 60
            items = cartpole(rng, 50)
            fast.extend(items)
            slow.extend(items)
            ref.extend(items)
        u = uniforms(fast, BATCH)
        np.testing.assert_array_equal(u, uniforms(slow, BATCH))
        a = fast.sample(BATCH)
        b = slow.sample(BATCH)
        assert list(a.keys()) == list(b.keys())
        assert_batch(a, ref, u)
        assert_batch(b, ref, u)
        prio = rng.exponential(size=BATCH) * 10.0 ** rng.integers(-3, 3)
        prio[rng.random(BATCH) < 0.1] = 0.0
        values = torch.from_numpy(prio if step % 2 else prio.astype(np.float32))
        fast.update_priority(a["index"], values)
        with monkeypatch.context() as m:
            general(m)
            slow.update_priority(b["index"], values)
        ref.update(a["index"].numpy(), values.double().numpy())
        assert_like_reference(fast, ref)
        assert_like_reference(slow, ref)
    plan = fast._read_plan  # type: ignore[attr-defined]
    assert plan.prioritized and plan.usable and all(taken)  # the compiled paths took every call


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("stale", StaleIndexError),
        ("unissued", XpbankIndexError),
        ("negative id", XpbankIndexError),
        ("nan", PriorityError),
        ("inf", PriorityError),
        ("negative", PriorityError),
        ("short", PriorityError),
    ],
)
def test_bad_updates_raise_and_write_nothing(
    kernels: object, monkeypatch: pytest.MonkeyPatch, bad: str, error: type
) -> None:
    fast, slow, ref = make()
    rng = np.random.default_rng(len(bad))
    for rb in (fast, slow, ref):
        rb.extend(cartpole(np.random.default_rng(1), 400))  # wrapped: ids 100 .. 399 live
    prio = torch.from_numpy(rng.random(BATCH))
    fast.update_priority(ref.next - 1 - torch.arange(BATCH), prio)
    slow.update_priority(ref.next - 1 - torch.arange(BATCH), prio)
    ref.update(ref.next - 1 - np.arange(BATCH), prio.numpy())
    ids = torch.from_numpy(rng.integers(ref.first, ref.next, BATCH))
    at = int(rng.integers(0, BATCH))
    if bad in ("stale", "unissued", "negative id"):
        ids[at] = {"stale": 99, "unissued": 400, "negative id": -1}[bad]
    elif bad == "short":
        prio = prio[1:]
    else:
        prio[at] = {"nan": math.nan, "inf": math.inf, "negative": -1e-9}[bad]
    assert not prioritized_fast.update_ids(fast.sampler, fast._ring, ids, prio, "raise")
    for rb, path in ((fast, None), (slow, general)):
        with monkeypatch.context() as m:
            if path is not None:
                path(m)
            with pytest.raises(error):
                rb.update_priority(ids, prio)
        assert_like_reference(rb, ref)  # nothing written


def test_stale_skip_writes_the_live_ids(kernels: object, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow, ref = make()
    for rb in (fast, slow, ref):
        rb.extend(cartpole(np.random.default_rng(2), 250))
    old = fast.sample(BATCH)["index"]
    slow.sample(BATCH)
    for rb in (fast, slow, ref):
        rb.extend(cartpole(np.random.default_rng(3), 100))  # ids 0 .. 49 overwritten
    prio = torch.rand(BATCH, dtype=torch.float64) + 0.5
    assert (old < 50).any() and (old >= 50).any()
    fast.update_priority(old, prio, stale="skip")
    with monkeypatch.context() as m:
        general(m)
        slow.update_priority(old, prio, stale="skip")
    ref.update(old.numpy(), prio.numpy(), stale="skip")
    assert_like_reference(fast, ref)
    assert_like_reference(slow, ref)
