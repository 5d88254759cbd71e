"""The asyncio runtime: real connections and timers around the sans-IO cores."""

from ecast.runtime.mux import CONGESTED, QUANTUM, TCP_LINK, Node, Runtime, read_secret, tune_process

__all__ = ["CONGESTED", "QUANTUM", "TCP_LINK", "Node", "Runtime", "read_secret", "tune_process"]
