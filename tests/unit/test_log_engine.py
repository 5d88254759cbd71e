"""The durable log engine (``storage_adapters.log``): what survives a crash, what a
damaged log does on restart, compaction and its cut point, group commit.  The
protocol itself is checked with every other engine in ``test_engine_conformance.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rubberband.engine import EVERYTHING, Placement
from storage_adapters.log import CorruptLog, LogEngine, records
from storage_adapters.log.index import COMMIT
from storage_adapters.memory import KVOps

OPS = KVOps()


def put(e: LogEngine, pairs: dict[Any, Any], t: int = -1) -> None:
    op = ("put", tuple(pairs.items()))
    assert e.apply([(op, OPS.part_fun(op, e.placement).ranges, t)]) == [None]


def content(e: LogEngine) -> dict[Any, Any]:
    return dict(e.items())


def crash(e: LogEngine) -> None:
    """Drop the engine as a SIGKILL would: no last commit, no checkpoint, no close."""
    for fd in e._log._fds.values():
        os.close(fd)
    e._log._fds.clear()
    os.close(e._lock)
    e._lock = -1


def segments(path: Path) -> list[Path]:
    return sorted(path.glob("log-*.seg"))


def test_writes_survive_a_clean_restart_and_a_crash_with_their_positions(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "one", 2: [1, 2]}, t=5)
    put(e, {"k": {"a": 1}}, t=9)
    e.apply([(("delete", (2,)), OPS.part_fun(("delete", (2,)), e.placement).ranges, 10)])
    e.close()
    e = LogEngine(path=str(tmp_path))
    assert content(e) == {1: "one", "k": {"a": 1}}
    assert e.position == 10 and e.recovered["checkpoint"] is not None
    put(e, {3: "three"}, t=11)
    crash(e)
    e = LogEngine(path=str(tmp_path))
    assert content(e) == {1: "one", "k": {"a": 1}, 3: "three"}
    assert e.position == 11 and e.recovered["redone"] == 1  # the write after the checkpoint
    e.close()


CHILD = textwrap.dedent(
    """
    import sys
    from storage_adapters.log import LogEngine
    from storage_adapters.memory import KVOps
    e = LogEngine(path=sys.argv[1], segment_mb=0.02, checkpoint_mb=0.05)
    ops = KVOps()
    i = 0
    while True:
        op = ("put", tuple((k, "v%d" % i) for k in range(i % 50, i % 50 + 20)))
        e.apply([(op, ops.part_fun(op, e.placement).ranges, i)])
        print(i, flush=True)  # acknowledged: apply returned, the batch is synced
        i += 1
    """
)


def test_every_acknowledged_batch_survives_sigkill(tmp_path: Path) -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert p.stdout is not None
    acked = -1
    for line in p.stdout:
        acked = int(line)
        if acked >= 400:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    for line in p.stdout.read().split():  # printed before the kill, read after
        acked = int(line)
    e = LogEngine(path=str(tmp_path))
    got = content(e)
    # The model: every acknowledged batch applied in order; the one in flight, perhaps.
    model: dict[int, str] = {}
    for i in range(acked + 1):
        model.update({k: f"v{i}" for k in range(i % 50, i % 50 + 20)})
    maybe = dict(model)
    maybe.update({k: f"v{acked + 1}" for k in range((acked + 1) % 50, (acked + 1) % 50 + 20)})
    assert got in (model, maybe)
    assert e.position in (acked, acked + 1)
    assert e.recovered["checkpoint"] is not None  # the child checkpointed as it went
    e.close()


def test_a_torn_last_record_is_cut_and_the_writes_before_it_kept(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "one"}, t=1)
    put(e, {2: "x" * 500}, t=2)
    crash(e)
    seg = segments(tmp_path)[-1]
    os.truncate(seg, seg.stat().st_size - 100)  # the last write, cut short by the crash
    e = LogEngine(path=str(tmp_path))
    assert content(e) == {1: "one"} and e.position == 1
    assert e.recovered["cut_bytes"] > 0
    put(e, {3: "three"}, t=3)  # appended where the torn record was
    e.close()
    e = LogEngine(path=str(tmp_path))
    assert content(e) == {1: "one", 3: "three"}
    e.close()


def test_a_flipped_byte_before_intact_records_refuses_to_open(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "a" * 200}, t=1)
    put(e, {2: "b" * 200}, t=2)
    put(e, {3: "c" * 200}, t=3)
    crash(e)
    seg = segments(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    data[150] ^= 0x40  # inside the first record's value
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match="intact data after it"):
        LogEngine(path=str(tmp_path))


def test_a_flipped_byte_in_a_value_behind_the_checkpoint_fails_the_read(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "a" * 200, 2: "b" * 200}, t=1)
    e.close()  # checkpointed: the restart reads no log, so the damage shows at a read
    seg = segments(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    data[100] ^= 0x01
    seg.write_bytes(bytes(data))
    e = LogEngine(path=str(tmp_path))
    with pytest.raises(CorruptLog, match="checksum"):
        e.items()  # an engine failure (the storage process stops), never a wrong value
    e.close()


def test_a_damaged_checkpoint_falls_back_to_an_older_one_then_to_the_log(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "one"}, t=1)
    e.checkpoint()
    put(e, {2: "two"}, t=2)
    e.close()
    ckpts = sorted(tmp_path.glob("ckpt-*.idx"))
    assert len(ckpts) == 2
    newest = bytearray(ckpts[-1].read_bytes())
    newest[-3] ^= 0xFF
    ckpts[-1].write_bytes(bytes(newest))
    e = LogEngine(path=str(tmp_path))
    assert e.recovered["checkpoint"] == ckpts[0].name and e.recovered["redone"] == 1
    assert content(e) == {1: "one", 2: "two"}
    crash(e)
    for c in tmp_path.glob("ckpt-*.idx"):
        c.write_bytes(b"\x00" * 40)
    e = LogEngine(path=str(tmp_path))
    assert e.recovered["checkpoint"] is None and content(e) == {1: "one", 2: "two"}
    e.close()


def test_compaction_bounds_the_log_and_keeps_every_live_value(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path), segment_mb=0.01, checkpoint_mb=1)
    for i in range(300):  # 20 keys overwritten over and over: mostly garbage
        put(e, {k: f"{i}-{k}-" + "x" * 60 for k in range(20)}, t=i)
        e.apply([(("delete", (99,)), OPS.part_fun(("delete", (99,)), e.placement).ranges, i)])
    s = e.stats()
    assert s["compactions"] > 5 and s["cut_bytes"] > 100_000
    assert s["bytes"] < 4 * (s["live_bytes"] + 10_500)  # bounded, not growing with writes
    want = {k: f"299-{k}-" + "x" * 60 for k in range(20)}
    assert content(e) == want
    crash(e)
    e = LogEngine(path=str(tmp_path))
    assert content(e) == want
    e.close()


def test_a_checkpoint_is_written_every_checkpoint_mb_of_log_and_bounds_the_redo(
    tmp_path: Path,
) -> None:
    """New keys only (nothing to compact): checkpoints come from the log's growth alone,
    so a crash redoes at most ``checkpoint_mb`` of log, not all of it."""
    e = LogEngine(path=str(tmp_path), checkpoint_mb=0.05)
    for i in range(200):
        put(e, {i * 10 + j: "x" * 100 for j in range(10)}, t=i + 1)  # about 1.2 kB a batch
    assert e.stats()["checkpoints"] >= 4 and e.stats()["compactions"] == 0
    crash(e)
    e = LogEngine(path=str(tmp_path))
    assert e.recovered["checkpoint"] is not None and e.recovered["redone"] < 60 * 10
    assert len(content(e)) == 2_000 and e.position == 200
    e.close()


def test_an_open_cursor_is_the_cut_point_compaction_waits_for(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path), segment_mb=0.01, checkpoint_mb=1)
    put(e, {k: f"old-{k}" for k in range(50)}, t=1)
    cursor = e.open_send(EVERYTHING)
    assert e._data.cut is not None
    first = cursor.next_chunk(500)
    for i in range(200):
        put(e, {k: f"new-{i}-" + "y" * 80 for k in range(50)}, t=2 + i)
        e.apply([(("delete", (7,)), OPS.part_fun(("delete", (7,)), e.placement).ranges, 2)])
    assert e.stats()["compactions"] == 0  # every segment may hold a version it reads
    got = list(first)
    while (chunk := cursor.next_chunk(500)) is not None:
        got.extend(chunk)
    assert {k: v for _slot, (k, v) in got} == {k: f"old-{k}" for k in range(50)}
    assert e._data.cut is None and not e._data.old  # closed at its end: versions dropped
    put(e, {1: "after"}, t=300)
    assert e.stats()["compactions"] >= 1
    e.close()


def test_group_commit_syncs_once_per_batch_or_per_interval(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path / "a"))
    base = e.stats()["syncs"]
    op = ("put", tuple((k, k) for k in range(100)))
    batch = [(("put", ((k, k),)), OPS.part_fun(("put", ((k, k),)), e.placement).ranges, k)
             for k in range(100)]  # fmt: skip
    e.apply(batch)
    e.apply_logged(batch)
    assert e.stats()["syncs"] - base == 2  # two batches of a hundred writes: two syncs
    e.apply([((("get", (1,))), OPS.part_fun(("get", (1,)), e.placement).ranges, -1)])
    assert e.stats()["syncs"] - base == 2  # a read writes nothing, syncs nothing
    e.close()
    e = LogEngine(path=str(tmp_path / "b"), fsync="interval", fsync_interval=3600)
    base = e.stats()["syncs"]
    for _ in range(10):
        e.apply([(op, OPS.part_fun(op, e.placement).ranges, 1)])
    assert e.stats()["syncs"] - base <= 1
    e.close()


def test_one_process_per_directory_and_one_partitioning_per_log(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    with pytest.raises(RuntimeError, match="in use"):
        LogEngine(path=str(tmp_path))
    put(e, {1: "one"})
    with pytest.raises(ValueError, match="range partitioning"):
        e.placement = Placement("hash")
    e.close()
    with pytest.raises(ValueError, match="range partitioning"):
        LogEngine(Placement("hash"), path=str(tmp_path))
    e = LogEngine(path=str(tmp_path))
    e.delete(EVERYTHING)
    e.placement = Placement("hash")  # empty: any partitioning
    put(e, {2: "two"})
    e.close()
    e = LogEngine(path=str(tmp_path))
    assert e.placement.partitioning == "hash" and content(e) == {2: "two"}
    e.close()


def test_a_batch_is_in_the_log_whole_or_not_at_all(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "one"}, t=1)
    put(e, {2: "x" * 100, 3: "y" * 100}, t=2)  # one batch, two keys
    crash(e)
    seg = segments(tmp_path)[-1]
    mark = len(records.pack((-1, COMMIT)))
    os.truncate(seg, seg.stat().st_size - mark)  # every record intact, the mark gone
    e = LogEngine(path=str(tmp_path))
    assert content(e) == {1: "one"} and e.position == 1  # neither key of the cut batch
    e.close()


def test_the_tail_says_what_a_restart_levels_and_an_epoch_starts_positions_again(
    tmp_path: Path,
) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "one"}, t=3)
    write = ("put", ((5, "five"), (900, "far")))
    e.whole(4, [(write, OPS.part_fun(write, e.placement).ranges)])
    e.apply([(write, OPS.part_fun(("put", ((5, "five"),)), e.placement).ranges, 4)])
    e.apply([(("delete", (1,)), OPS.part_fun(("delete", (1,)), e.placement).ranges, 6)])
    tail = e.tail(3)
    assert [(t, kind) for t, kind, _ in tail] == [(4, "whole"), (4, "put"), (6, "delete")]
    assert tail[0][2][0][0] == write and tail[1][2] == (5, "five") and tail[2][2] == 1
    e.new_epoch()
    assert e.position == 0 and e.tail(-1) == []
    put(e, {7: "seven"}, t=1)
    crash(e)
    e = LogEngine(path=str(tmp_path))
    assert e.position == 1 and [t for t, _, _ in e.tail(-1)] == [1]
    assert content(e) == {5: "five", 7: "seven"}
    e.close()


def test_epochs_are_numbered_and_survive_a_restart(tmp_path: Path) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "a"}, t=4)
    e.new_epoch()
    e.new_epoch()
    put(e, {2: "b"}, t=1)
    assert (e.epoch, e.position) == (2, 1)
    crash(e)
    e = LogEngine(path=str(tmp_path))  # by redo
    assert (e.epoch, e.position) == (2, 1)
    e.close()
    e = LogEngine(path=str(tmp_path))  # from the checkpoint written at close
    assert (e.epoch, e.position) == (2, 1) and e.recovered["checkpoint"]
    e.close()


def test_a_batch_that_fails_half_way_is_not_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = LogEngine(path=str(tmp_path))
    put(e, {1: "kept"}, t=1)
    append = e._log.append

    def full(body: Any) -> Any:  # the second write of the batch finds the disk full
        if body[2:3] == (3,):
            raise OSError(28, "no room left on the device")
        return append(body)

    monkeypatch.setattr(e._log, "append", full)
    ops = [("put", ((2, "half"),)), ("put", ((3, "never"),))]
    with pytest.raises(OSError):
        e.apply([(o, OPS.part_fun(o, e.placement).ranges, 2) for o in ops])
    e.close()  # a failed engine commits nothing more
    e = LogEngine(path=str(tmp_path))
    assert content(e) == {1: "kept"} and e.position == 1
    e.close()


def _live_bytes(e: LogEngine) -> dict[int, int]:
    """The bytes of each segment's records the index points at, counted from the index."""
    out: dict[int, int] = {}
    for entry in e._data.live.values():
        out[entry[2]] = out.get(entry[2], 0) + entry[4]
    return {n: b for n, b in out.items() if b}


def test_overwrites_and_deletes_across_segments_keep_the_live_byte_count(tmp_path: Path) -> None:
    """What compaction decides by (the live bytes of each segment) stays the sum of the
    records the index points at, through overwrites of keys, deletes, rotations and
    compactions, on the written-out put and the general road alike; no write is refused
    and the log reopens to the same content."""
    import random

    rng = random.Random(7)
    e = LogEngine(path=str(tmp_path), fsync="interval", segment_mb=0.004, checkpoint_mb=0.05)
    want: dict[Any, Any] = {}
    for t in range(1, 2_001):
        k = rng.randrange(20)
        if rng.random() < 0.1:
            op: Any = ("delete", (k,))
            want.pop(k, None)
        else:
            value = f"{t}" + "v" * rng.randrange(200)
            op = ("put", ((k, value),)) if rng.random() < 0.8 else ["put", [[k, value]]]
            want[k] = value
        results, _ = e.apply_logged([(op, OPS.part_fun(op, e.placement).ranges, t)])
        assert results == [None], (t, results)
        live = {n: b for n, b in e._data.live_bytes.items() if b}
        assert live == _live_bytes(e), t
    assert e.stats()["compactions"] > 0 and content(e) == want
    e.close(checkpoint=False)
    again = LogEngine(path=str(tmp_path), fsync="interval", segment_mb=0.004)
    assert content(again) == want
    assert {n: b for n, b in again._data.live_bytes.items() if b} == _live_bytes(again)
    again.close()
