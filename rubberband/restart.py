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

from rubberband.keys import contains, intersect, normalize
from rubberband.placement import Keyspace


def level(engines: dict[str, Any], keyspace: Keyspace) -> dict[str, int]:
    """Bring ``engines`` (holder name -> an open engine of that holder) level; returns
    the messages each one applied."""
    positions = {name: int(e.position) for name, e in engines.items()}
    low = min(positions.values(), default=0)
    wholes: dict[int, Any] = {}
    keys: dict[int, dict[Any, tuple[str, Any]]] = {}
    writes: dict[int, Any] = {}  # the table writes (with ranges) a replica logged
    for e in engines.values():
        for t, kind, body in e.tail(low):
            if kind == "whole":
                wholes.setdefault(t, body)
            elif kind == "writes":
                writes.setdefault(t, body)
            elif kind == "put":
                keys.setdefault(t, {})[body[0]] = ("put", body[1])
            else:
                keys.setdefault(t, {})[body] = ("delete", None)
    applied = {}
    for name, e in engines.items():
        owned = keyspace.partition(name)
        count = 0
        mine = _Mine(owned, e.placement)
        known = wholes.keys() | keys.keys() | writes.keys()
        for t in sorted(t for t in known if t > positions[name]):
            batch = _message(t, wholes.get(t), writes.get(t, ()), keys.get(t, {}), mine)
            if batch:
                e.apply(batch)
                count += 1
        applied[name] = count
    for e in engines.values():
        e.new_epoch()
    return applied


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
