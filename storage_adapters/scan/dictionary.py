"""Dictionary compression of string columns (dissertation 2.9), with order by rank.

Every distinct string of a column gets an integer *code* (code 0 is NULL), so a string
cell costs four bytes and comparing it for equality is comparing integers.  Codes are
handed out in arrival order, so they say nothing about string order; range and prefix
predicates instead use each code's *rank*, its position among the dictionary's strings
in code-point order (the order Python, SQLite's BINARY collation and UTF-8 bytes agree
on).  2.9 keeps an order-preserving dictionary with gaps; ranks kept beside the codes
give the same comparisons without re-coding rows when a string arrives.

Ranks are brought up to date lazily, and incrementally: a few new strings are merged
into the sorted array (O(distinct) vectorized), many are re-sorted.  A predicate constant
maps to a rank *bound* by binary search, so ``x < 'M'`` becomes ``rank(x) <= r`` for the
right ``r`` whether or not ``'M'`` itself is in the dictionary.

The arrays are only ever appended to, or replaced whole, never rewritten in place: a
send cursor (:mod:`.migrate`) that holds the arrays of an earlier moment keeps decoding
its codes correctly while the column goes on growing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_MAX_CHAR = 0x10FFFF


class StringDictionary:
    """The codes of one string column: ``values[code]`` is the string, ``values[0]`` None."""

    __slots__ = ("_ranked", "_sorted", "codes", "n", "rank", "values")

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values = np.empty(64, dtype=object)
        self.values[0] = None
        self.n = 1
        """Codes in use (including 0)."""
        self.rank = np.full(64, -1, dtype=np.int64)
        """``rank[code]`` for ``code < _ranked``; -1 for NULL."""
        self._ranked = 1
        self._sorted = np.zeros(0, dtype=object)
        """The strings of codes ``1.._ranked-1`` in order."""

    def __len__(self) -> int:
        return self.n

    # ---------------------------------------------------------------- codes
    def encode(self, strings: Sequence[str]) -> np.ndarray:
        """Codes of ``strings``, adding the new ones."""
        get = self.codes.get
        out = np.fromiter((get(s, 0) for s in strings), dtype=np.int32, count=len(strings))
        missing = np.flatnonzero(out == 0)
        if len(missing):
            for i in missing.tolist():
                s = strings[i]
                code = get(s, 0)
                if code == 0:
                    code = self._add(s)
                out[i] = code
        return out

    def code(self, s: str) -> int:
        """The code of ``s``, 0 if it is not in the dictionary."""
        return self.codes.get(s, 0)

    def _add(self, s: str) -> int:
        code = self.n
        if code >= len(self.values):
            grown = np.empty(2 * len(self.values), dtype=object)
            grown[:code] = self.values[:code]
            self.values = grown
        self.values[code] = s
        self.codes[s] = code
        self.n = code + 1
        return code

    def decode(self, codes: np.ndarray) -> list[str | None]:
        return self.values.take(codes).tolist()  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- ranks
    def ranks(self) -> np.ndarray:
        """``rank[code]`` for every code in use (a view; valid until the next string)."""
        if self._ranked < self.n:
            self._refresh()
        return self.rank[: self.n]

    def sorted_strings(self) -> np.ndarray:
        if self._ranked < self.n:
            self._refresh()
        return self._sorted

    def _refresh(self) -> None:
        old_n, n = self._ranked, self.n
        if len(self.rank) < n:
            grown = np.full(len(self.values), -1, dtype=np.int64)
            grown[:old_n] = self.rank[:old_n]
            self.rank = grown
        # Python sorts str by code point, NUL included; object arrays keep that order.
        if 4 * (n - old_n) >= old_n:
            everything = self.values[1:n]
            order = np.array(sorted(range(n - 1), key=everything.__getitem__), dtype=np.int64)
            self._sorted = everything[order]
            rank = np.empty(n - 1, dtype=np.int64)
            rank[order] = np.arange(n - 1)
            self.rank[1:n] = rank
        else:
            new = self.values[old_n:n]
            order = np.array(sorted(range(n - old_n), key=new.__getitem__), dtype=np.int64)
            new_sorted = new[order]
            pos = np.searchsorted(self._sorted, new_sorted)  # object needles: str order
            # Old entry i moves up by the number of new strings inserted at or before it.
            shift = np.searchsorted(pos, np.arange(len(self._sorted)), side="right")
            old_rank = self.rank[1:old_n]
            self.rank[1:old_n] = old_rank + shift[old_rank]
            new_rank = np.empty(n - old_n, dtype=np.int64)
            new_rank[order] = pos + np.arange(n - old_n)
            self.rank[old_n:n] = new_rank
            self._sorted = np.insert(self._sorted, pos, new_sorted)
        self._ranked = n

    def settle(self) -> None:
        """Rank a large arrival now (a bulk load), so that the first read to compare this
        column does not pay for the full sort: reads keep a predictable cost."""
        new = self.n - self._ranked
        if new >= 1024 and 4 * new >= self._ranked:
            self._refresh()

    def rank_at_least(self, s: str, strict: bool = False) -> int:
        """The smallest rank of a string ``>= s`` (``> s`` if ``strict``)."""
        side = "right" if strict else "left"
        needle = np.empty((), dtype=object)  # a str would become a NumPy string, NULs lost
        needle[()] = s
        return int(np.searchsorted(self.sorted_strings(), needle, side=side))  # type: ignore[call-overload]

    # ---------------------------------------------------------------- upkeep
    def remapped(self, used: np.ndarray) -> tuple[StringDictionary, np.ndarray]:
        """A dictionary of only the codes in ``used`` (sorted, without 0), and the map
        from old codes to new ones (old codes not in ``used`` map to 0)."""
        fresh = StringDictionary()
        strings = self.values[used].tolist()
        mapping = np.zeros(self.n, dtype=np.int32)
        mapping[used] = fresh.encode(strings)
        return fresh, mapping

    def nbytes(self) -> int:
        return 8 * len(self.values) + 8 * len(self.rank) + 60 * self.n


def prefix_successor(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (None: none)."""
    chars = list(prefix)
    while chars:
        last = ord(chars[-1])
        if last < _MAX_CHAR:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:
                nxt = 0xE000
            chars[-1] = chr(nxt)
            return "".join(chars)
        chars.pop()
    return None
