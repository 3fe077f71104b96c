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

from xpbank import _moved
from xpbank.bank import BankSummary, bank_metadata, list_banks, load, merge, new_session_id, open_bank, save
from xpbank.collect import Collector, ReplaySink, RolloutSink
from xpbank.distributed.limiter import RateLimiter
from xpbank.errors import (
    BankError,
    BatchTypeError,
    BufferChangedError,
    BufferTimeoutError,
    CapacityError,
    ChannelError,
    CorruptBankError,
    DeviceError,
    EmptyBufferError,
    EnvContractError,
    MissingExtraError,
    NotReadyError,
    PriorityError,
    RateLimitTimeout,
    ReadOnlyError,
    ShardUnavailableError,
    SpecError,
    StaleIndexError,
    XpbankError,
    XpbankIndexError,
)
from xpbank.her import HerSampler
from xpbank.integrations.minari import export_minari, import_minari
from xpbank.mix import Mixture
from xpbank.nstep import NStep, nstep_reduce, nstep_return, nstep_sum
from xpbank.replay import ReplayBuffer
from xpbank.ring import EpisodeIndex, EpisodeKeys
from xpbank.rollout import (
    RecurrentBatch,
    RolloutBuffer,
    RolloutKeys,
    discounted_returns,
    gae,
    normalize_advantages,
    nstep_targets,
    split_trajectories,
    unpad,
    vtrace,
)
from xpbank.sampler import PrioritizedSampler, Sampler, SequenceSampler, UniformSampler
from xpbank.spec import Field, Spec
from xpbank.storage import FrameStorage, MemmapStorage, Storage, TensorStorage
from xpbank.tools.episode_scan import iter_episodes
from xpbank.tools.npz import export_npz, import_npz

__version__ = "0.1.0"

_moved.install()  # old module paths users could import (xpbank.sinks ...), with a warning

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
    "HerSampler",
    "ReplayBuffer",
    "RolloutBuffer",
    "RolloutKeys",
    "RecurrentBatch",
    "gae",
    "vtrace",
    "discounted_returns",
    "nstep_targets",
    "normalize_advantages",
    "split_trajectories",
    "unpad",
    "EpisodeIndex",
    "EpisodeKeys",
    "NStep",
    "nstep_return",
    "nstep_reduce",
    "nstep_sum",
    "XpbankError",
    "SpecError",
    "BatchTypeError",
    "CapacityError",
    "EmptyBufferError",
    "NotReadyError",
    "XpbankIndexError",
    "StaleIndexError",
    "PriorityError",
    "BankError",
    "CorruptBankError",
    "DeviceError",
    "MissingExtraError",
    "EnvContractError",
    "Collector",
    "ReplaySink",
    "RolloutSink",
    "ReadOnlyError",
    "save",
    "load",
    "open_bank",
    "list_banks",
    "merge",
    "new_session_id",
    "BankSummary",
    "bank_metadata",
    "iter_episodes",
    "export_npz",
    "import_npz",
    "export_minari",
    "import_minari",
    "BufferTimeoutError",
    "ChannelError",
    "RateLimitTimeout",
    "ShardUnavailableError",
    "BufferChangedError",
    "RateLimiter",
    "Mixture",
]


def __dir__() -> list[str]:
    """The public API only (the submodules loaded on the way stay reachable by name)."""
    return sorted(__all__)
