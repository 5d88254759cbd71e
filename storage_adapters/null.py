"""The null engine: accepts every operation, stores nothing, answers nothing.

For protocol benchmarks (dissertation 4.6 ran Rubberband on a null engine too): what it
measures is E-Cast and Rubberband, with the cost of storing data taken out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rubberband.engine import AFTER_TAIL, BadOperation, Part, Placement, RangeSet

_new = tuple.__new__


class NullOps:
    """Operations are ``(kind, ranges, *rest)``: ``kind`` "read" or "write", ranges already
    in placement space; the benchmark builds them, and sizes its messages with ``rest``
    (a payload nobody reads).  ``("point", ekey)`` reads the one encoded key ``ekey``,
    and ``("set", ekey, *rest)`` writes it.

    Why point operations of their own: a bundle carries each read as ``(op, ranges)``,
    so a ``("read", ranges)`` op put its ranges on the wire twice, 21 msgpack objects a
    read where a key-value engine's ``("get", (key,))`` costs 14; a point read is 15.
    Likewise a write alone names its key's range in its header, and ``("write",
    ranges, payload)`` named it again: 12 objects in the operation where the memory
    engine's ``("put", ((key, value),))`` has 6, and ``("set", ekey, payload)`` 6.  The
    protocol benchmarks measured reads and writes dearer to pack and unpack, at every
    hop, than any real engine's."""

    def part_fun(self, op: Any, placement: Placement) -> Part:
        # ``tuple.__new__``: a NamedTuple's generated ``__new__`` cost a benchmark
        # client a third of this call, made once per read.
        kind, where = op[0], op[1]
        if kind == "point" or kind == "set":
            if type(where) is not tuple:
                raise BadOperation(f"{kind} takes an encoded key, not {where!r:.60}")
            end = where + AFTER_TAIL
            return _new(Part, ("read" if kind == "point" else "write", ((where, end),)))
        return _new(Part, ("read" if kind == "read" else "write", where))

    def combine(self, op: Any, answers: Sequence[Any]) -> Any:
        return None


class _Empty:
    def next_chunk(self, max_bytes: int) -> Any | None:
        return None

    def close(self) -> None:
        pass


class NullEngine:
    blocking = False
    """Every call returns at once: the storage process runs it on its event loop."""

    def __init__(self, placement: Placement | None = None) -> None:
        self.placement = placement or Placement()
        self.applied = 0

    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        self.applied += len(batch)
        return [None] * len(batch)

    @staticmethod
    def is_read(op: Any) -> bool:
        """:class:`NullOps`'s reads (nothing here changes, but a write sent as a read is
        refused as on every engine)."""
        return type(op) in (tuple, list) and len(op) > 1 and op[0] in ("read", "point")

    def open_send(self, ranges: RangeSet) -> _Empty:
        return _Empty()

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        pass

    def delete(self, ranges: RangeSet) -> None:
        pass

    def stats(self) -> dict[str, int | float]:
        return {"items": 0, "bytes": 0, "applied": self.applied}

    def close(self) -> None:
        pass
