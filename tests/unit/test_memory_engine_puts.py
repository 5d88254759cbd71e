"""The memory and log engines' written-out single-key put (and the memory engine's
reads, taken without the general road's change list) answer as their general road does:
the same results, changes, map and (the log) records at the same positions."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.engine import ReportsChanges
from rubberband.keys import after, encode_key
from storage_adapters.log import LogEngine
from storage_adapters.memory import MemoryEngine

KEYS = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**65),  # some outside what msgpack carries
    st.text(max_size=3),
    st.booleans(),
    st.floats(allow_nan=False, width=16),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.just(("~rows", "t", 1)),  # a table row's change key: refused as key-value data
)


def _ranges(draw: Any, key: Any) -> Any:
    """The key's own point (the usual part of a one-key write), a range around or
    beside it, two ranges, or a malformed set."""
    try:
        e = encode_key(key)
    except Exception:
        e = (2, 0)
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return ((e, after(e)),)
    if choice == 1:
        return (((2, -5), (3, "zz")),)
    if choice == 2:
        return (((3, "m"), (9,)),)
    if choice == 3:
        return (((2, -5), (2, 0)), ((3, ""), (9,)))
    return ((e, after(e)),)


@st.composite
def batches(draw: Any) -> list[tuple[Any, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        key = draw(KEYS)
        value = draw(st.one_of(st.integers(), st.text(max_size=4), st.none()))
        shape = draw(st.integers(0, 11))
        if shape <= 3:
            op: Any = ("put", ((key, value),))
        elif shape == 4:
            op = ["put", [[key, value]]]  # lists, as a test or a driver may pass
        elif shape == 5:
            op = ("put", ((key, value), (draw(KEYS), value)))
        elif shape == 6:
            op = ("delete", (key,))
        elif shape == 7:  # reads, which change nothing: the short way too
            op = ("get", (key, draw(KEYS)))
        elif shape == 8:
            op = ("scan", ((2, -5), (9,)), draw(st.sampled_from([None, 1, 2])))
        elif shape == 9:
            op = draw(st.sampled_from([("get",), ("get", "not keys"), ("scan", None),
                                       (["get"], (key,)), ["get", [key]]]))  # fmt: skip
        else:
            op = ("append", ((key, value),))
        out.append((op, _ranges(draw, key)))
    return out


def _state(e: MemoryEngine) -> Any:
    return list(e._data.items()), dict(e.counts)


@settings(max_examples=300, deadline=None)
@given(batches(), batches())
def test_a_put_of_one_key_written_out_is_the_general_roads(first: Any, second: Any) -> None:
    fast, general = MemoryEngine(), MemoryEngine()
    assert fast._put_store() is not None
    for batch in (first, second):
        got = fast.apply_logged(batch)
        want = ReportsChanges.apply_logged(general, batch)
        assert [repr(r) for r in got[0]] == [repr(r) for r in want[0]]
        assert got[1] == want[1]
        assert _state(fast) == _state(general)


def test_an_engine_that_applies_otherwise_takes_the_general_road() -> None:
    seen: list[Any] = []

    class Watched(MemoryEngine):
        def apply(self, batch: Any) -> list[Any]:
            seen.extend(batch)
            return super().apply(batch)

    e = Watched()
    assert e._put_store() is None
    put = (("put", ((1, "a"),)), (((2, 1), (2, 1, 0)),))
    assert e.apply_logged([put]) == ([None], [((1, "put", "a"),)])
    assert seen == [put]


def test_an_engine_whose_apply_is_wrapped_in_place_takes_the_general_road() -> None:
    e = MemoryEngine()
    seen: list[Any] = []
    plain = e.apply

    def apply(batch: Any) -> list[Any]:
        seen.extend(batch)
        return plain(batch)

    e.apply = apply  # type: ignore[method-assign]
    put = (("put", ((1, "a"),)), (((2, 1), (2, 1, 0)),))
    assert e.apply_logged([put]) == ([None], [((1, "put", "a"),)])
    assert seen == [put]


@st.composite
def positioned(draw: Any) -> list[tuple[Any, Any, int]]:
    """A batch as a durable engine gets it, each item with its position: rising, as
    deliveries come, or (``shuffle``) in any order, which the records must follow as
    the general road stamps them."""
    batch = draw(batches())
    ts = sorted(draw(st.lists(st.integers(1, 10**6), min_size=len(batch), max_size=len(batch))))
    if draw(st.booleans()):
        ts = draw(st.permutations(ts))
    return [(op, ranges, t) for (op, ranges), t in zip(batch, ts, strict=True)]


def _log_state(e: LogEngine) -> Any:
    return list(e._data.live.items()), dict(e.counts), e.position, e.tail(0)


@settings(max_examples=150, deadline=None)
@given(positioned(), positioned())
def test_the_log_engines_written_out_put_is_its_general_roads(first: Any, second: Any) -> None:
    fast, general = LogEngine(fsync="interval"), LogEngine(fsync="interval")
    try:
        assert fast._put_store() is not None
        for batch in (first, second):
            got = fast.apply_logged(batch)
            with general.group():
                want = ReportsChanges.apply_logged(general, batch)
            assert [repr(r) for r in got[0]] == [repr(r) for r in want[0]]
            assert got[1] == want[1]
            assert _log_state(fast) == _log_state(general)
    finally:
        fast.close()
        general.close()


def test_a_log_engine_that_applies_otherwise_takes_the_general_road() -> None:
    class Watched(LogEngine):
        def apply(self, batch: Any) -> list[Any]:
            seen.extend(batch)
            return super().apply(batch)

    seen: list[Any] = []
    e = Watched(fsync="interval")
    try:
        assert e._put_store() is None
        put = (("put", ((1, "a"),)), (((2, 1), (2, 1, 0)),), 7)
        assert e.apply_logged([put]) == ([None], [((1, "put", "a"),)])
        assert seen == [put]
        assert e.tail(0) == [(7, "put", (1, "a"))]
    finally:
        e.close()


def test_the_bytes_a_memory_engine_reports_are_its_items_encoded_size() -> None:
    # (the elasticity benchmark turns them into the bytes each migration moved)
    e = MemoryEngine()
    assert e.stats()["bytes"] == 0
    e.apply([(("put", tuple((k, "v" * 100) for k in range(5_000))), (((2, 0), (9,)),))])
    assert e.stats()["items"] == 5_000
    # each item is (key, value) encoded: about 3 bytes of array and key, 102 of value
    assert 5_000 * 100 < e.stats()["bytes"] < 5_000 * 110, e.stats()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.integers(0, 40), st.text(max_size=2), st.tuples(st.integers(0, 3), st.text(max_size=1)),
    st.tuples(st.just("~view"), st.sampled_from(["v", "w"]),
              st.tuples(st.integers(0, 3), st.integers(0, 3))),
), min_size=1, max_size=40))  # fmt: skip
def test_a_write_of_many_keys_names_the_points_normalize_makes(keys: list[Any]) -> None:
    """Past eight keys an operation's points are put in order by their flat forms and
    rid of repeats instead of normalized: the same range set, repeats and all.  (A get:
    a put of a view's keys is refused, and a write's points are found as a read's.)"""
    from rubberband.engine import Placement
    from rubberband.keys import normalize
    from storage_adapters.memory import KVOps

    op = ("get", tuple(keys))
    places = [encode_key(k) for k in keys]
    assert KVOps().part_fun(op, Placement()).ranges == normalize((p, after(p)) for p in places)


VERSION_KEYS = st.one_of(
    KEYS,
    st.tuples(st.just("~view"), st.sampled_from(["v", "w"]),
              st.tuples(st.integers(0, 3), st.integers(-2, 3))),
    st.tuples(st.just("~rows"), st.sampled_from(["t", "u"]), st.integers(0, 3)),
)  # fmt: skip
ENTRIES = st.one_of(
    st.tuples(st.integers(0, 30)),
    st.tuples(st.integers(0, 30), st.one_of(st.integers(), st.text(max_size=3))),
    st.just((-1, "x")),  # malformed: the whole write refused
)


@st.composite
def version_batches(draw: Any) -> list[tuple[Any, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 6))):
        pairs = draw(st.lists(st.tuples(VERSION_KEYS, ENTRIES), min_size=1, max_size=6))
        op = ("version", tuple(pairs), draw(st.integers(0, 30)))
        out.append((op, _ranges(draw, pairs[0][0])))
    return out


class _Slotted(MemoryEngine):
    """Finds each slot through a ``_slot`` of its own: the version write's general road."""

    def _slot(self, key: Any) -> Any:
        return MemoryEngine._slot(self, key)


@settings(max_examples=300, deadline=None)
@given(version_batches(), version_batches())
def test_a_version_write_written_out_is_the_general_roads(first: Any, second: Any) -> None:
    """The memory engine finds a view row's slot with ``sort_key`` itself: the same
    results (a table row's key refused, a malformed entry refused, nothing of either
    applied), changes and map as through ``_slot``, whatever the keys, ranges and
    existing chains.  (A new row's one version, which it also makes itself, is checked
    against ``merge`` by the engines' conformance test.)"""
    fast, general = MemoryEngine(), _Slotted()
    for batch in (first, second):
        got = fast.apply_logged(batch)
        want = general.apply_logged(batch)
        assert [repr(r) for r in got[0]] == [repr(r) for r in want[0]]
        assert got[1] == want[1]
        assert _state(fast) == _state(general)
