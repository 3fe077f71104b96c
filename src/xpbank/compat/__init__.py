"""The seed APIs (metta, ROSE, rsl_rl, objectrl, TorchRL) as thin front-ends on xpbank.

Each submodule mirrors one system's documented API, built thinly on xpbank's core
(:class:`~xpbank.ReplayBuffer`, :class:`~xpbank.RolloutBuffer`, samplers, banks):
switching is one import line (``from xpbank.compat.rsl_rl import RolloutStorage``). The
deliberate differences are listed in ``docs/compat/``. No submodule is imported here, so
an optional dependency of one never loads with another.

State a front-end must keep beyond the buffer's own goes in the bank's ``metadata``
(``save(rb, path, metadata=...)``, read back with ``bank_metadata``), keyed by the
front-end's module name, as :mod:`~xpbank.compat.rose` does.
"""
