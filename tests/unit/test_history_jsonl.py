"""The JSON-lines history format: every event kind survives a round trip, a malformed
line is named by its number, and a file read back checks as the history in memory."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ecast.core.config import BroadcastConfig
from ecast.core.message import Message
from ecast.history import (
    Ack,
    Crash,
    Deliver,
    DeliverUnsafe,
    History,
    HistoryError,
    HistoryWriter,
    Learned,
    Resubmit,
    Submit,
    SubmitUnsafe,
    Terminate,
    check_history,
    dumps_event,
    iter_events,
    read_history,
    write_history,
)
from tests import history_gen as g

MID = (("s2", 3, "x"), 5)


def every_kind() -> History:
    h = History()
    h.add("s2", Submit(MID, 1.0))
    h.add("s2", SubmitUnsafe((("s2", 3, "x~u"), 1), 1.1))
    h.add("h9", Resubmit(MID, 4.0))
    h.add("d1", Deliver(7, MID, 1.25, "s2", {"key": 4, "path": ["a", ["b"]]}, "m5"))
    h.add("d1", Deliver(8, MID, None, "s2", None, b"bytes are not kept"))
    h.add("d1", Deliver(9, MID))  # sender and header unknown
    h.add("d1", DeliverUnsafe(-1, 9, (("s2", 3, "x~u"), 1), True, 1.3, "s2", [1, 2], 3))
    h.add("s2", Ack(MID, 7, True, 1.4))
    h.add("s2", Ack(MID, None, False))
    h.add("d1", Crash(2.0))
    h.add("d2", Terminate("suspected", 2.5))
    h.add("d3", Terminate("suspected", 2.6, 8))
    h.add("r1", Learned(7, Message("s2", MID, {"key": 4}, "m5"), 1.2))
    return h


def expected(h: History) -> list[tuple[str, object]]:
    """What reading gives back: lists inside headers become tuples, payloads that are not
    a JSON scalar are dropped, unknown headers stay None."""
    out = []
    for p, e in h.events():
        if type(e) is Deliver:
            header = e.header
            if isinstance(header, dict):
                header = {"key": 4, "path": ("a", ("b",))}
            payload = e.payload if isinstance(e.payload, str | int) else None
            e = e._replace(header=header, payload=payload)
        elif type(e) is DeliverUnsafe:
            e = e._replace(header=(1, 2))
        out.append((p, e))
    return out


def test_every_event_kind_round_trips(tmp_path: Path) -> None:
    h = every_kind()
    path = tmp_path / "h.jsonl"
    write_history(h, path)
    lines = path.read_text().splitlines()
    assert len(lines) == len(h) == 13
    kinds = [json.loads(line)["event"] for line in lines]
    assert set(kinds) == {
        "submit",
        "submit_unsafe",
        "resubmit",
        "deliver",
        "deliver_unsafe",
        "ack",
        "crash",
        "terminate",
        "learned",
    }
    assert list(iter_events(path)) == expected(h)
    back = read_history(path)
    assert list(back.events()) == expected(h)
    assert back.routers["r1"].first_seen == {7: 1.2}
    # Ids come back as the tuples the routers use, sessions shared between events.
    ids = [e.id for e in back.processes["d1"] if type(e) is Deliver]
    assert ids[0] == MID and ids[0][0] is ids[1][0]


def test_one_line_per_event_with_the_documented_fields() -> None:
    line = dumps_event("d1", Deliver(7, MID, 1.25, "s2", {"key": 4}, "m5"))
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert json.loads(line) == {
        "process": "d1",
        "event": "deliver",
        "t": 7,
        "id": [["s2", 3, "x"], 5],
        "sender": "s2",
        "header": {"key": 4},
        "payload": "m5",
        "time": 1.25,
    }
    assert json.loads(dumps_event("s2", Ack(MID, None, False))) == {
        "process": "s2",
        "event": "ack",
        "id": [["s2", 3, "x"], 5],
        "t": None,
        "delivered": False,
    }
    with pytest.raises(TypeError, match="not a history event"):
        dumps_event("x", ("dlv", 1))


def test_a_run_written_streamed_and_read_back_checks_the_same(tmp_path: Path) -> None:
    config = BroadcastConfig.initial()
    ms = [g.join("a"), g.join("b"), *(g.data(p, i) for i in range(1, 3000) for p in "ab")]
    h = g.run(ms, config, learned=True)
    buf = io.StringIO()
    with HistoryWriter(buf) as w:  # a recorder appending as it goes
        for p, e in h.events():
            w.write(p, e)
    text = buf.getvalue()
    # Processes' lines may interleave in any order; each process's own order is kept.
    lines = text.splitlines(keepends=True)
    a = [x for x in lines if '"process":"a"' in x]
    rest = [x for x in lines if '"process":"a"' not in x]
    mixed = (
        [x for pair in zip(a, rest, strict=False) for x in pair] + a[len(rest) :] + rest[len(a) :]
    )
    back = read_history(io.StringIO("".join(mixed)))
    assert back.processes["a"] == h.processes["a"] and back.processes["b"] == h.processes["b"]
    v = check_history(back, config)
    assert v.ok and v.ran == check_history(h, config).ran
    # A planted anomaly in the file is found after reading it.
    swapped = text.replace('"t":9,', '"t":99,', 1)
    assert not check_history(read_history(io.StringIO(swapped)), config).ok


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("not json", "line 3: not JSON"),
        ("[1, 2]", "line 3: an event is a JSON object"),
        ('{"event": "submit", "id": [["a", 0, ""], 1]}', "line 3: an event needs 'process'"),
        ('{"process": "a", "event": "sent", "id": 1}', "line 3: unknown event 'sent'"),
        ('{"process": "a", "event": "submit"}', "line 3: a submit event needs 'id'"),
        ('{"process": "a", "event": "submit", "id": [1, 2]}', "line 3: a message id is"),
        ('{"process": "a", "event": "submit", "id": [["a", "0", ""], 1]}', "line 3: a session"),
        ('{"process": "a", "event": "deliver", "t": "7", "id": [["a", 0, ""], 1]}', "t is an"),
        ('{"process": 5, "event": "crash"}', "line 3: process 5 is not a string"),
        ('{"process": "a", "event": "terminate", "reason": "suspected", "t": 1.5}', "t is an"),
    ],
)
def test_a_malformed_line_is_named_by_its_number(line: str, error: str) -> None:
    good = dumps_event("a", Submit((("a", 0, ""), 1)))
    text = good + "\n" + line + "\n" + good  # a blank line is allowed
    with pytest.raises(HistoryError, match=error.replace("[", r"\[").replace("(", r"\(")):
        read_history(io.StringIO(text))


def test_a_malformed_line_far_into_a_file(tmp_path: Path) -> None:
    good = dumps_event("a", Crash())
    path = tmp_path / "h.jsonl"
    path.write_text(good * 10_000 + '{"process": "a"}\n' + good)
    with pytest.raises(HistoryError, match="line 10001: an event needs 'event'"):
        read_history(path)
