"""Rubberband keys, their one total order, and half-open key ranges (dissertation 4.2.2).

Rubberband partitions data along a single key domain.  The dissertation's Erlang
implementation could use any term as a key because Erlang orders all terms; Python's ``<``
raises across types, so keys here are first *encoded* into a sort form that Python's own
tuple comparison orders totally, in C:

=========  ======================  =========================================
key        encoded (``EKey``)      notes
=========  ======================  =========================================
``MIN``    ``(-1,)``               minus infinity, below every key
``None``   ``(0,)``
``bool``   ``(1, b)``              ``False < True``; never equal to 0 or 1
``int``    ``(2, n)``              ints and floats share a rank and compare
``float``  ``(2, x)``              by value: ``1`` and ``1.0`` are one key;
                                   NaN is refused
``str``    ``(3, s)``              code point order
``bytes``  ``(4, b)``
``tuple``  ``(5, (e1, e2, ...))``  element-wise, a prefix first
``MAX``    ``(9,)``                plus infinity, above every key
=========  ======================  =========================================

The encoded form is what travels in message headers and what routers compare: a router
never decodes a key (it only bisects encoded keys), and msgpack keeps tuples as arrays, so
an encoded key survives the wire unchanged (decoded with ``use_list=False``).

A *range* is a half-open interval ``(lo, hi)`` of encoded keys with ``lo < hi``; a point
key ``k`` is the range ``(k, after(k))``: no valid encoded key lies strictly between ``k``
and ``after(k)``.  A *range set* is a tuple of ranges in ascending order, disjoint and
never touching (``normalize`` merges adjacent ranges), so equal sets are equal tuples.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from bisect import bisect_right
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

import msgpack

from rubberband.errors import BadKey

Key = Any
"""``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, or a tuple of keys."""
EKey = tuple[Any, ...]
"""An encoded key (see the module docstring)."""
Range = tuple[EKey, EKey]
RangeSet = tuple[Range, ...]

MIN_EKEY: EKey = (-1,)
MAX_EKEY: EKey = (9,)
_NONE = (0,)
MAX_TUPLE_DEPTH = 8
MAX_INT = 2**64 - 1
MIN_INT = -(2**63)
"""msgpack's integer range: a key must survive the wire."""


class _Infinity:
    __slots__ = ("_e", "_name")

    def __init__(self, name: str, e: EKey) -> None:
        self._name = name
        self._e = e

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name


MIN = _Infinity("MIN", MIN_EKEY)
"""Minus infinity: the lower bound of the whole keyspace."""
MAX = _Infinity("MAX", MAX_EKEY)
"""Plus infinity: the (exclusive) upper bound of the whole keyspace."""

EVERYTHING: RangeSet = ((MIN_EKEY, MAX_EKEY),)
NOTHING: RangeSet = ()


# ------------------------------------------------------------------ encoding
def encode_key(key: Key, _depth: int = 0) -> EKey:
    """The sort form of ``key``; raises :class:`BadKey` for anything that is not a key."""
    t = type(key)
    if t is str:
        return (3, key)
    if t is int:
        if not MIN_INT <= key <= MAX_INT:
            raise BadKey(f"integer key {key} outside the 64-bit range msgpack carries")
        return (2, key)
    if t is tuple:
        if _depth >= MAX_TUPLE_DEPTH:
            raise BadKey(f"tuple keys nest at most {MAX_TUPLE_DEPTH} deep")
        # Strings and integers inline: a view row's key, ("~view", name, k), is encoded
        # several times a row by a maintainer, and a call per element was most of it.
        out = []
        for k in key:
            tk = type(k)
            if tk is str:
                out.append((3, k))
            elif tk is int and MIN_INT <= k <= MAX_INT:
                out.append((2, k))
            else:
                out.append(encode_key(k, _depth + 1))
        return (5, tuple(out))
    if t is bytes:
        return (4, key)
    if key is None:
        return _NONE
    if t is bool:
        return (1, key)
    if t is float:
        if math.isnan(key):
            raise BadKey("NaN is not a key: it is not ordered")
        return (2, key)
    if key is MIN or key is MAX:
        return key._e  # type: ignore[no-any-return]
    raise BadKey(
        f"{t.__name__} is not a key type (use None, bool, int, float, str, bytes or tuples)"
    )


_BY_THEMSELVES = (frozenset({int, float}), frozenset({str}), frozenset({bytes}))
"""Sets of key types whose keys sort by themselves as their sort forms do: one rank of
:func:`encode_key` each, ordered within it as Python orders them (a bool is a rank of
its own, and no key is NaN)."""


def sort_pairs(pairs: list[tuple[Any, Any]]) -> None:
    """Sort ``(key, value)`` pairs in place by key order.  Keys all of one plain type
    sort by themselves: a client combining a scan of a million rows spent a second
    making each key's sort form."""
    kinds = {type(p[0]) for p in pairs}
    if any(kinds <= same for same in _BY_THEMSELVES):
        pairs.sort(key=itemgetter(0))
    else:
        pairs.sort(key=lambda p: encode_key(p[0]))


# ------------------------------------------------------------------ flat sort forms
END = -2
"""Ends a tuple in a flat sort form: below every rank, so a tuple sorts before the
tuples it is a prefix of."""


def sort_key(key: Key) -> EKey:
    """A flat sort form of ``key``: ordered as :func:`encode_key`'s, equal where it is
    equal, checked alike (raises :class:`BadKey`), but one tuple of scalars, a tuple key
    spelled out as its rank, its elements' flat forms and :data:`END`.

    An ordered map of keys compares them on every insert: nested tuples compare level by
    level, and a key like ``("~view", name, (group, key))`` (a view row) cost a
    microsecond per comparison where its flat form costs a tenth of that, and is built
    several times faster.  Scalars' encoded forms are flat already and are their own
    sort form: ``sort_key(5) == encode_key(5)``."""
    t = type(key)
    if t is int:
        if not MIN_INT <= key <= MAX_INT:
            raise BadKey(f"integer key {key} outside the 64-bit range msgpack carries")
        return (2, key)
    if t is str:
        return (3, key)
    if t is tuple:
        if len(key) == 3 and type(key[0]) is str and type(key[1]) is str:
            got = _named(key)
            if got is not None:
                return got
        out: list[Any] = [5]
        _spell(key, out, 0)
        return tuple(out)
    return encode_key(key)


_PREFIXES: dict[str, dict[str, tuple[Any, ...]]] = {}
"""The flat forms' starts ``(5, 3, a, 3, b)`` of keys ``(a, b, ...)``, both strings
shared (:data:`_SHARED`), :data:`SHARED_STRINGS` of them at most."""
_PREFIXED = [0]


def _named(key: tuple[Any, ...]) -> EKey | None:
    """:func:`sort_key` of a key ``(str, str, k)`` with ``k`` an int, a string or a
    flat tuple of those (a view's row, a table's), or None for :func:`_spell`: the two
    names' start is built once, and a storage process makes a view row's form, as it
    applies the row at each replica, in half the time."""
    a, b, k = key
    inner = _PREFIXES.get(a)
    start = inner.get(b) if inner is not None else None
    if start is None:
        start = (5, 3, _shared(a), 3, _shared(b))
        shared = start[2] is _SHARED.get(a) is not None and start[4] is _SHARED.get(b)
        if shared and _PREFIXED[0] < SHARED_STRINGS:
            _PREFIXES.setdefault(start[2], {})[start[4]] = start
            _PREFIXED[0] += 1
    t = type(k)
    if t is int:
        return (*start, 2, k, END) if MIN_INT <= k <= MAX_INT else None
    if t is str:
        return (*start, 3, k, END)
    if t is not tuple:
        return None
    out = [*start, 5]
    last = k[-1] if k else None
    for e in k:
        te = type(e)
        if te is int and MIN_INT <= e <= MAX_INT:
            out += (2, e)
        elif te is str:
            out += (3, e if e is last else _shared(e))
        else:
            return None  # (the general road spells it, or says why it is no key)
    out += (END, END)
    return tuple(out)


SHARED_STRINGS = 4096
"""Distinct prefix strings kept for sharing, at most (each at most 64 characters): the
names and frequent values a store's keys start with.  Bounded, unlike the interpreter's
interned strings (never freed on some Pythons): a field of many values, once the table
is full, is compared by value as before."""
_SHARED: dict[str, str] = {}


def _shared(s: str) -> str:
    got = _SHARED.get(s)
    if got is not None:
        return got
    if len(_SHARED) < SHARED_STRINGS and len(s) <= 64:
        _SHARED[s] = s
    return s


def _spell(key: tuple[Any, ...], out: list[Any], depth: int) -> None:
    """``key``'s elements spelled into ``out``.  A short string that is not a tuple's
    last element (a view's or a table's name, an index's secondary key: a prefix many
    keys share) is replaced by the first equal one seen (:func:`_shared`): equal
    prefixes then compare by identity, and an ordered map's insert of a view row took a
    third less."""
    if depth >= MAX_TUPLE_DEPTH:
        raise BadKey(f"tuple keys nest at most {MAX_TUPLE_DEPTH} deep")
    last = key[-1] if key else None
    append = out.append  # (two appends cost less than extending by a new pair)
    for k in key:
        t = type(k)
        if t is str:
            append(3)
            append(k if k is last else _shared(k))  # (the last itself: never shared)
        elif t is int:
            if not MIN_INT <= k <= MAX_INT:
                raise BadKey(f"integer key {k} outside the 64-bit range msgpack carries")
            append(2)
            append(k)
        elif t is tuple:
            append(5)
            _spell(k, out, depth + 1)
        else:
            out += encode_key(k)
    append(END)


def sort_bound(ekey: EKey) -> EKey:
    """The flat sort form of an encoded key or of a bound ``after(k)`` (a range's end):
    ``sort_bound(encode_key(k)) == sort_key(k)``, and bounds compare with sort forms as
    they compare with encoded keys."""
    if ekey[0] != 5 or len(ekey) < 2:
        return ekey  # a scalar's form (or its after) is flat already
    out: list[Any] = [5]
    _flatten(ekey[1], out)
    out += ekey[2:]
    return tuple(out)


def _flatten(elements: tuple[EKey, ...], out: list[Any]) -> None:
    for e in elements:
        if e[0] == 5:
            out.append(5)
            _flatten(e[1], out)
        else:
            out += e
    out.append(END)


def json_key(value: Any, _depth: int = 0) -> Key:
    """A key as JSON gives it (the admin API's, a command line's): its arrays as tuples,
    since JSON has no tuple and a list is no key, so that an operator can name a key
    among a view's rows, ``("~view", name, ...)``; anything else as it is
    (:func:`encode_key` judges it)."""
    if type(value) is list:
        if _depth >= MAX_TUPLE_DEPTH:
            raise BadKey(f"tuple keys nest at most {MAX_TUPLE_DEPTH} deep")
        return tuple(json_key(v, _depth + 1) for v in value)
    return value


def text_key(text: str) -> Key:
    """A key as a command line gives it: an integer if it reads as one, a tuple if it
    reads as a JSON array (:func:`json_key`: ``'["~view", "by_city", ["M"]]'``, a place
    among a view's rows), else the text itself."""
    try:
        return int(text)
    except ValueError:
        pass
    if text.startswith("["):
        try:
            return json_key(json.loads(text))
        except json.JSONDecodeError:
            pass
        except RecursionError:  # (nested deeper than the JSON decoder goes)
            raise BadKey(f"tuple keys nest at most {MAX_TUPLE_DEPTH} deep") from None
    return text


def decode_key(ekey: EKey) -> Key:
    rank = ekey[0]
    if rank == 2 or rank == 3 or rank == 4 or rank == 1:
        return ekey[1]
    if rank == 0:
        return None
    if rank == 5:
        return tuple(decode_key(e) for e in ekey[1])
    if rank == -1:
        return MIN
    if rank == 9:
        return MAX
    raise BadKey(f"not an encoded key: {ekey!r:.60}")


def is_ekey(value: Any, _depth: int = 0) -> bool:
    """Whether ``value`` (e.g. decoded off the wire) is a well-formed encoded key."""
    if type(value) is not tuple or not value:
        return False
    rank = value[0]
    if type(rank) is not int:
        return False
    n = len(value)
    if n == 1:
        return rank in (-1, 0, 9)
    if n != 2:
        return False
    v = value[1]
    if rank == 2:
        return (type(v) is int and MIN_INT <= v <= MAX_INT) or (
            type(v) is float and not math.isnan(v)
        )
    if rank == 3:
        return type(v) is str
    if rank == 4:
        return type(v) is bytes
    if rank == 1:
        return type(v) is bool
    if rank == 5:
        return (
            _depth < MAX_TUPLE_DEPTH and type(v) is tuple and all(is_ekey(e, _depth + 1) for e in v)
        )
    return False


def is_key_quick(value: Any) -> bool:
    """:func:`is_ekey`, with an integer's or a string's key checked inline: a write of one
    key names it alone (``H.KEY``), checked by the routers and each holder."""
    if type(value) is tuple and len(value) == 2:
        rank, v = value
        if rank == 2 and type(rank) is int and type(v) is int:
            return MIN_INT <= v <= MAX_INT
        if rank == 3 and type(rank) is int:
            return type(v) is str
    return is_ekey(value)


def is_bound(value: Any) -> bool:
    """An encoded key, or the exclusive bound ``after(k)`` of one."""
    if type(value) is tuple and len(value) >= 2 and value[-1] == 0 and type(value[-1]) is int:
        head = value[:-1]
        if is_ekey(head) and len(head) <= 2:
            return True
    return is_ekey(value)


def after(ekey: EKey) -> EKey:
    """The smallest bound above ``ekey``: ``(ekey, after(ekey))`` holds ``ekey`` alone."""
    return (*ekey, 0)


AFTER_TAIL = (0,)
"""``ekey + AFTER_TAIL == after(ekey)``, inline where a write of one key is handled once
a write (the engines' client halves, a write's header, a holder's look-up): a call and
an unpacking cost twice as much."""


def point(key: Key) -> Range:
    e = encode_key(key)
    return (e, (*e, 0))


def points(places: list[EKey]) -> RangeSet:
    """The point ranges of encoded keys ``places`` as :func:`normalize` makes them,
    found in the order of their flat forms.  Distinct points never touch (``after(p)``
    is no key), so once sorted and rid of repeats they are a range set as they stand:
    ``normalize`` compared each with its neighbour and sorted them again, nested tuples
    compared level by level, which was half of a view maintainer's header (500 row
    keys a message)."""
    flats = [sort_bound(p) for p in places]
    out: list[Range] = []
    last = None
    for i in sorted(range(len(places)), key=flats.__getitem__):
        flat = flats[i]
        if flat != last:  # (equal flat forms: the same key again)
            last = flat
            p = places[i]
            out.append((p, after(p)))
    return tuple(out)


def with_point(ranges: RangeSet, place: EKey) -> RangeSet:
    """``ranges`` with the point of encoded key ``place`` added: one bisection where
    :func:`normalize` would sort them all again."""
    r = (place, after(place))
    i = bisect_right(ranges, r)
    if (i and place < ranges[i - 1][1]) or (i < len(ranges) and ranges[i][0] == place):
        return ranges  # held already
    return (*ranges[:i], r, *ranges[i:])


def key_range(lo: Key = MIN, hi: Key = MAX) -> Range:
    """``[lo, hi)`` of user keys (``MIN``/``MAX`` for open ends); empty ranges are refused."""
    a, b = encode_key(lo), encode_key(hi)
    if not a < b:
        raise BadKey(f"empty range [{lo!r}, {hi!r})")
    return (a, b)


def stable_hash32(key: Key) -> int:
    """A 32-bit hash of a key that every process and Python version computes alike
    (never Python's salted ``hash``): hash partitioning (dissertation 5.3)."""
    packer = getattr(_hashing, "packer", None)
    if packer is None:
        packer = _hashing.packer = msgpack.Packer(use_bin_type=True)
    data = packer.pack(_canonical(encode_key(key)))
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big")


_hashing = threading.local()
"""A Packer per thread for :func:`stable_hash32`: ``msgpack.packb`` builds one per call,
which was half the cost of hashing a key (clients hash every key they read or write)."""


def _canonical(ekey: EKey) -> EKey:
    """Equal keys, one byte form: an integral float hashes as the int it equals."""
    rank = ekey[0]
    if rank == 2 and type(ekey[1]) is float and ekey[1].is_integer():
        n = int(ekey[1])
        if MIN_INT <= n <= MAX_INT:
            return (2, n)
    if rank == 5:
        return (5, tuple(_canonical(e) for e in ekey[1]))
    return ekey


# ------------------------------------------------------------------ range sets
def normalize(ranges: Iterable[Range]) -> RangeSet:
    """Sorted, disjoint, non-touching; empty ranges dropped."""
    rs = sorted(r for r in ranges if r[0] < r[1])
    if len(rs) <= 1:
        return tuple(rs)
    out: list[Range] = []
    lo, hi = rs[0]
    for a, b in rs[1:]:
        if a <= hi:
            if b > hi:
                hi = b
        else:
            out.append((lo, hi))
            lo, hi = a, b
    out.append((lo, hi))
    return tuple(out)


def union(a: RangeSet, b: RangeSet) -> RangeSet:
    if not a:
        return b
    if not b:
        return a
    return normalize((*a, *b))


class Bounds:
    """A normalized range set's lower and upper bounds, apart: the one range that may
    hold a given bound is found by one bisection of plain bounds."""

    __slots__ = ("his", "los", "ranges")

    def __init__(self, ranges: RangeSet) -> None:
        self.ranges = ranges
        self.los = [lo for lo, _ in ranges]
        self.his = [hi for _, hi in ranges]


def intersect(a: RangeSet, b: RangeSet) -> RangeSet:
    """Both normalized; a linear merge.  One range of ``a`` inside one of ``b`` (a
    storage process intersecting a one-key operation with what it owns, for every
    delivery) is found by bisection and answered with ``a`` itself."""
    if len(a) == 1 and b:
        lo, hi = a[0]
        i = bisect_right(b, (lo,))  # b[i - 1] starts below lo, b[i] at lo or above
        for j in (i - 1, i):
            if 0 <= j < len(b) and b[j][0] <= lo and hi <= b[j][1]:
                return a
    out: list[Range] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = a[i][0] if a[i][0] > b[j][0] else b[j][0]
        hi = a[i][1] if a[i][1] < b[j][1] else b[j][1]
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def clip(rng: Range, rs: RangeSet) -> RangeSet:
    """``intersect((rng,), rs)`` by bisection: what ``rs`` holds of one range, without
    walking all of ``rs`` (a storage process clips each read of a bundle, up to 32, to
    each piece it holds of the bundle, which may itself be many ranges)."""
    lo, hi = rng
    if not lo < hi:
        return ()
    i = bisect_right(rs, (lo,))
    if i:
        i -= 1  # the range starting before lo may reach past it
    out: list[Range] = []
    n = len(rs)
    while i < n:
        a, b = rs[i]
        if a >= hi:
            break
        if b > lo:
            out.append((a if a > lo else lo, b if b < hi else hi))
        i += 1
    return tuple(out)


def difference(a: RangeSet, b: RangeSet) -> RangeSet:
    """``a`` minus ``b`` (both normalized)."""
    out: list[Range] = []
    j = 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            blo, bhi = b[k]
            if blo > cur:
                out.append((cur, blo))
            if bhi > cur:
                cur = bhi
            if cur >= hi:
                break
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return tuple(out)


_TOP: EKey = (*MAX_EKEY, 1)
"""Above every bound: ``(x, _TOP)`` sorts after every range that starts at ``x``."""


_FEW = 4
"""A range set of at most this many ranges is checked against a longer one by bisection
(a storage process's queue holds the points of thousands of waiting writes, and each
delivery is checked against them)."""


def covers(a: RangeSet, b: RangeSet) -> bool:
    """Whether ``a`` contains all of ``b``."""
    if len(b) <= _FEW < len(a):
        return all(_covers_one(a, lo, hi) for lo, hi in b)
    return not difference(b, a)


def _covers_one(rs: RangeSet, lo: EKey, hi: EKey) -> bool:
    """Whether ``rs`` (normalized: no two ranges touch) contains ``[lo, hi)``."""
    if not lo < hi:
        return True
    i = bisect_right(rs, (lo, _TOP)) - 1
    return i >= 0 and hi <= rs[i][1]  # (rs[i] starts at or before lo)


def _overlaps_one(rs: RangeSet, lo: EKey, hi: EKey) -> bool:
    """Whether ``rs`` (normalized) meets ``[lo, hi)``."""
    if not lo < hi:
        return False
    i = bisect_right(rs, (lo, _TOP)) - 1  # the last range starting at or before lo
    if i >= 0 and lo < rs[i][1]:
        return True
    return i + 1 < len(rs) and rs[i + 1][0] < hi


def overlaps(a: RangeSet, b: RangeSet) -> bool:
    if len(a) <= _FEW < len(b):
        return any(_overlaps_one(b, lo, hi) for lo, hi in a)
    if len(b) <= _FEW < len(a):
        return any(_overlaps_one(a, lo, hi) for lo, hi in b)
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] < b[j][1] and b[j][0] < a[i][1]:
            return True
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return False


def contains(rs: RangeSet, ekey: EKey) -> bool:
    i = bisect_right(rs, (ekey, _TOP)) - 1
    return i >= 0 and rs[i][0] <= ekey < rs[i][1]


def is_range_set(value: Any, limit: int = 4096) -> bool:
    """Whether a value off the wire is a normalized range set of at most ``limit`` ranges."""
    if type(value) is not tuple or len(value) > limit:
        return False
    if len(value) == 1:
        # A single key, ``[k, after(k))``: most writes and reads, checked at every
        # storage process that applies them.  ``hi`` is ``lo`` with a 0 appended, so
        # ``lo < hi`` holds and ``hi`` is a bound once ``lo`` is a key; anything else
        # takes the general loop below.
        r = value[0]
        if type(r) is tuple and len(r) == 2:
            lo, hi = r
            if (
                type(lo) is tuple
                and type(hi) is tuple
                and len(lo) == 2
                and len(hi) == 3
                and hi[2] == 0
                and type(hi[2]) is int
                and hi[0] == lo[0]
                and type(hi[0]) is int
                and hi[1] == lo[1]
                and type(hi[1]) is type(lo[1])
            ):
                # An integer or a string key is checked here, any other by is_ekey.
                rank, v = lo
                if type(rank) is int and (
                    (rank == 2 and type(v) is int and MIN_INT <= v <= MAX_INT)
                    or (rank == 3 and type(v) is str)
                    or is_ekey(lo)
                ):
                    return True
    prev = None
    for r in value:
        if type(r) is not tuple or len(r) != 2:
            return False
        lo, hi = r
        if not (is_bound(lo) and is_bound(hi)) or not lo < hi:
            return False
        if prev is not None and not prev < lo:
            return False
        prev = hi
    return True


def describe(rs: RangeSet) -> str:
    """For people: ``[a, b) | [c, MAX)``."""
    if not rs:
        return "(empty)"

    def show(e: EKey) -> str:
        if len(e) == 3 or (len(e) == 2 and e[0] in (-1, 0, 9)):
            return f"{decode_key(e[:-1])!r}+"
        return repr(decode_key(e))

    return " | ".join(f"[{show(lo)}, {show(hi)})" for lo, hi in rs)
