"""Bringing the replicas level before a cluster that lost every process restarts.

E-Cast delivers a message to all of its destinations or, after a crash, perhaps to some
of them only; a storage process on a durable engine confirms a batch once it is on
disk, so a write acknowledged to its client is on every replica's disk, but one that
was not acknowledged may be on some and not on others.  Restarted as they are, two
replicas of a range would answer differently.  So before the storage processes start,
each one's engine is brought level with the others (uniform agreement, finished late):

* every replica's position (the last delivery its engine holds, :attr:`position`) and
  the records of its log after the lowest of them (``tail``): each key it wrote at a
  position, and, for a message that reached beyond that replica's ranges, every write
  of the message (``whole``);
* each replica then applies, in position order, every message after its own position
  that touches its ranges: the whole message where some replica logged it whole, else
  the keys some replica wrote for it and the table writes it logged (``"writes"``, each
  with its ranges: a message that never reached beyond one replica's ranges was all
  written by whichever replica applied it, whole).

So a message that reached any replica reaches all of its destinations, whole; one that
reached none is nowhere.  Each engine then starts a new epoch: the new E-Cast group
numbers its positions from the start.  Engines offer ``position``, ``tail``, ``whole``
and ``new_epoch`` for this (``storage_adapters.log`` does).
"""

from __future__ import annotations

from typing import Any

from ecast import Direct, Effects
from rubberband.keys import contains, intersect, normalize
from rubberband.placement import Keyspace
from rubberband.proto import LevelApply, LevelAsk, Levelled, LevelTail


def level(engines: dict[str, Any], keyspace: Keyspace) -> dict[str, int]:
    """Bring ``engines`` (holder name -> an open engine of that holder, all on one
    machine) level and start their new epoch; returns the items each one applied.  The
    cluster does the same over the network (:class:`Leveller`)."""
    positions = {name: int(e.position) for name, e in engines.items()}
    low = min(positions.values(), default=0)
    tails = {name: e.tail(low) for name, e in engines.items()}
    placement = next(iter(engines.values())).placement if engines else None
    applied = {}
    for name, items in plan(positions, tails, keyspace, placement).items():
        if items:
            engines[name].apply(items)
        applied[name] = len(items)
    for e in engines.values():
        e.new_epoch()
    return applied


def plan(
    positions: dict[str, int], tails: dict[str, Any], keyspace: Keyspace, placement: Any
) -> dict[str, list[Any]]:
    """What each holder lacks, ``(op, ranges, t)`` items in position order: every message
    after its position that some holder's tail (its records after the lowest position)
    has and that touches its ranges."""
    wholes: dict[int, Any] = {}
    keys: dict[int, dict[Any, tuple[str, Any]]] = {}
    writes: dict[int, Any] = {}  # the table writes (with ranges) a replica logged
    for tail in tails.values():
        for t, kind, body in tail:
            if kind == "whole":
                wholes.setdefault(t, body)
            elif kind == "writes":
                writes.setdefault(t, body)
            elif kind == "put":
                keys.setdefault(t, {})[body[0]] = ("put", body[1])
            elif kind == "delete":
                keys.setdefault(t, {})[body] = ("delete", None)
    known = sorted(wholes.keys() | keys.keys() | writes.keys())
    out = {}
    for name, position in positions.items():
        mine = _Mine(keyspace.partition(name), placement)
        out[name] = [
            item
            for t in known
            if t > position
            for item in _message(t, wholes.get(t), writes.get(t, ()), keys.get(t, {}), mine)
        ]
    return out


class _Mine:
    """A replica's ranges, and whether a key lies in them."""

    def __init__(self, owned: Any, placement: Any) -> None:
        self.owned = owned
        self.placement = placement

    def has(self, key: Any) -> bool:
        return contains(self.owned, self.placement.ekey(key))


def _message(
    t: int, whole: Any, writes: Any, keys: dict[Any, tuple[str, Any]], mine: _Mine
) -> list[Any]:
    """The engine batch of message ``t`` for the replica ``mine`` (empty: nothing of
    the message is the replica's): its part of the whole message if some replica logged
    it whole, else the table writes and the keys some replica wrote for it."""
    out = []
    for op, ranges in whole if whole is not None else writes:
        part = intersect(normalize(tuple(tuple(r) for r in ranges)), mine.owned)
        if part:
            out.append((op, part, t))
    if whole is None:
        out += [
            (("put", ((k, v),)) if kind == "put" else ("delete", (k,)), mine.owned, t)
            for k, (kind, v) in keys.items()
            if mine.has(k)
        ]
    return out


LEVEL_AGAIN = 30.0
"""Seconds a levelling round may take (every holder reads its whole log, checksums and
all, at about 11 s per GB) before the coordinator starts a new one."""
SLICE = 2_000
"""Records or items per message of a levelling round."""


class Leveller:
    """The coordinating super's levelling of the recorded holders over the network,
    before it restores the ring (sans I/O: messages in, messages out).  A round asks
    every holder its position, then every holder its tail after the lowest, plans
    (:func:`plan`) and sends each holder what it lacks; it is done when each has
    answered :class:`~rubberband.proto.Levelled`.  A round that does not finish within
    :data:`LEVEL_AGAIN` starts over from the positions: a holder skips what it already
    applied (everything at or before its position), so a repeated slice or round applies
    nothing twice, and the holders start their new epoch only when the restore is
    delivered, so a new coordinator's round finds their tails as they are."""

    def __init__(self, holders: list[str], keyspace: Keyspace, placement: Any) -> None:
        self.holders = sorted(holders)
        self.keyspace = keyspace
        self.placement = placement
        self.round = 0
        self.done = False
        self.applied: dict[str, int] = {}
        self.error: str | None = None
        self._started = float("-inf")
        self._positions: dict[str, int] = {}
        self._tails: dict[str, list[Any]] = {}
        self._complete: set[str] = set()
        self._waiting: set[str] = set()
        self._low: int | None = None

    def step(self, now: float, fx: Effects) -> None:
        """Start a round if none is under way (or the last one overran)."""
        if self.done or now - self._started < LEVEL_AGAIN:
            return
        self.round += 1
        self._started = now
        self._positions, self._tails, self._complete, self._low = {}, {}, set(), None
        self._waiting = set()
        for h in self.holders:
            fx.send.append((h, Direct(LevelAsk(self.round, None))))
        fx.wake(now + LEVEL_AGAIN)

    def on_tail(self, src: str, msg: LevelTail, fx: Effects) -> None:
        if self.done or msg.round != self.round or src not in self.holders:
            return
        if self._low is None:  # the positions
            self._positions[src] = msg.position
            if len(self._positions) == len(self.holders):
                self._low = min(self._positions.values())
                for h in self.holders:
                    fx.send.append((h, Direct(LevelAsk(self.round, self._low))))
            return
        if src in self._complete:
            return
        self._tails.setdefault(src, []).extend(msg.records)
        if msg.last:
            self._complete.add(src)
        if len(self._complete) == len(self.holders):
            self._apply(fx)

    def _apply(self, fx: Effects) -> None:
        tails, self._tails = self._tails, {}
        try:
            lacks = plan(self._positions, tails, self.keyspace, self.placement)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
            # A holder sent records no engine writes: the round stops here, and the
            # next one (LEVEL_AGAIN) asks again; the restore waits, it never guesses.
            self.error = f"round {self.round}: unreadable records: {e}"
            return
        self.error = None
        self.applied = {h: len(items) for h, items in lacks.items()}
        self._waiting = {h for h, items in lacks.items() if items}
        for h in sorted(self._waiting):
            parts = _slices(lacks[h])
            for i, part in enumerate(parts):
                fx.send.append((h, Direct(LevelApply(self.round, part, i == len(parts) - 1))))
        self.done = not self._waiting

    def on_levelled(self, src: str, msg: Levelled) -> None:
        if self.done or msg.round != self.round:
            return
        self._waiting.discard(src)
        self.done = not self._waiting


def _slices(items: list[Any]) -> list[tuple[Any, ...]]:
    """``items`` in slices of about :data:`SLICE`, a message's items never split (a
    holder skips every item at or before its position once it applied a slice)."""
    out: list[tuple[Any, ...]] = []
    start = 0
    for i in range(1, len(items) + 1):
        if i == len(items) or (i - start >= SLICE and items[i][2] != items[i - 1][2]):
            out.append(tuple(items[start:i]))
            start = i
    return out


def answer_level(core: Any, src: str, msg: LevelAsk | LevelApply) -> None:
    """A holder's side of a round (``core`` a :class:`~rubberband.storage.StorageCore`,
    on its engine thread; ``src`` a super): only before any ring is restored (keyspace
    version 0).  An engine that keeps no positions holds nothing to level (position 0,
    no records); a damaged log stops the process, naming the file."""
    engine = core.engine
    if core.version != 0:
        return
    tail = getattr(engine, "tail", None)
    try:
        position = int(getattr(engine, "position", 0))
        if type(msg) is LevelAsk:
            records = () if msg.after is None or tail is None else tuple(tail(msg.after))
            for i in range(0, max(len(records), 1), SLICE):
                last = i + SLICE >= len(records)
                core.send(src, LevelTail(msg.round, position, records[i : i + SLICE], last))
            return
        batch = [
            tuple(item)
            for item in msg.items
            if type(item) in (list, tuple) and len(item) == 3 and type(item[2]) is int
            and item[2] > position
        ]  # fmt: skip
        if batch:
            engine.apply(batch)
        if msg.last:
            core.send(src, Levelled(msg.round, int(engine.position)))
    except OSError as e:  # a damaged log
        core.stop(f"cannot level this holder's data for the restart: {e}")
