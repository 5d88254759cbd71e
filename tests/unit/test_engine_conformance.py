"""One conformance suite for every storage engine (``-k conformance``).

What Rubberband requires of an engine (:mod:`rubberband.engine`), checked the same
way on the in-memory key-value engine, the durable log engine (small segments, so
checkpoints and compaction run inside the tests), the scan engine (with its own table
operations, and with the key-value operations of :mod:`storage_adapters.scan.kv`) and
the Memcached engine (a real ``memcached`` per engine): operations apply in the order
given and answer as a reference model does; a send cursor is a snapshot taken at the
call; a range goes from one engine to another in chunks (through msgpack, as on the
wire), and the writes held back while it travelled then apply on top of it; range
deletes drop only the range; invalid operations are rejected with a clear message,
alike at every replica; and a failure of the backend raises (the storage process
stops), it is never a rejection.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ecast import Effects, Message
from rubberband.engine import (
    EVERYTHING,
    MAX_EKEY,
    MIN_EKEY,
    BadOperation,
    Placement,
    RangeSet,
    encode_key,
    intersect,
)
from rubberband.outputs import Stop
from rubberband.proto import write_header
from rubberband.storage import StorageCore
from storage_adapters.log import LogEngine
from storage_adapters.memory import KVOps, MemoryEngine
from storage_adapters.scan import ScanEngine, ScanOps
from storage_adapters.scan.kv import ScanKVEngine
from storage_adapters.scan.log_kv import ScanLogEngine
from storage_adapters.scan.memory_kv import ScanMemoryEngine

ENGINES = [
    "memory", "log", "scan", "scan-kv", "scan-memory", "scan-memory-tables", "scan-log",
    "scan-log-tables", "memcached",
]  # fmt: skip
TABLES = ("scan", "scan-memory-tables", "scan-log-tables")
"""The drivers of tables (the others' data is key-value)."""


class KVDriver:
    """Operations of the key-value engines (memory and memcached)."""

    ops: Any = KVOps()

    def __init__(self, make: Any) -> None:
        self.make = make

    def engine(self, placement: Placement | None = None) -> Any:
        return self.make(placement)

    def setup(self, e: Any) -> None:
        pass

    def put(self, pairs: list[tuple[int, str]]) -> Any:
        return ("put", tuple(pairs))

    def delete(self, keys: list[int]) -> Any:
        return ("delete", tuple(keys))

    def get(self, keys: list[int]) -> Any:
        return ("get", tuple(keys))

    def got(self, result: Any) -> dict[int, str]:
        return dict(result)

    def content(self, e: Any) -> dict[int, str]:
        return {k: v for k, v in e.items()}

    def bad_ops(self) -> list[Any]:
        return [("explode", 1), ("put", ((1,),)), ("get", ([1],)), "put"]


class ScanDriver:
    """Operations of the scan engine on a two-column table keyed by ``k``."""

    ops: Any = ScanOps()

    def __init__(self, make: Any) -> None:
        self.make = make
        self.ops = ScanOps()

    def engine(self, placement: Placement | None = None) -> Any:
        return self.make(placement)

    def setup(self, e: Any) -> None:
        create = self.ops.create_table("t", [("k", "int64"), ("v", "varchar")], key="k")
        assert e.apply([(create, EVERYTHING)]) == [{"created": True}]

    def put(self, pairs: list[tuple[int, str]]) -> Any:
        return self.ops.upsert("t", [{"k": k, "v": v} for k, v in pairs])

    def delete(self, keys: list[int]) -> Any:
        return self.ops.delete("t", [("k", "in", list(keys))])

    def get(self, keys: list[int]) -> Any:
        return self.ops.select("t", [("k", "in", list(keys))], columns=["k", "v"])

    def got(self, result: Any) -> dict[int, str]:
        return {r["k"]: r["v"] for r in ScanOps.rows(result)}

    def content(self, e: Any) -> dict[int, str]:
        (res,) = e.apply([(self.ops.select("t", columns=["k", "v"]), EVERYTHING)])
        return self.got(res)

    def bad_ops(self) -> list[Any]:
        return [
            {"op": "explode", "table": "t"},
            self.ops.select("nope"),
            self.ops.insert("t", [{"k": 1, "zz": 2}]),
            self.ops.select("t", [("v", "<", 5)]),
        ]


def _memcached(placement: Placement | None) -> Any:
    from storage_adapters.memcached import MemcachedEngine

    return MemcachedEngine(placement, memory_mb=64)


@pytest.fixture(params=ENGINES)
def driver(request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[Any] = []

    def track(make: Any) -> Any:
        def build(placement: Placement | None = None) -> Any:
            e = make(placement)
            made.append(e)
            return e

        return build

    if request.param == "memory":
        d: Any = KVDriver(track(MemoryEngine))
    elif request.param == "log":  # durable: a private directory, every batch synced
        d = KVDriver(track(lambda p: LogEngine(p, segment_mb=0.05, checkpoint_mb=0.2)))
    elif request.param == "scan":
        d = ScanDriver(track(lambda p: ScanEngine(p, block_rows=32)))
    elif request.param == "scan-kv":  # the key-value operations on the scan engine
        d = KVDriver(track(lambda p: ScanKVEngine(p, block_rows=32)))
    elif request.param == "scan-memory":  # tables and key-value data side by side
        d = KVDriver(track(lambda p: ScanMemoryEngine(p, block_rows=32)))
    elif request.param == "scan-memory-tables":
        d = ScanDriver(track(lambda p: ScanMemoryEngine(p, block_rows=32)))
    elif request.param in ("scan-log", "scan-log-tables"):  # both stores on one log
        d = (KVDriver if request.param == "scan-log" else ScanDriver)(
            track(lambda p: ScanLogEngine(p, block_rows=32, segment_mb=0.05, checkpoint_mb=0.2))
        )
    else:
        if shutil.which("memcached") is None:
            pytest.fail(
                "memcached is not installed (.ci/run installs it: apt-get install memcached)"
            )
        d = KVDriver(track(_memcached))
    d.name = request.param
    yield d
    for e in made:
        e.close()


def run(d: Any, e: Any, *ops: Any) -> list[Any]:
    """Apply ``ops`` in one batch, each with the ranges its ``part_fun`` names."""
    return e.apply([(op, d.ops.part_fun(op, e.placement).ranges) for op in ops])


def key_range(lo: int, hi: int) -> RangeSet:
    return ((encode_key(lo), encode_key(hi)),)


def drain(cursor: Any, into: Any, max_bytes: int, ranges: RangeSet = EVERYTHING) -> int:
    chunks = 0
    while (chunk := cursor.next_chunk(max_bytes)) is not None:
        into.receive(msgpack.unpackb(msgpack.packb(chunk, use_bin_type=True), raw=False), ranges)
        chunks += 1
    cursor.close()
    return chunks


def test_conformance_operations_apply_in_the_order_given(driver: Any) -> None:
    d = driver
    e = d.engine()
    d.setup(e)
    res = run(
        d,
        e,
        d.put([(1, "a"), (2, "x")]),
        d.put([(1, "b")]),
        d.get([1, 2, 3]),
        d.delete([1]),
        d.get([1, 2]),
        d.put([(1, "c")]),
    )
    assert d.got(res[2]) == {1: "b", 2: "x"}
    assert d.got(res[4]) == {2: "x"}
    assert d.content(e) == {1: "c", 2: "x"}


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["put", "delete", "get"]),
            st.lists(st.integers(-20, 20), min_size=1, max_size=6),
            st.text(max_size=5),
        ),
        max_size=25,
    )
)
def test_conformance_answers_equal_a_reference_model(driver: Any, steps: list[Any]) -> None:
    d = driver
    e = getattr(d, "_shared", None)
    if e is None:
        e = d._shared = d.engine()
        d.setup(e)
    e.delete(EVERYTHING)
    model: dict[int, str] = {}
    for kind, keys, text in steps:
        if kind == "put":
            pairs = [(k, f"{text}{k}") for k in keys]
            run(d, e, d.put(pairs))
            model.update(pairs)
        elif kind == "delete":
            run(d, e, d.delete(keys))
            for k in keys:
                model.pop(k, None)
        else:
            (res,) = run(d, e, d.get(keys))
            assert d.got(res) == {k: model[k] for k in keys if k in model}
    assert d.content(e) == model


@pytest.mark.parametrize("chunk_first", [True, False])
def test_conformance_a_send_cursor_is_a_snapshot_while_writes_go_on(
    driver: Any, chunk_first: bool
) -> None:
    """Writes after the call, with part of the copy sent before them or none of it (then
    nothing the cursor read ahead can stand in for a copy made on write)."""
    d = driver
    src = d.engine()
    d.setup(src)
    run(d, src, d.put([(k, f"v{k}") for k in range(0, 300, 2)]))
    before = {k: v for k, v in d.content(src).items() if 100 <= k < 200}
    cursor = src.open_send(key_range(100, 200))
    first = cursor.next_chunk(64) if chunk_first else None
    later = [
        d.put([(150, "changed"), (151, "new"), (250, "outside")]),
        d.delete([120, 198, 2]),
        d.put([(120, "back")]),
    ]
    run(d, src, *later)
    dst = d.engine()
    if first is not None:
        dst.receive(
            msgpack.unpackb(msgpack.packb(first, use_bin_type=True), raw=False),
            key_range(100, 200),
        )
    drain(cursor, dst, 128, key_range(100, 200))
    assert d.content(dst) == before  # nothing written after the call leaked in
    # The writes held back while the range travelled apply on top: the copy is the source.
    run(d, dst, *later)
    assert d.content(dst) == {k: v for k, v in d.content(src).items() if 100 <= k < 200 or k == 250}


def test_conformance_a_range_moves_in_chunks_and_leaves_by_a_range_delete(driver: Any) -> None:
    d = driver
    src = d.engine()
    d.setup(src)
    run(d, src, d.put([(k, "x" * (k % 17)) for k in range(-50, 250)]))
    everything = d.content(src)
    moving = key_range(0, 100)
    dst = d.engine()
    chunks = drain(src.open_send(moving), dst, 200, moving)
    assert chunks >= 3
    assert d.content(dst) == {k: v for k, v in everything.items() if 0 <= k < 100}
    src.delete(moving)
    assert d.content(src) == {k: v for k, v in everything.items() if not 0 <= k < 100}
    # The receiver goes on with the range as its own.
    run(d, dst, d.put([(5, "after"), (500, "outside too")]), d.delete([6]))
    got = d.content(dst)
    assert got[5] == "after" and 6 not in got and len(got) == 100


def test_conformance_reads_and_writes_stay_inside_the_ranges_given(driver: Any) -> None:
    """A replica answers for its partition only: writes outside it are not applied,
    reads outside it are not reported (clients combine replicas without doubles)."""
    d = driver
    e = d.engine()
    d.setup(e)
    mine = key_range(0, 10)
    put = d.put([(k, f"v{k}") for k in range(-5, 15)])
    e.apply([(put, intersect(d.ops.part_fun(put, e.placement).ranges, mine))])
    assert set(d.content(e)) == set(range(10))
    get = d.get(list(range(-5, 15)))
    (res,) = e.apply([(get, key_range(3, 6))])
    assert set(d.got(res)) == {3, 4, 5}


def test_conformance_hash_placement_holds_what_its_hash_ranges_name(driver: Any) -> None:
    d = driver
    placement = Placement("hash")
    e = d.engine(placement)
    d.setup(e)
    keys = list(range(200))
    put = d.put([(k, str(k)) for k in keys])
    lo, hi = (2, 0), (2, 1 << 31)  # the lower half of the 32-bit hashes
    e.apply([(put, intersect(d.ops.part_fun(put, placement).ranges, ((lo, hi),)))])
    assert set(d.content(e)) == {k for k in keys if lo <= placement.ekey(k) < hi}
    dst = d.engine(placement)
    drain(e.open_send(((MIN_EKEY, MAX_EKEY),)), dst, 300)
    assert d.content(dst) == d.content(e)


def test_conformance_a_range_scan_under_hash_placement_answers_its_bounds_alone(
    driver: Any,
) -> None:
    """Under hash partitioning a scan's ranges are every bucket: the engine, not the
    placement, keeps the answer to the scan's key bounds."""
    d = driver
    if d.name in TABLES:
        pytest.skip("tables scan by predicates, not by key bounds")
    e = d.engine(Placement("hash"))
    d.setup(e)
    run(d, e, d.put([(k, str(k)) for k in range(200)]))
    for lo, hi in ((50, 80), (None, 7), (190, None), (3, 4)):
        (got,) = run(d, e, ("scan", lo, hi))
        want = [k for k in range(200) if (lo is None or lo <= k) and (hi is None or k < hi)]
        assert sorted(k for k, _ in got) == want, (lo, hi)
        assert all(v == str(k) for k, v in got)


@pytest.mark.parametrize("partitioning", ["range", "hash"])
def test_conformance_a_scan_with_a_limit_answers_the_first_keys_in_order(
    driver: Any, partitioning: str
) -> None:
    """``("scan", lo, hi, limit)``: the first ``limit`` keys of the range in key order
    (a maintainer pages a snapshot so; an answer must fit a frame), and the client's
    combination of several holders' answers keeps the first ``limit`` of them all."""
    d = driver
    if d.name in TABLES:
        pytest.skip("tables scan by predicates, not by key bounds")
    placement = Placement(partitioning)  # type: ignore[arg-type]
    e = d.engine(placement)
    d.setup(e)
    run(d, e, d.put([(k, str(k)) for k in range(0, 400, 3)]))
    for lo, hi, limit in ((None, None, 10), (50, 80, 4), (50, 80, 100), (390, None, 5)):
        op = ("scan", lo, hi, limit)
        (got,) = run(d, e, op)
        want = [k for k in range(0, 400, 3) if (lo is None or lo <= k) and (hi is None or k < hi)]
        assert [k for k, _ in got] == want[:limit], (partitioning, op)
        assert d.ops.combine(op, [got[2:], got[:2]]) == got
        assert d.ops.combine(op, [[(-1, "x")], got]) == [(-1, "x"), *got][:limit]
    with pytest.raises(BadOperation, match="limit"):
        d.ops.part_fun(("scan", None, None, 0), placement)


def test_conformance_an_engine_knows_its_reads_from_its_writes(driver: Any) -> None:
    """A storage process runs an operation sent as a read only if ``is_read`` says so
    (a read reaches one replica): every read of the engine is one, no write and nothing
    malformed is."""
    d = driver
    e = d.engine()
    reads = [d.get([1, 2]), d.get([3])]
    writes = [d.put([(1, "a")]), d.delete([1])]
    assert all(e.is_read(op) for op in reads), reads
    assert not any(e.is_read(op) for op in writes), writes
    for junk in (None, (), [], ("get",), (["get"], (1,)), {"op": ["select"]}, b"get", "get"):
        assert not e.is_read(junk), junk


def test_conformance_a_views_keys_take_no_plain_write(driver: Any) -> None:
    """Keys ``("~view", ...)`` hold version chains, written by maintainers alone: a
    plain value put there refused every later row, and the view's loop (with every view
    sharing its feed) started over each second.  Every key-value engine refuses a plain
    write of one, with the reason, and still takes the key's versions."""
    d = driver
    if not isinstance(d, KVDriver):
        pytest.skip("tables have no view keys")
    e = d.engine()
    d.setup(e)
    key = ("~view", "v", 1)
    for op in (("put", ((key, "x"),)), ("append", ((key, 1),)), ("add", ((key, 1),)),
               ("delete", (key,)), ("put", ((1, "a"), (key, "x")))):  # fmt: skip
        (got,) = e.apply([(op, EVERYTHING)])
        assert isinstance(got, BadOperation), (op, got)
        assert "maintainers alone" in str(got) or d.name == "scan-kv", got  # (integer keys)
    assert d.content(e) == {}
    if d.name != "scan-kv":
        (got,) = e.apply([(("version", ((key, (3, "row")),), 0), EVERYTHING)])
        assert got is None, got


def test_conformance_bad_operations_are_rejected_alike_with_a_clear_message(driver: Any) -> None:
    d = driver
    a, b = d.engine(), d.engine()
    for e in (a, b):
        d.setup(e)
        run(d, e, d.put([(1, "one")]))
    for op in d.bad_ops():
        try:
            ranges = d.ops.part_fun(op, a.placement).ranges
        except BadOperation as e:
            assert str(e)  # the client refuses it before it is sent
            ranges = EVERYTHING
        (ra,) = a.apply([(op, ranges)])
        (rb,) = b.apply([(op, ranges)])
        assert isinstance(ra, BadOperation) and isinstance(rb, BadOperation), op
        assert str(ra) == str(rb) and len(str(ra)) > 10, op
    assert d.content(a) == d.content(b) == {1: "one"}  # and nothing half done


def test_conformance_a_backend_failure_stops_the_storage_process(
    driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = driver
    e = d.engine()
    d.setup(e)
    run(d, e, d.put([(1, "one")]))
    if d.name == "memcached":
        e._server.kill()  # the backing server is gone
        e._server.wait()
    elif d.name in ("scan-kv", *TABLES):
        scan = e if d.name == "scan" else e.scan
        table = scan.tables["kv" if d.name == "scan-kv" else "t"]

        def no_memory(*_a: Any, **_k: Any) -> Any:
            raise MemoryError("no room for a row")

        for attr in ("append", "_put", "scatter"):  # every way rows are written
            monkeypatch.setattr(type(table), attr, no_memory)
    elif d.name in ("log", "scan-log"):

        def disk_full(*_a: Any) -> Any:
            raise OSError(28, "no room left on the device")

        log_ = (e if d.name == "log" else e.data)._log
        monkeypatch.setattr(log_, "flush", disk_full)  # the write of the group commit
    else:

        class Broken(dict):
            def __setitem__(self, *_a: Any) -> None:
                raise MemoryError("no room for an item")

            def get(self, *_a: Any) -> Any:
                raise MemoryError("no room")

        (e.data if d.name == "scan-memory" else e)._data = Broken()
    core = StorageCore("storage:1", e)
    ring = [[encode_key(0), "storage:1"]]  # alone on the ring: it holds everything
    state = [1, e.placement.partitioning, 0, ring, [], [], [], [], [], [], []]
    assert core.joined({"rubberband": state}) == Effects()
    assert core.owned
    op = d.put([(2, "two")])
    header = write_header(d.ops.part_fun(op, e.placement).ranges)
    out = core.deliver([(1, Message("client:c", (("c", 0, ""), 1), header, op))])
    assert out.deliver and type(out.deliver[-1]) is Stop, out
    assert "no room" in out.deliver[-1].reason or d.name == "memcached", out
    assert core.deliver([(2, Message("client:c", (("c", 0, ""), 2), header, op))]) == Effects()


@pytest.mark.parametrize("engine", ["memory", "scan-kv", "scan-memory", "memcached"])
def test_conformance_counters_add_atomically_and_refuse_non_numbers(engine: str) -> None:
    """The key-value engines' ``add``: absent counts as 0, a transfer (deltas summing to 0)
    keeps the total, and a key holding something else refuses the whole operation."""
    make = {
        "memory": MemoryEngine,
        "scan-kv": lambda p: ScanKVEngine(p, block_rows=32),
        "scan-memory": lambda p: ScanMemoryEngine(p, block_rows=32),
        "memcached": _memcached,
    }[engine]
    d = KVDriver(make)
    e = d.engine(None)
    try:
        run(d, e, ("add", ((1, 10), (2, 10))), ("add", ((1, -3), (2, 3))), ("put", ((3, "x"),)))
        assert d.content(e) == {1: 7, 2: 13, 3: "x"}
        (res,) = run(d, e, ("add", ((1, -1), (3, 1))))
        assert isinstance(res, BadOperation) and "holds a str" in str(res)
        (res,) = run(d, e, ("add", ((1, 1.5),)))
        assert isinstance(res, BadOperation) and "integer" in str(res)
        assert d.content(e) == {1: 7, 2: 13, 3: "x"}  # nothing of either applied
    finally:
        e.close()


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["put", "put", "delete", "delete_range", "scan", "items"]),
            st.integers(-30, 30),
            st.integers(0, 12),
        ),
        max_size=60,
    ),
)
def test_the_memory_engines_order_follows_every_write(steps: list[Any]) -> None:
    """Any interleaving of puts, deletes (of keys new, old and deleted before), range
    deletes and ordered reads (scans, ``items``) sees exactly the reference."""
    e = MemoryEngine()
    ops = KVOps()
    model: dict[int, int] = {}

    def ranges(op: Any) -> Any:
        return ops.part_fun(op, e.placement).ranges

    for kind, k, width in steps:
        if kind == "put":
            op: Any = ("put", ((k, k * 10 + width),))
            model[k] = k * 10 + width
        elif kind == "delete":
            op = ("delete", (k,))
            model.pop(k, None)
        elif kind == "delete_range":
            op = ("delete_range", k, k + width + 1)
            model = {j: v for j, v in model.items() if not k <= j < k + width + 1}
        elif kind == "scan":
            op = ("scan", k, k + width + 1)
            (rows,) = e.apply([(op, ranges(op))])
            assert rows == sorted((j, v) for j, v in model.items() if k <= j < k + width + 1)
            continue
        else:
            assert e.items() == sorted(model.items())
            continue
        assert e.apply([(op, ranges(op))]) == [None]
    assert e.items() == sorted(model.items())
    assert e.stats()["items"] == len(model)


def test_a_key_deleted_and_written_again_is_read_once() -> None:
    e = MemoryEngine()
    ops = KVOps()
    for _ in range(3):
        for op in (("put", ((1, "a"), (2, "b"))), ("scan", 0, 9), ("delete", (1,)),
                   ("put", ((1, "c"),)), ("scan", 0, 9), ("delete", (2,)), ("scan", 0, 9),
                   ("put", ((2, "d"),))):  # fmt: skip
            e.apply([(op, ops.part_fun(op, e.placement).ranges)])
        assert e.items() == [(1, "c"), (2, "d")]
        assert e.apply([(("scan", 0, 9), ops.part_fun(("scan", 0, 9), e.placement).ranges)]) == [
            [(1, "c"), (2, "d")]
        ]


LOGGED = ["memory", "scan-memory", "scan-log", "memcached"]
"""The engines that report what each write changed (``apply_logged``: change feeds)."""


@pytest.mark.parametrize("driver", LOGGED, indirect=True)
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["put", "append", "add", "delete", "delete_range", "get"]),
            st.lists(st.integers(-8, 8), min_size=1, max_size=4),
        ),
        max_size=20,
    )
)
def test_conformance_an_engine_reports_what_each_write_changed(
    driver: Any, steps: list[Any]
) -> None:
    """Each key a write changed, with its new value (or its removal): what a change
    feed tells (a key named twice counts once, with its last change)."""
    d = driver
    e = getattr(d, "_logged", None)
    if e is None:
        e = d._logged = d.engine()
    e.delete(EVERYTHING)
    model: dict[int, Any] = {}
    for i, (kind, keys) in enumerate(steps):
        expected: dict[int, tuple[str, Any]] = {}
        if kind == "put":
            op: Any = ("put", tuple((k, f"v{i}") for k in keys))
            for k in keys:
                model[k] = f"v{i}"
                expected[k] = ("put", model[k])
        elif kind == "append":
            op = ("append", tuple((f"l{k}", i) for k in keys))
            for k in keys:
                model[f"l{k}"] = [*model.get(f"l{k}", []), i]  # type: ignore[index]
                expected[f"l{k}"] = ("put", model[f"l{k}"])  # type: ignore[index]
        elif kind == "add":
            op = ("add", tuple((f"n{k}", k) for k in keys))
            for k in keys:
                model[f"n{k}"] = model.get(f"n{k}", 0) + k  # type: ignore[index,operator]
                expected[f"n{k}"] = ("put", model[f"n{k}"])  # type: ignore[index]
        elif kind == "delete":
            op = ("delete", tuple(keys))
            for k in keys:
                if model.pop(k, None) is not None:
                    expected[k] = ("delete", None)
        elif kind == "delete_range":
            lo, hi = min(keys), max(keys) + 1
            op = ("delete_range", lo, hi)
            for k in [k for k in model if type(k) is int and lo <= k < hi]:
                del model[k]
                expected[k] = ("delete", None)
        else:
            op = ("get", tuple(keys))
        ranges = d.ops.part_fun(op, e.placement).ranges
        (result,), (changes,) = e.apply_logged([(op, ranges)])
        assert not isinstance(result, BadOperation), result
        got = {key: (how, value) for key, how, value in changes}
        assert got == expected, (op, got, expected)


@pytest.mark.parametrize("driver", LOGGED, indirect=True)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.tuples(
            st.lists(
                st.tuples(
                    st.integers(-4, 4),
                    st.one_of(
                        st.tuples(st.integers(0, 30)).map(list),
                        st.tuples(st.integers(0, 30), st.text(max_size=3)).map(list),
                    ),
                ),
                min_size=1,
                max_size=5,
            ),
            st.integers(0, 30),
        ),
        max_size=12,
    )
)
def test_conformance_a_key_value_engine_merges_versions_as_the_reference_does(
    driver: Any, ops: list[Any]
) -> None:
    """The views' ``version`` operation (:mod:`rubberband.versions`): each engine that
    holds views keeps the same chains as the reference merge, reports each merged chain
    as a change, and refuses a version of a key holding a plain value, changing nothing."""
    from rubberband.versions import merge

    d = driver
    e = getattr(d, "_logged", None)
    if e is None:
        e = d._logged = d.engine()
    e.delete(EVERYTHING)
    model: dict[int, Any] = {}
    for pairs, floor in ops:
        op = ("version", tuple((k, entry) for k, entry in pairs), floor)
        by_key: dict[int, list[Any]] = {}
        for k, entry in pairs:
            by_key.setdefault(k, []).append(entry)
        for k, entries in by_key.items():
            model[k] = merge(model.get(k), entries, floor)
        ranges = d.ops.part_fun(op, e.placement).ranges
        (result,), (changes,) = e.apply_logged([(op, ranges)])
        assert result is None, result
        assert {k: v for k, how, v in changes} == {k: model[k] for k in by_key}
    assert {k: v for k, v in e.items()} == model
    e.apply(
        [(("put", ((99, "plain"),)), d.ops.part_fun(("put", ((99, "plain"),)), e.placement).ranges)]
    )
    bad = ("version", ((99, [1, "x"]), (3, [1, "y"])), 0)
    (result,) = e.apply([(bad, d.ops.part_fun(bad, e.placement).ranges)])
    assert isinstance(result, BadOperation) and "holds a str" in str(result), result
    assert dict(e.items()).get(3) == model.get(3)  # nothing of the refused op applied


@pytest.mark.parametrize("driver", LOGGED, indirect=True)
def test_conformance_a_key_value_engine_reclaims_only_chains_dead_by_the_position(
    driver: Any,
) -> None:
    """The views' ``reclaim`` operation drops a key only when its chain's newest version
    is an absence at or before the position named; a live row, a row absent only after
    it, a plain value and a missing key stay as they are, and each drop is a change."""
    d = driver
    e = getattr(d, "_logged", None)
    if e is None:
        e = d._logged = d.engine()
    e.delete(EVERYTHING)

    def run(op: Any) -> tuple[Any, Any]:
        (result,), (changes,) = e.apply_logged([(op, d.ops.part_fun(op, e.placement).ranges)])
        return result, changes

    chains = {1: [[3, "a"], [5]], 2: [[3, "a"], [9]], 3: [[3, "a"]], 4: [[5]], 5: [[4, "b"], [6]]}
    for k, entries in chains.items():
        assert run(("version", tuple((k, entry) for entry in entries), 0))[0] is None
    run(("put", ((6, "plain"),)))
    before = dict(e.items())
    result, changes = run(("reclaim", (1, 2, 3, 4, 5, 6, 7), 6))
    assert result is None, result
    assert sorted(k for k, how, _ in changes if how == "delete") == [1, 4, 5]
    assert dict(e.items()) == {k: v for k, v in before.items() if k not in (1, 4, 5)}
    for bad in (("reclaim", (1,), -1), ("reclaim", 1, 5), ("reclaim", (1,))):
        with pytest.raises(BadOperation):
            d.ops.part_fun(bad, e.placement)
