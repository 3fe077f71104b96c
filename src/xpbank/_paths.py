"""The one rule for turning a field's key into file names (``("next", "obs")`` ->
``next/obs.npy``), shared by memory-mapped storages and the bank format's torch-free
manifest check, so a key that could leave a directory is refused the same way in both.
Imports nothing heavy (``xpbank ls`` uses it without torch)."""

from __future__ import annotations

import re
from typing import Any

from xpbank.errors import SpecError

__all__ = ["SAFE_PART", "safe_file_parts"]

# a key part that is a plain file name: letters, digits, '_', '-', '.'; not a leading dot
SAFE_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def safe_file_parts(key: Any) -> tuple[str, ...]:
    """The parts of ``key`` (a str or a tuple of str), each a plain file name.

    Raises:
        SpecError: a part could leave the directory or hide a file (``..``, ``/``, a
            leading dot), naming the field and the part.

    Example:
        >>> safe_file_parts(("next", "obs"))
        ('next', 'obs')
    """
    parts = (key,) if isinstance(key, str) else tuple(key)
    for part in parts:
        if not SAFE_PART.fullmatch(part) or part in {".", ".."}:
            name = key if isinstance(key, str) else ".".join(key)
            raise SpecError(
                f"field {name!r}: key part {part!r} is not a safe file name "
                "(letters, digits, '_', '-', '.'; not starting with '.')"
            )
    return parts
