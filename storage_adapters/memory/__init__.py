"""An in-memory, ordered key-value engine: the engine behind Rubberband's key-value SDK.

Values are anything msgpack carries; a key is any Rubberband key.  Items are kept in a
map walked in order of *placement* (the key under range partitioning, its 32-bit hash
under hash partitioning, dissertation 5.3) and then by key, so a range of placement
space is one slice of the map whatever the partitioning.  The map
(:class:`~storage_adapters.leafmap.LeafMap`) is a dict whose new keys are sorted into
place in bulk when next read, not one by one as they come.  Its keys are flat sort
forms (:func:`rubberband.keys.sort_key`), not nested encoded keys: ordering compares
each new key with a dozen others, and a view row's nested key made that most of a
write's cost.

Operations (tuples, as they travel in payloads):

=======================================  ==============================================
operation                                meaning
=======================================  ==============================================
``("put", ((key, value), ...))``         set every key, atomically (one message)
``("append", ((key, value), ...))``      append ``value`` to each key's list
``("add", ((key, delta), ...))``         add integer ``delta`` to each key's number
``("delete", (key, ...))``               remove the keys
``("delete_range", lo, hi)``             remove ``[lo, hi)`` (range partitioning only)
``("version", ((key, entry), ...), f)``  merge version entries into each key's chain
                                         and raise its floor to ``f`` (views:
                                         :mod:`rubberband.versions`)
``("get", (key, ...))``                  ``{key: value}`` of the keys present
``("scan", lo, hi)``                     ``[(key, value), ...]`` of ``[lo, hi)`` in order
=======================================  ==============================================

A value is at most :data:`MAX_VALUE_BYTES` once msgpack-encoded, on every key-value
engine: a larger one is refused at the call (:meth:`KVOps.part_fun`), never acknowledged
and then dropped by an engine that cannot hold it.

Writes return None; a read returns what it found *inside the ranges it was given*, so a
client combines the answers of several replicas without double counting
(:meth:`KVOps.combine`).  ``append`` to a key that holds a non-list is a
:class:`BadOperation`, decided the same way at every replica.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import msgpack

from rubberband.engine import (
    AFTER_TAIL,
    INVALID,
    MAX_EKEY,
    MAX_INT,
    MIN_EKEY,
    MIN_INT,
    ROWS,
    BadKey,
    BadOperation,
    Change,
    EKey,
    Part,
    Placement,
    RangeSet,
    ReportsChanges,
    after,
    check_reclaim_op,
    check_version_op,
    contains,
    dead_by,
    encode_key,
    merge,
    normalize,
    points,
    refuse_row_key,
    refuse_view_keys,
    rejection,
    sort_bound,
    sort_key,
    sort_pairs,
)
from storage_adapters.leafmap import LeafMap

WRITES = frozenset({"put", "append", "add", "delete", "delete_range", "version", "reclaim"})
READS = frozenset({"get", "scan"})
_NAMES = WRITES | READS


def is_read(op: Any) -> bool:
    """Whether ``op`` is a key-value read (``get`` or ``scan``): :meth:`Engine.is_read`
    of every engine of these operations."""
    return type(op) in (tuple, list) and len(op) > 1 and type(op[0]) is str and op[0] in READS


_new = tuple.__new__  # ``_new(Part, (kind, ranges))``: a NamedTuple without its __new__
MAX_KEYS = 100_000
"""Keys one operation may name."""
MAX_VALUE_BYTES = 1 << 20
"""The largest value a key-value write carries, msgpack-encoded (as Memcached's default
item and etcd's request limit, about a megabyte).  Checked by the client, so every
engine that holds key-value data must hold any value up to it (the Memcached engine
starts its server so, and refuses a server of one's own that cannot)."""
SIZE_SAMPLE = 64
"""Items whose encoded size :meth:`MemoryEngine.stats` measures to estimate the bytes
held: counting every put's size would cost the write path, which reports never need."""
_PLAIN = (int, float, bool, type(None))
_ENCODED_BOUND = {bytes: 1, str: 4}
"""Bytes per ``len`` a value of these types takes at most, encoded (UTF-8: 4 per code
point), so that the common value is checked without encoding it."""


def check_value(key: Any, value: Any) -> None:
    """Raise :class:`BadOperation` when ``value`` is over :data:`MAX_VALUE_BYTES` or is
    nothing msgpack can carry."""
    t = type(value)
    if t in _PLAIN:
        return
    per = _ENCODED_BOUND.get(t)
    if per is not None and len(value) * per <= MAX_VALUE_BYTES - 5:  # 5: the header
        return
    try:
        size = len(msgpack.packb(value, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as e:
        raise BadOperation(f"the value of {key!r:.60} cannot be stored: {e}") from None
    if size > MAX_VALUE_BYTES:
        raise BadOperation(
            f"the value of {key!r:.60} is {size:,} bytes encoded: over the key-value limit "
            f"of {MAX_VALUE_BYTES:,} bytes"
        )


def _bound(key: Any) -> EKey:
    if key is None:
        return MIN_EKEY
    return encode_key(key)


class KVOps:
    """The client half: what an operation touches, and how replicas' answers combine."""

    def part_fun(self, op: Any, placement: Placement) -> Part:
        # Made by a client once per operation.  A put of one plain key (most writes)
        # takes a short way; anything it does not take, or finds wrong, takes the general
        # one, which says what is wrong.  The general path cost a put 2 us of the 2.8 its
        # message took to build (py-spy, timeit).
        if type(op) is tuple and len(op) == 2 and op[0] == "put":
            pairs = op[1]
            if type(pairs) in (tuple, list) and len(pairs) == 1:
                pair = pairs[0]
                if type(pair) in (tuple, list) and len(pair) == 2 and type(pair[0]) is not tuple:
                    try:
                        check_value(pair[0], pair[1])
                        e = placement.ekey(pair[0])
                    except (BadKey, BadOperation, TypeError):
                        pass
                    else:
                        return _new(Part, ("write", ((e, e + AFTER_TAIL),)))
        if type(op) not in (tuple, list) or not op or type(op[0]) is not str or op[0] not in _NAMES:
            raise BadOperation(f"not a key-value operation: {op!r:.80}")
        name = op[0]
        kind: Any = "write" if name in WRITES else "read"
        try:
            refuse_view_keys(op)  # (at the call: a put is not answered, so not refused later)
            if name == "version":
                pairs = check_version_op(op)[0]
                if len(pairs) > MAX_KEYS:
                    raise BadOperation(f"version names more than {MAX_KEYS} keys")
                keys = [p[0] for p in pairs]
                for k, entry in pairs:
                    if len(entry) == 2:
                        check_value(k, entry[1])
            elif name == "reclaim":
                keys = check_reclaim_op(op)[0]
                if len(keys) > MAX_KEYS:
                    raise BadOperation(f"reclaim names more than {MAX_KEYS} keys")
            elif name in ("put", "append", "add"):
                pairs = op[1]
                if len(pairs) > MAX_KEYS:
                    raise BadOperation(f"{name} takes (key, value) pairs")
                for p in pairs:
                    if len(p) != 2:
                        raise BadOperation(f"{name} takes (key, value) pairs")
                keys = [p[0] for p in pairs]
                if name != "add":
                    for k, v in pairs:
                        check_value(k, v)
            elif name in ("delete", "get"):
                keys = list(op[1])
                if len(keys) > MAX_KEYS:
                    raise BadOperation(f"{name} names more than {MAX_KEYS} keys")
            else:
                if len(op) != 3 and not (name == "scan" and len(op) == 4):
                    raise BadOperation(f"{name} takes lo and hi")
                if len(op) == 4 and (type(op[3]) is not int or not 0 < op[3] <= MAX_KEYS):
                    raise BadOperation(f"a scan's limit is an int from 1 to {MAX_KEYS}")
                if not placement.ordered:
                    if name == "delete_range":
                        raise BadOperation("delete_range needs range partitioning")
                    return Part(kind, ((MIN_EKEY, MAX_EKEY),))  # every hash bucket
                lo = _bound(op[1])
                hi = MAX_EKEY if op[2] is None else encode_key(op[2])
                if not lo < hi:
                    raise BadOperation(f"empty range [{op[1]!r}, {op[2]!r})")
                return Part(kind, ((lo, hi),))
            places = [placement.ekey(k) for k in keys]
            for k in keys:
                if type(k) is tuple:
                    refuse_row_key(k)
        except BadKey as e:
            raise BadOperation(str(e)) from None
        except TypeError:
            raise BadOperation(f"malformed {name}: {op!r:.80}") from None
        if len(places) == 1:
            p = places[0]
            return _new(Part, (kind, ((p, p + AFTER_TAIL),)))
        if not places:
            raise BadOperation(f"{name} names no key")
        if len(places) > 8:
            return Part(kind, points(places))
        return Part(kind, normalize((p, after(p)) for p in places))

    def combine(self, op: Any, answers: Sequence[Any]) -> Any:
        """One answer from the answers of responders that covered disjoint ranges."""
        if op[0] == "get":
            out: dict[Any, Any] = {}
            for a in answers:
                out.update(a)
            return out
        if op[0] == "scan":
            rows = [row for a in answers for row in a]
            sort_pairs(rows)
            return rows[: op[3]] if len(op) > 3 else rows
        return None

    def answered(self, op: Any) -> bool:
        """Whether a holder must answer the write: an append fails on a non-list (and a
        version on a non-chain)."""
        return bool(op) and op[0] in ("append", "add", "version")

    def restrict(self, result: Any, ranges: RangeSet, placement: Placement) -> Any:
        """The part of a read's answer inside ``ranges`` (placement space)."""
        if type(result) is dict:
            return {k: v for k, v in result.items() if inside(ranges, placement.ekey(k))}
        if type(result) in (list, tuple):
            return [kv for kv in result if inside(ranges, placement.ekey(kv[0]))]
        return result


def within_bounds(op: Any, items: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The items of a scan ``("scan", lo, hi[, limit])`` whose keys are in ``[lo, hi)``
    (the first ``limit`` of them in key order, with a limit).  Under
    hash partitioning a scan's ranges are every bucket (a key range is no placement
    range), so a holder cuts its answer to the scan's own bounds; under range
    partitioning the ranges it is given already are those bounds."""
    lo = _bound(op[1])
    hi = MAX_EKEY if op[2] is None else encode_key(op[2])
    inside = [(ek, kv) for kv in items if lo <= (ek := encode_key(kv[0])) < hi]
    if len(op) > 3:  # a limit: the first keys in key order (the holder's are by hash)
        inside.sort(key=lambda e: e[0])
        del inside[op[3] :]
    return [kv for _ek, kv in inside]


OUTSIDE: Any = object()
"""What :func:`one_put` says of a put of one key that lies outside its operation's part."""


def one_put(one: Sequence[Any]) -> Any:
    """For an item ``(op, ranges[, t])`` of ``apply``: the slot of the key of ``("put",
    ((key, value),))`` under one range (its flat sort form, :func:`sort_key`) when the
    key is an integer msgpack carries or a string and lies in the range;
    :data:`OUTSIDE` when such a key lies outside it; None for anything else."""
    op, ranges = one[0], one[1]
    if type(op) is not tuple or len(op) != 2 or op[0] != "put" or len(ranges) != 1:
        return None
    pairs = op[1]
    if (type(pairs) is not tuple and type(pairs) is not list) or len(pairs) != 1:
        return None
    kv = pairs[0]
    if (type(kv) is not tuple and type(kv) is not list) or len(kv) != 2:
        return None
    key = kv[0]
    if type(key) is str:
        slot: EKey = (3, key)
    elif type(key) is int and MIN_INT <= key <= MAX_INT:
        slot = (2, key)
    else:
        return None
    lo, hi = ranges[0]  # a scalar's bounds are their own sort forms
    if lo[0] == 5:
        lo = sort_bound(lo)
    if hi[0] == 5:
        hi = sort_bound(hi)
    return slot if lo <= slot < hi else OUTSIDE


def inside(ranges: RangeSet, place: EKey) -> bool:
    """Whether ``place`` is in ``ranges``: the operation's part this replica applies."""
    if len(ranges) == 1:  # most writes: a holder's part of a one-key write, or a bundle's
        lo, hi = ranges[0]
        return bool(lo <= place < hi)
    if len(ranges) < 8:
        return any(lo <= place < hi for lo, hi in ranges)
    return contains(ranges, place)  # a many-key write's points: bisection


class _Cursor:
    """A materialized copy: later writes cannot leak into it."""

    def __init__(self, items: list[tuple[Any, Any]]) -> None:
        self._items = items
        self._i = 0

    def next_chunk(self, max_bytes: int) -> Any | None:
        if self._i >= len(self._items):
            return None
        out = []
        size = 0
        while self._i < len(self._items) and (not out or size < max_bytes):
            k, v = self._items[self._i]
            out.append((k, v))
            size += 64 + len(repr(v)) if not isinstance(v, bytes | str) else 64 + len(v)
            self._i += 1
        return out

    def close(self) -> None:
        self._items = []


_POINT_OPS = frozenset({"put", "add", "version", "reclaim", "delete", "get"})
"""Operations on single keys whose cost per key is flat (:meth:`MemoryEngine.point_keys`)."""


class MemoryEngine(ReportsChanges):
    """Ordered key-value data in memory, keyed by (placement, encoded key)."""

    inline_points = True
    """A read or write of a few keys takes microseconds: a batch of them runs on the
    storage process's event loop (:class:`rubberband.engine.Engine`)."""

    is_read = staticmethod(is_read)

    @staticmethod
    def point_keys(op: Any) -> int:
        """The single keys ``op`` reads or writes, each in a few microseconds; -1 for an
        operation that may take longer (a range, an append, which copies its list)."""
        if type(op) is tuple and len(op) >= 2 and op[0] in _POINT_OPS:
            keys = op[1]
            if type(keys) in (tuple, list):
                return len(keys)
        return -1

    def __init__(self, placement: Placement | None = None) -> None:
        self.placement = placement or Placement()
        self._data = LeafMap()
        self.counts = {"writes": 0, "reads": 0, "rejected": 0}
        self._rng = random.Random(1)  # for estimates only: never for what replicas hold

    @property
    def placement(self) -> Placement:
        return self._placement

    @placement.setter
    def placement(self, placement: Placement) -> None:
        """Set by a storage process joining a cluster (its partitioning), before data."""
        self._placement = placement
        self._ordered = placement.ordered

    # ------------------------------------------------------------------ helpers
    def _slot(self, key: Any) -> EKey:
        """Where ``key`` sorts in the map: its flat sort form, after its hash bucket under
        hash partitioning, so a slot compares with :meth:`_flat` ranges as its placement
        does: ``(2, h, -1, ...)`` lies in ``[(2, h), (2, h, 0))``, a bucket's point range."""
        if type(key) is tuple:
            refuse_row_key(key)
        if self._ordered:
            return sort_key(key)
        return (*self.placement.ekey(key), -1, *sort_key(key))

    @staticmethod
    def _flat(ranges: RangeSet) -> RangeSet:
        return tuple([(sort_bound(lo), sort_bound(hi)) for lo, hi in ranges])

    def _range_items(self, ranges: RangeSet) -> list[tuple[Any, Any]]:
        """Every ``(slot, item)`` in ``ranges`` (flat, see :meth:`_flat`), in order."""
        out = []
        data = self._data
        for lo, hi in ranges:
            for slot in data.irange(lo, hi, inclusive=(True, False)):
                out.append((slot, data[slot]))
        return out

    # ------------------------------------------------------------------ the protocol
    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        return [self._one(op, ranges) for op, ranges in batch]

    def apply_logged(
        self, batch: Sequence[tuple[Any, RangeSet]]
    ) -> tuple[list[Any], list[tuple[Change, ...]]]:
        """:meth:`ReportsChanges.apply_logged`, with a put of one integer or string key
        under range partitioning written out: most writes are one, and the general road
        (each operation alone through :meth:`apply`, its ranges flattened, the key's
        slot found, its change listed) was half of this engine's time per write.  The
        engine's :meth:`_put_store` stores such a put; without one (a subclass or an
        instance that applies operations otherwise), every operation takes the general
        road.  A read changes nothing: where this class's :meth:`apply` would run it,
        it runs as :meth:`apply` runs it, without the road's change list around it (a
        bundled read of one key cost a storage core 2.3-2.4 µs instead of 3.0,
        2026-12-04)."""
        store = self._put_store()
        if store is None:
            return ReportsChanges.apply_logged(self, batch)
        results: list[Any] = []
        changed: list[tuple[Change, ...]] = []
        counts = self.counts
        one_op = self._one if type(self).apply is MemoryEngine.apply else None
        for one in batch:
            slot = one_put(one)
            if slot is None:  # anything else: the general road
                op = one[0]
                if (
                    one_op is not None
                    and type(op) is tuple
                    and op
                    and type(op[0]) is str
                    and op[0] in READS
                ):
                    results.append(one_op(op, one[1]))
                    changed.append(())
                    continue
                r, c = ReportsChanges.apply_logged(self, (one,))
                results += r
                changed += c
                continue
            counts["writes"] += 1
            try:
                changed.append(store(slot, one))
            except INVALID as e:  # a value the store cannot hold: as _one refuses it
                counts["rejected"] += 1
                changed.append(())
                results.append(rejection(one[0], e))
                continue
            results.append(None)
        return results, changed

    def _put_store(self) -> Any:
        """``store(slot, item)``, which applies an item :func:`one_put` found a slot (or
        :data:`OUTSIDE`) for as :meth:`apply` would and returns its changes, or
        raises, the put not applied, what :meth:`apply` would refuse it for; None when
        this engine may apply a put otherwise."""
        if not self._fast_puts(MemoryEngine, LeafMap):
            return None
        data = self._data
        setdefault, setitem, place_new = dict.setdefault, dict.__setitem__, data.place_new

        def store(slot: Any, one: Any) -> tuple[Change, ...]:
            if slot is OUTSIDE:
                return ()
            key, value = one[0][1][0]
            item = (key, value)
            if setdefault(data, slot, item) is item:  # a new key: its place to find
                place_new(slot)
            else:  # no new key: the order stands
                setitem(data, slot, item)
            return ((key, "put", value),)

        return store

    def _fast_puts(self, home: type[MemoryEngine], data: type) -> bool:
        """Whether this engine applies a put as ``home`` does, into a map of type
        ``data`` (nothing of it overridden by a subclass or on the instance)."""
        cls = type(self)
        mine = vars(self)
        return (
            type(self._data) is data
            and not ("apply" in mine or "_one" in mine or "_put" in mine or "_slot" in mine)
            and self._ordered
            and cls.apply is home.apply
            and cls._one is MemoryEngine._one
            and cls._put is MemoryEngine._put
            and cls._slot is MemoryEngine._slot
        )

    def _one(self, op: Any, ranges: RangeSet) -> Any:
        ranges = self._flat(ranges)
        try:
            name = op[0] if type(op) in (tuple, list) and op else None
            if name not in WRITES and name not in READS:
                raise BadOperation(f"not a key-value operation: {op!r:.80}")
            if name in WRITES:
                self.counts["writes"] += 1
                refuse_view_keys(op)
            else:
                self.counts["reads"] += 1
            return getattr(self, "_" + name)(op, ranges)
        except INVALID as e:
            self.counts["rejected"] += 1
            return rejection(op, e)

    def _put(self, op: Any, ranges: RangeSet) -> None:
        for key, value in op[1]:
            slot = self._slot(key)
            if inside(ranges, slot):
                self._data[slot] = (key, value)
                if self._changes is not None:
                    self._changes.append((key, "put", value))

    def _append(self, op: Any, ranges: RangeSet) -> None:
        mine = []
        for key, value in op[1]:
            slot = self._slot(key)
            if inside(ranges, slot):
                old = self._data.get(slot)
                if old is not None and type(old[1]) not in (list, tuple):
                    raise BadOperation(f"append to {key!r}, which holds a {type(old[1]).__name__}")
                mine.append((slot, key, value))
        for slot, key, value in mine:  # all checked first: the operation is atomic
            old = self._data.get(slot)
            new = self._data[slot] = (key, [*(old[1] if old else ()), value])
            if self._changes is not None:
                self._changes.append((key, "put", new[1]))

    def _add(self, op: Any, ranges: RangeSet) -> None:
        mine = []
        for key, delta in deltas(op[1]):
            slot = self._slot(key)
            if inside(ranges, slot):
                old = self._data.get(slot)
                if old is not None and type(old[1]) is not int:
                    raise BadOperation(f"add to {key!r}, which holds a {type(old[1]).__name__}")
                mine.append((slot, key, delta))
        for slot, key, delta in mine:  # all checked first: the operation is atomic
            old = self._data.get(slot)
            new = self._data[slot] = (key, (old[1] if old else 0) + delta)
            if self._changes is not None:
                self._changes.append((key, "put", new[1]))

    def _version(self, op: Any, ranges: RangeSet) -> None:
        # A view's rows come 500 to a message, each a key this process holds once per
        # replica: the per-row steps are written out (0.4 µs of a row's 4 went to
        # ``setdefault``'s spare list and to ``update``'s generic per-item insert).  An
        # ordered engine of this class's ``_slot`` finds a row's slot as it does
        # (``sort_key``, a table row's key refused), and a new row's one version is
        # made as ``merge`` makes it: without the two calls a row cost a storage core
        # 4.9 µs instead of 5.1 (500-row messages into 300,000 rows, 2026-12-04).
        pairs, floor = check_version_op(op)
        data = self._data
        slot_of = self._slot
        flat = self._ordered and getattr(slot_of, "__func__", None) is MemoryEngine._slot
        one = ranges[0] if len(ranges) == 1 else None
        entries: dict[EKey, tuple[Any, list[Any]]] = {}
        for key, entry in pairs:
            if not flat:
                slot = slot_of(key)
            elif type(key) is tuple and len(key) == 3 and key[0] == ROWS:
                slot = slot_of(key)  # (which refuses it)
            else:
                slot = sort_key(key)
            if (one[0] <= slot < one[1]) if one is not None else inside(ranges, slot):
                got = entries.get(slot)
                if got is None:
                    entries[slot] = (key, [entry])
                else:
                    got[1].append(entry)
        get = data.get
        new = []
        for slot, (key, mine) in entries.items():  # all checked first: the operation is atomic
            old = get(slot)
            if old is None and len(mine) == 1:
                new.append((slot, True, (key, [floor, list(mine[0])])))
            else:
                chain = merge(None if old is None else old[1], mine, floor, key)
                new.append((slot, old is None, (key, chain)))
        if type(data) is LeafMap:  # a key it held keeps its place: no order to find
            setitem, add_new = dict.__setitem__, data.add_new
            for slot, fresh, item in new:
                if fresh:
                    add_new(slot, item)
                else:
                    setitem(data, slot, item)
        else:
            for slot, _fresh, item in new:
                data[slot] = item
        if self._changes is not None:
            self._changes.extend((item[0], "put", item[1]) for _s, _f, item in new)

    def _reclaim(self, op: Any, ranges: RangeSet) -> None:
        keys, upto = check_reclaim_op(op)
        for key in keys:
            slot = self._slot(key)
            old = self._data.get(slot) if inside(ranges, slot) else None
            if old is not None and dead_by(old[1], upto):
                del self._data[slot]
                if self._changes is not None:
                    self._changes.append((key, "delete", None))

    def _delete(self, op: Any, ranges: RangeSet) -> None:
        for key in op[1]:
            slot = self._slot(key)
            gone = inside(ranges, slot) and self._data.pop(slot, None) is not None
            if gone and self._changes is not None:
                self._changes.append((key, "delete", None))

    def _delete_range(self, op: Any, ranges: RangeSet) -> None:
        for _slot, (key, _) in self._remove_ranges(ranges):
            if self._changes is not None:
                self._changes.append((key, "delete", None))

    def _remove_ranges(self, ranges: RangeSet) -> list[tuple[Any, Any]]:
        """Remove every item in ``ranges`` (flat); their ``(slot, item)``, in order: a
        leaf map's slices at once, another map's items one by one."""
        remove = getattr(self._data, "remove_range", None)
        if remove is not None:
            return [pair for lo, hi in ranges for pair in remove(lo, hi)]
        gone = self._range_items(ranges)
        for slot, _ in gone:
            del self._data[slot]
        return gone

    def _get(self, op: Any, ranges: RangeSet) -> dict[Any, Any]:
        out = {}
        for key in op[1]:
            slot = self._slot(key)
            if inside(ranges, slot):
                item = self._data.get(slot)
                if item is not None:
                    out[key] = item[1]
        return out

    def _scan(self, op: Any, ranges: RangeSet) -> list[tuple[Any, Any]]:
        if len(op) > 3 and self.placement.ordered:  # the first ``limit`` keys, in order
            data, limit, out = self._data, op[3], []
            for lo, hi in ranges:
                for slot in data.irange(lo, hi, inclusive=(True, False)):
                    if len(out) == limit:
                        return out
                    out.append(data[slot])
            return out
        items = [item for _, item in self._range_items(ranges)]
        return items if self.placement.ordered else within_bounds(op, items)

    def open_send(self, ranges: RangeSet) -> _Cursor:
        return _Cursor(self._range_items(self._flat(ranges)))

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        items = {}
        try:
            for _slot, item in chunk:
                key, value = item
                slot = self._slot(key)  # ours, not the sender's word
                items[slot] = (key, value)
        except (TypeError, ValueError) as e:
            raise BadOperation(f"a malformed chunk ({e})") from None
        ranges = self._flat(ranges)
        for slot in items:
            if not inside(ranges, slot):
                raise BadOperation(f"a chunk holds key {items[slot][0]!r:.40} outside the copy")
        self._data.update(items)

    def delete(self, ranges: RangeSet) -> None:
        self._remove_ranges(self._flat(ranges))

    def stats(self) -> dict[str, int | float]:
        """``bytes``: the items' encoded size (what a migration sends of them),
        estimated from :data:`SIZE_SAMPLE` of them at random."""
        data = self._data
        sample = data.sample(SIZE_SAMPLE, self._rng)
        try:
            size = sum(len(msgpack.packb(item, use_bin_type=True)) for item in sample)
        except (TypeError, ValueError, OverflowError):  # not sent as it is held: unknown
            sample, size = [], 0
        held = round(size * len(data) / len(sample)) if sample else 0
        return {"items": len(data), "bytes": held, **self.counts}

    def close(self) -> None:
        self._data.clear()

    def items(self) -> list[tuple[Any, Any]]:
        """Every (key, value) in placement order: what replicas compare."""
        return self._data.ordered_values()


def deltas(pairs: Any) -> list[tuple[Any, int]]:
    """An ``add``'s ``(key, delta)`` pairs, checked: integer deltas only (a counter
    holds an integer; absent, it counts as 0)."""
    out = []
    for key, delta in pairs:
        if type(delta) is not int or not -(2**63) <= delta < 2**63:
            raise BadOperation(f"add takes 64-bit integer deltas, not {delta!r:.40}")
        out.append((key, delta))
    return out


def _tuple(value: Any) -> Any:
    if type(value) in (list, tuple):
        return tuple(_tuple(v) for v in value)
    return value
