"""Uniform FIFO atomic broadcast among routers: reconfigurable wait-free Multi-Paxos (3.5.4)."""

from ecast.core.ufabcast.core import Ufabcast
from ecast.core.ufabcast.leader import NOOP
from ecast.core.ufabcast.messages import (
    AppCmd,
    Executed,
    Installed,
    JoinCmd,
    PartCmd,
    SnapshotNeeded,
    Stopped,
    View,
    ViewChanged,
)
from ecast.core.ufabcast.params import UfabParams

__all__ = [
    "NOOP",
    "AppCmd",
    "Executed",
    "Installed",
    "JoinCmd",
    "PartCmd",
    "SnapshotNeeded",
    "Stopped",
    "UfabParams",
    "Ufabcast",
    "View",
    "ViewChanged",
]
