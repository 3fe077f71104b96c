"""The names a rollout reads and the names its minibatches reserve."""

from __future__ import annotations

from dataclasses import dataclass

from xpbank.spec.spec import Field, NestedKey, Spec, reject_reserved

__all__ = ["RolloutKeys", "RESERVED_KEYS", "DERIVED", "check_reserved"]

# entries that minibatches add next to the stored fields
RESERVED_KEYS = frozenset({"index", "advantage", "return", "mask", "weight"})
DERIVED = Spec({"advantage": Field(()), "return": Field(())})


@dataclass(frozen=True)
class RolloutKeys:
    """The names of the fields the buffer reads for returns, stats and episode ends.

    Example:
        >>> RolloutKeys(reward="rew", terminated="done").reward
        'rew'
    """

    reward: NestedKey = "reward"
    value: NestedKey = "value"
    log_prob: NestedKey = "log_prob"
    action: NestedKey = "action"
    terminated: NestedKey = "terminated"
    truncated: NestedKey = "truncated"
    final_value: NestedKey = "final_value"
    ratio: NestedKey = "ratio"


def check_reserved(spec: Spec) -> Spec:
    """``spec``, or a :class:`SpecError` when a field uses a name minibatches reserve."""
    why = f"rollout minibatches carry their own {sorted(RESERVED_KEYS)} entries, which would hide it"
    return reject_reserved(spec, RESERVED_KEYS, why)
