"""Bridges to other RL tools and formats. Each submodule imports its tool lazily (an
optional extra).

- :mod:`xpbank.integrations.sb3`: Stable-Baselines3 (``pip install 'xpbank[sb3]'``).
- :mod:`xpbank.integrations.minari`: Minari datasets (``pip install 'xpbank[minari]'``).
"""
