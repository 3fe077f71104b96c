"""Drop-in front-ends for code written against other RL libraries' buffers.

Each submodule mirrors one system's documented API, built thinly on xpbank's core
(:class:`~xpbank.ReplayBuffer`, samplers, banks): switching is one import line. The
deliberate differences are listed in ``docs/compat/``. Submodules are imported on use,
so an optional dependency of one never loads with another.
"""
