"""The advantages and returns of a rollout: where they are stored, and how the grid's
inputs (next values across segment rows, truncation values) are put together.

:class:`Targets` belongs to a :class:`~xpbank.RolloutBuffer`; the math itself is the
pure functions of :mod:`xpbank.rollout.returns`. Inputs arrive as time-major grids
``[L, R]`` (see :mod:`xpbank.rollout.layout`); results are stored per slot in a small
packed storage (``"advantage"``, ``"return"``) and handed back in the buffer's shape.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from xpbank.errors import SpecError
from xpbank.rollout.layout import SegmentLayout, TimeLayout
from xpbank.rollout.returns import gae, normalize_advantages, vtrace
from xpbank.spec.spec import NestedKey
from xpbank.storage import TensorStorage

__all__ = ["Targets"]


class Targets:
    """Computed advantages/returns of one rollout (``None`` until computed)."""

    def __init__(self, layout: TimeLayout | SegmentLayout, storage: TensorStorage):
        self.layout = layout
        self.storage = storage
        self.computed = False
        # both grids are views of arange(capacity): [T, E] as it is, [S, H] transposed
        self.transposed = not isinstance(layout, TimeLayout)
        self.shape = layout.grid.T.shape if self.transposed else layout.grid.shape

    def clear(self) -> None:
        self.computed = False

    def to_grid(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x`` in the buffer's shape (or flat, ``[capacity]``) as the time-major grid (a view)."""
        if x.numel() != self.layout.capacity:
            raise SpecError(
                f"{name}: expected {list(self.shape)} values (the buffer's shape), got shape {list(x.shape)}"
            )
        x = x.detach().cpu().reshape(self.shape)
        return x.T if self.transposed else x

    def from_grid(self, g: torch.Tensor) -> torch.Tensor:
        """A time-major grid back in the buffer's shape (contiguous)."""
        return (g.T if self.transposed else g).contiguous()

    def next_values(
        self, values: torch.Tensor, last_values: Any, final: torch.Tensor | None, truncated: torch.Tensor
    ) -> torch.Tensor:
        """``V(s[t+1])`` per cell: the next cell, across a full segment row into the row
        that continues it, ``last_values`` of the writer after its last step, and the true
        final value where a step was truncated."""
        lay = self.layout
        last = torch.as_tensor(last_values).detach().to("cpu", torch.float32).reshape(-1)
        if last.numel() != lay.num_writers:
            raise SpecError(
                f"last_values: expected one value per env ({lay.num_writers}), got shape "
                f"{list(torch.as_tensor(last_values).shape)}"
            )
        values = values.float()
        nv = torch.empty_like(values)
        nv[:-1] = values[1:]
        succ = torch.from_numpy(lay.successor)
        has = succ >= 0
        writer = torch.from_numpy(lay.writer_of_row).clamp(min=0)
        nv[-1] = torch.where(has, values[0, succ.clamp(min=0)], last[writer])
        if final is not None:
            nv = torch.where(truncated > 0, final.float(), nv)
        return nv

    def _store(
        self, adv: torch.Tensor, ret: torch.Tensor, normalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if normalize:
            adv = normalize_advantages(adv)
        adv_b, ret_b = self.from_grid(adv), self.from_grid(ret)
        self.storage.write(
            slice(0, self.layout.capacity), {"advantage": adv_b.reshape(-1), "return": ret_b.reshape(-1)}
        )
        self.computed = True
        device = self.storage.device
        return adv_b.to(device), ret_b.to(device)

    def gae(
        self, grids: dict[str, torch.Tensor], gamma: float, lam: float, normalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        adv, ret = gae(
            grids["rewards"], grids["values"], grids["next_values"], grids["terminated"], grids["truncated"],
            gamma, lam,
        )  # fmt: skip
        return self._store(adv, ret, normalize)

    def vtrace(
        self,
        grids: dict[str, torch.Tensor],
        behaviour: torch.Tensor,
        target: torch.Tensor,
        gamma: float,
        rho_bar: float,
        c_bar: float,
        lam: float,
        normalize: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        adv, vs = vtrace(
            behaviour, target, grids["rewards"], grids["values"], grids["next_values"],
            grids["terminated"], grids["truncated"], gamma, rho_bar, c_bar, lam,
        )  # fmt: skip
        return self._store(adv, vs, normalize)

    def gather(self, slots: torch.Tensor) -> dict[NestedKey, torch.Tensor]:
        """``{"advantage", "return"}`` of ``slots`` (one ``index_select``), or ``{}``."""
        return self.storage.gather(slots) if self.computed else {}

    def write(self, slots: torch.Tensor, derived: dict[NestedKey, torch.Tensor]) -> None:
        self.storage.write(slots, derived)

    @staticmethod
    def normalize_in(td: TensorDict) -> None:
        """Normalize a minibatch's ``"advantage"`` (a fresh copy: storage is untouched)."""
        if "advantage" not in td:
            raise SpecError("normalize_advantages: no advantages yet; call compute_returns() first")
        td.set("advantage", normalize_advantages(td["advantage"]))
