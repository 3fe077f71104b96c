"""Bridges to other RL tools and formats. Each submodule imports its tool lazily (an
optional extra).

- :mod:`xpbank.integrations.sb3`: Stable-Baselines3 (the ``sb3`` extra).
- :mod:`xpbank.integrations.minari`: Minari datasets (the ``minari`` extra).
"""
