"""The data model: what an item holds and how batches are read.

- :mod:`~xpbank.spec.spec`: :class:`Field` and :class:`Spec` (an item's fields, their
  shapes and dtypes), and nested keys (``("next", "obs")``);
- :mod:`~xpbank.spec.spaces`: specs from gymnasium spaces and TorchRL specs;
- :mod:`~xpbank.spec.cast`: which dtype conversions a write makes silently;
- :mod:`~xpbank.spec.batch`: a user's batch (dict, TensorDict) as flat tensors, and back.
"""

from xpbank.spec.spec import Field, NestedKey, Spec, is_next_key, key_str, normalize_key

__all__ = ["Field", "NestedKey", "Spec", "is_next_key", "key_str", "normalize_key"]
