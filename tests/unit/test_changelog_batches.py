"""A change log fed a batch at a time holds what it holds fed a position at a time."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.changelog import ChangeLog

_keys = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b"]), st.booleans(), st.just((1,)))
_change = st.tuples(
    _keys, st.sampled_from(["put", "delete"]), st.one_of(st.none(), st.text(max_size=3))
)


@st.composite
def _batches(draw: Any) -> list[list[tuple[int, tuple[Any, ...]]]]:
    """Batches of ``(t, changes)`` in ``t`` order, as an engine batch reports them: one
    change a position mostly, several at one position (a bundle's items), none, and
    now and then a position at or below one already held (a write held back)."""
    t = 0
    out = []
    for _ in range(draw(st.integers(1, 6))):
        batch = []
        for _ in range(draw(st.integers(0, 8))):
            t += draw(st.sampled_from([0, 1, 1, 1, 2]))
            if draw(st.integers(0, 9)) == 0:
                t = max(0, t - draw(st.integers(1, 4)))
            batch.append((t, tuple(draw(st.lists(_change, min_size=0, max_size=3)))))
        out.append(batch)
    return out


def _held(log: ChangeLog) -> Any:
    return (
        log._t[log._head :],
        log._changes[log._head :],
        log._sizes[log._head :],
        log._count,
        log._bytes,
        log.recorded,
        log.floor,
        log.revisions,
    )


@settings(max_examples=300, deadline=None)
@given(_batches(), st.integers(1, 12))
def test_a_batch_is_logged_as_its_positions_one_at_a_time(batches: Any, most: int) -> None:
    fast, slow = ChangeLog(max_changes=most), ChangeLog(max_changes=most)
    for n, batch in enumerate(batches):
        fast.record_all(batch, float(n))
        groups: list[tuple[int, list[Any]]] = []
        for t, changes in batch:  # what one position changed, in the batch's order
            if not groups or groups[-1][0] != t:
                groups.append((t, []))
            groups[-1][1].extend(changes)
        for t, changes in groups:
            slow.record(t, float(n), changes)
        assert _held(fast) == _held(slow)
