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

from collections.abc import Sequence
from typing import Any

import msgpack

from ecast import Direct, Effects
from rubberband.bundles import cut
from rubberband.keys import EVERYTHING, contains, covers, difference, intersect, normalize, union
from rubberband.placement import Keyspace
from rubberband.proto import LevelApply, LevelAsk, Levelled, LevelTail


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
            elif kind == "writes":  # a replica's ranges of each: what any replica wrote
                writes[t] = _merged(writes.get(t), body)
            elif kind == "put":
                keys.setdefault(t, {})[body[0]] = ("put", body[1])
            elif kind == "delete":
                keys.setdefault(t, {})[body] = ("delete", None)
    known = sorted(wholes.keys() | keys.keys() | writes.keys())
    out = {}
    for name, position in positions.items():
        mine = _Mine(keyspace.partition(name), placement, keyspace.segments())
        out[name] = [
            item
            for t in known
            if t > position
            for item in _message(t, wholes.get(t), writes.get(t, ()), keys.get(t, {}), mine)
        ]
    return out


def _merged(a: Any, b: Any) -> Any:
    """Two replicas' logs of one message's table writes, ``((op, ranges), ...)``: each
    write with the ranges either ran it on (a replica that was levelled logged only its
    own part of a write)."""
    out: list[list[Any]] = [[op, _ranges(rs)] for op, rs in a or ()]
    for op, rs in b:
        ranges = _ranges(rs)
        same = [w for w in out if w[0] == op]
        if same:
            same[0][1] = union(same[0][1], ranges)
        else:
            out.append([op, ranges])
    return tuple((op, ranges) for op, ranges in out)


def _ranges(logged: Any) -> Any:
    """A range set as a log or the wire gave it back (lists for tuples)."""
    return normalize(tuple(tuple(r) for r in logged))


class _Mine:
    """A replica's ranges, and whether a key lies in them."""

    def __init__(self, owned: Any, placement: Any, segments: Any = ()) -> None:
        self.owned = owned
        self.placement = placement
        self.segments = [p for p in (intersect(seg, owned) for seg in segments) if p]

    def has(self, key: Any) -> bool:
        return contains(self.owned, self.placement.ekey(key))

    def pieces(self, part: Any) -> list[Any]:
        """``part`` cut at the ring's segments: a write is applied segment by segment,
        as a storage process applies it (``rubberband.applying``), so a levelled
        replica refuses the same parts of it as the replicas that delivered it."""
        return cut(part, self.segments)


def _message(
    t: int, whole: Any, writes: Any, keys: dict[Any, tuple[str, Any]], mine: _Mine
) -> list[Any]:
    """The engine batch of message ``t`` for the replica ``mine`` (empty: nothing of
    the message is the replica's): its part of the whole message if some replica logged
    it whole, else the table writes and the keys some replica wrote for it."""
    out = []
    for op, ranges in whole if whole is not None else writes:
        part = intersect(_ranges(ranges), mine.owned)
        if part:
            out += [(op, piece, t) for piece in mine.pieces(part)]
    if whole is None:
        out += [
            (("put", ((k, v),)) if kind == "put" else ("delete", (k,)), mine.owned, t)
            for k, (kind, v) in keys.items()
            if mine.has(k)
        ]
    return out


LEVEL_AGAIN = 30.0
"""Seconds a levelling round may go without an answer (every holder reads its whole
log for its tail, checksums and all, at about 11 s per GB) before the coordinator
starts a new one."""
SLICE = 2_000
"""Records or items per message of a levelling round, at most."""
SLICE_BYTES = 4 << 20
"""Their encoded bytes per message, about (a frame holds 16 MiB)."""


class Leveller:
    """The coordinating super's levelling of the recorded holders over the network,
    before it restores the ring (sans I/O: messages in, messages out).

    A round asks every storage process that joined (``candidates``) its epoch, position
    and whose data it keeps (``holds``: a process restarted under a new name, as the
    deploys do, still holds its predecessor's), maps each recorded holder to the
    process that holds its data (:attr:`rename`; the highest position first if two
    claim one, a process one holder's at most), asks those their tails after the lowest
    position, plans (:func:`plan`, by recorded name: the data is the recorded holder's)
    and sends each what it lacks; it is done when each has answered
    :class:`~rubberband.proto.Levelled`.  A holder of an earlier epoch (a power cut
    while the last restore was delivered: it was level then, and missed the restore)
    starts the newest one and counts from 0.  Answers are taken in order and only for
    the round and phase they answer (rounds are numbered on from ``first_round`` across
    levellers); a round with no answer for :data:`LEVEL_AGAIN` starts over.  A holder
    skips what it already applied (everything at or before its position), so a repeated
    slice or round applies nothing twice, and the holders start their new epoch only
    when the restore is delivered, so a new coordinator's round finds their tails as
    they are."""

    def __init__(
        self, candidates: list[str], recorded: list[str], keyspace: Keyspace, placement: Any,
        first_round: int = 0,
    ) -> None:  # fmt: skip
        self.holders = sorted(candidates)
        self.recorded = sorted(recorded)
        self.keyspace = keyspace
        self.placement = placement
        self.round = first_round
        self.done = False
        self.rename: dict[str, str] = {}
        """Recorded holder -> the process that holds its data now."""
        self.unclaimed: list[str] = list(self.recorded)
        """Recorded holders no process has claimed (as of the last round's positions)."""
        self.claims_known = False
        """Every candidate has said whose data it holds (in some round)."""
        self.applied: dict[str, int] = {}
        self.error: str | None = None
        self._heard = float("-inf")
        self._answers: dict[str, LevelTail] = {}
        self._tails: dict[str, list[Any]] = {}
        self._next: dict[str, int] = {}
        self._complete: set[str] = set()
        self._waiting: set[str] = set()
        self._low: int | None = None
        self._epoch = 0
        self._planned: dict[str, int] = {}
        self.next_epoch = 1
        """The epoch the restore starts (one past the newest any holder is in)."""
        self.highest = -1
        """The newest position any holder holds (once claims are known): the restore
        must come after it, or positions would repeat."""

    def step(self, now: float, fx: Effects) -> None:
        """Start a round if none is under way (or the last one went quiet)."""
        if self.done or now - self._heard < LEVEL_AGAIN:
            return
        self.round += 1
        self._heard = now
        self._answers, self._tails, self._next = {}, {}, {}
        self._complete, self._waiting, self._low = set(), set(), None
        for h in self.holders:
            fx.send.append((h, Direct(LevelAsk(self.round, None))))
        fx.wake(now + LEVEL_AGAIN)

    def on_tail(self, src: str, msg: LevelTail, now: float, fx: Effects) -> None:
        if self.done or msg.round != self.round or src not in self.holders:
            return
        if self._low is None:  # the positions and claims
            if msg.after is None and src not in self._answers:
                self._answers[src], self._heard = msg, now
                if len(self._answers) == len(self.holders):
                    self._claimed(fx)
            return
        if msg.after != self._low or src not in self._tails or msg.index != self._next[src]:
            return  # another phase's, a holder that is not asked, or out of order
        self._tails[src].extend(msg.records)
        self._next[src], self._heard = msg.index + 1, now
        if msg.last:
            self._complete.add(src)
            if len(self._complete) == len(self._tails):
                self._apply(fx)

    def _claimed(self, fx: Effects) -> None:
        self.claims_known = True
        answers = self._answers
        rename: dict[str, str] = {}
        for p in sorted(self.holders, key=lambda p: (-answers[p].epoch, -answers[p].position, p)):
            mine = [n for n in answers[p].holds if n in self.recorded and n not in rename]
            if mine:
                rename[mine[0]] = p
        self.unclaimed = [n for n in self.recorded if n not in rename]
        if self.unclaimed:
            return  # a holder's disk is not back (yet): the next round asks again
        epochs = {answers[p].epoch for p in rename.values()}
        if -1 in epochs and len(epochs - {-1}) > 1:
            # A holder that joined a group of unknown number, and holders that disagree
            # on the newest: which group its positions are of cannot be told.  Waiting
            # (and saying why) beats a guess that could apply writes twice.
            self.error = f"the holders' epochs differ ({sorted(epochs)}): not levelled"
            return
        self.rename = rename
        self._epoch = max(epochs | {0})
        self.next_epoch = self._epoch + 1
        self._low = min((self._position(p) for p in rename.values()), default=0)
        self.highest = max((self._position(p) for p in rename.values()), default=-1)
        for p in sorted(rename.values()):
            self._tails[p], self._next[p] = [], 0
            fx.send.append((p, Direct(LevelAsk(self.round, self._low))))
        if not rename:
            self.done = True

    def _position(self, p: str) -> int:
        """A holder's position in the newest epoch (0 if it has not started it; one that
        joined the group later, of unnumbered epoch, is in it)."""
        a = self._answers[p]
        return a.position if a.epoch in (self._epoch, -1) else 0

    def _behind(self, p: str) -> bool:
        return self._answers[p].epoch not in (self._epoch, -1)

    def _apply(self, fx: Effects) -> None:
        tails, self._tails = self._tails, {}
        newest = {p: t for p, t in tails.items() if not self._behind(p)}
        by_process = {p: n for n, p in self.rename.items()}
        positions = {n: self._position(p) for n, p in self.rename.items()}
        try:
            lacks = plan(positions, {by_process[p]: t for p, t in newest.items()},
                         self.keyspace, self.placement)  # fmt: skip
            slices = {n: _slices(items, by_message=True) for n, items in lacks.items()}
        except (TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
            # A holder sent records no engine writes: the round stops here, and the
            # next one (LEVEL_AGAIN) asks again; the restore waits, it never guesses.
            self.error = f"round {self.round}: unreadable records: {e}"
            return
        self.error = None
        self.applied = {self.rename[n]: len(items) for n, items in lacks.items()}
        behind = {p for p in self.rename.values() if self._behind(p)}
        self._waiting = {self.rename[n] for n, items in lacks.items() if items} | behind
        self._planned = {  # the position each must answer it reached
            self.rename[n]: max([positions[n], *(t for *_, t in items)])
            for n, items in lacks.items()
        }
        for p in sorted(self._waiting):
            parts = slices[by_process[p]]
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                fx.send.append((p, Direct(LevelApply(self.round, self._epoch, i, part, last))))
        self.done = not self._waiting

    def on_levelled(self, src: str, msg: Levelled, now: float) -> None:
        if self.done or msg.round != self.round or src not in self._waiting:
            return
        if msg.position < self._planned.get(src, 0):
            self.error = f"{src} answered levelled at {msg.position}, short of its plan"
            return  # the round goes quiet and starts over
        self._waiting.discard(src)
        self._heard = now
        self.done = not self._waiting

    def renamed(self, names: Any) -> tuple[Any, ...]:
        """``names`` (recorded holders) as the processes that hold their data now."""
        return tuple(self.rename.get(n, n) for n in names)

    def covered_without(self, names: list[str]) -> bool:
        """Whether the recorded holders but ``names`` hold a copy of every range."""
        kept: Any = ()
        for n in self.recorded:
            if n not in names:
                kept = union(kept, self.keyspace.partition(n))
        return bool(covers(kept, EVERYTHING))


def drop_kept(core: Any) -> None:
    """A storage process that kept data an earlier process left (``--keep-data``)
    starts empty after all, its positions from the start: at its join into a live
    cluster, or at a first keyspace change that is not the restore of the whole
    cluster's ring (a migration would add to the data, not replace it)."""
    if core.kept is not None:
        core.kept = None
        core.engine.delete(EVERYTHING)
        getattr(core.engine, "new_epoch", lambda _: None)(-1)  # the group's, unnumbered


def restored(core: Any, t: int, epoch: int | None) -> None:
    """The restore of the ring was delivered at ``t`` to a storage process: its engine
    kept its ranges on disk, brought level with the other replicas, and its positions
    start again with this group's, in the restore's ``epoch``; what it holds beyond its
    ranges goes.  Positions must rise across the restart (the new group's founding
    router numbers from the clock, ``--origin``): the coordinating super restores only
    once its group is past every position the holders hold (:attr:`Leveller.highest`),
    and a holder whose engine holds one at or above ``t`` all the same stops rather than
    answer two writes at one position (its views, feed offsets and read positions would
    mix the two groups')."""
    core.kept = None
    last = getattr(core.engine, "position", None)
    if type(last) is int and last >= t:
        core.stop(
            f"the restored cluster's positions start at or below {last}, this engine's "
            f"newest (the restore came at {t}): start the routers' group with --origin "
            f"above {last}"
        )
        return
    getattr(core.engine, "new_epoch", lambda _: None)(epoch)
    rest = difference(EVERYTHING, core.owned)
    if rest:
        core.order(rest, t, ("delete", rest, 0))


def _slices(items: Sequence[Any], by_message: bool = False) -> list[tuple[Any, ...]]:
    """``items`` in slices of at most :data:`SLICE` items and about :data:`SLICE_BYTES`
    (at least one slice; ``by_message``: a message's items, equal in position, never
    split: a holder skips every item at or before its position once it applied one)."""
    out: list[tuple[Any, ...]] = []
    start, size = 0, 0
    for i, item in enumerate(items):
        n = len(msgpack.packb(item, use_bin_type=True, default=repr))
        same = by_message and i > start and items[i - 1][2] == item[2]
        if i > start and not same and (i - start >= SLICE or size + n > SLICE_BYTES):
            out.append(tuple(items[start:i]))  # cut before the item that would overflow
            start, size = i, 0
        size += n
    if start < len(items) or not out:
        out.append(tuple(items[start:]))
    return out


def answer_level(core: Any, src: str, msg: LevelAsk | LevelApply) -> None:
    """A holder's side of a round (``core`` a :class:`~rubberband.storage.StorageCore`,
    on its engine thread; ``src`` a super): only before any ring is restored (keyspace
    version 0).  ``core.kept``: the names the data it kept was written under (None: it
    kept nothing, claims nothing and holds nothing to level).  A damaged log stops the
    process, naming the file; a malformed request changes nothing."""
    engine = core.engine
    if core.version != 0:
        return
    kept = core.kept
    try:
        epoch = int(getattr(engine, "epoch", 0)) if kept is not None else 0
        position = int(getattr(engine, "position", 0)) if kept is not None else 0
        if type(msg) is LevelAsk:
            _tail(core, src, msg, epoch, position)
            return
        expected = core.level_next.get((src, msg.round), 0)
        if msg.index != expected or kept is None:
            return  # out of order (one before it was lost): the round starts over
        if 0 <= epoch < msg.epoch:  # it missed the last restore, level before it
            engine.new_epoch(msg.epoch)
            position = 0
        batch = [
            tuple(item)
            for item in msg.items
            if type(item) in (list, tuple) and len(item) == 3 and type(item[2]) is int
            and item[2] > position
        ]  # fmt: skip
        if batch:
            try:
                engine.apply(batch)
            except Exception as e:  # the engine failed: this replica stops (fail-stop)
                core.stop(f"levelling for the restart failed: {e}")
                return
        core.level_next = {(src, msg.round): expected + 1}
        if msg.last:
            getattr(engine, "sync", lambda: None)()  # on disk before it says so
            core.send(src, Levelled(msg.round, int(getattr(engine, "position", 0))))
    except OSError as e:  # a damaged log
        core.stop(f"cannot level this holder's data for the restart: {e}")
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        return  # a request no super makes: ignored (the round starts over)


def _tail(core: Any, src: str, msg: LevelAsk, epoch: int, position: int) -> None:
    tail = getattr(core.engine, "tail", None)
    records: Sequence[Any] = ()
    if msg.after is not None and tail is not None and core.kept is not None:
        cached = core.level_tail
        if cached is None or cached[0] != (epoch, position, msg.after):
            cached = core.level_tail = ((epoch, position, msg.after), tail(msg.after))
        records = cached[1]
    holds = tuple(core.kept or ())
    parts = _slices(records)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        core.send(src, LevelTail(msg.round, epoch, position, holds, msg.after, i, part, last))
