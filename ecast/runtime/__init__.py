"""The asyncio runtime: real connections and timers around the sans-IO cores."""

from ecast.runtime.mux import QUANTUM, Runtime
from ecast.runtime.node import CONGESTED, TCP_LINK, Node
from ecast.runtime.process import (
    load_auth,
    new_incarnation,
    read_secret,
    step_kept,
    tune_process,
)

__all__ = [
    "CONGESTED",
    "QUANTUM",
    "TCP_LINK",
    "Node",
    "Runtime",
    "load_auth",
    "new_incarnation",
    "read_secret",
    "step_kept",
    "tune_process",
]
