"""The write fast path's episode-index upkeep for lockstep env steps
(``ring/episode_step.py``): one compiled call that reads each item's ``terminated`` /
``truncated`` from the row just stored. Whatever the flags' dtype, it must record what
the full path records (``value != 0``: NaN ends an episode, -0.0 does not), and small
torch tensors read with ``tolist()`` must store the same bytes as the full path.

Each test runs the same calls into a buffer with the fast path and one without
(``rb._fast_write = False``) and compares them (``test_fast_write.assert_same``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_fast_write import _bytes, assert_same, call, pair
from xpbank import Field, NStep, Spec
from xpbank.replay import fast_write
from xpbank.ring import episode_step

FLAG_VALUES = {
    torch.bool: [False, True],
    torch.uint8: [0, 1, 255, 0],
    torch.int8: [0, -1, 0, 7],
    torch.int64: [0, 1, -(2**63), 2**40, 0],
    torch.float16: [0.0, -0.0, 1.0, float("nan"), 6e-8, 0.0],
    torch.float32: [0.0, -0.0, 1.0, float("nan"), float("-inf"), 1e-45, 0.0],
    torch.float64: [0.0, -0.0, -2.5, float("nan"), 5e-324, 0.0],
}


def _spec(dtype: torch.dtype, truncated: bool) -> Spec:
    fields = {"obs": Field((2,)), "reward": Field(()), "terminated": Field((), dtype)}
    if truncated:
        fields["truncated"] = Field((), dtype)
    return Spec(fields)


@pytest.mark.parametrize("truncated", [False, True])
@pytest.mark.parametrize("dtype", list(FLAG_VALUES), ids=[str(d) for d in FLAG_VALUES])
@pytest.mark.parametrize("envs,nstep", [(1, False), (3, False), (3, True)])
def test_episode_ends_read_from_the_stored_rows_match_the_full_path(dtype, truncated, envs, nstep):
    kw = {"num_envs": envs, **({"nstep": NStep(2, 0.9)} if nstep else {})}
    spec = _spec(dtype, truncated)
    fast, slow = pair(10, spec, **kw)
    rng = np.random.default_rng(0)
    values = FLAG_VALUES[dtype]
    np_dtype = torch.empty((), dtype=dtype).numpy().dtype
    for i in range(40):  # the ring wraps (capacity 10): overwritten predecessors too
        ends = rng.choice(len(values), size=(2, envs), p=None)
        step = {
            "obs": rng.standard_normal((envs, 2)).astype(np.float32),
            "reward": rng.standard_normal(envs).astype(np.float32),
            "terminated": np.array([values[j] for j in ends[0]], dtype=np_dtype),
        }
        if truncated:
            step["truncated"] = np.array([values[j] for j in ends[1]], dtype=np_dtype)
        if i % 3 == 2:  # torch input too (small 1-d tensors: read with tolist())
            step = {k: torch.from_numpy(v) for k, v in step.items()}
        assert call(fast, "extend", step) == call(slow, "extend", step)
        assert_same(fast, slow)
    sig = fast.__dict__.get("_signature")
    assert sig is not None
    if episode_step._kernel is not None:  # numba: the compiled step was taken
        assert sig.step is not None
    if nstep:
        a, b = fast.sample_by_index(list(range(10))), slow.sample_by_index(list(range(10)))
        for key in b.keys(include_nested=True, leaves_only=True):
            assert _bytes(a[key]) == _bytes(b[key]), key  # NaN flags too


def test_stored_ends_say_where_each_flag_lies_or_refuse():
    from xpbank.storage.blocks import Block, layout

    spec = Spec({"obs": Field((2,)), "terminated": Field((), torch.float16), "wide": Field((2,), torch.bool)})
    members, row = layout(spec, list(spec.keys()))
    block = Block(members, row, torch.zeros(4, row, dtype=torch.uint8))
    at = {m.key: m for m in members}
    ends = episode_step.stored_ends(block, "terminated", None)
    assert ends is not None and ends.tolist() == [at["terminated"].start, 2, 1, -1, -1, -1]
    assert episode_step.stored_ends(block, "wide", None) is None  # not one flag per item


def test_small_torch_tensors_of_every_stored_dtype_match_the_full_path():
    """1-d tensors up to 8 values are read with tolist(): Python numbers must land as
    the same bytes as the full path's copy (int64 extremes, float16, NaN, -0.0)."""
    cases = {
        "i64": (torch.int64, [2**63 - 1, -(2**63), 0, -1]),
        "u8": (torch.uint8, [0, 255, 7, 128]),
        "i8": (torch.int8, [-128, 127, 0, -1]),
        "i16": (torch.int16, [-(2**15), 2**15 - 1, 3, 0]),
        "i32": (torch.int32, [-(2**31), 2**31 - 1, 5, 0]),
        "f16": (torch.float16, [65504.0, -0.0, float("nan"), 6e-8]),
        "f32": (torch.float32, [3.4e38, -0.0, float("nan"), 1e-45]),
        "f64": (torch.float64, [1e308, -0.0, float("nan"), 5e-324]),
        "b": (torch.bool, [True, False, True, True]),
    }
    items, rows = (
        pair(8, Spec({k: Field((4,), d) for k, (d, _) in cases.items()})),
        pair(8, Spec({k: Field((), d) for k, (d, _) in cases.items()})),
    )
    for i in range(6):
        batch = {k: torch.tensor(v, dtype=d).roll(i) for k, (d, v) in cases.items()}
        assert call(items[0], "add", batch) == call(items[1], "add", batch)  # one item of [4] fields
        assert call(rows[0], "extend", batch) == call(rows[1], "extend", batch)  # 4 items of 0-d fields
    for fast, slow in (items, rows):
        sig = fast.__dict__.get("_signature")
        assert sig is not None and all(e[1] == fast_write._TENSOR_LIST for e in sig.entries)
        assert_same(fast, slow)


def test_every_path_that_replaces_the_per_env_state_replaces_last_end():
    """The write fast path checks only ``last_end`` to see whether the per-env state it
    packed for the compiled upkeep is still the index's (``fast_write.try_write``):
    every path that replaces any of the four arrays must replace ``last_end`` too, and
    the fast path must then record from the new arrays."""
    envs = 3
    fast, slow = pair(10, _spec(torch.bool, True), num_envs=envs)
    rng = np.random.default_rng(1)

    def steps(k: int) -> dict[str, np.ndarray]:
        return {
            "obs": rng.standard_normal((k * envs, 2)).astype(np.float32),
            "reward": rng.standard_normal(k * envs).astype(np.float32),
            "terminated": rng.random(k * envs) < 0.2,
            "truncated": rng.random(k * envs) < 0.1,
        }

    def state(rb):
        e = rb.episodes
        return e._last_id, e._cur_start, e._last_end, e._fresh

    saved = None
    ops = {
        "two steps (the full path)": lambda rb, batch: rb.extend(batch),
        "truncate_newest": lambda rb, batch: rb.episodes.truncate_newest(),
        "clear": lambda rb, batch: rb.clear(),
        "load_state_dict": lambda rb, batch: rb.load_state_dict(saved),
    }
    for name, op in [*ops.items(), *ops.items()]:
        for _ in range(4):  # lockstep steps: the fast path's compiled upkeep
            step = steps(1)
            assert call(fast, "extend", step) == call(slow, "extend", step)
        if saved is None:
            saved = slow.state_dict()
        before, batch = state(fast), steps(2)
        for rb in (fast, slow):
            op(rb, batch)
        after = state(fast)
        if any(a is not b for a, b in zip(before, after, strict=True)):
            assert after[2] is not before[2], name
        step = steps(1)
        assert call(fast, "extend", step) == call(slow, "extend", step)
        assert_same(fast, slow)
    if episode_step._kernel is not None:
        sig = fast.__dict__.get("_signature")
        assert sig is not None and sig.step is not None
