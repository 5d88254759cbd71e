"""Recorded histories: operations as JSON lines, and their pairing into calls.

A history is what clients observed, in the style of Jepsen.  Every operation a client
attempts appears twice: once when it is invoked and once when it completes::

    {"process": "c1", "type": "invoke", "f": "txn", "value": [["append", "x", 1]],
     "time": 0.012, "index": 0}
    {"process": "c1", "type": "ok", "f": "txn", "value": [["append", "x", 1]],
     "time": 0.019, "index": 1}

``type`` is ``invoke`` or one of three outcomes: ``ok`` (it happened), ``fail`` (it
definitely did not happen) and ``info`` (indeterminate: a timeout or a crash; it may
have happened, now or later).  ``index`` is the position in the history, which is the
real-time order in which the recorder saw events; ``time`` is in seconds and is only
shown to people.  An optional ``level`` names a read's isolation level (``sequential``,
``snapshot`` or ``basic``, Rubberband's levels of 4.5.2; a view's reads also
``read-your-writes`` and ``any``, ``docs/views.md``); any other field is kept in
``extra`` and written back unchanged.

A process runs one operation at a time.  A process that crashed leaves an invoke
without completion; ``pair_calls`` turns it into an ``info`` call, whether the history
ends first or the process (restarted under the same name) invokes again.  An ``info``
record with no pending invoke is a standalone event (a nemesis note) and is skipped.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
Outcome = Literal["ok", "fail", "info"]

OP_TYPES: frozenset[str] = frozenset(("invoke", "ok", "fail", "info"))
LEVELS: frozenset[str] = frozenset(
    ("sequential", "snapshot", "basic", "read-your-writes", "any")  # the last two: views'
)
_KNOWN_FIELDS = frozenset(("process", "type", "f", "value", "time", "index", "level"))


class HistoryError(ValueError):
    """The history is malformed: the recorder or the workload is wrong, not the system."""


@dataclass(frozen=True, slots=True)
class Op:
    """One record of a history, exactly as the recorder wrote it."""

    process: str
    type: OpType
    f: str
    value: Any
    index: int
    time: float | None = None
    level: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, record: Mapping[str, Any], default_index: int = 0) -> Op:
        """Build an op from a decoded JSON object, checking what checkers rely on."""
        if not isinstance(record, Mapping):
            raise HistoryError(f"an operation must be a JSON object, not {record!r}")
        try:
            process = record["process"]
            op_type = record["type"]
            f = record["f"]
        except KeyError as missing:
            raise HistoryError(f"operation {dict(record)!r} lacks field {missing}") from None
        if op_type not in OP_TYPES:
            raise HistoryError(f"operation type {op_type!r} is not one of {sorted(OP_TYPES)}")
        index = record.get("index", default_index)
        if not isinstance(index, int) or isinstance(index, bool):
            raise HistoryError(f"index {index!r} is not an integer")
        time = record.get("time")
        if time is not None and not isinstance(time, int | float):
            raise HistoryError(f"time {time!r} is not a number of seconds")
        level = record.get("level")
        if level is not None and level not in LEVELS:
            raise HistoryError(f"level {level!r} is not one of {sorted(LEVELS)}")
        extra = (
            {}
            if record.keys() <= _KNOWN_FIELDS
            else {k: v for k, v in record.items() if k not in _KNOWN_FIELDS}
        )
        return cls(
            process=str(process),
            type=op_type,
            f=str(f),
            value=record.get("value"),
            index=index,
            time=None if time is None else float(time),
            level=level,
            extra=extra,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object for this op; ``from_json`` of it gives the op back."""
        record: dict[str, Any] = {
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
            "index": self.index,
        }
        if self.time is not None:
            record["time"] = self.time
        if self.level is not None:
            record["level"] = self.level
        record.update(self.extra)
        return record


@dataclass(frozen=True, slots=True)
class Call:
    """An invocation and its outcome; ``completion`` is None when the process crashed."""

    invoke: Op
    completion: Op | None
    outcome: Outcome

    @property
    def process(self) -> str:
        return self.invoke.process

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def level(self) -> str:
        """The isolation level the client asked for; sequential unless it said otherwise."""
        return self.invoke.level or "sequential"

    @property
    def value(self) -> Any:
        """What the call did: the completion's value if ok, else what was asked for.

        An ``info`` or ``fail`` completion tells nothing reliable about reads, so the
        invocation's value (reads still unknown) is what a checker may use.
        """
        if self.outcome == "ok" and self.completion is not None:
            return self.completion.value
        return self.invoke.value

    @property
    def invoke_index(self) -> int:
        return self.invoke.index

    @property
    def complete_index(self) -> int | None:
        """Index of the completion, None if the call never completed."""
        return None if self.completion is None else self.completion.index

    def describe(self) -> str:
        """A short name for people: outcome, process and where it is in the history."""
        return f"{self.outcome} {self.f} by process {self.process} at index {self.invoke_index}"


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a history is read or checked.

    Ops, calls and indexes are millions of small objects that form no reference cycles,
    yet each batch of allocations makes the collector walk all of them again: for a
    history of 100,000 transactions that was more than half of the checking time.
    Reference counting still frees everything; the collector resumes afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_lines(lines: Iterable[str]) -> Iterator[Op]:
    """Decode JSON lines into ops; blank lines are skipped, errors name the line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise HistoryError(f"line {number}: not JSON ({err})") from None
        try:
            yield Op.from_json(record, default_index=number - 1)
        except HistoryError as err:
            raise HistoryError(f"line {number}: {err}") from None


def read_history(source: str | os.PathLike[str] | IO[str]) -> list[Op]:
    """Read a JSON-lines history from a path or an open text file."""
    with gc_paused():
        if isinstance(source, str | os.PathLike):
            with open(source, encoding="utf-8") as fh:
                return list(parse_lines(fh))
        return list(parse_lines(source))


def dump_lines(ops: Iterable[Op]) -> Iterator[str]:
    """One JSON line (with its newline) per op."""
    for op in ops:
        yield json.dumps(op.to_json(), separators=(",", ":")) + "\n"


def write_history(ops: Iterable[Op], target: str | os.PathLike[str] | IO[str]) -> None:
    """Write ops as JSON lines to a path or an open text file."""
    if isinstance(target, str | os.PathLike):
        with open(target, "w", encoding="utf-8") as fh:
            fh.writelines(dump_lines(ops))
    else:
        target.writelines(dump_lines(ops))


def pair_calls(ops: Iterable[Op]) -> list[Call]:
    """Pair every invoke with its completion; the calls come back in invocation order.

    Ops are taken in ``index`` order (a history merged from several recorders may be out
    of order on disk).  A completion must follow an invoke of the same process and ``f``;
    anything else means the recorder is broken, and is an error rather than a guess.
    """
    ordered = sorted(ops, key=lambda op: op.index)
    calls: list[Call] = []
    pending: dict[str, int] = {}  # process -> position in calls of its open invoke
    previous_index: int | None = None
    for op in ordered:
        if op.index == previous_index:
            raise HistoryError(f"two operations share index {op.index}")
        previous_index = op.index
        if op.type == "invoke":
            open_at = pending.get(op.process)
            if open_at is not None:
                crashed = calls[open_at]
                calls[open_at] = Call(crashed.invoke, None, "info")
            pending[op.process] = len(calls)
            calls.append(Call(op, None, "info"))
            continue
        open_at = pending.pop(op.process, None)
        if open_at is None:
            if op.type == "info":
                continue  # a standalone event, such as a nemesis note
            raise HistoryError(
                f"index {op.index}: {op.type} completion of process {op.process} "
                "has no invoke before it"
            )
        call = calls[open_at]
        if call.invoke.f != op.f:
            raise HistoryError(
                f"index {op.index}: process {op.process} completes {op.f!r} "
                f"but invoked {call.invoke.f!r} at index {call.invoke.index}"
            )
        calls[open_at] = Call(call.invoke, op, op.type)  # type: ignore[arg-type]
    return calls
