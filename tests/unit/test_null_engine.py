"""The null engine's operations: a point read carries its key once and is answered whole,
as a read of the same ranges is, in one :class:`rubberband.proto.Whole` answer."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ecast import Message
from rubberband.client import ClientCore
from rubberband.keys import after
from rubberband.proto import H, Whole
from storage_adapters.null import NullEngine, NullOps
from tests.rubberband_model import Model


def test_point_reads_travel_lighter_and_every_one_is_answered_whole() -> None:
    m = Model(f=3).ring_of(4)
    for core in m.storage.values():  # nothing is migrated from here on
        core.engine = NullEngine(m.placement)
    client = ClientCore(NullOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    keys = [m.placement.ekey(k) for k in range(0, 400, 7)]
    points: list[Any] = [("point", e) for e in keys]
    ranged: list[Any] = [("read", ((e, after(e)),)) for e in keys]
    gp, gr = client.gathers(points), client.gathers(ranged)
    assert [g.ranges for g in gp] == [g.ranges for g in gr]
    by_points = client.read_messages(points, gp, 64, 1 << 16)
    by_ranges = client.read_messages(ranged, gr, 64, 1 << 16)
    size = sum(len(p) for _, p, _ in by_points)
    assert size < 0.8 * sum(len(p) for _, p, _ in by_ranges)

    answered: dict[int, int] = {}
    seq = itertools.count()
    for indices, payload, header in by_points:
        header[H.REQUEST] = ("b", indices)
        msg = Message("client:c", (("u", 0, "client:c"), next(seq)), header, payload)
        for d in sorted(m.config.destset(msg)):
            for _, out in m.storage[d].deliver_unsafe(msg, m.t, True).send:
                # Every read answered whole and without error: the results alone.
                whole = out.payload
                assert type(whole) is Whole and whole.request == ("b", indices)
                assert len(whole.results) == len(indices)
                for i in range(len(whole.results)):
                    answered[indices[i]] = answered.get(indices[i], 0) + 1
    assert answered == dict.fromkeys(range(len(keys)), 1)


def test_a_write_of_one_key_names_it_once_and_reaches_its_holders_as_a_ranged_write() -> None:
    """``("set", ekey, payload)`` is routed as ``("write", ((ekey, after(ekey)),),
    payload)`` is, to the same holders, each applying it once, and its operation packs
    half the objects: the header already names the key's range."""
    m = Model(f=3).ring_of(4)
    for core in m.storage.values():
        core.engine = NullEngine(m.placement)
        core._logged = False  # (the model built them on the memory engine, which logs)
    client = ClientCore(NullOps())
    client.learn(m.config.version, m.config.keyspace.to_state())
    blob = b"x" * 16
    for k in range(0, 400, 7):
        e = m.placement.ekey(k)
        point, header = client.write_message(("set", e, blob))
        ranged, ranged_header = client.write_message(("write", ((e, after(e)),), blob))
        assert header == ranged_header
        assert _objects(point) == 6 < _objects(ranged) == 12
        before = {d: core.engine.applied for d, core in m.storage.items()}
        dests = m.submit("client:c", header, point)
        assert dests == m.submit("client:c", ranged_header, ranged) and len(dests) == 3
        for d, core in m.storage.items():
            assert core.engine.applied - before[d] == (2 if d in dests else 0)


def _objects(value: Any) -> int:
    """msgpack objects in ``value``, containers and their items alike."""
    if type(value) is tuple:
        return 1 + sum(_objects(v) for v in value)
    return 1


def test_a_point_operation_on_anything_but_an_encoded_key_is_refused() -> None:
    """The client refuses it (``BadOperation``): a key the header cannot name as a range
    (a string, a list) would otherwise fail deep in the client as a ``TypeError``."""
    from rubberband.engine import BadOperation, Placement

    ops = NullOps()
    for kind in ("point", "set"):
        assert ops.part_fun((kind, (2, 5), b""), Placement()).ranges == (((2, 5), (2, 5, 0)),)
        for bad in ("ab", [2, 5], 5, None):
            with pytest.raises(BadOperation, match="an encoded key"):
                ops.part_fun((kind, bad, b""), Placement())
