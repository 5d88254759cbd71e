"""Checkers for recorded histories: Elle's list-append, the bank, E-Cast's multicast,
and their shared result.

Pure library code (the standard library, and for the multicast workload
``ecast.history``): a fault-injection runner and the simulators record histories
(``history``), and ``check_all`` judges one against its workload.
"""

from rubberband.checkers.bank import BankOptions
from rubberband.checkers.history import (
    Call,
    HistoryError,
    Op,
    pair_calls,
    read_history,
    write_history,
)
from rubberband.checkers.list_append import MODELS, ListAppendOptions
from rubberband.checkers.multicast import MulticastOptions
from rubberband.checkers.result import CheckResult
from rubberband.checkers.run import check_all, workload_options

__all__ = [
    "MODELS",
    "BankOptions",
    "Call",
    "CheckResult",
    "HistoryError",
    "ListAppendOptions",
    "MulticastOptions",
    "Op",
    "check_all",
    "pair_calls",
    "read_history",
    "workload_options",
    "write_history",
]
