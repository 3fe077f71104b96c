"""Old module paths that users could import, kept importable with a warning.

Before the packages (``xpbank.nstep``, ``xpbank.ring``, ``xpbank.collect``,
``xpbank.spec``, ``xpbank.replay``) the modules sat side by side at the top of the
package. Those a user could have imported (their names are documented or carry public
classes) still import, as the module at the new path, with a ``DeprecationWarning``
that names it; internals (kernels, tables, helpers) were moved without an alias.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     import xpbank.sinks
    >>> xpbank.sinks.__name__, caught[0].category.__name__
    ('xpbank.collect.sinks', 'DeprecationWarning')
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

#: old module path -> the module it is now
MOVED = {
    "xpbank.cast": "xpbank.spec.cast",
    "xpbank.cli": "xpbank.tools.cli",
    "xpbank.episodes": "xpbank.ring.episodes",
    "xpbank.nstep_returns": "xpbank.nstep.returns",
    "xpbank.sinks": "xpbank.collect.sinks",
    "xpbank.spaces": "xpbank.spec.spaces",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path (only when no real module has it) and loads the new module."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} has moved to {new}; import from there, or the public names from xpbank",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module was loaded at its new path: nothing to run."""


def install() -> None:
    """Put the alias finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
