"""A change log fed a batch at a time holds what it holds fed a position at a time."""

from __future__ import annotations

import bisect
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


class _InsertedOneByOne:
    """The change log's retention as it was first written: each entry inserted at its
    position (after those held there), then the oldest dropped while too many or too
    old."""

    def __init__(self, most: int, age: float) -> None:
        self.most, self.age = most, age
        self.t: list[int] = []
        self.at: list[float] = []
        self.sizes: list[int] = []
        self.floor: int | None = None

    def record(self, t: int, now: float, n: int) -> None:
        i = bisect.bisect_right(self.t, t)
        self.t.insert(i, t)
        self.at.insert(i, now)
        self.sizes.insert(i, n)
        while self.t and (sum(self.sizes) > self.most or self.at[0] < now - self.age):
            self.floor = self.t.pop(0)
            self.at.pop(0)
            self.sizes.pop(0)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 40), st.integers(1, 3)), max_size=12),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 12),
    st.sampled_from([0.5, 1.5, 600.0]),
)
def test_positions_older_than_the_newest_are_held_as_if_inserted_one_by_one(
    batches: Any, most: int, age: float
) -> None:
    """Held-back writes drained after later ones are merged into the log in bulk; what
    it holds and what it dropped are what inserting them one at a time gave."""
    log, ref = ChangeLog(max_changes=most, max_age=age), _InsertedOneByOne(most, age)
    for n, batch in enumerate(batches):
        # (two entries at one position next to each other are one bundle: kept apart)
        batch = [e for i, e in enumerate(batch) if i == 0 or e[0] != batch[i - 1][0]]
        entries = [(t, tuple((f"k{j}", "put", j) for j in range(k))) for t, k in batch]
        log.record_all(entries, float(n))
        for t, k in batch:
            ref.record(t, float(n), k)
        assert log._t[log._head :] == ref.t
        assert [len(c) for c in log._changes[log._head :]] == ref.sizes
        assert log._at[log._head :] == ref.at
        if ref.floor is not None:
            assert log.floor == ref.floor


def test_a_full_log_is_trimmed_back_to_its_bounds_once_past_them_by_a_32nd() -> None:
    """Trimmed at every change past a bound, a full log spent a third of its recording
    on trim calls; trimmed once a 32nd past it, back to the bound, it never keeps less
    than it is told to (a feed can always resume within the configured window) and at
    most a 32nd more, by count, by bytes and by age."""
    log = ChangeLog(max_changes=64, max_age=64.0)
    t = 0

    def write(n: int, now: float) -> None:
        nonlocal t
        batch = []
        for _ in range(n):
            t += 1
            batch.append((t, ((t, "put", "x"),)))
        log.record_all(batch, now)

    write(64, 0.0)
    assert log._count == 64 and log.floor == -1
    write(2, 0.0)  # 66: within the slack of 64 >> 5 = 2
    assert log._count == 66 and log.floor == -1
    write(1, 0.0)  # 67: past it, back to 64 (the three oldest dropped)
    assert log._count == 64 and log.floor == 3 and log._t[log._head] == 4
    for _ in range(100):
        write(1, 0.0)
        assert 64 <= log._count <= 66
        assert log.floor == t - log._count  # every change after the floor is held

    by_bytes = ChangeLog(max_changes=10_000, max_bytes=101 * 64)  # a change of "x": 101
    for i in range(200):
        by_bytes.record_all([(i + 1, ((i, "put", "x"),))], 0.0)
        assert 64 <= by_bytes._count <= 66 or i < 63

    log = ChangeLog(max_changes=10_000, max_age=64.0)
    t = 0
    for now in range(100):
        write(1, float(now))
        held = log._at[log._head :]
        assert held[0] >= now - 66.0  # at most a 32nd of the age past it
        assert held[0] <= max(0.0, now - 64.0)  # and never less than the age kept
