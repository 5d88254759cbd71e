"""Local durability (2.8): the redo log and rolling snapshots bring an engine back."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from rubberband.engine import EVERYTHING, BadOperation, encode_key
from storage_adapters.scan import ScanEngine, ScanOps

OPS = ScanOps()


def content(e: ScanEngine) -> dict[str, list[tuple]]:
    out = {}
    for name in sorted(e.tables):
        (got,) = e.apply([(OPS.select(name), EVERYTHING)])
        out[name] = sorted(zip(*got["data"], strict=True), key=repr)
    return out


def workload(e: ScanEngine, rounds: int, start: int = 0) -> None:
    for r in range(start, start + rounds):
        got = e.apply(
            [
                (
                    OPS.create_table("t", [("k", "int64"), ("s", "varchar"), ("d", "date")], "k"),
                    EVERYTHING,
                ),
                (
                    OPS.insert(
                        "t",
                        [
                            {"k": r * 10 + i, "s": f"r{r}", "d": dt.date(2024, 1, 1 + i)}
                            for i in range(10)
                        ],
                    ),
                    EVERYTHING,
                ),
                (OPS.update("t", [("k", "<", r * 5)], {"s": f"u{r}"}), EVERYTHING),
                (OPS.delete("t", [("k", "=", r * 3)]), EVERYTHING),
                (OPS.insert("t", [{"k": 0}]), EVERYTHING),  # mostly rejected: k 0 exists
                (OPS.select("t", agg=("count", "*")), EVERYTHING),
            ]
        )
        assert not isinstance(got[2], BadOperation)


def crash(e: ScanEngine) -> None:
    """Stop without closing: the files stay as the last acknowledged call left them (every
    record is written through before its call returns), a snapshot possibly half done."""
    del e


def test_recovery_replays_the_log_after_the_snapshot(tmp_path: Path) -> None:
    e = ScanEngine(durable_dir=tmp_path, fsync=False)
    workload(e, 5)
    e.checkpoint()
    workload(e, 5, start=5)
    other = ScanEngine()
    other.apply(
        [
            (OPS.create_table("m", [("k", "varchar")], "k"), EVERYTHING),
            (OPS.insert("m", [{"k": "a"}, {"k": "b"}]), EVERYTHING),
        ]
    )
    cursor = other.open_send(EVERYTHING)
    while (chunk := cursor.next_chunk(1 << 16)) is not None:
        e.receive(chunk, EVERYTHING)
    e.delete(((encode_key(20), encode_key(30)),))
    e.apply([(OPS.drop_table("nothing"), EVERYTHING)])
    expected = content(e)
    crash(e)
    back = ScanEngine(durable_dir=tmp_path, fsync=False)
    assert content(back) == expected
    stats = back.stats()
    assert stats["recovered_snapshot_lsn"] > 0 and stats["recovered_records"] > 0
    # It goes on logging from where it stopped.
    workload(back, 2, start=10)
    expected = content(back)
    back.close()
    assert content(ScanEngine(durable_dir=tmp_path)) == expected


def test_a_torn_last_record_is_dropped_and_never_appended_to(tmp_path: Path) -> None:
    e = ScanEngine(durable_dir=tmp_path, fsync=False)
    workload(e, 3)
    expected = content(e)
    crash(e)
    (log,) = sorted(tmp_path.glob("log-*.redo"))
    with log.open("ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")  # a record header promising 256 bytes, then less
    back = ScanEngine(durable_dir=tmp_path, fsync=False)
    assert content(back) == expected
    workload(back, 1, start=3)
    expected = content(back)
    crash(back)
    assert content(ScanEngine(durable_dir=tmp_path)) == expected


def test_rolling_snapshots_are_written_beside_the_writes_and_trim_the_log(
    tmp_path: Path,
) -> None:
    e = ScanEngine(durable_dir=tmp_path, fsync=False, snapshot_after_bytes=2000, block_rows=16)
    sizes: list[Any] = []
    for r in range(30):
        workload(e, 1, start=r)
        sizes.append(sum(p.stat().st_size for p in tmp_path.glob("log-*.redo")))
    assert list(tmp_path.glob("snap-*.snap")), "a snapshot completed on its own"
    assert max(sizes) < 3 * 2000 + 5000  # the log is trimmed as snapshots complete
    expected = content(e)
    crash(e)  # possibly with a snapshot half written: the complete one is used
    assert content(ScanEngine(durable_dir=tmp_path, fsync=False)) == expected
    assert not list(tmp_path.glob("*.tmp"))


def test_durability_is_off_by_default_and_reads_are_not_logged(tmp_path: Path) -> None:
    e = ScanEngine()
    assert "log_lsn" not in e.stats()
    d = ScanEngine(durable_dir=tmp_path, fsync=False)
    d.apply([(OPS.create_table("t", [("k", "int64")], "k"), EVERYTHING)])
    size = sum(p.stat().st_size for p in tmp_path.glob("log-*.redo"))
    d.apply([(OPS.select("t"), EVERYTHING), (OPS.insert("t", [{"k": "x"}]), EVERYTHING)])
    assert sum(p.stat().st_size for p in tmp_path.glob("log-*.redo")) == size
