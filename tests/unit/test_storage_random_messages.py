"""Random client messages, well formed or not, never set replicas apart.

A client (honest and buggy, or hostile) chooses every part of a message: its operation,
the ranges its header names, whether it travels as a read or a write, packed or not.
Whatever it sends, every holder of a key must end with the same value for it, no
storage process may stop, and none may hold a key outside its partition.  Two faults
this found: a write sent as a read ran at the one replica the read reached, and a write
whose validity depends on the data (an append to a key that holds no list) was refused
at a replica holding the bad key and applied at one holding only its other keys.  Nor may
any message make cyclic garbage in a storage process's step, which runs frozen."""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rubberband.engine import Placement, encode_key
from rubberband.proto import H
from storage_adapters.memory import KVOps
from tests.garbage import garbage_kept, older_objects_frozen
from tests.rubberband_model import Model

KEYS = st.one_of(
    st.integers(-5, 450),
    st.text(max_size=3),
    st.tuples(st.just("~view"), st.text(max_size=2), st.integers(0, 5)),
    st.tuples(st.just("~views"), st.text(max_size=2)),
    st.tuples(st.integers(0, 9)),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.binary(max_size=3),
)
VALUES = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
)
ENTRIES = st.one_of(
    st.tuples(st.integers(-2, 50)),
    st.tuples(st.integers(-2, 50), VALUES),
    st.lists(st.integers(0, 50), max_size=3),
)
PAIRS = st.lists(st.tuples(KEYS, VALUES), max_size=4)
OPS = st.one_of(
    st.tuples(st.sampled_from(["put", "append", "add"]), PAIRS),
    st.tuples(st.sampled_from(["delete", "get"]), st.lists(KEYS, max_size=4)),
    st.tuples(st.sampled_from(["scan", "delete_range"]), KEYS, KEYS),
    st.tuples(st.just("scan"), KEYS, KEYS, st.integers(-1, 5)),
    st.tuples(
        st.just("version"), st.lists(st.tuples(KEYS, ENTRIES), max_size=3), st.integers(-1, 60)
    ),
    st.tuples(st.just("reclaim"), st.lists(KEYS, max_size=3), st.integers(-1, 60)),
)
SENDERS = ("client:c", "maintainer:m")
"""A client's views' rows and definitions are refused, or only its base keys deleted; a
maintainer's are applied: both at every replica alike."""
AS_ITSELF, AS_ANOTHER, AS_EVERYTHING, ANSWERED = range(4)
"""How a message's header is made: from its own operation (as a client does), from
another operation (a read's header on a write, a write's on a read, other keys), naming
the whole ring, or from its own operation asking for an answer."""

_OPS = KVOps()
_PLACEMENT = Placement()


def _header(op: Any, other: Any, how: int, request: int) -> dict[str, Any]:
    try:
        part = _OPS.part_fun(other if how == AS_ANOTHER else op, _PLACEMENT)
    except Exception:
        return {H.WRITES: (((2, 0), (2, 500)),)} if how == AS_EVERYTHING else {}
    if part.kind == "write":
        return {
            H.WRITES: part.ranges,
            **({H.REQUEST: request, H.ANSWER: 1} if how == ANSWERED else {}),
        }
    return {H.READS: part.ranges, H.REQUEST: request, H.OFFSET: 0}


MESSAGES = st.lists(
    st.tuples(OPS, OPS, st.integers(0, 3), st.booleans(), st.sampled_from(SENDERS)),
    min_size=1,
    max_size=5,
)
"""A client's messages: ``(op, another op, how its header is made, packed, sender)``."""


def _model() -> Model:
    m = Model(f=3).ring_of(5)
    m.write(("put", ((5, "a"), (150, [1]))))
    return m


def _send(m: Model, messages: list[tuple[Any, Any, int, bool, str]]) -> None:
    """Each of ``messages`` submitted and settled, in order."""
    for i, (op, other, how, packed, sender) in enumerate(messages):
        header = _header(op, other, how, i + 1)
        payload: Any = op
        if packed:
            payload = msgpack.packb(op, use_bin_type=True)
            header[H.PACKED] = 1
        m.submit(sender, header, payload)
        m.settle()


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(MESSAGES)
def test_random_client_messages_leave_every_key_alike_at_its_holders(
    messages: list[tuple[Any, Any, int, bool, str]],
) -> None:
    m = _model()
    _send(m, messages)
    assert not m.stopped
    ks = m.config.keyspace
    held: dict[str, dict[Any, Any]] = {}
    for name in ks.processes:
        core = m.storage[name]
        assert not core.incomplete
        # by encoded key: 0, 0.0 and False are three keys here, one in a dict
        held[name] = {encode_key(k): v for k, v in core.engine.items()}
    values: dict[Any, tuple[str, Any]] = {}
    for name, got in held.items():
        part = ks.partition(name)
        for k, v in got.items():
            assert any(lo <= k < hi for lo, hi in part), (name, k, "outside its partition")
            first = values.setdefault(k, (name, v))
            assert first[1] == v, (k, first, (name, v))
    for name, got in held.items():
        for k, (who, _) in values.items():
            if any(lo <= k < hi for lo, hi in ks.partition(name)):
                assert k in got, (name, "lacks", k, "which", who, "holds")


def test_a_rejected_write_makes_no_cyclic_garbage() -> None:
    """A storage process's steps on the loop run frozen: what they make is never walked
    by the collector (``ecast.step_kept``), so a cycle made in one would never be freed.
    A rejection kept the traceback of its raise, whose frames held the batch's results,
    which held the rejection: 362 objects of cyclic garbage for the first three rejected
    writes here.  A rejection raised while handling another exception (a version of a
    key that holds no chain) kept that one as its context, whose traceback's frames led
    to the same results (hypothesis found it: 224 objects in its example)."""
    m = _model()
    rejected = [
        ("client:c", ("append", ((5, "x"),))),
        ("client:c", ("add", ((5, 1),))),
        ("client:c", ("version", (((9,), [3]),), 0)),
        ("maintainer:m", ("version", ((5, [0]), (5, [1])), 0)),
    ]
    with garbage_kept() as garbage:
        for i, (sender, op) in enumerate(rejected):
            part = _OPS.part_fun(op, _PLACEMENT)
            m.submit(sender, {H.WRITES: part.ranges, H.REQUEST: i + 1, H.ANSWER: 1}, op)
            m.settle()
        assert gc.collect() == 0, Counter(type(o).__name__ for o in garbage).most_common(5)
    answers = [error for rid in (1, 2, 3, 4) for _who, _covered, _res, error in m.results[rid]]
    assert answers and all(answers), answers  # every one of them rejected


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(MESSAGES)
def test_random_client_messages_make_no_cyclic_garbage(
    messages: list[tuple[Any, Any, int, bool, str]],
) -> None:
    with older_objects_frozen():  # (the model made inside: its objects walked too)
        m = _model()
        with garbage_kept() as garbage:
            _send(m, messages)
            assert gc.collect() == 0, Counter(type(o).__name__ for o in garbage).most_common(5)
