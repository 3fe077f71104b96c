"""The fused n-step read (``nstep_kernel.nstep_gather``: window, return and the rows'
words in one compiled pass) against the NumPy path, and its copy plan
(``storage/pair_rows.py``) against a byte-by-byte reference written here.

The kernel's source also runs as plain Python (``prefetch`` is a no-op there), so its
logic is checked against the NumPy path whether or not numba is installed."""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from test_nstep_kernel import CASES, _assert_same, _fill, needs_kernel
from xpbank import NStep, ReplayBuffer, TensorStorage
from xpbank.nstep import kernel as nstep_kernel
from xpbank.nstep.option import _kernel_inputs
from xpbank.storage.pair_rows import Span, pair_plan

# -- the copy plan ---------------------------------------------------------------------


def _random_layout(rng: np.random.Generator) -> tuple[list[Span], int]:
    """Fields of random widths at aligned offsets (widest first, as TensorStorage lays
    them out), with random gaps, in a row of random padding."""
    sizes = sorted(rng.choice([1, 2, 4, 8], size=int(rng.integers(1, 7))).tolist(), reverse=True)
    spans, offset = [], 0
    for i, size in enumerate(sizes):
        offset = -(-offset // size) * size + size * int(rng.integers(0, 2))  # sometimes a gap
        nbytes = size * int(rng.integers(1, 20))
        spans.append(Span(f"f{i}", offset, nbytes))
        offset += nbytes
    align = max(sizes)
    row = -(-offset // align) * align + align * int(rng.integers(0, 2))
    return spans, row


def _apply(plan, item: np.ndarray, partner: np.ndarray) -> np.ndarray:
    """The output row the plan makes of two rows (NumPy, as the kernel does it)."""
    a, b = item.view(plan.word), partner.view(plan.word)
    out = np.zeros_like(a)
    for (lo, hi), src in zip(plan.runs.tolist(), plan.run_src.tolist(), strict=True):
        out[lo:hi] = (a if src == 0 else b)[lo:hi]
    for w, m, k in zip(plan.mixed.tolist(), plan.mask, plan.keep, strict=True):
        out[w] = (a[w] & m) | (b[w] & k)
    return out.view(np.uint8)


@pytest.mark.parametrize("seed", range(40))
def test_pair_plan_copies_every_wanted_byte_from_its_row(seed: int) -> None:
    rng = np.random.default_rng(seed)
    spans, row = _random_layout(rng)
    keys = [s.key for s in spans if rng.random() < 0.8] or [spans[0].key]
    second = {k for k in keys if rng.random() < 0.5}
    plan = pair_plan(spans, row, second, keys)
    assert row % plan.word.itemsize == 0
    item = rng.integers(0, 256, row, dtype=np.uint8)
    partner = rng.integers(0, 256, row, dtype=np.uint8)
    out = _apply(plan, item, partner)
    for s in spans:
        if s.key in keys:  # byte by byte, from the row the field belongs to
            want = (partner if s.key in second else item)[s.start : s.start + s.nbytes]
            assert out[s.start : s.start + s.nbytes].tolist() == want.tolist(), s
    # words holding no wanted byte are not copied; mixed words hold bytes of both rows
    copied = {w for lo, hi in plan.runs.tolist() for w in range(lo, hi)} | set(plan.mixed.tolist())
    size = plan.word.itemsize
    for w in range(row // size):
        holds = {
            s.key
            for s in spans
            if s.key in keys and s.start < (w + 1) * size and w * size < s.start + s.nbytes
        }
        assert (w in copied) == bool(holds)
        assert (w in plan.mixed.tolist()) == (bool(holds & second) and bool(holds - second))


def test_pair_plan_word_sizes_and_errors() -> None:
    assert pair_plan([Span("a", 0, 3)], 3, set(), ["a"]).word == np.dtype(np.uint8)
    assert pair_plan([Span("a", 0, 6)], 6, set(), ["a"]).word == np.dtype(np.uint16)
    assert pair_plan([Span("a", 0, 12)], 12, {"a"}, ["a"]).word == np.dtype(np.uint32)
    with pytest.raises(ValueError, match=r"field 'a' at bytes 0\.\.8 is outside a row of 8"):
        pair_plan([Span("a", 0, 9)], 8, set(), ["a"])
    with pytest.raises(ValueError, match="field 'b' overlaps another wanted field"):
        pair_plan([Span("a", 0, 4), Span("b", 2, 4)], 8, set(), ["a", "b"])


# -- the fused read --------------------------------------------------------------------


@contextlib.contextmanager
def _numpy_path(monkeypatch: pytest.MonkeyPatch, rb: ReplayBuffer) -> Iterator[None]:
    """The compiled kernels switched off (the NumPy path) inside, for ``rb``'s samples
    (its NStep's cached fused entry is valid only for the kernel it was made with)."""
    with monkeypatch.context() as m:
        m.setattr(nstep_kernel, "_compiled", [None])
        yield


def _python_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's source run as plain Python (prefetch a no-op) instead of compiled."""
    monkeypatch.setattr(nstep_kernel, "_compiled", [nstep_kernel._nstep_gather])


def _compare(rb: ReplayBuffer, rng: np.random.Generator, envs: int, keys, monkeypatch) -> None:
    ring, storage = rb._ring, rb._storage
    live = np.arange(ring.first_id, ring.next_id)
    newest = live[-envs:]
    ids = torch.from_numpy(np.concatenate([rng.choice(live, size=48), newest, newest, live[:3]]))
    slots = ids % ring.capacity
    assert rb._nstep._fused(storage, storage.spec, ring.episodes, keys)[4] is not None  # the fused path runs
    fused = rb._nstep.gather(storage, ring, slots, ids, keys)
    with _numpy_path(monkeypatch, rb):
        reference = rb._nstep.gather(storage, ring, slots, ids, keys)
    _assert_same(fused, reference)


# obs dtype -> the word the kernel copies rows in (float32/float64 rewards keep rows a
# multiple of 4 bytes; narrower words are covered by the plan's tests above)
LAYOUTS = {torch.float32: 8, torch.float64: 8, torch.float16: 4, torch.uint8: 8}


def _buffer(case: tuple, n: int, capacity: int, seed: int) -> ReplayBuffer:
    envs, env_field = case[:2]
    return ReplayBuffer(capacity, num_envs=None if env_field else envs, nstep=NStep(n, 0.9), seed=seed)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_read_matches_numpy_path(case: int, compiled: bool, monkeypatch) -> None:
    """Random streams (several envs or an env field, both kinds of end, wraps, cuts by
    truncate_newest, the newest items, duplicates), n from 1 to 4, every field or a few:
    the same batch as the NumPy path, bit for bit."""
    if compiled and nstep_kernel.kernel() is None:
        pytest.skip("numba not installed, or XPBANK_NO_NUMBA=1")
    if not compiled:
        _python_kernel(monkeypatch)
    envs = CASES[case][0]
    rng = np.random.default_rng(500 + case)
    for trial, n in enumerate([1, 2, 3, 4]):
        rb = _buffer(CASES[case], n, int(rng.integers(6, 30)) * envs, trial)
        for _ in range(3):
            _fill(rb, rng, int(rng.integers(1, 25)), CASES[case])
            if rng.random() < 0.3:
                rb.episodes.truncate_newest()
            spec = list(rb.spec)
            subset = [k for k in spec if rng.random() < 0.5] or spec[:1]
            for keys in (None, subset):
                _compare(rb, rng, envs, keys, monkeypatch)


@pytest.mark.parametrize("obs_dtype", list(LAYOUTS))
def test_fused_read_for_every_word_size(obs_dtype: torch.dtype, monkeypatch) -> None:
    """Rows copied in 8- and 4-byte words, fields sharing words (bytes and flags)."""
    if nstep_kernel.kernel() is None:
        _python_kernel(monkeypatch)
    rng = np.random.default_rng(7)
    width = {torch.float32: 2, torch.float64: 2, torch.float16: 1, torch.uint8: 1}[obs_dtype]
    rb = ReplayBuffer(40, num_envs=2, nstep=NStep(3, 0.8), seed=1)
    reward_dtype = torch.float64 if obs_dtype == torch.float64 else torch.float32
    for _ in range(35):  # wraps
        rb.extend({"obs": torch.as_tensor(rng.integers(0, 9, (2, width))).to(obs_dtype),
                   "next_obs": torch.as_tensor(rng.integers(0, 9, (2, width))).to(obs_dtype),
                   "reward": torch.as_tensor(rng.normal(size=2)).to(reward_dtype),
                   "terminated": torch.as_tensor(rng.random(2) < 0.2),
                   "truncated": torch.as_tensor(rng.random(2) < 0.1)})  # fmt: skip
    pairs = rb._storage.pair_rows(list(rb.spec), rb._nstep.keys(rb.spec)[1])
    assert pairs is not None
    assert pairs.plan.word.itemsize == LAYOUTS[obs_dtype]
    _compare(rb, rng, 2, None, monkeypatch)


@needs_kernel
def test_nstep_gather_equals_window_then_pairs() -> None:
    """The public pieces: ``nstep_gather`` = ``nstep_window`` + ``gather_pairs``."""
    rng = np.random.default_rng(3)
    rb = ReplayBuffer(48, num_envs=4, nstep=NStep(3, 0.9), seed=0)
    _fill(rb, rng, 30, CASES[1])  # 4 envs in lockstep
    storage, episodes = rb._storage, rb.episodes
    spec = storage.spec
    _, nexts = rb._nstep.keys(spec)
    inputs = _kernel_inputs(storage, spec, "reward", episodes)
    assert inputs is not None
    ids = rng.integers(rb._ring.first_id, rb._ring.next_id, 100)
    pairs = storage.pair_rows(list(spec), nexts)
    lockstep, capacity, *links = inputs
    window = (lockstep, capacity, rb._ring.next_id, *links, rb._nstep._powers)
    rows, last, *rest = nstep_kernel.nstep_gather(ids, *window, pairs)
    pair, *expected = nstep_kernel.nstep_window(ids, *window)
    assert np.array_equal(pair, np.concatenate([ids % 48, last]))
    for got, want in zip(rest, expected, strict=True):
        assert np.array_equal(got, want)
    read, reference = nstep_kernel.nstep_rows(pairs).read(rows), storage.gather_pairs(pair, list(spec), nexts)
    for key in spec:
        assert torch.equal(read[key], reference[key]), key


def test_other_storages_take_the_other_paths() -> None:
    """Unpacked, memmap and bfloat16-reward buffers have no fused read (same batches,
    checked in test_nstep_paths / test_nstep_kernel)."""
    for kwargs in ({"storage": "memmap"}, {"storage": TensorStorage(20, pack=False)}):
        rb = ReplayBuffer(20, num_envs=2, nstep=NStep(3, 0.9), **kwargs)
        rb.extend(
            {
                "obs": torch.zeros(2, 1),
                "reward": torch.ones(2),
                "terminated": torch.zeros(2, dtype=torch.bool),
            }
        )
        assert rb._nstep._fused(rb._storage, rb.spec, rb.episodes, None)[4] is None
        assert rb.sample(4)["nstep_steps"].tolist() == [1, 1, 1, 1]


def test_pickled_option_leaves_its_caches_behind() -> None:
    rb = ReplayBuffer(1000, num_envs=2, nstep=NStep(3, 0.9), seed=0)
    rb.extend({"obs": torch.zeros(1000, 8), "reward": torch.ones(1000)})
    rb.sample(8)
    clone = pickle.loads(pickle.dumps(rb._nstep))
    assert clone == rb._nstep and clone._fused_cache == [] and clone._cache == []
    assert len(pickle.dumps(rb._nstep)) < 1000  # no storage arrays inside
