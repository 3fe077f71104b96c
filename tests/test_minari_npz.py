"""Minari and .npz conversions: what Minari itself reads back, dict observations, bad input."""

from __future__ import annotations

import zipfile
from typing import Any

import numpy as np
import pytest
import torch

import xpbank
from episode_data import filled_buffer, reference_episodes
from xpbank.errors import BankError, SpecError
from xpbank.integrations.minari import export_minari, import_minari
from xpbank.tools.npz import export_npz, import_npz


def _minari() -> Any:
    """Minari, or a skip: the .npz tests below need no Minari."""
    return pytest.importorskip("minari")


def test_minari_reads_our_episodes_with_t_plus_1_observations(tmp_path):
    minari = _minari()
    rb = filled_buffer([[3, 5], [4]], 30, 50)  # wrapped: cut heads are skipped
    out = export_minari(rb, tmp_path / "ds", dataset_id="xpbank/test-v0")
    ds = minari.MinariDataset(out)
    want = reference_episodes(rb, 2)
    data = rb.sample_all()
    assert ds.total_episodes == len(want) and ds.total_steps == sum(len(w["positions"]) for w in want)
    assert ds.spec.dataset_id == "xpbank/test-v0"
    for ep, w in zip(ds.iterate_episodes(), want, strict=True):
        pos = w["positions"]
        assert ep.observations.shape == (len(pos) + 1, 4)
        np.testing.assert_array_equal(ep.observations[:-1], data["obs"][pos].numpy())
        np.testing.assert_array_equal(ep.observations[-1], data["next", "obs"][pos[-1]].numpy())
        np.testing.assert_array_equal(ep.actions, data["action"][pos].numpy())
        np.testing.assert_allclose(ep.rewards, data["reward"][pos].numpy())
        assert ep.terminations.tolist() == [False] * (len(pos) - 1) + [w["terminated"]]
        assert ep.truncations.tolist() == [False] * (len(pos) - 1) + [not w["terminated"]]
        np.testing.assert_array_equal(ep.infos["step"], np.arange(len(pos)))


def _minari_dataset(path, episodes):
    """A Minari dataset written with Minari's own storage API (dict observations)."""
    minari = _minari()
    from gymnasium import spaces
    from minari.dataset.minari_storage import MinariStorage

    obs_space = spaces.Dict(
        {"pos": spaces.Box(-10, 10, (2,), np.float32), "count": spaces.Box(0, 99, (), np.int64)}
    )
    storage = MinariStorage.new(path, obs_space, spaces.Discrete(3), data_format="hdf5", jpeg_encoding=False)
    storage.update_episodes(episodes)
    storage.update_metadata({"dataset_id": "test/dict-v0", "minari_version": minari.__version__})
    return path


def test_import_dict_observations_and_an_episode_that_ends_unflagged(tmp_path):
    minari = _minari()
    from minari.data_collector import EpisodeBuffer

    rng = np.random.default_rng(0)
    eps = []
    for i, (t, term) in enumerate([(3, True), (2, False)]):
        eps.append(
            EpisodeBuffer(
                id=i,
                observations={
                    "pos": rng.normal(size=(t + 1, 2)).astype(np.float32),
                    "count": np.arange(t + 1),
                },
                actions=rng.integers(0, 3, t),
                rewards=rng.normal(size=t),
                terminations=np.array([False] * (t - 1) + [term]),
                truncations=np.zeros(t, bool),
                infos={},
            )
        )
    src = _minari_dataset(tmp_path / "ds", eps)
    bank = xpbank.load(import_minari(src, tmp_path / "b"))
    got = bank.sample_all()
    assert len(bank) == 5 and bank.capacity == 5
    np.testing.assert_array_equal(got["obs", "pos"][:3].numpy(), eps[0].observations["pos"][:3])
    np.testing.assert_array_equal(got["next", "obs", "pos"][3:].numpy(), eps[1].observations["pos"][1:])
    assert got["next", "obs", "count"].tolist() == [1, 2, 3, 1, 2]
    assert got["terminated"].tolist() == [False, False, True, False, False]
    assert got["truncated"].tolist() == [False, False, False, False, True]  # the unflagged end
    # and back out: the dict observations survive
    again = minari.MinariDataset(export_minari(bank, tmp_path / "again"))
    first = next(iter(again.iterate_episodes()))
    np.testing.assert_array_equal(first.observations["pos"], eps[0].observations["pos"])


def test_minari_export_names_missing_fields_and_writes_nothing(tmp_path):
    _minari()
    rb = xpbank.ReplayBuffer(10)
    rb.extend({"obs": torch.zeros(3, 2), "reward": torch.zeros(3), "done": torch.tensor([0, 0, 1]).bool()})
    with pytest.raises(SpecError, match=r"lacks field\(s\) \['action', 'next.obs'\]"):
        export_minari(rb, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    with pytest.raises(BankError, match="holds no items"):
        export_minari(xpbank.ReplayBuffer(4), tmp_path / "ds")


def test_npz_round_trip_of_a_wrapped_bank_streams_in_chunks(tmp_path):
    rb = filled_buffer([[3, 5], [4]], 40, 30)
    bank = xpbank.open_bank(xpbank.save(rb, tmp_path / "a"), "r")
    out = export_npz(bank, tmp_path / "a.npz", chunk=7)
    with zipfile.ZipFile(out) as zf:
        assert sorted(zf.namelist()) == sorted(
            [
                "obs.npy",
                "action.npy",
                "reward.npy",
                "terminated.npy",
                "truncated.npy",
                "next/obs.npy",
                "info/step.npy",
            ]
        )
    back = xpbank.load(import_npz(out, tmp_path / "b", chunk=4, capacity=100))
    want, got = rb.sample_all(), back.sample_all()
    assert back.capacity == 100 and len(back) == 30
    for key in want.keys(True, True):
        if key != "index":
            assert torch.equal(got[key], want[key]), key
    assert xpbank.open_bank(tmp_path / "b", verify=True) is not None  # checksums written


def test_npz_import_refuses_unequal_lengths_and_writes_nothing(tmp_path):
    np.savez(tmp_path / "x.npz", obs=np.zeros((3, 2)), reward=np.zeros(4))
    with pytest.raises(
        SpecError, match=r"every array needs the same number of items, got \{'obs.npy': 3, 'reward.npy': 4\}"
    ):
        import_npz(tmp_path / "x.npz", tmp_path / "b")
    assert not (tmp_path / "b").exists()
    with pytest.raises(BankError, match="already exists"):
        export_npz(filled_buffer([[2]], 3, 5, num_envs=False), tmp_path / "x.npz")
    with pytest.raises(BankError, match="is not a file"):
        import_npz(tmp_path / "nothing.npz", tmp_path / "b")
