"""xpbank: the experience store for reinforcement learning in PyTorch.

Example:
    >>> import torch, xpbank
    >>> rb = xpbank.ReplayBuffer(10_000, seed=0)
    >>> rb.extend({"obs": torch.randn(8, 4), "action": torch.zeros(8, dtype=torch.int64)})
    range(0, 8)
    >>> rb.sample(4)["obs"].shape
    torch.Size([4, 4])
"""

# ruff: noqa: F405 (__all__ names the star import's names, which load lazily)
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from xpbank import _moved

if TYPE_CHECKING:  # the names for type checkers and the API reference; at run time: __getattr__
    from xpbank._api import *  # noqa: F403

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
    "Table",
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


def __getattr__(name: str) -> Any:
    """Import the public API on first use (``import xpbank`` alone stays light)."""
    if name in __all__:
        from xpbank import _api

        value = getattr(_api, name)
        globals()[name] = value
        return value
    if not name.startswith("__") and importlib.util.find_spec(f"xpbank.{name}") is not None:
        return importlib.import_module(f"xpbank.{name}")  # xpbank.bank, as before
    raise AttributeError(f"module 'xpbank' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API only (the submodules loaded on the way stay reachable by name)."""
    return sorted(__all__)
