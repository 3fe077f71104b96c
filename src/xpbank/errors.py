"""The few exceptions xpbank raises.

Each is an :class:`XpbankError` and also the built-in exception Python users already
catch for that kind of mistake (``ValueError``, ``TypeError``, ``IndexError``,
``OSError``, ``ImportError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
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
    "ReadOnlyError",
    "MissingExtraError",
    "DeviceError",
    "EnvContractError",
    "BufferTimeoutError",
    "ChannelError",
    "RateLimitTimeout",
    "ShardUnavailableError",
    "BufferChangedError",
]


class XpbankError(Exception):
    """Base class of every error raised by xpbank."""


class SpecError(XpbankError, ValueError):
    """A batch or a spec does not match the expected layout (keys, shapes, dtypes)."""


class BatchTypeError(XpbankError, TypeError):
    """A batch is not something xpbank can read (not a TensorDict, mapping or array)."""


class CapacityError(XpbankError, ValueError):
    """A size argument is out of its valid range (capacity, batch size, ...)."""


class EmptyBufferError(XpbankError, ValueError):
    """Sampling or reading from a buffer that holds nothing."""


class NotReadyError(EmptyBufferError):
    """A rollout is read (returns, minibatches) before every env has written its steps."""


class XpbankIndexError(XpbankError, IndexError):
    """An index names no stored item."""


class StaleIndexError(XpbankIndexError):
    """An index names an item that has since been overwritten or cleared."""


class PriorityError(XpbankError, ValueError):
    """Priorities or prioritized-sampling settings that cannot be used (NaN, negative ...)."""


class BankError(XpbankError, OSError):
    """A bank on disk cannot be written or read."""


class CorruptBankError(BankError):
    """A bank on disk is malformed or has been tampered with."""


class ReadOnlyError(XpbankError, PermissionError):
    """A write to something opened read-only (e.g. a bank opened with ``mode="r"``)."""


class DeviceError(XpbankError, ValueError):
    """A device was asked for that this machine does not have (e.g. CUDA)."""


class EnvContractError(XpbankError, ValueError):
    """An environment returned something that contradicts its (declared or assumed) contract."""


class BufferTimeoutError(XpbankError, TimeoutError):
    """A blocking call waited longer than its timeout (a full channel, a rate limiter)."""


class ChannelError(XpbankError, RuntimeError):
    """A shared-memory writer channel cannot be used (taken by another process, closed, resized)."""


class RateLimitTimeout(BufferTimeoutError):
    """A rate limiter kept an insert or a sample waiting longer than its timeout."""


class ShardUnavailableError(XpbankError, RuntimeError):
    """A shard of a distributed buffer (a Ray actor) is down or did not answer in time."""


class BufferChangedError(XpbankError, RuntimeError):
    """An iterator's plan (``epochs``, minibatches) was made for a buffer state that has
    since changed: items written or cleared, or a rollout's episode ends updated, after
    the plan was made. Make a new iterator."""


class MissingExtraError(XpbankError, ImportError):
    """An optional dependency is needed and not installed."""


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as a positive int (NumPy ints too, bools not), or a :class:`CapacityError`."""
    if type(value) is int and value > 0:  # the common case, on every sample
        return value
    import operator

    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number <= 0:
        raise CapacityError(f"{name}: expected a positive int, got {value!r}")
    return number


def check_finite_number(name: str, value: Any, low: float) -> float:
    """``value`` as a finite float ``>= low`` (bools not), or a :class:`CapacityError` naming it."""
    import math

    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # float(10**400) overflows
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < low:
        raise CapacityError(f"{name}: expected a finite number >= {low}, got {value!r}")
    return number


def install_hint(extra: str) -> str:
    """How to install an xpbank extra, as every message that names one says it.

    xpbank is installed from a clone for now (``pip install -e .``); the published
    spelling is given beside it.

    Example:
        >>> install_hint("cli")
        "pip install -e '.[cli]' in a clone of xpbank (once published: pip install 'xpbank[cli]')"
    """
    return f"pip install -e '.[{extra}]' in a clone of xpbank (once published: pip install 'xpbank[{extra}]')"


def require(module: str, extra: str) -> Any:
    """Import an optional dependency, or fail naming the extra to install.

    Args:
        module: the module to import, e.g. ``"gymnasium"``.
        extra: the xpbank extra that provides it, e.g. ``"gym"``.

    Raises:
        MissingExtraError: ``module`` is not installed; the message gives
            :func:`install_hint` for ``extra``.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"this feature needs the optional dependency {module!r} (the {extra!r} extra), which is "
            f"not installed; run: {install_hint(extra)}"
        ) from exc
