"""Collection: a :class:`Collector` steps a gymnasium vector env and hands every vector
step to a :class:`Sink` (:class:`ReplaySink` into a replay buffer, :class:`RolloutSink`
into rollout storage)."""

from xpbank.collect.collector import Collector
from xpbank.collect.sinks import ReplaySink, RolloutSink, Sink

__all__ = ["Collector", "ReplaySink", "RolloutSink", "Sink"]
