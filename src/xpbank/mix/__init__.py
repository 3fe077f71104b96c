"""Offline-to-online mixing: batches drawn from several buffers and banks in set shares.

See :class:`~xpbank.mix.mixture.Mixture` and ``docs/guides/mixing.md``.
"""

from __future__ import annotations

from xpbank.mix.mixture import METADATA_KEY, Mixture
from xpbank.mix.schedule import Constant, Linear, split_counts

__all__ = ["Mixture", "Constant", "Linear", "split_counts", "METADATA_KEY"]
