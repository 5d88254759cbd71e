"""A dict that also walks its keys in order, paying for the order in sorts, not inserts.

A sorted map (``sortedcontainers.SortedDict``) finds each new key's place as it comes:
a bisection of its leaf with generic comparisons and a list insert, in Python, 9 µs at
200,000 keys and 16 µs at a million on this project's machine (most of a storage
process's cost per new key).  :class:`LeafMap` keeps the same shape, sorted leaves of
about :data:`LOAD` keys under a list of their upper bounds, but a new key is only
*appended* to its leaf: the leaf is sorted when it is next read or split, in one
``list.sort``, whose comparisons are specialised to the keys' type.  A new key costs a
bisection of the bounds and an append (about 5 µs at 200,000 keys, 6 at a million),
and no read or write waits for more than one leaf's sort.

A leaf read after a few appends (a lookup under writes) is not sorted whole: its
sorted part stays, and each appended key is put in its place by bisection.  A walk of
the 300 keys of one secondary value in an index view's 300,000 rows, after one insert
into its leaf, took 167 µs sorting the leaf whole and 28.8 µs placing the one key
(21.7 µs with no insert; after 4 inserts 199 µs against 38.0, after 16 257 against
68.4; 2026-12-04).

A removed key stays in its leaf as a *ghost*: skipped when read, dropped when the leaf
is next sorted whole, or from every leaf when ghosts reach half the live keys.  A ghost
added again keeps its place.

Only the map's own writing methods keep the order: ``d[k] = v``, ``del d[k]``,
``pop``, ``update``, ``add_new``, ``remove_range`` and ``clear``; the others that would
add keys are refused.  ``dict.__setitem__(d, k, v)`` on a key ``d`` already holds is
allowed (the order does not change), and is how a hot loop overwrites; so is
``dict.setdefault(d, k, v)`` followed, when it took the key, by ``place_new(k)``.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

LOAD = 1000
"""Keys a leaf holds after a split (it splits at twice as many)."""
_CHUNK = 64
"""Keys a walk copies out of a leaf at a time (a scan with a limit stops early)."""
_PLACED = 32
"""Keys appended to a sorted leaf that a read puts in place one by one (a bisection
and a list insert each); more, and the read sorts the leaf whole (a sort walks every
key once at least: 145 µs for 1,200 keys of a view's rows)."""
_second = itemgetter(1)


class LeafMap(dict):  # type: ignore[type-arg]
    """A dict whose keys can also be walked in order (:meth:`irange`)."""

    __slots__ = ("_bounds", "_ghosts", "_leaves", "_load", "_moves", "_unsorted")

    def __init__(self, load: int = LOAD) -> None:
        super().__init__()
        if load < 1:
            raise ValueError("a leaf holds at least one key")
        self._load = load
        self._bounds: list[Any] = []
        """Leaf ``i`` holds keys above ``_bounds[i - 1]`` and up to ``_bounds[i]``
        (a bound need not be a key any more: a leaf's largest may have gone)."""
        self._leaves: list[list[Any]] = []
        """Every key held, and every ghost, once; none empty."""
        self._unsorted: dict[int, int] = {}
        """``id`` of each leaf appended to out of order since it was last sorted, and how
        many of its first keys are still in order (every key after them was appended)."""
        self._ghosts: set[Any] = set()
        """Keys in a leaf that the dict no longer holds."""
        self._moves = 0
        """Counts changes that move keys within or between leaves (a sort, a split, a
        sweep), so that an open walk finds its place again; an append moves none."""

    # ------------------------------------------------------------------ writes
    def add_new(self, key: Any, value: Any) -> None:
        """Set a key this dict does not hold (the caller has checked)."""
        dict.__setitem__(self, key, value)
        self.place_new(key)

    def place_new(self, key: Any) -> None:
        """Give a key the dict has just taken (``dict.setdefault(d, key, v) is v``: one
        look-up of the key where a check and a set made two, 0.2 µs of a new key's put
        at a million keys) its place in the order."""
        ghosts = self._ghosts
        if ghosts and key in ghosts:
            ghosts.discard(key)  # still in its leaf: its place stands
            return
        bounds = self._bounds
        pos = bisect_left(bounds, key)  # leaf i holds keys up to bounds[i], itself too
        if pos == len(bounds):  # above every bound: the last leaf, still in order
            if not bounds:
                self._leaves.append([key])
                bounds.append(key)
                return
            pos -= 1
            bounds[pos] = key
            leaf = self._leaves[pos]
            leaf.append(key)
        else:
            leaf = self._leaves[pos]
            unsorted = self._unsorted
            if id(leaf) not in unsorted:
                unsorted[id(leaf)] = len(leaf)
            leaf.append(key)
        if len(leaf) > 2 * self._load:
            self._split(pos)

    def __setitem__(self, key: Any, value: Any) -> None:
        if dict.__contains__(self, key):
            dict.__setitem__(self, key, value)
        else:
            self.add_new(key, value)

    def update(self, items: Any = (), /, **kw: Any) -> None:  # type: ignore[override]
        if kw:
            raise TypeError("LeafMap.update takes no keyword arguments")
        for key, value in items.items() if hasattr(items, "items") else items:
            self[key] = value

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._ghost(key)

    def pop(self, key: Any, *default: Any) -> Any:
        if dict.__contains__(self, key):
            value = dict.pop(self, key)
            self._ghost(key)
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def remove_range(self, lo: Any, hi: Any) -> list[tuple[Any, Any]]:
        """Remove every key from ``lo`` to ``hi`` (excluded); their ``(key, value)``
        pairs, in order.  A leaf's part goes in one slice: removed one by one, the
        100,000 keys a migration moves away held their storage process for up to a
        second after it."""
        out = self._remove_range(lo, hi)
        self._sweep_if_haunted()  # fewer keys live: the ghosts elsewhere may be too many
        return out

    def _remove_range(self, lo: Any, hi: Any) -> list[tuple[Any, Any]]:
        out: list[tuple[Any, Any]] = []
        above = bisect_left
        while True:
            bounds = self._bounds
            pos = above(bounds, lo)  # the first leaf that may hold a key from lo
            if pos == len(bounds):
                return out
            leaf = self._sorted(pos)
            if not leaf:
                return out
            bound = self._bounds[pos]
            i, j = above(leaf, lo), bisect_left(leaf, hi)
            if i < j:
                for key in leaf[i:j]:
                    if dict.__contains__(self, key):
                        out.append((key, dict.pop(self, key)))
                    else:
                        self._ghosts.discard(key)  # out of its leaf now
                del leaf[i:j]
                self._moves += 1
                if not leaf:
                    self._remove(pos)
            if not bound < hi:
                return out
            lo, above = bound, bisect_right  # resume past this leaf

    def clear(self) -> None:
        dict.clear(self)
        self._moves += 1
        self._bounds = []
        self._leaves = []
        self._unsorted = {}
        self._ghosts = set()

    def _refused(self, *args: Any, **kw: Any) -> Any:
        raise TypeError("LeafMap keeps its order only through its own writing methods")

    setdefault = popitem = __ior__ = _refused  # type: ignore[assignment]

    # ------------------------------------------------------------------ leaves
    def _ghost(self, key: Any) -> None:
        self._ghosts.add(key)
        self._sweep_if_haunted()

    def _sweep_if_haunted(self) -> None:
        """Sweep once ghosts outnumber half the live keys (and a leaf's load)."""
        if len(self._ghosts) > max(self._load, len(self) // 2):
            self._sweep()

    def _sweep(self) -> None:
        """Drop every ghost from every leaf (a filter keeps a sorted leaf sorted)."""
        self._moves += 1
        unsorted = self._unsorted
        for pos in range(len(self._leaves) - 1, -1, -1):
            leaf = self._leaves[pos]
            ordered = unsorted.get(id(leaf))
            if ordered is not None:  # the keys kept of its sorted part are its sorted part
                unsorted[id(leaf)] = sum(1 for k in leaf[:ordered] if k in self)
            leaf[:] = [k for k in leaf if k in self]
            if not leaf:
                self._remove(pos)
        self._ghosts = set()

    def _sorted(self, pos: int) -> list[Any]:
        """Leaf ``pos``, sorted; without ghosts when it was sorted whole (then it may
        go, and this is the next one)."""
        leaf = self._leaves[pos]
        ordered = self._unsorted.pop(id(leaf), None)
        if ordered is None:
            return leaf
        self._moves += 1
        if len(leaf) - ordered <= _PLACED:
            # A few appended: each to its place.  Its ghosts stay (a walk skips them):
            # finding them would walk the whole leaf, the cost this saves.
            tail = leaf[ordered:]
            del leaf[ordered:]
            for key in tail:
                insort(leaf, key)
            return leaf
        self._sort(pos, leaf)
        if self._ghosts:
            gone = [k for k in leaf if k not in self]
            if gone:
                self._ghosts.difference_update(gone)
                leaf[:] = [k for k in leaf if k in self]
                if not leaf:
                    self._remove(pos)
                    return self._sorted(pos) if pos < len(self._leaves) else []
        return leaf

    def _sort(self, pos: int, leaf: list[Any]) -> None:
        """Sort leaf ``pos`` whole, comparing as little of each key as its bounds allow.

        Every key of a leaf lies above the bound before it and up to its own bound, so
        when both bounds are tuples that start alike, every key starts so too and the
        rest of each key orders them.  A view's rows share their first seven elements
        or more (``(5, 3, "~view", 3, name, 5, 2, g, ...)``), which a tuple comparison
        walks each time: sorting by the rest took 2,001 of one index's rows 348 µs
        instead of 508, 232 instead of 517 when they share a secondary value, and
        690-796 instead of 985 scattered over a heap of 600,000 rows as a storage
        process's are (where these sorts at leaf splits were 9 % of a view holder's CPU
        under an index view's peak load, py-spy).  Pairs of one rank, ``(r, a)`` and
        ``(r, b)`` (the memory engine's integer and string keys under range
        partitioning), when every key is a pair, are ordered by their second elements
        alone: 101 µs instead of 267 for 2,001 integer keys, the check included
        (2026-12-05)."""
        if pos:
            lo, hi = self._bounds[pos - 1], self._bounds[pos]
            if type(lo) is tuple and type(hi) is tuple and lo and hi and lo[0] == hi[0]:
                if len(lo) == 2 and len(hi) == 2 and sum(map(len, leaf)) == 2 * len(leaf):
                    leaf.sort(key=_second)
                    return
                same = 1
                most = min(len(lo), len(hi))
                while same < most and lo[same] == hi[same]:
                    same += 1
                if same >= 2:
                    leaf.sort(key=itemgetter(slice(same, None)))
                    return
        leaf.sort()

    def _remove(self, pos: int) -> None:
        self._unsorted.pop(id(self._leaves[pos]), None)
        del self._leaves[pos]
        del self._bounds[pos]

    def _split(self, pos: int) -> None:
        leaf = self._sorted(pos)
        load = self._load
        if len(leaf) > 2 * load:
            self._moves += 1
            self._leaves.insert(pos + 1, leaf[load:])
            del leaf[load:]
            self._bounds.insert(pos, leaf[-1])

    # ------------------------------------------------------------------ order
    def irange(
        self, lo: Any = None, hi: Any = None, inclusive: tuple[bool, bool] = (True, False)
    ) -> Iterator[Any]:
        """The keys from ``lo`` to ``hi`` (None: unbounded) in order, without ghosts.
        Writes may come between two keys given: a key added while the walk is open
        may be missed, none is given twice, and one removed is not given unless it
        was removed while the walk was inside its chunk of :data:`_CHUNK` keys."""
        above = bisect_left if inclusive[0] else bisect_right
        below = bisect_right if inclusive[1] else bisect_left
        while True:
            bounds = self._bounds
            pos = 0 if lo is None else above(bounds, lo)  # the first leaf that may hold lo
            if pos == len(bounds):
                return
            leaf = self._sorted(pos)
            if not leaf:
                return
            bound = self._bounds[pos]  # every key up to it is in this leaf, now
            i = 0 if lo is None else above(leaf, lo)
            j = len(leaf) if hi is None else below(leaf, hi)
            last = j == len(leaf) and (hi is None or bound < hi)
            moves = self._moves
            for s in range(i, j, _CHUNK):  # a slice touches every key it copies
                chunk = leaf[s : min(s + _CHUNK, j)]
                if self._ghosts:
                    yield from [key for key in chunk if key in self]
                else:
                    yield from chunk
                if self._moves != moves:  # the leaf was sorted or cut: find our place again
                    lo, above = chunk[-1], bisect_right
                    break
            else:
                if not last:
                    return
                lo, above = bound, bisect_right  # resume past this leaf

    def ordered_keys(self) -> list[Any]:
        """Every key, in order."""
        return list(self.irange())

    def ordered_values(self) -> list[Any]:
        """Every value, in the order of the keys."""
        return [self[k] for k in self.irange()]

    def sample(self, n: int, rng: random.Random) -> list[Any]:
        """About ``n`` values at random, each key as likely as any other, for estimates
        (a map of ``n`` or fewer: every value).  A leaf at random and a place in it up
        to the largest leaf's size, drawn again when the place is past the leaf's end
        or holds a ghost: leaves differ in size (a sweep thins some), and a leaf drawn
        first would favour the keys of small ones."""
        if len(self) <= n:
            return list(self.values())
        leaves, ghosts, get, out = self._leaves, self._ghosts, dict.get, []
        most = max(map(len, leaves))
        for _ in range(8 * n):
            leaf = leaves[rng.randrange(len(leaves))]
            i = rng.randrange(most)
            if i < len(leaf) and leaf[i] not in ghosts:
                out.append(get(self, leaf[i]))
                if len(out) == n:
                    break
        return out

    def stats(self) -> dict[str, int]:
        return {"leaves": len(self._leaves), "unsorted": len(self._unsorted),
                "ghosts": len(self._ghosts)}  # fmt: skip
