"""``scan-log``: the scan engine's tables and the log engine's key-value data on one log.
What survives a crash (tables from a checkpoint's snapshot and the log's table records
after it), a crash in the middle of a checkpoint, damage, and the levelling of a
whole-cluster restart.  The protocol is checked in ``test_engine_conformance.py``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rubberband.engine import EVERYTHING
from rubberband.keys import covers, encode_key, intersect
from rubberband.placement import Keyspace
from storage_adapters.log import CorruptLog
from storage_adapters.memory import KVOps
from storage_adapters.scan import ScanOps
from storage_adapters.scan.log_kv import ScanLogEngine
from tests.unit.test_rubberband_restore import level

OPS, KV = ScanOps(), KVOps()
SCHEMA = [("k", "int64"), ("g", "int64"), ("s", "varchar")]
SMALL = {"segment_mb": 0.05, "checkpoint_mb": 0.1}
"""Segments and checkpoints small enough that a test's writes make several of each."""


def apply(e: ScanLogEngine, op: Any, t: int) -> Any:
    parts = (OPS if isinstance(op, dict) else KV).part_fun(op, e.placement).ranges
    (result,) = e.apply([(op, parts, t)])
    return result


def rows(e: ScanLogEngine) -> dict[int, tuple[int, str]]:
    (res,) = e.apply([(OPS.select("t"), EVERYTHING, -1)])
    return {r["k"]: (r["g"], r["s"]) for r in ScanOps.rows(res)}


def workload(seed: int, n: int) -> list[Any]:
    """Table writes of every kind (inserts, upserts, updates and deletes by predicate)
    and key-value writes, interleaved."""
    rng = random.Random(seed)
    out: list[Any] = [OPS.create_table("t", SCHEMA, key="k")]
    for i in range(n):
        roll = rng.random()
        if roll < 0.45:
            batch = [{"k": rng.randrange(400), "g": rng.randrange(8), "s": f"r{i}" * 20}
                     for _ in range(rng.randrange(1, 20))]  # fmt: skip
            out.append(OPS.upsert("t", list({r["k"]: r for r in batch}.values())))
        elif roll < 0.6:
            g = rng.randrange(8)
            out.append(OPS.update("t", [("g", "=", g)], {"s": f"u{i}"}))
        elif roll < 0.7:
            out.append(OPS.delete("t", [("k", "<", rng.randrange(400)), ("g", "=", i % 8)]))
        else:
            out.append(("put", tuple((rng.randrange(300), f"v{i}") for _ in range(5))))
    return out


def model_of(ops: list[Any]) -> ScanLogEngine:
    """The state those writes make, on an engine that never restarts."""
    m = ScanLogEngine(block_rows=32)
    for t, op in enumerate(ops, 1):
        apply(m, op, t)
    return m


def same(a: ScanLogEngine, b: ScanLogEngine) -> None:
    assert rows(a) == rows(b)
    assert a.items() == b.items()


def test_tables_and_data_survive_restarts_through_checkpoints_compaction_and_redo(
    tmp_path: Path,
) -> None:
    ops = workload(1, 600)
    model = model_of(ops)
    path = str(tmp_path / "e")
    e = ScanLogEngine(block_rows=32, path=path, **SMALL)
    made = {"checkpoints": 0, "compactions": 0, "redone": 0}
    for t, op in enumerate(ops, 1):
        apply(e, op, t)
        if t % 150 == 0:  # a restart now and then, without a checkpoint at close
            made = {k: n + e.data.stats().get(k, 0) for k, n in made.items()}
            e.close(checkpoint=False)
            e = ScanLogEngine(path=path, block_rows=32, **SMALL)
            made["redone"] += e.recovered["redone"]
            assert e.position == t
    assert made["checkpoints"] >= 3 and made["compactions"] >= 1 and made["redone"], made
    same(e, model)
    e.close(checkpoint=False)
    again = ScanLogEngine(path=path, block_rows=32, **SMALL)
    assert again.recovered["checkpoint"] is not None
    same(again, model)
    assert again.position == len(ops)
    # A received copy and a deleted range are in the log too.
    cursor = model.open_send(EVERYTHING)
    fresh = ScanLogEngine(path=str(tmp_path / "copy"), block_rows=32)
    while (chunk := cursor.next_chunk(4096)) is not None:
        fresh.receive(chunk, EVERYTHING)
    fresh.delete(((encode_key(200), EVERYTHING[0][1]),))  # keys from 200 on
    fresh.close(checkpoint=False)
    fresh = ScanLogEngine(path=str(tmp_path / "copy"), block_rows=32)
    assert rows(fresh) == {k: v for k, v in rows(model).items() if k < 200}
    assert fresh.items() == [(k, v) for k, v in model.items() if k < 200]
    for x in (again, fresh, model):
        x.close()


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import storage_adapters.log as logmod
    from tests.unit.test_scan_log_engine import SMALL, apply, workload
    from storage_adapters.scan.log_kv import ScanLogEngine

    path, kill_in = sys.argv[1], sys.argv[2]
    e = ScanLogEngine(path=path, block_rows=32, **SMALL)
    write = logmod._write_file

    def torn(final, bodies):  # the process dies half way through this file of a checkpoint
        if final.suffix == kill_in and len(list(final.parent.glob("ckpt-*.idx"))) >= 1:
            tmp = final.with_suffix(final.suffix + ".tmp")
            with tmp.open("wb") as f:
                for i, body in enumerate(bodies):
                    f.write(logmod.records.pack(body))
                    if i == 1:
                        f.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
        write(final, bodies)

    logmod._write_file = torn
    for t, op in enumerate(workload(2, 800), 1):
        apply(e, op, t)
        print(t, flush=True)
    """
)


@pytest.mark.parametrize("kill_in", [".store", ".idx"])
def test_a_sigkill_in_the_middle_of_a_checkpoint_loses_nothing_acknowledged(
    tmp_path: Path, kill_in: str
) -> None:
    """The process is SIGKILLed while it writes the tables' snapshot, or the index after
    it: the restart ignores the half-written checkpoint, opens the one before, and redoes
    the log after it, up to the last batch the process had returned from."""
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), kill_in], capture_output=True, text=True,
        cwd=Path(__file__).parents[2], timeout=120,
    )  # fmt: skip
    assert p.returncode == -signal.SIGKILL, p.stderr
    acked = int(p.stdout.split()[-1])
    assert list(tmp_path.glob("*.tmp")), "the kill did not land inside a checkpoint"
    e = ScanLogEngine(path=str(tmp_path), block_rows=32, **SMALL)
    assert not list(tmp_path.glob("*.tmp"))
    ops = workload(2, 800)
    # Killed inside the checkpoint of the batch after the last one printed, which was
    # already committed (a checkpoint follows its commit): that one is there too.
    assert e.position == acked + 1
    model = model_of(ops[: acked + 1])
    same(e, model)
    model.close()
    e.close()


def test_a_damaged_tables_snapshot_falls_back_and_a_compacted_log_is_refused(
    tmp_path: Path,
) -> None:
    ops = workload(3, 400)
    path = tmp_path / "e"
    e = ScanLogEngine(path=str(path), block_rows=32, checkpoint_mb=0.05)  # one segment
    for t, op in enumerate(ops, 1):
        apply(e, op, t)
    e.close(checkpoint=False)
    snaps = sorted(path.glob("ckpt-*.store"))
    assert len(snaps) == 2
    data = bytearray(snaps[-1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    snaps[-1].write_bytes(bytes(data))
    model = model_of(ops)
    e = ScanLogEngine(path=str(path), block_rows=32, checkpoint_mb=0.05)
    assert e.recovered["checkpoint"] == snaps[0].with_suffix(".idx").name
    same(e, model)
    e.close(checkpoint=False)
    # Both snapshots gone and the log's first segment compacted away: refused, since
    # the tables' records before it are gone (the key-value data alone would rebuild).
    for snap in path.glob("ckpt-*.store"):
        snap.unlink()
    (first,) = path.glob("log-*.seg")
    first.rename(first.with_name("log-00000002.seg"))  # as if segment 1 were compacted
    with pytest.raises(CorruptLog, match="compacted"):
        ScanLogEngine(path=str(path), block_rows=32)
    model.close()


def test_a_restart_brings_the_tables_of_every_replica_level(tmp_path: Path) -> None:
    """Table writes that reached some replicas of their ranges, not others: after
    ``level`` every replica holds every row of its ranges that any replica wrote (a
    write logged whole by a replica it reached beyond, or by the replica that held all
    of it)."""
    ks = Keyspace(3, [(encode_key(i * 100), f"storage:{i}") for i in range(4)])
    engines = {n: ScanLogEngine(path=str(tmp_path / n), block_rows=32) for _, n in ks.ring()}

    def deliver(n: str, op: Any, t: int) -> bool:
        full = (OPS if isinstance(op, dict) else KV).part_fun(op, engines[n].placement).ranges
        mine = intersect(full, ks.partition(n))
        if mine:
            if not covers(mine, full):
                engines[n].whole(t, [(op, full)])
            assert engines[n].apply([(op, mine, t)]) != [None] or not isinstance(op, dict)
        return bool(mine)

    messages = [
        OPS.create_table("t", SCHEMA, key="k"),
        OPS.upsert("t", [{"k": k, "g": k % 3, "s": "a"} for k in range(0, 400, 7)]),
        OPS.update("t", [("g", "=", 1)], {"s": "b"}),  # every range
        OPS.upsert("t", [{"k": 150, "g": 9, "s": "c"}]),  # storage:1-3's range only
        OPS.delete("t", [("k", "<", 60)]),
        ("put", ((50, "x"), (250, "y"))),
    ]
    cut = {"storage:0": 6, "storage:1": 2, "storage:2": 4, "storage:3": 3}
    for n in engines:
        for t, op in enumerate(messages, 1):
            if t <= cut[n]:
                deliver(n, op, t)
    model = model_of(messages)
    level(engines, ks)
    for n, e in engines.items():
        part = ks.partition(n)
        mine = {k: v for k, v in rows(model).items() if _inside(part, k)}
        assert rows(e) == mine, n
        assert e.items() == [(k, v) for k, v in model.items() if _inside(part, k)], n
        assert e.position == 0  # a new epoch
        e.close()
    model.close()


def _inside(ranges: Any, k: int) -> bool:
    ek = encode_key(k)
    return any(lo <= ek < hi for lo, hi in ranges)


def test_one_sync_per_batch_covers_both_stores(tmp_path: Path) -> None:
    e = ScanLogEngine(path=str(tmp_path), block_rows=32)
    apply(e, OPS.create_table("t", SCHEMA, key="k"), 1)
    before = e.data.stats()["syncs"]
    table = OPS.upsert("t", [{"k": 1, "g": 1, "s": "x"}])
    kv = ("put", ((1, "one"),))
    batch = [(op, (OPS if isinstance(op, dict) else KV).part_fun(op, e.placement).ranges, t)
             for t, op in ((2, table), (3, kv), (4, table))]  # fmt: skip
    e.apply(batch)
    assert e.data.stats()["syncs"] == before + 1
    assert os.path.exists(tmp_path / "LOCK")
    e.close()


def test_each_write_is_stamped_with_its_own_position_and_copies_with_none(
    tmp_path: Path,
) -> None:
    """A batch's key-value writes keep their positions beside its table writes (a
    restart levels by them), and records that no message wrote (a received copy) are in
    no tail."""
    e = ScanLogEngine(path=str(tmp_path / "a"), block_rows=32)
    apply(e, OPS.create_table("t", SCHEMA, key="k"), 1)
    kv = ("put", ((7, "seven"),))
    row = OPS.upsert("t", [{"k": 7, "g": 1, "s": "x"}])
    e.apply([(op, (OPS if isinstance(op, dict) else KV).part_fun(op, e.placement).ranges, t)
             for t, op in ((3, kv), (5, row))])  # fmt: skip
    assert [(t, kind) for t, kind, _ in e.tail(1)] == [(3, "put"), (5, "writes")]
    other = ScanLogEngine(path=str(tmp_path / "b"), block_rows=32)
    cursor = e.open_send(EVERYTHING)
    while (chunk := cursor.next_chunk(4096)) is not None:
        other.receive(chunk, EVERYTHING)
    assert other.tail(-1) == [] and other.items() == [(7, "seven")] and rows(other)
    e.close()
    other.close()
