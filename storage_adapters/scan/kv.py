"""The key-value operations on the scan engine: one table ``kv`` (``k`` an integer key,
``v`` the value as JSON text), so every workload written for the key-value engines
(the Rubberband simulator's list-append clients, the key-value SDK) runs unchanged on
the scan engine's shared scans, migration cursors and range deletes.

Each key-value operation becomes scan-engine operations applied in order: ``put`` an
upsert, ``delete`` and ``delete_range`` deletes by key predicate, ``get`` and ``scan``
strict selects, and ``append`` a strict select of the keys' lists and an upsert of the
longer lists (atomic: every key is checked before anything is written).  Migration is
the scan engine's own (``open_send`` / ``receive`` / ``delete`` are passed through), so
the simulator's faults exercise exactly the code a scan-engine cluster runs.  Keys are
64-bit integers; anything else is a :class:`BadOperation`, the same at every replica.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rubberband.engine import (
    EVERYTHING,
    INVALID,
    BadOperation,
    Placement,
    RangeSet,
    SendCursor,
    contains,
    rejection,
)
from storage_adapters.memory import READS, WRITES, KVOps, deltas
from storage_adapters.scan.client import ScanOps
from storage_adapters.scan.engine import ScanEngine
from storage_adapters.scan.ops import is_table_or_kv_read

TABLE = "kv"
_OPS = ScanOps({TABLE: "k"})


def _key(k: Any) -> int:
    if type(k) is not int or not -(2**63) <= k < 2**63:
        raise BadOperation(f"keys of the scan engine's kv table are 64-bit integers, not {k!r:.40}")
    return k


class _EngineFailed(Exception):
    """The scan engine itself raised: a failure of the replica, not a bad operation."""


_MODIFY = frozenset({"append", "add"})


def _none(_: Any) -> None:
    return None


def _select(keys: list[int]) -> dict[str, Any]:
    return _OPS.select(TABLE, [("k", "in", keys)], columns=["k", "v"])


def _as_dict(res: Any) -> dict[int, Any]:
    ks, vs = res["data"]
    return {k: json.loads(v) for k, v in zip(ks, vs, strict=True)}


def _as_sorted(res: Any) -> list[tuple[int, Any]]:
    ks, vs = res["data"]
    return sorted((k, json.loads(v)) for k, v in zip(ks, vs, strict=True))


def _modified(name: str, pairs: list[tuple[int, Any]], values: dict[int, Any]) -> dict[int, Any]:
    """An append's or add's new values from ``values`` (what its keys hold); raises
    :class:`BadOperation` before changing anything if a key holds the wrong kind."""
    new: dict[int, Any] = {}
    for k, v in pairs:
        cur = new[k] if k in new else values.get(k, [] if name == "append" else 0)
        if name == "append":
            if type(cur) is not list:
                raise BadOperation(f"append to {k!r}, which holds a {type(cur).__name__}")
            new[k] = [*cur, v]
        else:
            if type(cur) is not int:
                raise BadOperation(f"add to {k!r}, which holds a {type(cur).__name__}")
            new[k] = cur + v
    return new


class _Cycle:
    """Scan-engine operations for one Clock Scan cycle, each with the batch positions
    its answer goes to (none for a read the batch itself needs) and how to decode it.

    Consecutive writes of whole values (puts, and the upserts of appends and adds) merge
    into one upsert of the rows inside each one's ranges, the later row of a key winning
    as it would one after another: a cycle's cost grows with its operations (each is
    compiled and run on the hot rows, :mod:`.clock`), not with the rows they write."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, RangeSet]] = []
        self.slots: list[tuple[list[int], Any]] = []
        self._rows: dict[int, str] | None = None
        """The rows of the last entry while it is a merged upsert."""

    def add(self, pos: int | None, op: Any, ranges: RangeSet, decode: Any) -> int:
        self._rows = None
        self.ops.append((op, ranges))
        self.slots.append(([] if pos is None else [pos], decode))
        return len(self.ops) - 1

    def put(self, pos: int, rows: dict[int, str]) -> None:
        """``rows``: already restricted to the writing operation's ranges."""
        if self._rows is None:
            self._rows = {}
            self.ops.append((self._rows, EVERYTHING))
            self.slots.append(([], _none))
        self._rows.update(rows)
        self.slots[-1][0].append(pos)

    def take(self) -> tuple[list[tuple[Any, RangeSet]], list[tuple[list[int], Any]]]:
        ops = [
            (_OPS.upsert(TABLE, [{"k": k, "v": v} for k, v in op.items()]), ranges)
            if type(op) is dict and "op" not in op
            else (op, ranges)
            for op, ranges in self.ops
        ]
        slots = self.slots
        self.ops, self.slots, self._rows = [], [], None
        return ops, slots


@dataclass(slots=True)
class _Modify:
    pos: int
    op: Any
    ranges: RangeSet
    pairs: list[tuple[int, Any]]
    read: int = -1


class ScanKVEngine:
    """A :class:`ScanEngine` answering the key-value engines' operations (tuples) beside
    its own (dicts: tables).  Clients use :class:`ScanKVOps` for both."""

    def __init__(self, placement: Placement | None = None, **scan_options: Any) -> None:
        self.scan = ScanEngine(placement, **scan_options)

    is_read = staticmethod(is_table_or_kv_read)

    @property
    def placement(self) -> Placement:
        return self.scan.placement

    @placement.setter
    def placement(self, value: Placement) -> None:
        self.scan.placement = value  # before any data: the table is made on first use

    def _table(self) -> None:
        if TABLE not in self.scan.tables:
            create = _OPS.create_table(TABLE, [("k", "int64 not null"), ("v", "varchar")], "k")
            self._run(create, EVERYTHING)

    def _run(self, op: Any, ranges: RangeSet) -> Any:
        try:
            (res,) = self.scan.apply([(op, ranges)])
        except Exception as e:
            raise _EngineFailed() from e
        if isinstance(res, BadOperation):
            raise res
        return res

    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        """The whole batch in as few Clock Scan cycles as its reads allow: one, plus one
        per run of read-modify-write operations (``append``, ``add``), which need the
        values their run starts from.  A cycle applies its operations exactly as one
        after another (:mod:`.clock`), so this equals running them one by one, which
        cost a scan each and held a storage process to a few thousand writes a second.
        """
        results: list[Any] = [None] * len(batch)
        cycle = _Cycle()
        run: list[_Modify] = []
        if any(not isinstance(op, dict) for op, _ in batch):
            self._table()
        for pos, (op, ranges) in enumerate(batch):
            if isinstance(op, dict):  # the scan engine's own operations: its tables
                if run:
                    self._modify(run, cycle, results)
                    run = []
                cycle.add(pos, op, ranges, None)
                continue
            try:
                name = op[0] if type(op) in (tuple, list) and op else None
                if name in _MODIFY:
                    run.append(self._parse_modify(pos, op, ranges))
                    continue
                if name == "put":
                    rows = self._rows(op[1], ranges)
                else:
                    scan_op, decode = self._compile(name, op)
            except INVALID as e:
                results[pos] = rejection(op, e)
                continue
            if run:
                self._modify(run, cycle, results)
                run = []
            if name == "put":
                cycle.put(pos, rows)
            else:
                cycle.add(pos, scan_op, ranges, decode)
        if run:
            self._modify(run, cycle, results)
        self._flush(cycle, results)
        return results

    def _compile(self, name: Any, op: Any) -> tuple[dict[str, Any], Any]:
        """A key-value operation other than a read-modify-write as one scan-engine
        operation, and how to turn its answer into the key-value answer."""
        if name not in WRITES and name not in READS:
            raise BadOperation(f"not a key-value operation: {op!r:.80}")
        if name == "delete":
            return _OPS.delete(TABLE, [("k", "in", [_key(k) for k in op[1]])]), _none
        if name == "get":
            return _select([_key(k) for k in op[1]]), _as_dict
        if len(op) != 3 and not (name == "scan" and len(op) == 4):
            raise BadOperation(f"{name} takes lo and hi")
        where = [("k", ">=", _key(op[1]))] if op[1] is not None else []
        if op[2] is not None:
            where.append(("k", "<", _key(op[2])))
        if name == "delete_range":
            return _OPS.delete(TABLE, where), _none
        if len(op) == 4:  # the first ``limit`` keys: the scan engine reads them all anyway
            limit = op[3]
            return _OPS.select(TABLE, where, columns=["k", "v"]), lambda r: _as_sorted(r)[:limit]
        return _OPS.select(TABLE, where, columns=["k", "v"]), _as_sorted

    def _rows(self, pairs: Any, ranges: RangeSet) -> dict[int, str]:
        """A put's rows inside ``ranges`` (the last of a key wins); every key and value is
        checked, inside or not, so every replica refuses the same puts."""
        ekey = self.placement.ekey
        rows = {}
        for k, v in pairs:
            row = (_key(k), json.dumps(v))
            if contains(ranges, ekey(k)):
                rows[k] = row[1]
        return rows

    def _parse_modify(self, pos: int, op: Any, ranges: RangeSet) -> _Modify:
        if op[0] == "append":
            pairs = [(_key(k), v) for k, v in op[1]]
            json.dumps([v for _, v in pairs])  # a value JSON cannot hold is refused here
        else:
            pairs = [(_key(k), d) for k, d in deltas(op[1])]
        return _Modify(pos, op, ranges, pairs)

    def _modify(self, run: list[_Modify], cycle: _Cycle, results: list[Any]) -> None:
        """A run of appends and adds: one strict read of every key they name, at the end
        of the pending cycle; the new values computed here, one after another (each
        operation atomic: it checks every key before it changes one); their upserts open
        the next cycle."""
        for m in run:
            m.read = cycle.add(None, _select(sorted({k for k, _ in m.pairs})), m.ranges, None)
        answers = self._flush(cycle, results)
        written: dict[int, Any] = {}
        """Values the run has written so far inside the writer's ranges: what a later
        operation of it reads (a key outside an operation's ranges it neither reads nor
        writes)."""
        placement = self.placement
        for m in run:
            res = answers[m.read]
            if isinstance(res, BadOperation):
                results[m.pos] = res
                continue
            values = _as_dict(res)
            for k, _ in m.pairs:
                if k in written and contains(m.ranges, placement.ekey(k)):
                    values[k] = written[k]
            try:
                new = _modified(m.op[0], m.pairs, values)
            except INVALID as e:
                results[m.pos] = rejection(m.op, e)
                continue
            mine = {k: v for k, v in new.items() if contains(m.ranges, placement.ekey(k))}
            written.update(mine)
            cycle.put(m.pos, {k: json.dumps(v) for k, v in mine.items()})

    def _flush(self, cycle: _Cycle, results: list[Any]) -> list[Any]:
        """Run the pending cycle; answers by the cycle's own positions."""
        if not cycle.ops:
            return []
        ops, slots = cycle.take()
        answers = self.scan.apply(ops)
        for (positions, decode), res in zip(slots, answers, strict=True):
            if positions:
                value = res if isinstance(res, BadOperation) or decode is None else decode(res)
                for pos in positions:
                    results[pos] = value
        return answers

    def open_send(self, ranges: RangeSet) -> SendCursor:
        return self.scan.open_send(ranges)

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        self.scan.receive(chunk, ranges)

    def delete(self, ranges: RangeSet) -> None:
        self.scan.delete(ranges)

    def stats(self) -> dict[str, int | float]:
        return self.scan.stats()

    def close(self) -> None:
        self.scan.close()

    def items(self) -> list[tuple[Any, Any]]:
        """Every (key, value) in placement order: what replicas compare."""
        if TABLE not in self.scan.tables:
            return []
        res = self._run(_OPS.select(TABLE, columns=["k", "v"]), EVERYTHING)
        ks, vs = res["data"]
        pairs = [(k, json.loads(v)) for k, v in zip(ks, vs, strict=True)]
        return sorted(pairs, key=lambda kv: self.placement.ekey(kv[0]))


class ScanKVOps:
    """The client half of :class:`ScanKVEngine`: the key-value engines' operations
    (tuples) and the scan engine's (dicts), each routed and combined by its own rules,
    and the scan engine's table calls (``rb.table``, ``rb.create_table``)."""

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self.tables = ScanOps(keys)
        self.kv = KVOps()

    def _of(self, op: Any) -> Any:
        return self.tables if isinstance(op, Mapping) else self.kv

    def part_fun(self, op: Any, placement: Placement) -> Any:
        return self._of(op).part_fun(op, placement)

    def combine(self, op: Any, answers: Sequence[Any]) -> Any:
        return self._of(op).combine(op, answers)

    def answered(self, op: Any) -> bool:
        return bool(self._of(op).answered(op))

    def restrict(self, result: Any, ranges: RangeSet, placement: Placement) -> Any:
        """Key-value answers are trimmed to ``ranges``; a select's answer (columns and
        data) already holds only its responder's ranges."""
        if isinstance(result, Mapping) and "columns" in result:
            return result
        return self.kv.restrict(result, ranges, placement)

    def bind(self, client: Any) -> Any:
        return self.tables.bind(client)

    # the table builders, as ScanOps has them (rb.table(...) calls them)
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.__dict__["tables"], name)
