"""The memory engine's written-out single-key put answers as its general road does."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.engine import ReportsChanges
from rubberband.keys import after, encode_key
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
        shape = draw(st.integers(0, 6))
        if shape <= 3:
            op: Any = ("put", ((key, value),))
        elif shape == 4:
            op = ["put", [[key, value]]]  # lists, as a test or a driver may pass
        elif shape == 5:
            op = ("put", ((key, value), (draw(KEYS), value)))
        else:
            op = ("delete", (key,))
        out.append((op, _ranges(draw, key)))
    return out


def _state(e: MemoryEngine) -> Any:
    return list(e._data.items()), dict(e.counts)


@settings(max_examples=300, deadline=None)
@given(batches(), batches())
def test_a_put_of_one_key_written_out_is_the_general_roads(first: Any, second: Any) -> None:
    fast, general = MemoryEngine(), MemoryEngine()
    assert fast._fast_puts()
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
    assert not e._fast_puts()
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
