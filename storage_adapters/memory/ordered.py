"""A map of slots whose order is kept up to date only when something reads it.

The memory and log engines keep their items by slot and answer ranges in slot order
(scans, deletes of a range, migration, replica comparison), but most writes are puts
of single keys that nothing reads by range before the next one.  A sorted map paid a
sorted insert for every new key: about a fifth of a storage process's time on the log
engine under writes to random keys, measured by py-spy (``docs/benchmarks.md``).  Here
a new slot waits in a set and joins the order, in one merge with every other waiting
slot, at the next ordered read; a removal leaves the order at once (removals are rare).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sortedcontainers import SortedList

_NONE: Any = object()


class SortedOnRead(dict):  # type: ignore[type-arg]
    """``slot -> item``.  Point access is a dict's; ``irange``, ``ordered`` and
    ``values`` answer in slot order.  Every way in or out keeps the order's bookkeeping:
    writers that bypass ``__setitem__`` (``dict.__setitem__``, for speed) add a new
    slot to ``_new`` first; the dict methods that would skip it are refused."""

    __slots__ = ("_new", "_order")

    def __init__(self) -> None:
        super().__init__()
        self._order: SortedList = SortedList()
        self._new: set[Any] = set()
        """Slots set since the order was last brought up to date."""

    def __setitem__(self, slot: Any, item: Any) -> None:
        if not dict.__contains__(self, slot):
            self._new.add(slot)
        dict.__setitem__(self, slot, item)

    def __delitem__(self, slot: Any) -> None:
        dict.__delitem__(self, slot)
        self._forget(slot)

    def _forget(self, slot: Any) -> None:
        if slot in self._new:
            self._new.discard(slot)
        else:
            self._order.remove(slot)

    def pop(self, slot: Any, default: Any = _NONE) -> Any:
        if dict.__contains__(self, slot):
            item = dict.pop(self, slot)
            self._forget(slot)
            return item
        if default is _NONE:
            raise KeyError(slot)
        return default

    def update(self, items: Mapping[Any, Any]) -> None:  # type: ignore[override]
        for slot, item in items.items():
            self[slot] = item

    def clear(self) -> None:
        dict.clear(self)
        self._order.clear()
        self._new.clear()

    def ordered(self) -> SortedList:
        """Every slot, in order (read it before the map changes again)."""
        if self._new:
            self._order.update(self._new)
            self._new.clear()
        return self._order

    def irange(self, lo: Any, hi: Any, inclusive: tuple[bool, bool] = (True, True)) -> Any:
        return self.ordered().irange(lo, hi, inclusive=inclusive)

    def values(self) -> list[Any]:  # type: ignore[override]
        """Every item, in slot order."""
        get = dict.__getitem__
        return [get(self, slot) for slot in self.ordered()]

    def __reduce__(self) -> Any:
        """Copied or pickled as its items, each set anew (the order rebuilt)."""
        return (type(self), (), None, None, iter(dict.items(self)))

    def popitem(self) -> Any:
        raise TypeError("SortedOnRead.popitem: use del or pop, which keep the order")

    def setdefault(self, *_: Any) -> Any:
        raise TypeError("SortedOnRead.setdefault: assign, which keeps the order")

    def __ior__(self, _: Any) -> Any:
        raise TypeError("SortedOnRead |=: use update, which keeps the order")
