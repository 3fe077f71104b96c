"""``PrioritizedDQN``: SB3's DQN with prioritized replay (Schaul et al. 2016).

The smallest change to SB3's DQN: ``train()`` is SB3's own loop with two differences.
Each item's Huber loss is multiplied by its importance weight (the batch's ``"weight"``
from :class:`~xpbank.PrioritizedSampler`) before the mean, and the absolute TD errors
go back to the buffer with ``update_priority``. Everything else (target network,
exploration, gradient clipping, ``learn``, ``save``/``load``) is SB3's.

``PrioritizedDQN(n_steps=3)`` gives the buffer SB3's n-step arguments (``n_steps``,
``gamma``) itself, so n-step is on, without SB3's warning that ``n_steps`` is ignored
for a custom ``replay_buffer_class``. With ``optimize_memory_usage=True``, SB3's warning
that "the last trajectory in the replay buffer will be truncated" at each
``learn(reset_num_timesteps=True)`` is replaced by a log line saying what xpbank does:
each env's newest step is a truncation, which bootstraps from its true next observation
(SB3's buffer makes it a termination), so the warning's advice is not needed.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xpbank.errors import PriorityError, require
from xpbank.integrations.sb3.buffer import XpbankReplayBuffer
from xpbank.sampler import PrioritizedSampler

__all__ = ["PrioritizedDQN", "weighted_td_loss"]

_SB3_CUT_WARNING = "The last trajectory in the replay buffer will be truncated"

require("stable_baselines3", "sb3")  # a MissingExtraError naming the extra, before the import below

from stable_baselines3 import DQN  # noqa: E402


def weighted_td_loss(
    current: torch.Tensor, target: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean(w_i * huber(q_i - y_i))`` and the absolute TD errors ``|q_i - y_i|`` (detached).

    Args:
        current: Q-values of the taken actions, ``[B, 1]``.
        target: TD targets, ``[B, 1]`` (no gradient flows into them).
        weights: importance weights, ``[B]``.

    Example:
        >>> q, y = torch.tensor([[0.0], [3.0]]), torch.tensor([[0.5], [0.0]])
        >>> loss, td = weighted_td_loss(q, y, torch.tensor([1.0, 0.5]))
        >>> round(float(loss), 4), td.tolist()  # huber: 0.125 and 2.5
        (0.6875, [0.5, 3.0])
    """
    per_item = F.smooth_l1_loss(current, target, reduction="none").reshape(-1)
    loss = (weights.reshape(-1).to(per_item.dtype) * per_item).mean()
    return loss, (current - target).detach().abs().reshape(-1)


class PrioritizedDQN(DQN):
    """SB3's ``DQN`` drawing from a prioritized :class:`XpbankReplayBuffer`.

    Takes exactly DQN's arguments. Without ``replay_buffer_class`` it uses an
    :class:`XpbankReplayBuffer` with ``PrioritizedSampler()`` (alpha 0.6, beta 0.4);
    choose the sampler with ``replay_buffer_kwargs={"sampler": PrioritizedSampler(alpha=...,
    beta=..., beta_steps=...)}``. ``n_steps > 1`` is passed to an
    :class:`XpbankReplayBuffer` (unless ``replay_buffer_kwargs`` names ``n_steps``):
    n-step targets, ``gamma ** k`` as the bootstrap discount, as SB3's n-step DQN.

    Raises:
        PriorityError: the buffer is not an :class:`XpbankReplayBuffer` whose sampler
            keeps priorities.

    Example:
        >>> model = PrioritizedDQN("MlpPolicy", "CartPole-v1", learning_starts=50, seed=0)
        >>> _ = model.learn(200)
        >>> type(model.replay_buffer.xp.sampler).__name__
        'PrioritizedSampler'
    """

    def _setup_model(self) -> None:
        if self.replay_buffer_class is None:
            self.replay_buffer_class = XpbankReplayBuffer
            self.replay_buffer_kwargs = {"sampler": PrioritizedSampler(), **self.replay_buffer_kwargs}
        n_steps = self.n_steps
        if n_steps > 1 and issubclass(self.replay_buffer_class, XpbankReplayBuffer):
            # the buffer takes SB3's n-step arguments itself: SB3 would warn they are ignored
            self.replay_buffer_kwargs = {"n_steps": n_steps, "gamma": self.gamma, **self.replay_buffer_kwargs}
            self.n_steps = 1
        try:
            super()._setup_model()
        finally:
            self.n_steps = n_steps
        buffer = self.replay_buffer
        if not isinstance(buffer, XpbankReplayBuffer) or not hasattr(buffer.xp.sampler, "update_priority"):
            what = type(buffer.xp.sampler).__name__ if isinstance(buffer, XpbankReplayBuffer) else None
            raise PriorityError(
                "replay_buffer_class: expected XpbankReplayBuffer with a prioritized sampler, got "
                f"{type(buffer).__name__}{f' with {what}' if what else ''}; PrioritizedDQN needs "
                "per-item weights and update_priority"
            )

    def _setup_learn(self, *args: Any, **kwargs: Any) -> Any:
        """SB3's ``_setup_learn`` without its cut warning for an xpbank buffer (above)."""
        with warnings.catch_warnings():
            if isinstance(self.replay_buffer, XpbankReplayBuffer):  # the cut is logged instead
                warnings.filterwarnings("ignore", message=_SB3_CUT_WARNING)
            return super()._setup_learn(*args, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """SB3's DQN update with importance weights in the loss and priority updates."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        buffer: Any = self.replay_buffer
        losses = []
        for _ in range(gradient_steps):
            replay_data, batch = buffer.sample_batch(batch_size, env=self._vec_normalize_env)
            with torch.no_grad():
                next_q, _ = self.q_net_target(replay_data.next_observations).max(dim=1)
                discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
                target = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q.reshape(-1, 1)
            current = torch.gather(
                self.q_net(replay_data.observations), dim=1, index=replay_data.actions.long()
            )
            loss, td_error = weighted_td_loss(current, target, batch["weight"].to(current.device))
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            buffer.xp.update_priority(batch["index"], td_error.cpu())
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
