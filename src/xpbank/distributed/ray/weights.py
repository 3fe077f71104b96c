"""Importance weights of a sample drawn across shards, from the global totals (pure).

A sharded draw picks shard ``s`` with probability ``total_s / total`` and then item ``i``
of ``s`` with ``p_i / total_s``: item ``i`` is drawn with ``p_i / total``, exactly as in
one buffer holding every shard's items. Its weight must then use the global ``N``
(items in all shards), ``total`` (summed stored priorities) and smallest priority, not
the shard's own: that is all this function adds to
:func:`~xpbank.sampler.priorities.importance_weights`.

Example:
    >>> import numpy as np
    >>> from xpbank import PrioritizedSampler
    >>> shards = [{"size": 2, "total": 3.0, "smallest": 1.0}, {"size": 1, "total": 4.0, "smallest": 4.0}]
    >>> global_weights(np.array([2.0, 4.0]), shards, PrioritizedSampler(beta=1.0), samples=0).tolist()
    [0.5, 0.25]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xpbank.sampler import PrioritizedSampler
from xpbank.sampler.priorities import beta_at, importance_weights

__all__ = ["global_weights"]


def global_weights(
    stored: np.ndarray, shards: Sequence[Mapping[str, Any]], sampler: PrioritizedSampler, samples: int
) -> np.ndarray:
    """float32 weights of drawn items of stored priority ``stored`` (``p ** alpha``).

    Args:
        stored: the drawn items' stored priorities.
        shards: each shard's ``{"size", "total", "smallest"}`` (the shards that are up).
        sampler: the settings (``beta``, ``beta_steps``, ``normalize_weights``).
        samples: the ``sample`` calls before this one (the beta schedule's position).
    """
    n = sum(int(t["size"]) for t in shards)
    total = sum(float(t["total"]) for t in shards)
    smallest = min(float(t["smallest"]) for t in shards)
    beta = beta_at(sampler.beta0, sampler.beta_steps, samples)
    return importance_weights(stored, total, smallest, n, beta, sampler.normalize_weights).astype(np.float32)
