"""HerSampler over a RayReplayBuffer: each shard relabels from its own episode index.

A buffer whose sampler needs episodes keeps each env's rows on one shard, and each shard
runs the sampler on its local buffer (with the ``compute_reward`` the client sent it),
so every relabelled goal must come from a later step of the item's own episode, on the
item's own shard; ``"her_goal"`` is a global id, like ``"index"``. Samplers Ray cannot
serve correctly are refused when the buffer is built, before any actor starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

from xpbank import PrioritizedSampler, SpecError
from xpbank.distributed.ray import RayReplayBuffer, decode
from xpbank.her import HerSampler

# the goal step's uid minus the item's (goals are ``uid + 0.5``): names the pairing. A
# lambda: Ray pickles it by value (a function of this test module, by reference, would
# not import in the actors, which do not have tests/ on their path)
gap = lambda achieved, desired, info: (desired[..., 0] - achieved[..., 0]).astype(np.float32)  # noqa: E731


@pytest.mark.slow
def test_goals_come_from_the_items_episode_on_its_shard(ray_pool: Any, tmp_path: Path) -> None:
    her = HerSampler(strategy="future", n_sampled_goal=4, compute_reward=gap)
    rb = RayReplayBuffer(
        2, 400, sampler=her, flush_bytes=0, shards=ray_pool.take(2, first=0), checkpoint_dir=tmp_path, seed=0
    )
    try:
        rng = np.random.default_rng(0)
        envs, steps = 4, 40
        episode = np.arange(envs)  # each env's current episode number
        where: dict[int, tuple[int, int, int]] = {}  # global id -> (uid, env, episode)
        for t in range(steps):
            uid = np.arange(t * envs, (t + 1) * envs)
            term = rng.random(envs) < 0.1
            trunc = (rng.random(envs) < 0.05) & ~term
            ids = rb.extend(
                {
                    "uid": torch.from_numpy(uid),
                    "next_achieved_goal": torch.from_numpy(uid + 0.5).float()[:, None],
                    "desired_goal": torch.full((envs, 1), -7.0),
                    "reward": torch.full((envs,), -3.0),
                    "terminated": torch.from_numpy(term),
                    "truncated": torch.from_numpy(trunc),
                    "env_id": torch.arange(envs),
                }
            )
            for gid, u, e in zip(torch.as_tensor(list(ids)).tolist(), uid.tolist(), range(envs), strict=True):
                where[gid] = (u, e, int(episode[e]))
            ended = term | trunc
            episode[ended] = episode.max() + 1 + np.arange(int(ended.sum()))
        batch = rb.sample(300)
        goal_ids, index = batch["her_goal"].numpy(), batch["index"].numpy()
        relabelled = goal_ids >= 0
        assert abs(int(relabelled.sum()) - 240) <= 2  # int(k * 4 / 5) of each shard's k items
        for i in np.flatnonzero(relabelled):
            uid, env, ep = where[int(index[i])]
            assert int(batch["uid"][i]) == uid
            g_uid, g_env, g_ep = where[int(goal_ids[i])]
            assert (g_env, g_ep) == (env, ep) and g_uid >= uid  # a later step of its episode
            assert decode(goal_ids[i : i + 1], 2)[0][0] == decode(index[i : i + 1], 2)[0][0]  # its shard
            assert float(batch["desired_goal"][i, 0]) == g_uid + 0.5
            assert float(batch["reward"][i]) == g_uid - uid  # compute_reward ran on the shard
        kept = ~relabelled
        assert kept.any()
        assert (batch["desired_goal"][torch.from_numpy(kept)] == -7.0).all()
        assert (batch["reward"][torch.from_numpy(kept)] == -3.0).all()
    finally:
        rb.close()


def test_a_her_sampler_the_shards_cannot_serve_is_refused() -> None:
    with pytest.raises(SpecError, match="no compute_reward"):
        RayReplayBuffer(2, 100, sampler=HerSampler())
    with pytest.raises(SpecError, match="needs a UniformSampler base"):
        RayReplayBuffer(2, 100, sampler=HerSampler(PrioritizedSampler(), compute_reward=gap))
