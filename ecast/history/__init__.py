"""Recorded histories of E-Cast runs and the checks of its guarantees on them.

One library for every recorder: the simulator fills a :class:`History` in memory, the
benchmark, the demo and the fault-injection suite write JSON lines
(:mod:`ecast.history.jsonl`) from real processes, and :func:`check_history` judges
either, now or later from a file.  Pure: it imports only ``ecast.core`` and the
standard library.
"""

from ecast.core.config import load_config
from ecast.history.checks import (
    LIVENESS,
    NEEDS_CONFIG,
    SAFETY,
    CheckOptions,
    Verdict,
    check_history,
)
from ecast.history.events import (
    Ack,
    Crash,
    Deliver,
    DeliverUnsafe,
    Event,
    History,
    Learned,
    Resubmit,
    RouterLog,
    Submit,
    SubmitUnsafe,
    Terminate,
)
from ecast.history.jsonl import (
    HistoryError,
    HistoryWriter,
    dumps_event,
    iter_events,
    read_history,
    to_record,
    write_history,
)
from ecast.history.reference import Reference, build_reference

__all__ = [
    "LIVENESS",
    "NEEDS_CONFIG",
    "SAFETY",
    "Ack",
    "CheckOptions",
    "Crash",
    "Deliver",
    "DeliverUnsafe",
    "Event",
    "History",
    "HistoryError",
    "HistoryWriter",
    "Learned",
    "Reference",
    "Resubmit",
    "RouterLog",
    "Submit",
    "SubmitUnsafe",
    "Terminate",
    "Verdict",
    "build_reference",
    "check_history",
    "dumps_event",
    "iter_events",
    "load_config",
    "read_history",
    "to_record",
    "write_history",
]
