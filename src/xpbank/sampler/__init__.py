"""Which slots to read. Samplers return indices (and weights), never data."""

from __future__ import annotations

from xpbank.sampler.base import Sampler
from xpbank.sampler.epochs import epoch_plan
from xpbank.sampler.prioritized import PrioritizedSampler
from xpbank.sampler.uniform import UniformSampler

__all__ = ["PrioritizedSampler", "Sampler", "UniformSampler", "epoch_plan"]
from xpbank.sampler.registry import SAMPLERS, make_sampler, register_sampler, sampler_config

__all__ = [
    "Sampler",
    "UniformSampler",
    "epoch_plan",
    "SAMPLERS",
    "register_sampler",
    "sampler_config",
    "make_sampler",
]
