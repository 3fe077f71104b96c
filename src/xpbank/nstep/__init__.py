"""N-step returns: the option a buffer takes, the pure reduction, the compiled kernel and
the window table.

- :mod:`~xpbank.nstep.option`: :class:`NStep`, what a :class:`~xpbank.ReplayBuffer`
  takes (``nstep=NStep(3, 0.99)``) to add n-step targets to every sample;
- :mod:`~xpbank.nstep.returns`: the math as pure functions (:func:`nstep_return`,
  :func:`nstep_reduce`, :func:`nstep_sum`);
- :mod:`~xpbank.nstep.kernel`: the compiled gather (numba, the ``fast`` extra);
- :mod:`~xpbank.nstep.table`: the window table that keeps complete windows' results.
"""

from xpbank.nstep.option import NStep
from xpbank.nstep.returns import nstep_reduce, nstep_return, nstep_sum

__all__ = ["NStep", "nstep_reduce", "nstep_return", "nstep_sum"]
