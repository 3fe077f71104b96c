"""The data model: what an item holds and how batches are read.

- :mod:`~xpbank.spec.keys`: nested keys (``("next", "obs")``);
- :mod:`~xpbank.spec.field`: :class:`Field` (one entry's per-item shape and dtype);
- :mod:`~xpbank.spec.spec`: :class:`Spec` (an item's fields);
- :mod:`~xpbank.spec.space_fields` and :mod:`~xpbank.spec.spaces`: fields and specs from
  gymnasium spaces and TorchRL specs;
- :mod:`~xpbank.spec.cast`: which dtype conversions a write makes silently;
- :mod:`~xpbank.spec.batch`: a user's batch (dict, TensorDict) as flat tensors, and back.
"""

from xpbank.spec.field import Field
from xpbank.spec.keys import NestedKey, is_next_key, key_str, normalize_key
from xpbank.spec.spec import Spec

__all__ = ["Field", "NestedKey", "Spec", "is_next_key", "key_str", "normalize_key"]
