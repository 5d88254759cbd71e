"""A storage core logs the changes of every engine that reports them, whatever shape
its operations have: key-value tuples, table operations as dicts, bundles of both."""

from __future__ import annotations

from typing import Any

from ecast.core.message import Message
from rubberband.changelog import ChangeLog
from rubberband.engine import EVERYTHING, row_key
from rubberband.keys import point
from rubberband.proto import write_header
from rubberband.storage import StorageCore
from storage_adapters.memory import MemoryEngine
from storage_adapters.scan.client import ScanOps
from storage_adapters.scan.engine import ScanEngine
from storage_adapters.scan.memory_kv import ScanMemoryEngine

T = ScanOps()


def _core(engine: Any) -> StorageCore:
    core = StorageCore("storage:1", engine, changes=ChangeLog(max_changes=1000))
    core.joined({"rubberband": [1, "range", 0, [], [], [], [], [], [], [], []]})
    core.owned = EVERYTHING
    assert core._logged
    return core


def _revision(core: StorageCore, key: Any) -> int:
    [[_, t]] = core.changes.revisions_of([key], EVERYTHING)
    return int(t)


def _msg(i: int, header: Any, op: Any) -> tuple[int, Message]:
    return (i, Message("client:c", (("c", 0, ""), i), header, op))


def test_table_writes_are_applied_and_logged() -> None:
    core = _core(ScanEngine(block_rows=16))
    everything = write_header(EVERYTHING)
    table = T.create_table("t", [("k", "int64"), ("v", "int32")], "k")
    fx = core.deliver(
        [_msg(1, everything, table), _msg(2, everything, T.insert("t", [{"k": 1, "v": 2}]))]
    )
    assert core.stopped is None, core.stopped
    assert not any(type(d).__name__ == "Stop" for d in fx.deliver)
    assert core.delivered == 2
    assert core.changes.recorded == 1
    assert _revision(core, row_key("t", 1)) == 2


def test_tables_and_keys_side_by_side_are_applied_and_logged() -> None:
    core = _core(ScanMemoryEngine(block_rows=16))
    everything = write_header(EVERYTHING)
    table = T.create_table("t", [("k", "int64"), ("v", "int32")], "k")
    batch = [
        _msg(1, everything, table),
        _msg(2, write_header((point(5),)), ("put", ((5, "x"),))),
        _msg(3, everything, T.insert("t", [{"k": 1, "v": 2}])),
        _msg(4, write_header((point("a"),)), ("put", (("a", "y"),))),
    ]
    core.deliver(batch)
    assert core.stopped is None, core.stopped
    assert core.changes.recorded == 3
    assert _revision(core, 5) == 2 and _revision(core, "a") == 4
    assert _revision(core, row_key("t", 1)) == 3


def test_key_value_puts_are_applied_and_logged() -> None:
    core = _core(MemoryEngine())
    core.deliver([_msg(i, write_header((point(i),)), ("put", ((i, i),))) for i in range(1, 6)])
    assert core.stopped is None and core.changes.recorded == 5
    assert [_revision(core, i) for i in range(1, 6)] == [1, 2, 3, 4, 5]
