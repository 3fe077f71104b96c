"""SB3's n-step replay (``NStepReplayBuffer``'s ``n_steps`` and ``gamma``) on an
:class:`~xpbank.integrations.sb3.XpbankReplayBuffer`, through xpbank's :class:`~xpbank.NStep`.

SB3's ``NStepReplayBuffer`` gives, for a sampled step ``t`` of env ``e``: ``rewards`` =
``sum_{j<k} gamma**j r_{t+j}`` over a window that stops after the first step that is
done or timed out (inclusive) and at the newest row, at most ``n_steps`` long;
``discounts`` = ``gamma**k``; ``next_observations`` and ``dones`` (``done * (1 -
timeout)``) of the window's last step. xpbank's ``NStep`` window is the same one (read
from its episode index: it stops after a terminated or truncated step and at the newest
item), so the targets are the same; ``tests/test_sb3_nstep.py`` checks them against
SB3's buffer fed the same stream, item by item.

Where they differ, and why:

- SB3 computes the return in float32, xpbank in float64 then rounds: the last bit may
  differ.
- With a ``VecNormalize`` env, SB3 normalizes (and clips) each reward before summing;
  here the n-step return is divided by the same scale and clipped as a whole
  (normalization is linear, so they agree unless clipping kicks in).
- ``optimize_memory_usage=True`` works with n-step here (SB3's raises
  ``NotImplementedError``), and SB3's cut between ``learn()`` calls is a truncation
  (see :class:`~xpbank.integrations.sb3.views.Dones`): a window stops there and
  bootstraps from the cut step's true next observation.
- Timeouts are stored even with ``handle_timeout_termination=False`` (SB3 drops them):
  the window stops there either way, and ``dones`` is then ``terminated or truncated``
  of the last step, as SB3's ``done``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.errors import SpecError
from xpbank.integrations.sb3.views import SB3Layout
from xpbank.nstep.option import NStep
from xpbank.replay import reading

__all__ = ["make_nstep", "nstep_targets", "read_slots"]

_NEXT_KEYS = [("next", "obs"), "terminated", "truncated"]  # taken from the window's last step


def make_nstep(n_steps: Any, gamma: Any) -> NStep | None:
    """xpbank's ``NStep`` for SB3's ``n_steps`` and ``gamma`` (``None`` for ``n_steps=1``).

    Raises:
        SpecError: ``n_steps`` not a positive int or ``gamma`` not in ``[0, 1]``.

    Example:
        >>> make_nstep(3, 0.9).n, make_nstep(1, 0.9)
        (3, None)
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise SpecError(f"n_steps: expected a positive int, got {n_steps!r}")
    if int(n_steps) == 1:
        return None
    return NStep(int(n_steps), float(gamma), reward_key="reward", next_keys=_NEXT_KEYS)


def read_slots(buffer: SB3Layout, slots: np.ndarray) -> TensorDict:
    """The items in ``slots`` as :meth:`ReplayBuffer.sample <xpbank.ReplayBuffer.sample>`
    gives them (with the n-step entries when the buffer has ``NStep``): SB3's
    ``_get_samples`` of given rows.

    Raises:
        SpecError: a slot that holds no transition (a row not written yet).
    """
    xp = buffer.xp
    index = torch.as_tensor(np.asarray(slots, dtype=np.int64))
    with xp.lock:
        # the live ids are [next - len, next), each in slot id % capacity
        first_slot = (buffer.next_id - len(xp)) % xp.capacity
        if len(index) and bool(((index - first_slot) % xp.capacity >= len(xp)).any()):
            raise SpecError(
                f"batch_inds: rows must hold transitions ({buffer.size()} rows stored), got slots "
                f"{index.tolist()}"
            )
        return reading.sample_slots(xp, index)


def nstep_targets(batch: TensorDict, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SB3's n-step ``rewards`` and ``discounts`` (``gamma ** k``, also when the window
    terminated: SB3's ``dones`` zeroes the bootstrap then), each ``[B, 1]`` float32."""
    steps = batch["nstep_steps"].to(torch.float64)
    discounts = torch.pow(torch.tensor(float(gamma), dtype=torch.float64), steps).to(torch.float32)
    return batch["nstep_return"].reshape(-1, 1), discounts.reshape(-1, 1)
