"""FrameStorage with frame dtypes NumPy lacks (held as same-width ints, viewed back on read)."""

from __future__ import annotations

import pytest
import torch

from xpbank import FrameStorage, ReplayBuffer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
def test_frames_of_any_dtype_come_back_bit_for_bit(dtype):
    frames = torch.randn(12, 3, 3).to(dtype)  # one env, two episodes (steps 0-6, 7-11)

    def stack(t: int, start: int) -> torch.Tensor:  # 2 frames, the episode's first repeated
        return torch.stack([frames[max(start, t - 1)], frames[t]])

    rb = ReplayBuffer(8, storage=FrameStorage(8), num_envs=1, seed=0)  # wraps: 11 > 8
    added = []
    for t in range(11):
        start = 0 if t < 7 else 7
        item = {"obs": stack(t, start), ("next", "obs"): stack(t + 1, start), "terminated": t == 6}
        if t == 6:  # the episode's true final observation is not the next step's
            item["next", "obs"] = torch.stack([frames[6], -frames[6]])
        rb.add(item)
        added.append(item)
    for batch in (rb.sample_all(), rb.sample(8)):
        assert batch["obs"].dtype == dtype and batch["next", "obs"].dtype == dtype
        for i, index in enumerate(batch["index"].tolist()):
            assert torch.equal(batch["obs"][i], added[index]["obs"])
            assert torch.equal(batch["next", "obs"][i], added[index]["next", "obs"])
