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
from typing import Any

from storage_adapters.base import (
    EVERYTHING,
    INVALID,
    BadOperation,
    Placement,
    RangeSet,
    SendCursor,
    rejection,
)
from storage_adapters.memory import READS, WRITES, KVOps, deltas
from storage_adapters.scan.client import ScanOps
from storage_adapters.scan.engine import ScanEngine

TABLE = "kv"
_OPS = ScanOps({TABLE: "k"})


def _key(k: Any) -> int:
    if type(k) is not int or not -(2**63) <= k < 2**63:
        raise BadOperation(f"keys of the scan engine's kv table are 64-bit integers, not {k!r:.40}")
    return k


class _EngineFailed(Exception):
    """The scan engine itself raised: a failure of the replica, not a bad operation."""


class ScanKVEngine:
    """A :class:`ScanEngine` answering the key-value engines' operations (tuples) beside
    its own (dicts: tables).  Clients use :class:`ScanKVOps` for both."""

    def __init__(self, placement: Placement | None = None, **scan_options: Any) -> None:
        self.scan = ScanEngine(placement, **scan_options)

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

    def _values(self, keys: list[int], ranges: RangeSet) -> dict[int, Any]:
        res = self._run(_OPS.select(TABLE, [("k", "in", keys)], columns=["k", "v"]), ranges)
        ks, vs = res["data"]
        return {k: json.loads(v) for k, v in zip(ks, vs, strict=True)}

    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        out = []
        for op, ranges in batch:
            if isinstance(op, dict):  # the scan engine's own operations: its tables
                out.extend(self.scan.apply([(op, ranges)]))
                continue
            try:
                self._table()
                out.append(self._one(op, ranges))
            except _EngineFailed as e:
                raise e.__cause__ from None  # type: ignore[misc]
            except INVALID as e:
                out.append(rejection(op, e))
        return out

    def _one(self, op: Any, ranges: RangeSet) -> Any:
        name = op[0] if type(op) in (tuple, list) and op else None
        if name not in WRITES and name not in READS:
            raise BadOperation(f"not a key-value operation: {op!r:.80}")
        if name == "put":
            rows = {_key(k): json.dumps(v) for k, v in op[1]}  # the last of a key wins
            self._run(_OPS.upsert(TABLE, [{"k": k, "v": v} for k, v in rows.items()]), ranges)
            return None
        if name == "append":
            pairs = [(_key(k), v) for k, v in op[1]]
            lists = self._values(sorted({k for k, _ in pairs}), ranges)
            for k, v in pairs:
                cur = lists.get(k, [])
                if type(cur) is not list:
                    raise BadOperation(f"append to {k!r}, which holds a {type(cur).__name__}")
                lists[k] = [*cur, v]
            rows = [{"k": k, "v": json.dumps(v)} for k, v in lists.items()]
            self._run(_OPS.upsert(TABLE, rows), ranges)
            return None
        if name == "add":
            pairs = [(_key(k), d) for k, d in deltas(op[1])]
            values = self._values(sorted({k for k, _ in pairs}), ranges)
            for k, d in pairs:
                cur = values.get(k, 0)
                if type(cur) is not int:
                    raise BadOperation(f"add to {k!r}, which holds a {type(cur).__name__}")
                values[k] = cur + d
            rows = [{"k": k, "v": json.dumps(v)} for k, v in values.items()]
            self._run(_OPS.upsert(TABLE, rows), ranges)
            return None
        if name == "delete":
            self._run(_OPS.delete(TABLE, [("k", "in", [_key(k) for k in op[1]])]), ranges)
            return None
        if name == "get":
            return self._values([_key(k) for k in op[1]], ranges)
        if len(op) != 3:
            raise BadOperation(f"{name} takes lo and hi")
        where = [("k", ">=", _key(op[1]))] if op[1] is not None else []
        if op[2] is not None:
            where.append(("k", "<", _key(op[2])))
        if name == "delete_range":
            self._run(_OPS.delete(TABLE, where), ranges)
            return None
        res = self._run(_OPS.select(TABLE, where, columns=["k", "v"]), ranges)
        ks, vs = res["data"]
        return sorted((k, json.loads(v)) for k, v in zip(ks, vs, strict=True))

    def open_send(self, ranges: RangeSet) -> SendCursor:
        return self.scan.open_send(ranges)

    def receive(self, chunk: Any) -> None:
        self.scan.receive(chunk)

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
