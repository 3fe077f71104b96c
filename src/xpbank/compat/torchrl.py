"""TorchRL's ``ReplayBufferTrainer`` hook, for xpbank buffers and TorchRL's own.

Switch with one import line: ``from xpbank.compat.torchrl import ReplayBufferTrainer``.
It registers on a TorchRL ``Trainer`` like TorchRL's (``batch_process`` -> :meth:`extend`,
``process_optim_batch`` -> :meth:`sample`, ``post_loss`` -> :meth:`update_priority`) and
drives an :class:`xpbank.ReplayBuffer` (uniform or prioritized) or a TorchRL
``TensorDictReplayBuffer``. Differences from TorchRL: ``docs/compat/torchrl.md``.

Example:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> import xpbank
    >>> from xpbank.compat.torchrl import ReplayBufferTrainer
    >>> rb = xpbank.ReplayBuffer(100, sampler=xpbank.PrioritizedSampler(), seed=0)
    >>> hook = ReplayBufferTrainer(rb, batch_size=4, flatten_tensordicts=True)
    >>> collected = TensorDict({"obs": torch.randn(2, 5, 3)}, batch_size=[2, 5])
    >>> collected["collector", "mask"] = torch.ones(2, 5, dtype=torch.bool)
    >>> hook.extend(collected).batch_size
    torch.Size([10])
    >>> batch = hook.sample(None)
    >>> batch["td_error"] = torch.full((4,), 3.0)  # what a loss writes
    >>> hook.update_priority(batch)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase, pad

from xpbank.errors import CapacityError, SpecError
from xpbank.replay.buffer import ReplayBuffer

__all__ = ["ReplayBufferTrainer"]


def _is_xpbank(rb: Any) -> bool:
    return isinstance(rb, ReplayBuffer)


def pad_to(batch: TensorDictBase, max_dims: Sequence[int]) -> TensorDictBase:
    """Pad ``batch`` with zeros up to ``max_dims`` per batch dim (``-1``: leave that dim).

    Raises:
        SpecError: a dim is larger than its maximum (TorchRL would crop it silently),
            or ``max_dims`` has not one entry per batch dim.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> pad_to(TensorDict({"x": torch.ones(2, 3)}, [2, 3]), [4, -1])["x"].sum(1)
        tensor([3., 3., 0., 0.])
    """
    if len(max_dims) != batch.ndim:
        raise SpecError(f"max_dims: expected {batch.ndim} entries (one per batch dim), got {list(max_dims)}")
    pads: list[int] = []
    for d, (size, most) in enumerate(zip(batch.batch_size, max_dims, strict=True)):
        if most != -1 and size > most:
            raise SpecError(
                f"max_dims: batch dim {d} has size {size}, more than max_dims[{d}] = {most}; "
                f"refusing to crop collected data (raise max_dims or use -1 for no maximum)"
            )
        pads += [0, 0 if most == -1 else most - size]
    return pad(batch, pads) if any(pads) else batch


class ReplayBufferTrainer:
    """Replay buffer hook for a TorchRL ``Trainer``: store collections, sample, update priorities.

    Args:
        replay_buffer: an :class:`xpbank.ReplayBuffer` or a TorchRL ``TensorDictReplayBuffer``.
        batch_size: items per sample; required for an xpbank buffer (TorchRL's may use
            its own).
        memmap: accepted for compatibility (TorchRL ignores it too).
        device: where samples are delivered.
        flatten_tensordicts: keep only the valid steps of a collection (its
            ``("collector", "mask")``), or flatten it, before storing.
        max_dims: without flattening, pad each batch dim up to this size (``-1``: no
            maximum); a larger dim raises instead of being cropped.
        iterate: sample by iterating over the buffer (one pass of minibatches; the
            trainer's optimization loop stops at its end) instead of drawing at random.
        priority_key: the entry a loss writes priorities to (TorchRL losses:
            ``loss.tensor_keys.priority``, ``"td_error"`` by default).
    """

    def __init__(
        self,
        replay_buffer: Any,
        batch_size: int | None = None,
        memmap: bool = False,
        device: Any = "cpu",
        flatten_tensordicts: bool = False,
        max_dims: Sequence[int] | None = None,
        iterate: bool = False,
        priority_key: str | tuple[str, ...] = "td_error",
    ) -> None:
        if _is_xpbank(replay_buffer) and batch_size is None:
            raise CapacityError(
                "batch_size: an xpbank ReplayBuffer has no default batch size; pass batch_size="
            )
        if not _is_xpbank(replay_buffer) and not hasattr(replay_buffer, "sample"):
            raise SpecError(
                f"replay_buffer: expected an xpbank.ReplayBuffer or a TorchRL replay buffer, "
                f"got {type(replay_buffer).__name__}"
            )
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        self.memmap = memmap
        self.device = None if device is None else torch.device(device)
        self.flatten_tensordicts = flatten_tensordicts
        self.max_dims = None if max_dims is None else list(max_dims)
        self.iterate = iterate
        self.priority_key = priority_key
        self._iter: Iterator[TensorDictBase] | None = None

    def extend(self, batch: TensorDictBase) -> TensorDictBase:
        """Store a collected batch (masked or flattened, or padded); returns what was stored.

        The collector's batch is not modified (TorchRL marks its last steps truncated in
        place; here that happens on a copy).
        """
        if self.flatten_tensordicts:
            mask_key = ("collector", "mask")
            if mask_key in batch.keys(include_nested=True):
                batch = batch[batch.get(mask_key)]
            else:
                if ("next", "truncated") in batch.keys(include_nested=True):
                    batch = batch.clone(recurse=False)
                    batch["next"] = batch["next"].clone(recurse=False)
                    truncated = batch["next", "truncated"].clone()
                    truncated.select(batch.ndim - 1, -1).fill_(True)  # the collection cuts here
                    batch["next", "truncated"] = truncated
                batch = batch.reshape(-1)
        elif self.max_dims is not None:
            batch = pad_to(batch, self.max_dims)
        if not _is_xpbank(self.replay_buffer):
            batch = batch.cpu()
        self.replay_buffer.extend(batch)
        return batch

    def _draw(self) -> TensorDictBase:
        if not self.iterate:
            return self.replay_buffer.sample(batch_size=self.batch_size)
        if self._iter is None:
            rb = self.replay_buffer
            self._iter = rb.epochs(self.batch_size) if _is_xpbank(rb) else iter(rb)
        try:
            return next(self._iter)
        except StopIteration:
            self._iter = None  # the next call starts a new pass
            raise

    def sample(self, batch: TensorDictBase | None) -> TensorDictBase:
        """A training batch from the buffer (the trainer's collected ``batch`` is ignored)."""
        out = self._draw()
        return out.to(self.device) if self.device is not None else out

    def update_priority(self, batch: TensorDictBase) -> None:
        """Send the loss's priorities (``priority_key``) back by ``batch["index"]``.

        Nothing happens for buffers without priorities (uniform sampling). Items
        overwritten since the sample (a collection landed in between) are skipped: their
        slots hold new items, which keep the priority they were written with.
        """
        rb = self.replay_buffer
        if not _is_xpbank(rb):
            update = getattr(rb, "update_tensordict_priority", None)
            if update is not None:
                update(batch)
            return
        if not hasattr(rb.sampler, "update_priority"):
            return
        if self.priority_key not in batch.keys(include_nested=True):
            raise SpecError(
                f"update_priority: the batch has no {self.priority_key!r} entry (the loss's priority "
                f"key); pass priority_key= to ReplayBufferTrainer"
            )
        priority = batch.get(self.priority_key).detach()
        index = batch.get("index")
        if priority.ndim > index.ndim:  # e.g. [B, 1]: one priority per item
            priority = priority.reshape(index.shape[0], -1).amax(-1)
        rb.update_priority(index.cpu(), priority.float().cpu(), stale="skip")

    def state_dict(self) -> dict[str, Any]:
        """``{"replay_buffer": ...}``: the buffer's state (data, cursor, sampler, RNG)."""
        return {"replay_buffer": self.replay_buffer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.replay_buffer.load_state_dict(state_dict["replay_buffer"])

    def register(self, trainer: Any, name: str = "replay_buffer") -> None:
        """Register the hooks at TorchRL's default places and the module under ``name``."""
        trainer.register_op("batch_process", self.extend)
        trainer.register_op("process_optim_batch", self.sample)
        trainer.register_op("post_loss", self.update_priority)
        trainer.register_module(name, self)
