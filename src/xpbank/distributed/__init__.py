"""Scaling out past one process: :mod:`xpbank.distributed.shm` (many writer processes on
one machine through shared memory). Import the submodule you use."""

from __future__ import annotations
