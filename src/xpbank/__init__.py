"""xpbank: the experience store for reinforcement learning in PyTorch.

Example:
    >>> import torch, xpbank
    >>> rb = xpbank.ReplayBuffer(10_000, seed=0)
    >>> rb.extend({"obs": torch.randn(8, 4), "action": torch.zeros(8, dtype=torch.int64)})
    range(0, 8)
    >>> rb.sample(4)["obs"].shape
    torch.Size([4, 4])
"""

from __future__ import annotations

from xpbank.episodes import EpisodeIndex, EpisodeKeys
from xpbank.errors import (
    BankError,
    BatchTypeError,
    CapacityError,
    CorruptBankError,
    DeviceError,
    EmptyBufferError,
    MissingExtraError,
    PriorityError,
    SpecError,
    StaleIndexError,
    XpbankError,
    XpbankIndexError,
)
from xpbank.nstep import NStep
from xpbank.nstep_returns import nstep_return
from xpbank.replay import ReplayBuffer
from xpbank.sampler import PrioritizedSampler, Sampler, SequenceSampler, UniformSampler
from xpbank.spec import Field, Spec
from xpbank.storage import FrameStorage, MemmapStorage, Storage, TensorStorage

__version__ = "0.1.0"

__all__ = [
    "Field",
    "Spec",
    "Storage",
    "TensorStorage",
    "MemmapStorage",
    "FrameStorage",
    "Sampler",
    "UniformSampler",
    "PrioritizedSampler",
    "SequenceSampler",
    "ReplayBuffer",
    "EpisodeIndex",
    "EpisodeKeys",
    "NStep",
    "nstep_return",
    "XpbankError",
    "SpecError",
    "BatchTypeError",
    "CapacityError",
    "EmptyBufferError",
    "XpbankIndexError",
    "StaleIndexError",
    "PriorityError",
    "BankError",
    "CorruptBankError",
    "DeviceError",
    "MissingExtraError",
]
