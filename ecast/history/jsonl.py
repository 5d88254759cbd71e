"""Histories as JSON lines: one event per line, written and read as a stream.

Every line is an object with the ``process`` that observed the event, the ``event``
kind, the kind's fields and an optional ``time`` in seconds::

    {"process": "s2", "event": "submit", "id": [["s2", 0, ""], 5], "time": 1.23}
    {"process": "s2", "event": "submit_unsafe", "id": [["s2", 0, "~u"], 1], "time": 1.3}
    {"process": "h9", "event": "resubmit", "id": [["s2", 0, ""], 5], "time": 4.0}
    {"process": "d1", "event": "deliver", "t": 7, "id": [["s2", 0, ""], 5],
     "sender": "s2", "header": {"key": 4}, "payload": "m5", "time": 1.25}
    {"process": "d1", "event": "deliver_unsafe", "tag": 7, "frontier": 9,
     "id": [["s2", 0, "~u"], 1], "accepted": true, "sender": "s2", "header": null}
    {"process": "s2", "event": "ack", "id": [["s2", 0, ""], 5], "t": 7,
     "delivered": true, "time": 1.4}
    {"process": "d1", "event": "crash", "time": 2.0}
    {"process": "d1", "event": "terminate", "reason": "suspected", "time": 2.5, "t": 9}
    {"process": "r1", "event": "learned", "t": 7,
     "message": {"sender": "s2", "id": [["s2", 0, ""], 5], "header": {"key": 4}}}

A message id is ``[[namespace, epoch, stream], seq]``.  JSON has no tuples: the reader
turns every list inside ids and headers back into a tuple, as the routers' msgpack
decoding does, so a config replayed over a stored history sees the headers the routers
saw.  ``sender`` and ``header`` of a delivery are written only when known (a header of
``null`` is a header).  Payloads are opaque to E-Cast and are kept only where they are a
JSON number, string or boolean, for people reading the file.

Only the order of one process's lines carries meaning; lines of different processes may
interleave in any order (a runner may append each process's file to one).  Reading parses
thousands of lines per call to the JSON decoder, which is what makes a history of a
million events load in seconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ecast.core.message import Message, MsgId, Session
from ecast.history.events import (
    Ack,
    Crash,
    Deliver,
    DeliverUnsafe,
    History,
    Learned,
    Resubmit,
    Submit,
    SubmitUnsafe,
    Terminate,
)

_CHUNK = 4096
"""Lines handed to the JSON decoder at once (one array): per-call overhead is most of
the cost of decoding short lines one by one."""

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
"""One encoder for every line: ``json.dumps`` with options builds a new one per call."""

_PLAIN = (str, int, float, bool)


class HistoryError(ValueError):
    """A history file that is not a history (the recorder is wrong, not the system)."""


# ====================================================================== writing
def _jid(mid: MsgId) -> list[Any]:
    s = mid[0]
    return [[s[0], s[1], s[2]], mid[1]]


def to_record(process: str, event: Any) -> dict[str, Any]:
    """The JSON object for one event (``decode_record`` of it gives the event back)."""
    kind = type(event)
    rec: dict[str, Any] = {"process": process}
    if kind is Deliver:
        rec["event"] = "deliver"
        rec["t"] = event.t
        rec["id"] = _jid(event.id)
        if event.sender is not None:
            rec["sender"] = event.sender
            rec["header"] = event.header
        if type(event.payload) in _PLAIN:
            rec["payload"] = event.payload
    elif kind is Ack:
        rec["event"] = "ack"
        rec["id"] = _jid(event.id)
        rec["t"] = event.t
        rec["delivered"] = event.delivered
    elif kind is Submit or kind is Resubmit or kind is SubmitUnsafe:
        rec["event"] = _NAMES[kind]
        rec["id"] = _jid(event.id)
    elif kind is DeliverUnsafe:
        rec["event"] = "deliver_unsafe"
        rec["tag"] = event.tag
        rec["frontier"] = event.frontier
        rec["id"] = _jid(event.id)
        rec["accepted"] = event.accepted
        if event.sender is not None:
            rec["sender"] = event.sender
            rec["header"] = event.header
        if type(event.payload) in _PLAIN:
            rec["payload"] = event.payload
    elif kind is Crash:
        rec["event"] = "crash"
    elif kind is Terminate:
        rec["event"] = "terminate"
        rec["reason"] = event.reason
        if event.t is not None:
            rec["t"] = event.t
    elif kind is Learned:
        m = event.message
        msg: dict[str, Any] = {"sender": m.sender, "id": _jid(m.id), "header": m.header}
        if type(m.payload) in _PLAIN:
            msg["payload"] = m.payload
        rec["event"] = "learned"
        rec["t"] = event.t
        rec["message"] = msg
    else:
        raise TypeError(f"not a history event: {event!r}")
    if event.time is not None:
        rec["time"] = event.time
    return rec


_NAMES: dict[type, str] = {Submit: "submit", Resubmit: "resubmit", SubmitUnsafe: "submit_unsafe"}


def dumps_event(process: str, event: Any) -> str:
    """One line (with its newline) for one event."""
    return _encode(to_record(process, event)) + "\n"


class HistoryWriter:
    """Appends events to a JSON-lines file as they happen (a recorder in a real process).

    Lines are buffered by the file object; ``flush`` after events that must survive a
    crash of the recording process (a runner that kills processes flushes at each step).
    """

    def __init__(self, target: str | os.PathLike[str] | IO[str], append: bool = False) -> None:
        if isinstance(target, str | os.PathLike):
            self._fh: IO[str] = open(target, "a" if append else "w", encoding="utf-8")  # noqa: SIM115
            self._owned = True
        else:
            self._fh = target
            self._owned = False

    def write(self, process: str, event: Any) -> None:
        self._fh.write(dumps_event(process, event))

    def write_all(self, items: Iterable[tuple[str, Any]]) -> None:
        self._fh.writelines(dumps_event(p, e) for p, e in items)

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if self._owned:
            self._fh.close()
        else:
            self._fh.flush()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_history(history: History, target: str | os.PathLike[str] | IO[str]) -> None:
    """Write a whole history: each process's events in order, then the routers'."""
    with HistoryWriter(target) as w:
        w.write_all(history.events())


# ====================================================================== reading
def freeze(value: Any) -> Any:
    """Lists become tuples, inside dicts too (what the routers' decoding gives)."""
    kind = type(value)
    if kind is list:
        return tuple([freeze(v) for v in value])
    if kind is dict:
        for v in value.values():
            if type(v) is list or type(v) is dict:
                return {k: freeze(v) for k, v in value.items()}
    return value


class _Decoder:
    """Turns decoded JSON objects into events, sharing one tuple per session."""

    __slots__ = ("builders", "sessions")

    def __init__(self) -> None:
        self.sessions: dict[tuple[Any, Any, Any], Session] = {}
        self.builders: dict[str, Callable[[dict[str, Any]], Any]] = {
            "deliver": self._deliver,
            "ack": self._ack,
            "submit": lambda r: Submit(self.id(r["id"]), r.get("time")),
            "resubmit": lambda r: Resubmit(self.id(r["id"]), r.get("time")),
            "submit_unsafe": lambda r: SubmitUnsafe(self.id(r["id"]), r.get("time")),
            "deliver_unsafe": self._unsafe,
            "crash": lambda r: Crash(r.get("time")),
            "terminate": self._terminate,
            "learned": self._learned,
        }

    def id(self, raw: Any) -> MsgId:
        try:
            s, seq = raw
            key = (s[0], s[1], s[2])
            if len(s) != 3:
                raise ValueError
        except (TypeError, ValueError, KeyError, IndexError):
            raise HistoryError(
                f"a message id is [[namespace, epoch, stream], seq], not {raw!r}"
            ) from None
        session = self.sessions.get(key)
        if session is None:
            ns, epoch, stream = key
            if type(ns) is not str or type(epoch) is not int or type(stream) is not str:
                raise HistoryError(f"a session is [string, integer, string], not {s!r}")
            session = self.sessions[key] = key
        if type(seq) is not int:
            raise HistoryError(f"a sequence number is an integer, not {seq!r}")
        return (session, seq)

    def event(self, rec: Any) -> tuple[str, Any]:
        if type(rec) is not dict:
            raise HistoryError(f"an event is a JSON object, not {rec!r}")
        try:
            process = rec["process"]
            build = self.builders[rec["event"]]
        except KeyError as missing:
            if missing.args and missing.args[0] in ("process", "event"):
                raise HistoryError(f"an event needs {missing}") from None
            raise HistoryError(
                f"unknown event {rec['event']!r}; known: {sorted(self.builders)}"
            ) from None
        if type(process) is not str:
            raise HistoryError(f"process {process!r} is not a string")
        try:
            return process, build(rec)
        except KeyError as missing:
            raise HistoryError(f"a {rec['event']} event needs {missing}") from None

    def _deliver(self, r: dict[str, Any]) -> Deliver:
        t = r["t"]
        if type(t) is not int:
            raise HistoryError(f"t is an integer, not {t!r}")
        sender = r.get("sender")
        header = r.get("header")
        if type(header) is dict or type(header) is list:
            header = freeze(header)
        return Deliver(t, self.id(r["id"]), r.get("time"), sender, header, r.get("payload"))

    def _ack(self, r: dict[str, Any]) -> Ack:
        t = r["t"]
        if t is not None and type(t) is not int:
            raise HistoryError(f"an ack's t is an integer or null, not {t!r}")
        return Ack(self.id(r["id"]), t, bool(r["delivered"]), r.get("time"))

    def _terminate(self, r: dict[str, Any]) -> Terminate:
        t = r.get("t")
        if t is not None and type(t) is not int:
            raise HistoryError(f"a termination's t is an integer or absent, not {t!r}")
        return Terminate(_str(r["reason"], "reason"), r.get("time"), t)

    def _unsafe(self, r: dict[str, Any]) -> DeliverUnsafe:
        tag = r["tag"]
        frontier = r["frontier"]
        if type(tag) is not int or type(frontier) is not int:
            raise HistoryError(f"tag and frontier are integers, not {tag!r} and {frontier!r}")
        return DeliverUnsafe(
            tag,
            frontier,
            self.id(r["id"]),
            bool(r["accepted"]),
            r.get("time"),
            r.get("sender"),
            freeze(r.get("header")),
            r.get("payload"),
        )

    def _learned(self, r: dict[str, Any]) -> Learned:
        t = r["t"]
        m = r["message"]
        if type(t) is not int or type(m) is not dict:
            raise HistoryError("a learned event has an integer t and a message object")
        msg = Message(
            _str(m["sender"], "sender"), self.id(m["id"]), freeze(m.get("header")), m.get("payload")
        )
        return Learned(t, msg, r.get("time"))


def _str(value: Any, what: str) -> str:
    if type(value) is not str:
        raise HistoryError(f"{what} is a string, not {value!r}")
    return value


def iter_events(source: str | os.PathLike[str] | IO[str]) -> Iterator[tuple[str, Any]]:
    """Every ``(process, event)`` of a JSON-lines history, in file order (streaming)."""
    if isinstance(source, str | os.PathLike):
        with open(source, encoding="utf-8") as fh:
            yield from _iter_lines(fh)
    else:
        yield from _iter_lines(source)


def _iter_lines(lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    decoder = _Decoder()
    chunk: list[str] = []
    first = 1  # line number of the chunk's first line
    for number, line in enumerate(lines, start=1):
        chunk.append(line)
        if len(chunk) >= _CHUNK:
            yield from _decode_chunk(decoder, chunk, first)
            chunk = []
            first = number + 1
    if chunk:
        yield from _decode_chunk(decoder, chunk, first)


def _decode_chunk(decoder: _Decoder, chunk: list[str], first: int) -> Iterator[tuple[str, Any]]:
    lines = [line for line in chunk if not line.isspace() and line]
    try:
        records = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        records = None
    if records is None or len(records) != len(lines):
        # Find the culprit (or a line holding two values) with its line number.
        records = []
        for i, line in enumerate(chunk):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise HistoryError(f"line {first + i}: not JSON ({err})") from None
    event = decoder.event
    out = []
    try:
        for rec in records:
            out.append(event(rec))
    except HistoryError as err:
        nonblank = [i for i, line in enumerate(chunk) if line.strip()]
        raise HistoryError(f"line {first + nonblank[len(out)]}: {err}") from None
    return iter(out)


def read_history(source: str | os.PathLike[str] | IO[str]) -> History:
    """Read a JSON-lines history from a path or an open text file."""
    history = History()
    processes = history.processes
    for process, event in iter_events(source):
        if type(event) is Learned:
            history.router(process).learn(event.t, event.message, event.time)
            continue
        log = processes.get(process)
        if log is None:
            log = processes[process] = []
        log.append(event)
    return history
