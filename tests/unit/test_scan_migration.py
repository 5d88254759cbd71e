"""Partial live migration: consistent send cursors, chunks, receive and delete (5.4)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rubberband.engine import EVERYTHING, Placement, encode_key
from storage_adapters.scan import ScanEngine, ScanOps

OPS = ScanOps()
SCHEMA = [("k", "int64"), ("s", "varchar"), ("f", "float"), ("d", "date"), ("b", "bool")]


def loaded(n: int, placement: Placement | None = None, block_rows: int = 32) -> ScanEngine:
    e = ScanEngine(placement, block_rows=block_rows)
    e.apply([(OPS.create_table("t", SCHEMA, key="k"), EVERYTHING)])
    rows = [
        {
            "k": i,
            "s": None if i % 7 == 0 else f"s{i % 13}",
            "f": i / 4,
            "d": None if i % 5 == 0 else f"2024-03-{i % 28 + 1:02d}",
            "b": i % 3 == 0,
        }
        for i in range(n)
    ]
    assert e.apply([(OPS.insert("t", rows), EVERYTHING)]) == [{"inserted": n}]
    return e


def content(e: ScanEngine, table: str = "t") -> list[tuple]:
    (got,) = e.apply([(OPS.select(table), EVERYTHING)])
    return sorted(zip(*got["data"], strict=True), key=repr)


def drain(
    cursor: Any, into: ScanEngine, max_bytes: int, wire: bool = True, ranges: Any = EVERYTHING
) -> int:
    chunks = 0
    while (chunk := cursor.next_chunk(max_bytes)) is not None:
        if wire:  # what a chunk becomes after a trip through msgpack
            chunk = msgpack.unpackb(msgpack.packb(chunk, use_bin_type=True), raw=False)
        into.receive(chunk, ranges)
        chunks += 1
    cursor.close()
    return chunks


def scribble(e: ScanEngine, round_: int) -> None:
    """Writes of every kind, to every block."""
    base = 1000 * (round_ + 1)
    got = e.apply(
        [
            (OPS.update("t", [("k", "<", 50)], {"s": "changed", "f": -1.0}), EVERYTHING),
            (OPS.delete("t", [("b", "=", True)]), EVERYTHING),
            (OPS.insert("t", [{"k": base + i, "s": "new"} for i in range(40)]), EVERYTHING),
            (OPS.upsert("t", [{"k": 1, "s": "up"}, {"k": base + 999}]), EVERYTHING),
            (OPS.create_table("later", [("x", "int32")], key="x"), EVERYTHING),
        ]
    )
    assert not any(isinstance(r, Exception) for r in got), got


def test_a_cursor_sends_the_rows_as_of_its_opening_whatever_is_written_after() -> None:
    e = loaded(300)
    before = content(e)
    cursor = e.open_send(EVERYTHING)
    scribble(e, 0)
    first = cursor.next_chunk(2000)  # part of it now, the rest after more writes
    receiver = ScanEngine()
    receiver.receive(first, EVERYTHING)
    scribble(e, 1)
    e.apply([(OPS.drop_table("t"), EVERYTHING)])
    drain(cursor, receiver, 2000)
    assert content(receiver) == before
    assert "later" not in receiver.tables  # created after the cursor opened


def test_two_cursors_over_one_block_each_keep_it_as_of_their_opening() -> None:
    """A cursor released each block it had read and then every block again with its
    table: the second release took another cursor's pin, a write changed the arrays that
    cursor still read, and its copy carried a row written after it opened (two sends
    from one storage process, the simulator's seed 43241 on the scan engine)."""
    e = loaded(20)  # one block
    before = content(e)
    a, b = e.open_send(EVERYTHING), e.open_send(EVERYTHING)
    drain(a, ScanEngine(), 1 << 20)  # read and released whole, twice over
    assert e.apply([(OPS.update("t", [("k", "=", 3)], {"s": "after"}), EVERYTHING)])
    receiver = ScanEngine()
    drain(b, receiver, 1 << 20)
    assert content(receiver) == before


def test_writes_after_opening_copy_only_the_blocks_they_touch() -> None:
    e = loaded(320, block_rows=32)  # ten blocks
    cursor = e.open_send(EVERYTHING)
    table = e.tables["t"]
    arrays = [b.cols["f"] for b in table.blocks]
    e.apply([(OPS.update("t", [("k", "=", 40)], {"f": 0.0}), EVERYTHING)])
    copied = [b.cols["f"] is not a for b, a in zip(table.blocks, arrays, strict=True)]
    assert copied == [i == 1 for i in range(10)]
    e.apply([(OPS.update("t", [("k", "=", 41)], {"f": 0.0}), EVERYTHING)])
    assert table.blocks[1].cols["f"] is not arrays[1]
    cursor.close()
    # A closed cursor pins nothing: the next write changes the block in place.
    unpinned = table.blocks[2].cols["f"]
    e.apply([(OPS.update("t", [("k", "=", 70)], {"f": 0.0}), EVERYTHING)])
    assert table.blocks[2].cols["f"] is unpinned


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 200),
    bounds=st.tuples(st.integers(-10, 210), st.integers(-10, 210)),
    max_bytes=st.sampled_from([1, 64, 700, 1 << 20]),
    partitioning=st.sampled_from(["range", "hash"]),
)
def test_send_receive_delete_round_trips_exactly_the_ranges_rows(
    n: int, bounds: tuple[int, int], max_bytes: int, partitioning: str
) -> None:
    placement = Placement(partitioning)  # type: ignore[arg-type]
    sender = loaded(n, placement)
    everything_before = content(sender)
    if partitioning == "range":
        lo, hi = sorted(bounds)
        ranges = ((encode_key(lo), encode_key(hi)),) if lo < hi else ()
        inside = [r for r in everything_before if lo <= r[0] < hi]
    else:  # a range of hashes: the keys whose hash lies in it
        hashes = sorted({placement.ekey(k) for k in range(-10, 211)})
        a, b = sorted(hashes[abs(x) % len(hashes)] for x in bounds)
        ranges = ((a, b),) if a < b else ()
        inside = [r for r in everything_before if a <= placement.ekey(r[0]) < b]
    receiver = ScanEngine(placement)
    chunks = drain(sender.open_send(ranges), receiver, max_bytes, ranges=ranges)
    assert chunks >= 1  # at least the schema travels
    assert receiver.tables["t"].schema == sender.tables["t"].schema
    assert content(receiver) == inside
    if max_bytes == 1:
        assert chunks == max(len(inside), 1)  # never more than about max_bytes: one row
    sender.delete(ranges)
    outside = [r for r in everything_before if r not in inside]
    assert content(sender) == outside
    # Sending it back restores the whole table.
    drain(receiver.open_send(EVERYTHING), sender, 4096)
    assert content(sender) == everything_before


def test_receiving_a_chunk_again_replaces_rather_than_duplicates() -> None:
    e = loaded(50)
    chunks = []
    cursor = e.open_send(EVERYTHING)
    while (c := cursor.next_chunk(500)) is not None:
        chunks.append(c)
    receiver = ScanEngine()
    for c in chunks + chunks[:2]:
        receiver.receive(c, EVERYTHING)
    assert content(receiver) == content(e)
    assert receiver.stats()["items"] == 50


def test_empty_tables_travel_as_schemas_and_mismatches_stop_the_receiver() -> None:
    e = ScanEngine()
    e.apply([(OPS.create_table("empty", [("k", "varchar(4)")], key="k"), EVERYTHING)])
    receiver = ScanEngine()
    assert drain(e.open_send(EVERYTHING), receiver, 100) == 1
    assert receiver.tables["empty"].schema == e.tables["empty"].schema
    other = ScanEngine()
    other.apply([(OPS.create_table("empty", [("k", "int32")], key="k"), EVERYTHING)])
    with pytest.raises(ValueError, match="another schema"):
        drain(e.open_send(EVERYTHING), other, 100)
    with pytest.raises(ValueError, match="not a scan-engine chunk"):
        other.receive({"v": 99}, EVERYTHING)


def test_a_cursor_keeps_decoding_strings_after_the_dictionary_is_rebuilt() -> None:
    e = loaded(20)
    before = content(e)
    cursor = e.open_send(EVERYTHING)
    for i in range(5):  # thousands of strings no row keeps: the dictionary is compacted
        e.apply(
            [
                (OPS.update("t", [("k", "=", j)], {"s": f"tmp{i}-{j}-{n}"}), EVERYTHING)
                for j in range(20)
                for n in range(60)
            ]
        )
    assert len(e.tables["t"].dicts["s"]) < 4200  # of 6,000 strings written
    receiver = ScanEngine()
    drain(cursor, receiver, 300)
    assert content(receiver) == before
    assert sorted(r[1] for r in content(e)) == sorted(f"tmp4-{j}-59" for j in range(20))


def test_delete_everything_and_nothing() -> None:
    e = loaded(40)
    e.delete(())
    assert e.stats()["items"] == 40
    e.delete(EVERYTHING)
    assert e.stats()["items"] == 0
    assert content(e) == []
    assert e.apply([(OPS.insert("t", [{"k": 1}]), EVERYTHING)]) == [{"inserted": 1}]
