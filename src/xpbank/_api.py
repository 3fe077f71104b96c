"""Every public name of :mod:`xpbank`, imported eagerly (torch, tensordict, ...).

``import xpbank`` itself imports nothing heavy: the package's ``__getattr__`` imports this
module on the first use of a public name (``xpbank.ReplayBuffer``), so ``xpbank --help``
and the other tools that need no tensors start in a fraction of a second.
Add a new public name here and to ``xpbank.__all__``.
"""

# ruff: noqa: F401 (every import here is a re-export, listed in xpbank.__all__)
from __future__ import annotations

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
from xpbank.table import Table
from xpbank.tools.episode_scan import iter_episodes
from xpbank.tools.npz import export_npz, import_npz
