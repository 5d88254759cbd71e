"""Version chains: a key's values by position, which key-value engines keep for views.

A materialized view (:mod:`rubberband.views`) must be readable exactly as of a position
in the total order, but its maintainer writes it *after* the base writes it reflects.  So
a view row is not one value but a *chain*: the row's value at each base position that
changed it, and a floor below which the chain no longer answers::

    [floor, [p1, value1], [p2], [p3, value3], ...]     # [p] = absent from p on

An engine that holds views implements the ``version`` operation with :func:`merge` (the
memory and Memcached engines do); it merges entries into chains:

    ("version", ((key, [position, value] | [position]), ...), floor[, low])

Merging is idempotent and order-free: an entry at a position the chain already has is
the same entry (a view's rows at a base position are a function of the base history, so
two maintainers compute the same ones), an entry below the chain's floor is history the
chain gave up, and the floor only rises.  So a maintainer that restarts, or a stale one
still running beside its replacement, can never corrupt a chain, only repeat it.

Raising the floor drops the versions no reader can ask for any more: every version
below the floor except the newest one at or below it (the value *at* the floor).  A
chain also raises its own floor to keep at most :data:`MAX_ENTRIES` versions.

**Reclaiming.** A row that left its view keeps its chain, ending in an absence; a view
over a field that keeps changing would keep one for every (field, key) pair there ever
was.  ``("reclaim", keys, upto)`` drops the keys whose chain has been absent since
``upto`` or before (:func:`dead_by`).  Two rules make the drop safe (``docs/views.md``,
"Reclaiming dead rows"):

* *Readers never look below it*: its maintainer names an ``upto`` no higher than a floor
  it has published, stable, and writes ``upto`` first as the view's reclaim floor (the
  floor of a chain of its own, which only rises: no stale maintainer can lower it);
  every read takes that as a floor of the view.
* *No writer brings it back*: a stale maintainer (paused, partitioned) could write a
  version from before the absence into the dropped key, and the row would be back.  So
  a storage process refuses, whole, a ``version`` write that holds a position more than
  :data:`WINDOW` below the position at which it is delivered (:func:`too_old`), and the
  maintainer names an ``upto`` at least ``WINDOW`` below a progress it has written.  A
  version that could bring a dropped row back is older than that, so refused.  ``low``
  is the oldest position among the maintainer's writes not yet known applied, this one
  included: a write refused leaves every later one of the same maintainer refused too,
  so no progress is ever taken without its rows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from ecast.core import mutations
from rubberband.errors import BadOperation
from rubberband.keys import encode_key

STALE_VERSIONS_TAKEN = mutations.declare(
    "stale_versions_taken", "storage",
    "a version write delivered far behind the positions it holds is applied, not refused",
)  # fmt: skip

MAX_ENTRIES = 1_000
"""Versions one chain keeps at most: beyond, its floor rises to its 1,000th newest (as
every replica does alike, and a raised floor never makes an answer wrong, only refuses
older positions).  A row changed that often within the view's retention is read at
recent positions only."""


_POSITION = itemgetter(0)

WINDOW = 1 << 23
"""Positions a ``version`` write may lag behind the position it is delivered at: older,
it is refused (:func:`too_old`).  8,388,608 messages: about five minutes at 30,000
messages a second, hours at a light load.  A maintainer that far behind starts over from
a new snapshot (its feed would be compacted first at the default retention); a view's
start must write its rows within it (a backfill of ten million rows at 50,000 rows a
second does, beside 30,000 other messages a second).  Dead rows are dropped only this
far behind their maintainer's progress, so it also bounds how long they stay."""


VIEW = "~view"
"""The first element of every key of a view's rows and progress (``("~view", name,
...)``, :mod:`rubberband.views.define`)."""

PLAIN_WRITES = frozenset({"put", "append", "add", "delete"})
"""The key-value writes of single keys, which may not name a key of a view's."""


def refuse_view_keys(op: Any) -> None:
    """:class:`BadOperation` for a plain write (``put``, ``append``, ``add``, ``delete``)
    of a key of a view's, ``("~view", ...)``.  Those hold version chains, written by
    their maintainers alone (``version``, ``reclaim``) and dropped with their view (a
    range delete): a chain overwritten by a plain value refused every later row the
    maintainer wrote there, and the view's loop started over every second, with every
    view that shares its feed.  Any other operation passes."""
    if (
        type(op) not in (tuple, list)
        or len(op) < 2
        or type(op[0]) is not str
        or op[0] not in PLAIN_WRITES
    ):
        return
    for item in op[1]:
        key = item if op[0] == "delete" else item[0]
        if type(key) is tuple and key and key[0] == VIEW:
            raise BadOperation(
                f"{op[0]} of {key!r:.60}: keys ({VIEW!r}, ...) hold views' rows, written "
                "by their maintainers alone"
            )


VIEW_KEYS: tuple[tuple[Any, Any]] = ((encode_key((VIEW,)), encode_key((VIEW + "\x00",))),)
"""The range set every key ``(VIEW, ...)`` encodes inside, and no other key does: what
a client's ``delete_range`` leaves alone (``rubberband.applying``)."""

CATALOG = "~views"
"""The first element of every key of views' definitions (``("~views", name)``,
:mod:`rubberband.views.define`): written by maintainers alone, like the rows."""

CATALOG_KEYS: tuple[tuple[Any, Any]] = ((encode_key((CATALOG,)), encode_key((CATALOG + "\x00",))),)
"""The range set every key ``(CATALOG, ...)`` encodes inside, and no other key does."""

MAINTAINED_KEYS: tuple[tuple[Any, Any], ...] = (*VIEW_KEYS, *CATALOG_KEYS)
"""Views' rows and definitions: the keys only maintainers write (``VIEW_KEYS`` sorts
first: its end, ``VIEW`` and a NUL, comes before ``CATALOG``)."""


def names_catalog(op: Any) -> bool:
    """Does plain write ``op`` (``put``, ``append``, ``add``, ``delete``) name a key of
    the catalog, ``(CATALOG, ...)``?  False for any other operation, or a malformed
    one (which the engine refuses on its own)."""
    if type(op) is not tuple or len(op) < 2:  # (an engine may take more elements)
        return False
    items = op[1]
    if op[0] == "put" and type(items) is tuple and len(items) == 1:  # most writes
        pair = items[0]
        if type(pair) is tuple and len(pair) == 2:
            key = pair[0]
            return type(key) is tuple and bool(key) and key[0] == CATALOG
    if op[0] not in PLAIN_WRITES or (type(items) is not tuple and type(items) is not list):
        return False
    keyed = op[0] != "delete"
    for item in items:
        key = item[0] if keyed and type(item) in (tuple, list) and item else item
        if type(key) is tuple and key and key[0] == CATALOG:
            return True
    return False


def is_version_op(op: Any) -> bool:
    """Is ``op`` a write of a view's rows (``version`` or ``reclaim``)?"""
    return type(op) is tuple and len(op) in (3, 4) and op[0] in _ROWS_OPS


_ROWS_OPS = frozenset({"version", "reclaim"})


def check_reclaim_op(op: Any) -> tuple[list[Any], int]:
    """A ``reclaim`` operation's keys and position, or :class:`BadOperation`::

        ("reclaim", (key, ...), upto)

    drops each key whose chain's newest version is an absence at or before ``upto``
    (:func:`dead_by`); a key that holds anything else is left as it is."""
    if len(op) != 3 or type(op[2]) is not int or op[2] < 0:
        raise BadOperation("reclaim takes keys and a position (an int >= 0)")
    if type(op[1]) not in (list, tuple):
        raise BadOperation("reclaim takes a list of keys")
    return list(op[1]), op[2]


def dead_by(chain: Any, upto: int) -> bool:
    """Is ``chain`` a version chain whose key has been absent since a position at or
    before ``upto``?  Its maintainer drops such a chain once no reader can ask for a
    position before that absence (:mod:`rubberband.views.maintain`, "Reclaiming")."""
    return is_chain(chain) and len(chain) > 1 and len(chain[-1]) == 1 and chain[-1][0] <= upto


def check_version_op(op: Any) -> tuple[Sequence[Sequence[Any]], int]:
    """A ``version`` operation's (key, entry) pairs, as the operation holds them (a
    merge copies what it keeps), and its floor; or :class:`BadOperation`.  Checked in
    place: a view's rows come 500 to a message at every replica, and a new list of new
    pairs cost a row 0.18 µs where the checks alone cost 0.09."""
    if len(op) not in (3, 4) or type(op[2]) is not int or op[2] < 0:
        raise BadOperation("version takes (key, entry) pairs and a floor position (an int >= 0)")
    if len(op) == 4 and (type(op[3]) is not int or op[3] < 0):
        raise BadOperation("a version's low position is an int >= 0")
    pairs = op[1]
    if type(pairs) is not tuple and type(pairs) is not list:
        raise BadOperation("version takes (key, entry) pairs")
    for pair in pairs:
        if (type(pair) is not tuple and type(pair) is not list) or len(pair) != 2:
            raise BadOperation("version takes (key, entry) pairs")
        entry = pair[1]
        if (type(entry) is not tuple and type(entry) is not list) or len(entry) not in (1, 2):
            raise BadOperation(
                f"a version entry is [position] or [position, value], not {entry!r:.60}"
            )
        if type(entry[0]) is not int or entry[0] < 0:
            raise BadOperation(f"a version's position is an int >= 0, not {entry[0]!r:.40}")
    return pairs, op[2]


def too_old(op: Any, t: int) -> str | None:
    """Why a storage process refuses ``op``, a write delivered at position ``t``, or
    None: a ``version`` write holding a position (or a ``low``) more than
    :data:`WINDOW` below ``t``.  A malformed op is left to the engine, which refuses it
    as such."""
    if type(op) is not tuple or not op or op[0] != "version":
        return None
    try:
        low = min(entry[0] for _key, entry in op[1])
        if len(op) == 4:
            low = min(low, op[3])
        if low < t - WINDOW and not mutations.on(STALE_VERSIONS_TAKEN):
            return (
                f"version write holds position {low}, more than {WINDOW:,} positions "
                f"below {t}, where it was delivered: its maintainer is too far behind "
                "(it starts over from a new snapshot)"
            )
    except (TypeError, ValueError, LookupError):
        return None
    return None


def is_chain(value: Any) -> bool:
    return (
        type(value) in (list, tuple)
        and len(value) >= 1
        and type(value[0]) is int
        and all(type(e) in (list, tuple) and len(e) in (1, 2) for e in value[1:])
    )


def merge(chain: Any, entries: list[list[Any]], floor: int, key: Any = None) -> list[Any]:
    """``chain`` (None: a new one) with ``entries`` merged and its floor raised to
    ``floor``; :class:`BadOperation` if ``chain`` is a value of another kind.

    A hot row (an aggregate's group) gains a version with nearly every base write and
    keeps a retention's worth of them, hundreds: a merge costs a copy of the chain's
    references (the stored chain is never changed in place: a read may be answering
    with it) and a search only for an entry that does not come after the newest, so a
    write no longer costs a pass over every version in Python."""
    try:
        return _merge(chain, entries, floor)
    except (TypeError, LookupError, AttributeError, ValueError, ArithmeticError):
        # A list that only looks like a chain (a client may write any value anywhere).
        raise BadOperation(
            f"version of {key!r:.60}, which holds a {type(chain).__name__} that is no version chain"
        ) from None


def _merge(chain: Any, entries: list[list[Any]], floor: int) -> list[Any]:
    if chain is None and len(entries) == 1:
        # A new row's one version (most of a view's rows): what the road below makes of
        # it, a version below the floor kept as the one the floor reads.
        return [floor, list(entries[0])]
    if chain is None:  # new: absent before its first version (and the writer's floor)
        low = floor
        for e in entries:  # (a generator under min() was half a new row's merge)
            if e[0] < low:
                low = e[0]
        out: list[Any] = [low]
    elif type(chain) in (list, tuple) and chain and type(chain[0]) is int:
        out = list(chain)
        if len(out) > 1 and type(out[1]) is not list:  # decoded off the wire: tuples
            out[1:] = [list(e) for e in out[1:]]
        if len(out) > 1 and len(out[-1]) not in (1, 2):
            raise TypeError
    else:
        raise TypeError
    low = out[0]
    for entry in entries:
        p = entry[0]
        if p < low:
            continue  # history the chain gave up
        if len(out) == 1 or p > out[-1][0]:
            out.append(list(entry))  # the usual case: the newest version
            continue
        i = bisect_right(out, p, 1, key=_POSITION)
        if i > 1 and out[i - 1][0] == p:
            continue  # the same version again
        out.insert(i, list(entry))
    if floor > low:
        low = out[0] = floor
        keep = bisect_right(out, low, 1, key=_POSITION) - 1  # the newest at or below it
        if keep > 1:
            del out[1:keep]
    if len(out) - 1 > MAX_ENTRIES:
        del out[1 : len(out) - MAX_ENTRIES]
        out[0] = max(out[0], out[1][0])
    return out


def as_of(chain: Any, position: int) -> tuple[bool, Any]:
    """``(present, value)`` of a chain's key as of ``position``; ``None`` chain: absent.
    Raises :class:`LookupError` (with the floor) below the chain's floor."""
    if chain is None:
        return False, None
    if position < chain[0]:
        raise LookupError(chain[0])
    best = None
    for entry in chain[1:]:
        if entry[0] > position:
            break
        best = entry
    if best is None or len(best) == 1:
        return False, None
    return True, best[1]
