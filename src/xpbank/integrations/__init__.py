"""Bridges to other RL tools. Each submodule imports its tool lazily (an optional extra).

- :mod:`xpbank.integrations.sb3`: Stable-Baselines3 (``pip install 'xpbank[sb3]'``).
"""
