"""PrioritizedDQN: the weighted loss by hand, priorities from the TD errors, buffer checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
pytest.importorskip("gymnasium")

from stable_baselines3 import DQN

from xpbank import PrioritizedSampler, PriorityError
from xpbank.integrations.sb3 import PrioritizedDQN, XpbankReplayBuffer
from xpbank.integrations.sb3.dqn import weighted_td_loss


def huber(x: float) -> float:
    return 0.5 * x * x if abs(x) < 1 else abs(x) - 0.5


def test_weighted_td_loss_against_a_loop():
    gen = torch.Generator().manual_seed(0)
    q, y = torch.randn(9, 1, generator=gen) * 2, torch.randn(9, 1, generator=gen) * 2
    w = torch.rand(9, generator=gen)
    expected = sum(float(w[i]) * huber(float(q[i, 0] - y[i, 0])) for i in range(9)) / 9
    q.requires_grad_(True)
    loss, td = weighted_td_loss(q, y, w)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert td.tolist() == pytest.approx((q.detach() - y).abs()[:, 0].tolist(), rel=1e-6)
    assert not td.requires_grad
    loss.backward()  # the gradient of item i is w_i * huber'(q_i - y_i) / B
    diff = (q.detach() - y)[:, 0].tolist()
    grad = [float(w[i]) * float(np.clip(diff[i], -1, 1)) / 9 for i in range(9)]
    assert q.grad[:, 0].tolist() == pytest.approx(grad, rel=1e-5)


def frozen_model(**kwargs) -> PrioritizedDQN:
    """A PrioritizedDQN whose networks do not move (lr 0), with a filled buffer."""
    model = PrioritizedDQN(
        "MlpPolicy", "CartPole-v1", learning_rate=0.0, learning_starts=10_000, buffer_size=500, seed=0,
        device="cpu", **kwargs,
    )  # fmt: skip
    model.learn(300)  # fills the buffer, no training before learning_starts
    return model


def test_train_weights_the_loss_and_sends_td_errors_back():
    model = frozen_model(replay_buffer_kwargs={"sampler": PrioritizedSampler(alpha=0.7, eps=0.01)})
    buffer = model.replay_buffer
    model.train(gradient_steps=1, batch_size=32)  # priorities of the first batch differ from the rest
    seen: list = []
    sample_batch = buffer.sample_batch
    buffer.sample_batch = lambda *a, **k: seen.append(sample_batch(*a, **k)) or seen[-1]
    sent: list = []
    update = buffer.xp.update_priority
    buffer.xp.update_priority = lambda i, p, **k: (sent.append((i.clone(), p.clone())), update(i, p, **k))
    model.train(gradient_steps=1, batch_size=32)

    data, batch = seen[0]
    with torch.no_grad():  # DQN's target and current Q, recomputed (the networks did not move)
        next_q = model.q_net_target(data.next_observations).max(dim=1).values
        target = data.rewards[:, 0] + (1 - data.dones[:, 0]) * model.gamma * next_q
        current = model.q_net(data.observations).gather(1, data.actions.long())[:, 0]
    td = (current - target).abs()
    w = batch["weight"]
    assert len(w.unique()) > 1  # the weights that multiply the loss are not all 1
    loss = sum(float(w[i]) * huber(float(current[i] - target[i])) for i in range(32)) / 32
    assert model.logger.name_to_value["train/loss"] == pytest.approx(loss, rel=1e-5)
    ((index, priorities),) = sent
    assert torch.equal(index, batch["index"])
    torch.testing.assert_close(priorities, td)
    # what the sampler now stores for each sampled slot: (|td| + eps) ** alpha (last one wins)
    leaves = buffer.xp.sampler.state_dict()["priorities"]
    last = {int(i): float(p) for i, p in zip(index, td, strict=False)}
    for i, p in last.items():
        assert float(leaves[i % buffer.xp.capacity]) == pytest.approx((p + 0.01) ** 0.7, rel=1e-5)


def test_default_buffer_is_prioritized_xpbank():
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", buffer_size=100, device="cpu", seed=0)
    assert isinstance(model.replay_buffer, XpbankReplayBuffer)
    assert isinstance(model.replay_buffer.xp.sampler, PrioritizedSampler)


def test_needs_a_prioritized_xpbank_buffer():
    with pytest.raises(
        PriorityError,
        match="prioritized sampler, got XpbankReplayBuffer with UniformSampler; PrioritizedDQN needs",
    ):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=XpbankReplayBuffer, device="cpu")
    from stable_baselines3.common.buffers import ReplayBuffer

    with pytest.raises(PriorityError, match="got ReplayBuffer;"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer, device="cpu")


def test_uniform_xpbank_buffer_gives_sb3_dqn_the_same_update():
    """With uniform weights (alpha 0, beta 0) PrioritizedDQN's loss is DQN's loss."""
    model = frozen_model(replay_buffer_kwargs={"sampler": PrioritizedSampler(alpha=0.0, beta=0.0)})
    data, batch = model.replay_buffer.sample_batch(64)
    assert torch.all(batch["weight"] == 1)
    model.replay_buffer.sample = lambda *a, **k: data
    model.replay_buffer.sample_batch = lambda *a, **k: (data, batch)
    model.train(1, 64)
    ours = model.logger.name_to_value["train/loss"]
    DQN.train(model, 1, 64)  # SB3's own update on the same batch
    assert model.logger.name_to_value["train/loss"] == pytest.approx(ours, rel=1e-6)
