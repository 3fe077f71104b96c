"""SB3's buffer cursor (``pos``, ``full``, ``size()``, ``reset()``) derived from xpbank's ring.

:class:`RingCursor` is the part that :class:`~xpbank.integrations.sb3.XpbankReplayBuffer`
and :class:`~xpbank.integrations.sb3.her.XpbankHerReplayBuffer` share: SB3's
``BaseBuffer.__init__`` is not called (its arrays are the xpbank buffer ``xp``), so SB3's
``pos`` / ``full`` counters are properties read from the ring, and banks are saved with
:func:`xpbank.save`. It comes first among the bases (``class B(RingCursor, SB3Buffer)``)
so that its properties and methods override SB3's attributes of the same names.

The ring holds ``buffer_size * n_envs`` items, one ``add`` writing one step of each of
the ``n_envs`` envs, so SB3's row ``pos`` is items ``pos * n_envs ... + n_envs - 1``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError, require
from xpbank.replay.buffer import ReplayBuffer

__all__ = ["RingCursor"]

require("stable_baselines3", "sb3")

from stable_baselines3.common import preprocessing as _preprocessing  # noqa: E402
from stable_baselines3.common import utils as _utils  # noqa: E402


class RingCursor:
    """SB3's cursor over an xpbank buffer ``xp`` of ``buffer_size * n_envs`` items.

    Example:
        >>> import gymnasium as gym
        >>> from xpbank.integrations.sb3 import XpbankReplayBuffer
        >>> env = gym.make("CartPole-v1")
        >>> rb = XpbankReplayBuffer(4, env.observation_space, env.action_space, "cpu", seed=0)
        >>> isinstance(rb, RingCursor), rb.pos, rb.full, rb.size()
        (True, 0, False, 0)
    """

    xp: ReplayBuffer
    n_envs: int
    buffer_size: int
    _next_id: int

    def _init_sb3(
        self,
        buffer_size: int,
        observation_space: Any,
        action_space: Any,
        device: torch.device | str,
        n_envs: int,
        handle_timeout_termination: bool,
    ) -> None:
        """SB3's ``BaseBuffer`` attributes (what its ``__init__`` would set, less the
        arrays); ``buffer_size`` becomes rows (``buffer_size // n_envs``, at least 1).

        Raises:
            SpecError: ``n_envs`` is not a positive int.
        """
        if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1:
            raise SpecError(f"n_envs: expected a positive int, got {n_envs!r}")
        self.observation_space, self.action_space = observation_space, action_space
        self.action_dim = _preprocessing.get_action_dim(action_space)
        self.device = _utils.get_device(device)
        self.n_envs = int(n_envs)
        self.buffer_size = max(int(buffer_size) // self.n_envs, 1)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self._kept_for_add()

    def _kept_for_add(self) -> None:
        """What every ``add`` reuses: an action's ``[envs, action_dim]`` shape, and the
        step's truncated flags when no env hit its time limit (read only: add's extend
        copies it)."""
        self._action_shape = (self.n_envs, self.action_dim)
        self._no_timeouts = np.zeros(self.n_envs, dtype=bool)
        self._no_timeouts.flags.writeable = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (SB3's ``load_replay_buffer``): the state, and what ``add`` reuses
        made anew (a pickle from before it was kept has none; NumPy's pickle drops the
        read-only flag)."""
        self.__dict__.update(state)
        self._kept_for_add()

    def _step_flags(self, infos: Any, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(terminated, truncated)`` of one vector step: SB3's ``done`` (bool, one per
        env) split by each env's ``infos[e]["TimeLimit.truncated"]``, which SB3 reads
        when it samples (``handle_timeout_termination``); xpbank stores both flags.

        Raises:
            SpecError: ``infos`` is not a list of one dict per env.
        """
        e = self.n_envs
        if not isinstance(infos, (list, tuple)) or len(infos) != e:
            got = f"{len(infos)} infos" if isinstance(infos, (list, tuple)) else type(infos).__name__
            raise SpecError(f"field 'infos': expected a list of {e} dicts (one per env), got {got}")
        for info in infos:  # (a loop: a generator in any() costs ~0.4 µs a step)
            if info.get("TimeLimit.truncated", False):
                timeout = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
                return done & ~timeout, done & timeout
        return done, self._no_timeouts  # no time limit hit: one kept array (extend copies it)

    def _attach(self, xp: ReplayBuffer) -> None:
        """Hold ``xp`` (new or loaded from a bank); the cursor continues after its newest item."""
        self.xp = xp
        self._next_id = int(xp.sample_by_index(-1)["index"]) + 1 if len(xp) else 0

    @property
    def pos(self) -> int:
        """The row the next ``add`` writes (SB3's ``pos``)."""
        return (self._next_id // self.n_envs) % self.buffer_size

    @property
    def next_id(self) -> int:
        """The id the next transition written gets (``buffer.xp``'s ids)."""
        return self._next_id

    @property
    def full(self) -> bool:
        """Whether every row holds a transition (SB3's ``full``)."""
        return self.xp.is_full

    def size(self) -> int:
        """Rows stored (SB3 counts steps, not transitions: ``len(buffer.xp) // n_envs``)."""
        return len(self.xp) // self.n_envs

    def reset(self) -> None:
        """Drop every transition (ids sampled before become stale)."""
        self.xp.clear()
        self._next_id = -(-self._next_id // self.xp.capacity) * self.xp.capacity

    def save_bank(self, path: str | os.PathLike[str]) -> os.PathLike[str]:
        """Save the transitions, cursor, sampler and RNG state as an xpbank bank."""
        from xpbank.bank import save

        return save(self.xp, path)
