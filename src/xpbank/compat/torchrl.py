"""TorchRL's ``ReplayBufferTrainer`` hook, for xpbank buffers and TorchRL's own.

Switch with one import line: ``from xpbank.compat.torchrl import ReplayBufferTrainer``.
It registers on a TorchRL ``Trainer`` like TorchRL's (``batch_process`` -> :meth:`extend`,
``process_optim_batch`` -> :meth:`sample`, and priorities after each optimization step,
see :meth:`ReplayBufferTrainer.register`) and drives an :class:`xpbank.ReplayBuffer`
(uniform or prioritized) or a TorchRL ``TensorDictReplayBuffer``. Differences from
TorchRL: ``docs/compat/torchrl.md``.

Without ``flatten_tensordicts`` a ``[E, T]`` collection is stored as ``E`` items that
each keep their ``[T]`` batch dim, and samples come back with ``batch_size [B, T]``
(``"index"`` and weights expanded over ``T``), as TorchRL's do: a loss that reads time
from the batch (TD(lambda), GAE) sees the same data.

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
from tensordict import TensorDict, TensorDictBase, pad

from xpbank.errors import CapacityError, SpecError
from xpbank.replay.buffer import ReplayBuffer

__all__ = ["ReplayBufferTrainer"]


def _is_xpbank(rb: Any) -> bool:
    return isinstance(rb, ReplayBuffer)


def with_item_dims(batch: TensorDictBase, item_dims: Sequence[int]) -> TensorDictBase:
    """``batch`` (``[B]``) as ``[B, *item_dims]``: what TorchRL gives for items with batch dims.

    Fields stored with the items' dims keep them; per-item entries (``"index"``, a
    sampler's ``"weight"``) are expanded over them, as TorchRL expands its index.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> b = TensorDict({"obs": torch.zeros(2, 5, 3), "index": torch.tensor([4, 7])}, [2])
        >>> out = with_item_dims(b, [5])
        >>> out.batch_size, out["index"][1].tolist()
        (torch.Size([2, 5]), [7, 7, 7, 7, 7])
    """
    dims = tuple(int(d) for d in item_dims)
    if not dims:
        return batch
    n, k = batch.batch_size[0], len(dims)
    flat: dict[Any, torch.Tensor] = {}
    for key, value in batch.items(include_nested=True, leaves_only=True):
        if tuple(value.shape[1 : 1 + k]) != dims:  # a per-item entry: index, weight
            value = value.reshape(n, *([1] * k), *value.shape[1:]).expand(n, *dims, *value.shape[1:])
        flat[key] = value
    out = TensorDict(batch_size=[n, *dims], device=batch.device)
    for key, value in flat.items():
        out.set(key, value)
    return out


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
        self.item_dims: list[int] = []  # the batch dims of the stored items (TorchRL: [T])
        self._last: TensorDictBase | None = None  # the newest sample (priorities after the step)

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
        dims = list(batch.batch_size[1:])
        if dims:  # items with batch dims of their own: stored as fields, given back with them
            if len(self.replay_buffer) and self.item_dims != dims:
                raise SpecError(
                    f"extend: the buffer holds items of batch dims {self.item_dims}, got a "
                    f"collection of batch_size {list(batch.batch_size)} (items of {dims}); "
                    f"keep frames_per_batch fixed or set flatten_tensordicts=True"
                )
            self.replay_buffer.extend(dict(batch.items(include_nested=True, leaves_only=True)))
        else:
            self.replay_buffer.extend(batch)
        self.item_dims = dims
        return batch

    def _draw(self) -> TensorDictBase:
        rb = self.replay_buffer
        if not self.iterate:
            out = rb.sample(batch_size=self.batch_size)
        else:
            if self._iter is None:
                self._iter = rb.epochs(self.batch_size) if _is_xpbank(rb) else iter(rb)
            try:
                out = next(self._iter)
            except StopIteration:
                self._iter = None  # the next call starts a new pass
                raise
        return with_item_dims(out, self.item_dims) if _is_xpbank(rb) else out

    def sample(self, batch: TensorDictBase | None) -> TensorDictBase:
        """A training batch from the buffer (the trainer's collected ``batch`` is ignored)."""
        out = self._draw()
        self._last = out = out.to(self.device) if self.device is not None else out
        return out

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
        if index.ndim > 1:  # items with batch dims: the index was expanded over them
            index = index.reshape(index.shape[0], -1)[:, 0]
        # e.g. [B, 1], or [B, T] for items with batch dims: one priority per item (the max)
        priority = priority.reshape(index.shape[0], -1).amax(-1)
        rb.update_priority(index.cpu(), priority.float().cpu(), stale="skip")

    def update_last_priority(self) -> None:
        """:meth:`update_priority` of the newest sample, after the optimizer step.

        The loss wrote its priorities into the sampled batch; TorchRL's ``post_optim``
        stage (where TorchRL asks priority updates to go since ``OptimizationStepper``
        replaced ``post_loss``) passes no batch, so the hook keeps the one it handed out.
        """
        if self._last is not None:
            batch, self._last = self._last, None
            self.update_priority(batch)

    def state_dict(self) -> dict[str, Any]:
        """``{"replay_buffer": ...}``: the buffer's state (data, cursor, sampler, RNG)."""
        return {"replay_buffer": self.replay_buffer.state_dict(), "item_dims": list(self.item_dims)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.replay_buffer.load_state_dict(state_dict["replay_buffer"])
        self.item_dims = [int(d) for d in state_dict.get("item_dims", [])]

    def register(self, trainer: Any, name: str = "replay_buffer") -> None:
        """Register the hooks on ``trainer`` and the module under ``name``.

        ``batch_process`` -> :meth:`extend`, ``process_optim_batch`` -> :meth:`sample`.
        Priorities: with a TorchRL that has ``OptimizationStepper`` (whose arrival
        deprecates the ``post_loss`` stage), ``post_optim`` ->
        :meth:`update_last_priority`, which also runs when the trainer is given an
        ``optimization_stepper`` (``post_loss`` never does then); with an older
        TorchRL, ``post_loss`` -> :meth:`update_priority`, as TorchRL's hook does.
        """
        trainer.register_op("batch_process", self.extend)
        trainer.register_op("process_optim_batch", self.sample)
        if _has_optimization_stepper():
            trainer.register_op("post_optim", self.update_last_priority)
        else:
            trainer.register_op("post_loss", self.update_priority)
        trainer.register_module(name, self)


def _has_optimization_stepper() -> bool:
    """Whether the installed TorchRL has ``OptimizationStepper`` (its ``post_loss`` successor)."""
    try:
        from torchrl.trainers import OptimizationStepper  # noqa: F401
    except ImportError:
        return False
    return True
