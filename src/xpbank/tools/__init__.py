"""What the ``xpbank`` command line runs, usable from Python too.

Modules: :mod:`~xpbank.tools.episode_scan` (the episodes stored in a buffer, streaming),
:mod:`~xpbank.tools.stats` (per-field statistics in chunks, episode returns),
:mod:`~xpbank.tools.npz` (streaming ``.npz`` export and import),
:mod:`~xpbank.tools.import_bank` (write a bank from a stream of batches),
:mod:`~xpbank.tools.plot` (a bank's episodes and rewards as a PNG),
:mod:`~xpbank.tools.quickbench` (the short replay benchmark of ``xpbank bench``),
:mod:`~xpbank.tools.commands` (the typer commands).
"""
