"""objectrl's ``ReplayBuffer``, on an xpbank :class:`~xpbank.ReplayBuffer`.

Switch with one import line: ``from xpbank.compat.objectrl import ReplayBuffer``. Every
documented method is here with objectrl's signature; storage, sampling and persistence
are xpbank's. Deliberate differences (``docs/compat/objectrl.md``): ``save``/``load``
restore the full contents (objectrl keeps metadata only); ``sample_by_index`` reads
logical positions (0 = oldest) instead of physical slots; ``get_next_batch`` without an
iterator samples at random, as documented (objectrl raises ``AttributeError``);
``sample_by_index_fields`` returns a tensor or a tuple, as documented.

Example:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from xpbank.compat.objectrl import ReplayBuffer
    >>> buffer = ReplayBuffer(torch.device("cpu"), torch.device("cpu"), buffer_size=4)
    >>> buffer.add_batch(TensorDict({"obs": torch.arange(6.0)}, batch_size=[6]))
    >>> len(buffer), buffer.sample_by_index([0, -1])["obs"]
    (4, tensor([2., 5.]))
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.bank import load as load_bank
from xpbank.bank import save as save_bank
from xpbank.errors import BankError, SpecError, check_positive_int
from xpbank.replay.buffer import ReplayBuffer as _Buffer
from xpbank.replay.state import seed_from
from xpbank.sampler import epoch_plan
from xpbank.storage.base import check_device

__all__ = ["ReplayBuffer"]


def _positions(indices: Any) -> Any:
    if isinstance(indices, range):
        return np.arange(indices.start, indices.stop, indices.step)
    return indices


class ReplayBuffer:
    """A fixed-size FIFO replay buffer with objectrl's API.

    Args:
        device: where sampled batches are delivered (the training device).
        storing_device: where the data lives.
        buffer_size: the most transitions kept; the oldest are overwritten first.
        print_gc_warning: accepted for compatibility; xpbank's storage is allocated
            once, so no garbage collection is ever triggered.

    Attributes:
        memory: the underlying :class:`xpbank.ReplayBuffer` (objectrl: a TorchRL
            ``TensorDictReplayBuffer``).
        epoch_iterator: the iterator :meth:`get_next_batch` draws from, or ``None``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> buffer = ReplayBuffer(torch.device("cpu"), torch.device("cpu"), 100)
        >>> buffer.add(TensorDict({"obs": torch.zeros(3), "action": torch.tensor(1)}, []))
        >>> buffer.get_steps_and_iterator(n_epochs=2, max_iter=0, batch_size=1)
        2
        >>> buffer.get_next_batch(1)["action"]
        tensor([1])
    """

    def __init__(
        self,
        device: torch.device,
        storing_device: torch.device,
        buffer_size: int,
        print_gc_warning: bool = False,
    ) -> None:
        self.device = check_device(device)
        self.storing_device = check_device(storing_device)
        self.buffer_size = check_positive_int("buffer_size", buffer_size)
        self.print_gc_warning = print_gc_warning
        self.epoch_iterator: Iterator[TensorDict] | None = None
        self.reset()

    def reset(self, buffer_size: int | None = None) -> None:
        """Empty the buffer (new memory), optionally with a new ``buffer_size``."""
        if buffer_size is not None:
            self.buffer_size = check_positive_int("buffer_size", buffer_size)
        self.memory = _Buffer(
            self.buffer_size, storing_device=self.storing_device, device=self.device, seed=seed_from()
        )
        self.epoch_iterator = None
        self._written = 0

    # -- writing ---------------------------------------------------------------
    def add(self, experience: TensorDict) -> None:
        """Add one transition (a TensorDict without a batch dim)."""
        self.memory.add(experience)
        self._written += 1

    def add_batch(self, batch: TensorDict) -> None:
        """Add a batch of transitions (leading dim = transitions); checked whole first."""
        self._written += len(self.memory.extend(batch))

    # -- status ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.memory)

    @property
    def size(self) -> int:
        """The number of stored transitions (``len(buffer)``)."""
        return len(self.memory)

    @property
    def data_size(self) -> int:
        """objectrl's name for the number of stored transitions."""
        return len(self.memory)

    @property
    def pointer(self) -> int:
        """The slot the next transition is written to."""
        return self._written % self.buffer_size

    # -- reading ---------------------------------------------------------------
    def sample_batch(self, batch_size: int) -> TensorDict:
        """``batch_size`` transitions drawn uniformly with replacement, on ``device``."""
        return self.memory.sample(batch_size)

    def sample_random(self, batch_size: int) -> TensorDict:
        """Alias of :meth:`sample_batch`."""
        return self.sample_batch(batch_size)

    def sample_by_index(self, indices: list[int] | torch.Tensor | range) -> TensorDict:
        """The transitions at logical positions ``indices`` (0 = oldest, -1 = newest)."""
        return self.memory.sample_by_index(_positions(indices))

    def sample_by_index_fields(
        self, indices: list[int] | torch.Tensor | range, fields: list[str]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Some fields of the transitions at ``indices``: a tensor for one field, else a tuple."""
        if isinstance(fields, str):
            fields = [fields]
        if not fields:
            raise SpecError("fields: expected at least one field name, got an empty list")
        td = self.memory.sample_by_index(_positions(indices), fields=fields)
        out = tuple(td[f] for f in fields)
        return out[0] if len(out) == 1 else out

    def sample_all(self) -> TensorDict:
        """Every stored transition, oldest first."""
        return self.memory.sample_all()

    # -- epochs ----------------------------------------------------------------
    def create_epoch_iterator(self, batch_size: int, n_epochs: int = 1) -> Iterator[TensorDict]:
        """Batches of ``batch_size`` in storage order (oldest first), ``n_epochs`` passes.

        The transitions stored now are the ones visited; the last batch of a pass may
        be smaller. The iterator is also kept for :meth:`get_next_batch`. A write after
        this call raises :class:`~xpbank.BufferChangedError` at the next batch (objectrl
        reads positions of the new contents).
        """
        with self.memory.lock:  # the size and the plan of one state
            if len(self) == 0:
                epoch_plan(0, batch_size, n_epochs)  # checks the arguments; visits nothing
                self.epoch_iterator = iter(())
            else:
                self.epoch_iterator = self.memory.epochs(batch_size, n_epochs, shuffle=False)
        return self.epoch_iterator

    def get_next_batch(self, batch_size: int) -> TensorDict:
        """The next batch of the epoch iterator; a random batch when there is none."""
        if self.epoch_iterator is not None:
            return next(self.epoch_iterator)
        return self.sample_batch(batch_size)

    def calculate_num_batches(self, batch_size: int) -> int:
        """How many batches one pass takes (the last may be short)."""
        batch_size = check_positive_int("batch_size", batch_size)
        return -(-len(self) // batch_size)

    def get_steps_and_iterator(self, n_epochs: int, max_iter: int, batch_size: int) -> int:
        """Training steps to run: ``n_epochs`` passes (iterator made), or ``max_iter`` random batches."""
        if n_epochs > 0:
            self.create_epoch_iterator(batch_size, n_epochs)
            return n_epochs * self.calculate_num_batches(batch_size)
        self.epoch_iterator = None
        return max_iter

    # -- persistence -----------------------------------------------------------
    def save(self, path: str) -> None:
        """Save the whole buffer (contents, cursor, RNG) as an xpbank bank at ``path``."""
        save_bank(self.memory, path)

    def load(self, path: str) -> None:
        """Restore a buffer saved by :meth:`save`: contents, size and cursor.

        Raises:
            BankError: ``path`` is not a bank, e.g. only objectrl's ``path.metadata``
                exists (it holds no data to restore).
        """
        root = Path(os.fspath(path))
        if not root.is_dir() and Path(f"{root}.metadata").is_file():
            raise BankError(
                f"{root}.metadata is objectrl's metadata-only save: it holds no transitions to "
                f"restore; save with xpbank.compat.objectrl.ReplayBuffer.save to keep the contents"
            )
        loaded = load_bank(root, device=self.storing_device)
        self.memory = _Buffer(
            loaded.capacity, storing_device=self.storing_device, device=self.device, seed=seed_from()
        )
        self.memory.load_state_dict(loaded.state_dict())
        self.buffer_size = loaded.capacity
        self._written = int(loaded.state_dict(data=False)["ring"]["next_id"])
        self.epoch_iterator = None
