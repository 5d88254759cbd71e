"""A storage process answers a delivered batch of read bundles and nothing else from one
engine call, without a mixed batch's per-read bookkeeping (``Apply._reads``): the same
answers, in the same order, and the same counts as the general road gives them."""

from __future__ import annotations

from typing import Any
from unittest import mock

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from ecast import Message
from rubberband.applying import Apply
from rubberband.client import ClientCore
from rubberband.engine import BadOperation
from rubberband.proto import H
from storage_adapters.memory import KVOps
from tests.rubberband_model import Model

POOL: list[Any] = [
    ("get", (5,)),
    ("get", (6,)),  # rejected by the engine below: its bundle is answered read by read
    ("get", (7, 8, 99)),
    ("get", (150,)),
    ("get", (200, 201)),
    ("scan", 90, 130),  # across a segment boundary: answered in parts
    ("scan", 250, 260),
    ("get", (399,)),
]


def _model() -> Model:
    m = Model(f=3)
    for i in range(4):
        m.join_storage(f"storage:{i}")
    for i in range(4):
        m.reconfigure(("expand", f"storage:{i}", i * 100))
        m.settle()
    for k in range(0, 400, 3):
        m.write(("put", ((k, -k),)))
    m.settle()
    for core in m.storage.values():
        apply = core.engine.apply

        def rejecting(batch: Any, apply: Any = apply) -> list[Any]:
            results = apply(batch)
            return [
                BadOperation("not 6 today") if item[0] == ("get", (6,)) else res
                for item, res in zip(batch, results, strict=True)
            ]

        core.engine.apply = rejecting  # type: ignore[method-assign]
    return m


def _messages(m: Model, picks: list[list[int]], broken: list[bool]) -> list[Message]:
    """A bundle of the pool's reads ``picks[j]`` for each ``j`` (malformed where
    ``broken[j]``), as the SDK's ``read_batch`` groups them."""
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    out = []
    for j, pick in enumerate(picks):
        ops = [POOL[i] for i in pick]
        gathers = [client.read_message(op)[2] for op in ops]
        groups, offset = client.bundles(gathers, 8)
        for group in groups:
            reads = [(ops[i], gathers[i]) for i in group]
            payload, header = client.bundle(reads, offset)
            header[H.REQUEST] = ("b", j, tuple(group))
            if broken[j]:
                payload = msgpack.packb([1, 2])
            out.append(Message("client:c", (("m", 0, "client:c"), len(out) + 1), header, payload))
    return out


def _answers(m: Model, msgs: list[Message]) -> dict[str, Any]:
    """Each storage core's answers to the messages it holds, delivered as one batch."""
    t = m.t
    got: dict[str, Any] = {}
    for name, core in sorted(m.storage.items()):
        mine = [msg for msg in msgs if name in m.config.destset(msg)]
        fx = core.deliver([(t + i + 1, msg) for i, msg in enumerate(mine)])
        got[name] = ([d.payload for _, d in fx.send], core.stats.applied, core.stats.rejected)
        assert core.stopped is None
    return got


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(
        st.lists(st.integers(0, len(POOL) - 1), min_size=2, max_size=8), min_size=1, max_size=5
    ),
    data=st.data(),
)
def test_a_batch_of_read_bundles_is_answered_as_the_general_road_answers_it(
    picks: list[list[int]], data: Any
) -> None:
    broken = data.draw(st.lists(st.booleans(), min_size=len(picks), max_size=len(picks)))
    short, general = _model(), _model()
    taken: list[bool] = []
    real = Apply._reads

    def watched(self: Apply) -> bool:
        taken.append(real(self))
        return taken[-1]

    with mock.patch.object(Apply, "_reads", watched):
        fast = _answers(short, _messages(short, picks, broken))
    with mock.patch.object(Apply, "_reads", lambda self: False):
        slow = _answers(general, _messages(general, picks, broken))
    assert fast == slow
    assert any(taken)  # (the short road was taken)
    replies = [r for sent, _, _ in fast.values() for r in sent]
    assert replies


def test_a_batch_with_a_write_takes_the_general_road() -> None:
    m = _model()
    msgs = _messages(m, [[0, 2, 4]], [False])
    client = ClientCore(KVOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    payload, header = client.write_message(("put", ((5, "x"),)))
    write = Message("client:c", (("m", 0, "client:c"), 99), header, payload)
    taken: list[bool] = []
    real = Apply._reads

    def watched(self: Apply) -> bool:
        taken.append(real(self))
        return taken[-1]

    both = [
        (name, msg)
        for name in sorted(m.config.destset(write))
        for msg in msgs
        if name in m.config.destset(msg)
    ]
    assert both
    with mock.patch.object(Apply, "_reads", watched):
        for name, msg in both:
            m.storage[name].deliver([(m.t + 1, msg), (m.t + 2, write)])
    assert taken and not any(taken)
