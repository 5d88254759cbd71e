"""Checkers for recorded histories: Elle's list-append, the bank, E-Cast's multicast,
and their shared result.

Pure library code (the standard library, and for the multicast workload
``ecast.history``): a fault-injection runner and the simulators record histories
(``history``), and ``check_all`` judges one against its workload.
"""

from jepsen_like.checkers.bank import BankOptions
from jepsen_like.checkers.history import (
    Call,
    HistoryError,
    Op,
    pair_calls,
    read_history,
    write_history,
)
from jepsen_like.checkers.list_append import MODELS, ListAppendOptions
from jepsen_like.checkers.multicast import MulticastOptions
from jepsen_like.checkers.result import CheckResult
from jepsen_like.checkers.run import check_all, workload_options

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
