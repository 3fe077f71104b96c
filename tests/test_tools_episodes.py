"""tools.episode_scan and tools.stats against brute-force references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import xpbank
from episode_data import filled_buffer, reference_episodes
from xpbank.errors import CapacityError, SpecError
from xpbank.tools.episode_scan import iter_episodes
from xpbank.tools.stats import combine, episode_stats, field_stats, moments


def _spans(rb: xpbank.ReplayBuffer, chunk: int) -> list[dict[str, object]]:
    return [
        {"env": s.env, "positions": s.positions.tolist(), "terminated": s.terminated, "return": s.total}
        for s in iter_episodes(rb, reward="reward", chunk=chunk)
    ]


def _same(got: list[dict[str, object]], want: list[dict[str, object]]) -> None:
    assert [(g["env"], g["positions"], g["terminated"]) for g in got] == [
        (w["env"], w["positions"], w["terminated"]) for w in want
    ]
    np.testing.assert_allclose([g["return"] for g in got], [w["return"] for w in want], rtol=1e-9)


schedules = st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None)
@given(schedule=schedules, n_steps=st.integers(1, 40), capacity=st.integers(4, 60), chunk=st.integers(1, 50))
def test_episodes_match_brute_force_with_an_episode_index(schedule, n_steps, capacity, chunk):
    """num_envs buffers: interleaved envs, the ring's wrap (cut heads known exactly), any chunk size."""
    rb = filled_buffer(schedule, n_steps, capacity * len(schedule))
    assert rb.episodes is not None
    _same(_spans(rb, chunk), reference_episodes(rb, len(schedule)))


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    n_steps=st.integers(1, 60),
    capacity=st.integers(4, 60),
    chunk=st.integers(1, 50),
)
def test_episodes_match_brute_force_from_fields_only(lengths, n_steps, capacity, chunk):
    """No episode index (one env): the flag fields; after a wrap the first episode is dropped."""
    schedule = [lengths]
    rb = filled_buffer(schedule, n_steps, capacity, num_envs=False)
    assert rb.episodes is None
    _same(_spans(rb, chunk), reference_episodes(rb, len(schedule), exact_heads=False))


def test_partial_episodes_are_yielded_only_when_asked():
    rb = filled_buffer([[3], [5]], 7, 100)  # env 0: 3+3 then 1 open; env 1: 5 then 2 open
    spans = list(iter_episodes(rb, partial=True))
    assert [(s.env, len(s), s.complete) for s in spans] == [
        (0, 3, True),
        (1, 5, True),
        (0, 3, True),
        (0, 1, False),
        (1, 2, False),
    ]
    assert [len(s) for s in iter_episodes(rb)] == [3, 5, 3]
    assert not spans[-1].terminated and not spans[-1].truncated


def test_terminated_and_truncated_are_told_apart():
    rb = filled_buffer([[2], [3]], 6, 100)
    got = [(s.env, s.terminated, s.truncated) for s in iter_episodes(rb)]
    # env e's k-th episode terminates when (e + k) is even, else it is truncated
    assert got == [(0, True, False), (1, False, True), (0, False, True), (0, True, False), (1, True, False)]


def test_scan_errors_name_the_argument():
    rb = filled_buffer([[3]], 4, 10)
    with pytest.raises(SpecError, match=r"reward: field 'rew' is not in the buffer"):
        list(iter_episodes(rb, reward="rew"))
    with pytest.raises(
        SpecError, match=r"reward: field 'obs' must hold one number per item, got shape \(4,\)"
    ):
        list(iter_episodes(rb, reward="obs"))
    with pytest.raises(CapacityError, match=r"chunk: expected a positive int, got 0"):
        list(iter_episodes(rb, chunk=0))


def test_no_flags_means_one_unfinished_episode():
    rb = xpbank.ReplayBuffer(10)
    rb.extend({"x": torch.zeros(4)})
    assert list(iter_episodes(rb)) == []
    assert [len(s) for s in iter_episodes(rb, partial=True)] == [4]


@settings(max_examples=30, deadline=None)
@given(data=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60), cut=st.integers(0, 60))
def test_combined_moments_equal_numpy(data, cut):
    x = np.array(data)
    m = combine(moments(x[:cut]), moments(x[cut:]))
    assert m.count == x.size and m.min == x.min() and m.max == x.max()
    np.testing.assert_allclose(m.mean, x.mean(), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(m.std, x.std(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_field_stats_do_not_depend_on_the_chunk(chunk):
    rb = filled_buffer([[4, 6], [5]], 30, 40)  # wrapped
    stats = field_stats(rb, chunk=chunk)
    data = rb.sample_all()
    for key in rb.spec:
        x = data[key].double().numpy()
        m = stats[key]
        assert (m.count, m.min, m.max) == (x.size, x.min(), x.max())
        np.testing.assert_allclose([m.mean, m.std], [x.mean(), x.std()], rtol=1e-9, atol=1e-12)


def test_episode_stats_of_an_opened_bank(tmp_path):
    rb = filled_buffer([[4, 6], [5], [2, 9]], 50, 90)
    bank = xpbank.open_bank(xpbank.save(rb, tmp_path / "b"), "r")
    want = reference_episodes(rb, 3)
    s = episode_stats(bank, chunk=13)
    assert s.lengths.tolist() == [len(w["positions"]) for w in want]
    np.testing.assert_allclose(s.returns, [w["return"] for w in want], rtol=1e-9)
    assert s.terminated.tolist() == [w["terminated"] for w in want]
    assert s.partial == len(list(iter_episodes(bank, partial=True))) - len(want)
