"""The ``rubberband`` PySpark data source against a real cluster: a local Spark
(``local[2,2]``: two cores, a failed task is retried once) streams into 3 routers, 1 super
and 3 storage processes started with ``rubberband cluster up``.

Exactly once is checked with list-appends (key ``id % 101``, value ``id``): a row written
twice shows as a doubled value, a row lost as a missing one, which upserts would hide."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType

import rubberband.sdk as rbsdk
import rubberband.spark
from tests.integration.test_rubberband import cli

PY = sys.executable
KEYS = 101
ROWS = 10_000
"""Rows per partition in the retry test: enough that the failed attempt's writer gets
whole Arrow batches before its input ends (with fewer, PySpark fails its read of the
first batch instead, which tests less)."""
FAIL_AT = 8_000


def up(d: Path, *extra: str) -> Path:
    r = cli("cluster", "up", "--routers", "3", "--supers", "1", "--storage", "3",
            "--state-dir", str(d), *extra)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return d


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = PY
    s = (
        SparkSession.builder.master("local[2,2]")
        .appName("rubberband-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "512")
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    rubberband.spark.register(s)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def kv_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("spark") / "kv"
    try:
        yield up(d, "--partitioning", "hash", "--engine", "memory")
    finally:
        cli("cluster", "down", "--state-dir", str(d))


@pytest.fixture(scope="module")
def scan_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("spark") / "scan"
    try:
        yield up(d, "--engine", "scan", "--key-space", "100000")
    finally:
        cli("cluster", "down", "--state-dir", str(d))


def client(d: Path, ops: str | None = None) -> Any:
    st = json.loads((d / "cluster.json").read_text())
    return rbsdk.connect(
        st["routers"],
        f"client:test-{os.urandom(6).hex()}",
        ops=ops,
        credentials=st["client_credentials"],
    )


def lists(d: Path) -> dict[Any, list[Any]]:
    async def go() -> dict[Any, list[Any]]:
        rb = await client(d)
        try:
            return dict(await rb.scan())
        finally:
            await rb.close()

    return asyncio.run(go())


def assert_exactly_once(found: dict[Any, list[Any]], prefix: str, ids: range) -> None:
    """Every id under its key exactly once: nothing missing, nothing doubled."""
    mine = {k: v for k, v in found.items() if isinstance(k, str) and k.startswith(prefix)}
    seen = sorted(x for v in mine.values() for x in v)
    doubled = len(seen) - len(set(seen))
    missing = sorted(set(ids) - set(seen))
    assert doubled == 0 and not missing, (
        f"{doubled} rows doubled, {len(missing)} missing (first {missing[:5]})"
    )
    assert len(seen) == len(ids)
    for k, v in mine.items():
        assert all(f"{prefix}{x % KEYS}" == k for x in v)


def write_files(d: Path, files: int, rows: int) -> None:
    d.mkdir(parents=True)
    for f in range(files):
        with open(d / f"part-{f:03d}.json", "w") as out:
            for i in range(f * rows, (f + 1) * rows):
                out.write(json.dumps({"id": i}) + "\n")


def traces(d: Path) -> list[dict[str, Any]]:
    out = []
    for f in d.glob("*.jsonl") if d.exists() else ():
        out.extend(json.loads(line) for line in f.read_text().splitlines())
    return out


def appends(df: Any, prefix: str) -> Any:
    return df.select(
        F.concat(F.lit(prefix), (F.col("id") % KEYS).cast("string")).alias("key"),
        F.col("id").alias("value"),
    )


def stream(spark: SparkSession, d: Path, cluster: Path, trace: Path, ck: Path, **kw: Any) -> Any:
    df = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(d))
    df = kw.pop("transform", lambda x: x)(df)
    return (
        appends(df, kw.pop("prefix"))
        .writeStream.format("rubberband")
        .option("state_dir", str(cluster))
        .option("operation", "append")
        .option("rows_per_message", kw.pop("rows_per_message", 50))
        .option("trace", str(trace))
        .option("checkpointLocation", str(ck))
    )


def test_a_retried_task_whose_input_ended_early_lands_every_row_once(
    spark: SparkSession, kv_cluster: Path, tmp_path: Path
) -> None:
    """The first attempt of partition 0 sees its upstream fail after about half its rows
    (its input just ends, PySpark raises nothing in the writer) and after some of its
    messages were acknowledged; the retry resubmits in the same session."""
    src = tmp_path / "in"
    write_files(src, 1, 2 * ROWS)
    marker = tmp_path / "failed"

    def flaky(i: int, seen: list[int] = [0]) -> int:  # noqa: B006 (one count per task)
        from pyspark import TaskContext

        tc = TaskContext.get()
        seen[0] += 1
        if tc.attemptNumber() == 0 and tc.partitionId() == 0 and seen[0] == FAIL_AT:
            time.sleep(3)  # the writer's earlier messages become stable meanwhile
            marker.write_text("failed")
            raise RuntimeError("upstream fails on the first attempt")
        return i

    # Partition 0 holds about ROWS rows; its upstream fails at its FAIL_AT-th.
    trace = tmp_path / "trace"
    q = (
        stream(
            spark,
            src,
            kv_cluster,
            trace,
            tmp_path / "ck",
            prefix="a:",
            transform=lambda df: df.repartition(2).select(
                F.udf(flaky, LongType())(F.col("id")).alias("id")
            ),
        )
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    assert marker.exists(), "the upstream never failed: the test did not test anything"
    tasks = [t for t in traces(trace) if t["what"] == "task" and t["partition"] == 0]
    first = [t for t in tasks if t["attempt"] == 0]
    retry = [t for t in tasks if t["attempt"] == 1]
    assert first and retry, tasks
    assert 0 < first[0]["rows"] < retry[0]["rows"], "the first attempt's input ended early"
    assert first[0]["messages"] > 0
    assert_exactly_once(lists(kv_cluster), "a:", range(2 * ROWS))


def test_a_stopped_query_resumes_from_its_checkpoint_and_a_replay_writes_nothing(
    spark: SparkSession, kv_cluster: Path, tmp_path: Path
) -> None:
    src = tmp_path / "in"
    write_files(src, 6, 2000)
    trace = tmp_path / "trace"
    ck = tmp_path / "ck"

    def slow(i: int) -> int:
        if i % 200 == 0:
            time.sleep(0.1)  # batches of 2,000 rows take about 2 s
        return i

    def query() -> Any:
        return stream(
            spark,
            src,
            kv_cluster,
            trace,
            ck,
            prefix="b:",
            transform=lambda df: df.repartition(2).select(
                F.udf(slow, LongType())(F.col("id")).alias("id")
            ),
        )

    q = query().trigger(processingTime="100 milliseconds").start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        tasks = [t for t in traces(trace) if t["what"] == "task" and t["epoch"] >= 1]
        if tasks:  # batch 1 is being written: a task of it finished, the batch not
            break
        time.sleep(0.05)
    q.stop()
    committed = {t["epoch"] for t in traces(trace) if t["what"] == "commit"}
    assert tasks and max(committed, default=-1) < 6, "stopped before the last batch"
    q = query().trigger(availableNow=True).start()
    q.awaitTermination(240)
    assert_exactly_once(lists(kv_cluster), "b:", range(12000))

    # Forget that the last batch was committed: Spark replays it; its sessions were
    # closed, so every message is refused and the replay succeeds without writing.
    last = max(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    for f in (str(last), f".{last}.crc"):  # the log entry and its checksum
        (ck / "commits" / f).unlink(missing_ok=True)
    shutil.rmtree(trace)
    q = query().trigger(availableNow=True).start()
    q.awaitTermination(240)
    replay = traces(trace)
    assert replay and all(t["epoch"] == last for t in replay), replay
    assert all(t["closed"] for t in replay), replay
    assert [t["messages"] for t in replay if t["what"] == "commit"] == [0]
    assert_exactly_once(lists(kv_cluster), "b:", range(12000))


def changes(
    spark: SparkSession, cluster: Path, prefix: str, since: int,
    schema: str = "position long, key string, kind string, value string",
) -> Any:  # fmt: skip
    """A change stream of the keys starting with ``prefix`` (the bound above them: its
    last character one up), from position ``since``."""
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return (
        spark.readStream.format("rubberband")
        .schema(schema)
        .option("state_dir", str(cluster))
        .option("lo", json.dumps(prefix))
        .option("hi", json.dumps(hi))
        .option("since", str(since))
    )


def test_a_change_stream_lands_every_acknowledged_write_once_across_a_failed_task_and_a_restart(
    spark: SparkSession, kv_cluster: Path, tmp_path: Path
) -> None:
    """``readStream.format("rubberband")`` over the keys ``f:...`` into a checkpointed
    Parquet sink, in two runs of one query with writes before each: the first run's
    task fails once after reading its batch (a UDF downstream of the source), and the
    sink holds every acknowledged write exactly once, at its position, a multi-key
    write's keys at one position, and nothing outside the range."""
    marker = tmp_path / "failed"
    out, ck = tmp_path / "out", tmp_path / "ck"

    async def writes(first: int, n: int, pause: float = 0.0, query: Any = None) -> int:
        rb = await client(kv_cluster)
        try:
            page = await rb.changes(None)
            await rb.put("g:outside", first)  # outside the stream's range
            for i in range(first, first + n, 10):
                await asyncio.gather(*(rb.put(f"f:{j % 37:02d}", j) for j in range(i, i + 9)))
                await rb.put_many({f"f:m{i}": i + 9, f"f:n{i}": i + 9})
                await asyncio.sleep(pause)
                if query is not None and (i // 10) % 5 == 4:
                    await a_batch_more(query)
            await rb.delete(f"f:{first % 37:02d}")
            return int(page.position)
        finally:
            await rb.close()

    async def a_batch_more(q: Any) -> None:
        """Every 50 writes, a micro-batch more read beside them (a minute at most): on a
        machine three times slower, 40 pauses of 0.1 s passed within five batches."""
        seen, deadline = len(q.recentProgress), time.monotonic() + 60
        while len(q.recentProgress) <= seen and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    def fail_once(v: str) -> str:
        from pyspark import TaskContext

        if TaskContext.get().attemptNumber() == 0 and not marker.exists():
            marker.write_text("failed")
            raise RuntimeError("the sink's first attempt fails")
        return v

    def query(since: int, **trigger: Any) -> Any:
        df = changes(spark, kv_cluster, "f:", since).load()
        value = F.udf(fail_once, StringType())(F.col("value")).alias("value")
        return (
            df.select("position", "key", "kind", value)
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(**trigger)
            .start()
        )

    def to_the_end(since: int) -> None:
        q = query(since, availableNow=True)
        q.awaitTermination(240)
        assert q.exception() is None, q.exception()

    start = asyncio.run(writes(0, 400))
    to_the_end(start)
    assert marker.exists(), "no task failed: the test did not test anything"
    q = query(0, processingTime="100 milliseconds")  # the checkpoint's offset wins over since
    deadline = time.monotonic() + 120
    while not q.recentProgress and time.monotonic() < deadline:
        time.sleep(0.1)
    asyncio.run(writes(400, 400, pause=0.1, query=q))  # while micro-batches read
    batches = len(q.recentProgress)
    q.stop()
    assert batches > 5, "the writes did not go on while batches were read"
    to_the_end(0)
    rows = [(r.position, r.key, r.kind, r.value) for r in spark.read.parquet(str(out)).collect()]
    assert len(rows) == len({(p, k) for p, k, _, _ in rows}), "a change twice"
    puts = sorted(int(v) for _, _, kind, v in rows if kind == "put")
    written = sorted([*range(800), *(i + 9 for i in range(0, 800, 10))])
    assert puts == written, "each acknowledged write once, nothing else"
    assert {k for _, k, _, _ in rows} <= {f"f:{j:02d}" for j in range(37)} | {
        f"f:{c}{i}" for c in "mn" for i in range(0, 800, 10)
    }
    deletes = [(p, k) for p, k, kind, _ in rows if kind == "delete"]
    assert [k for _, k in deletes] == ["f:00", "f:30"]  # 0 % 37 and 400 % 37
    by_position: dict[int, set[str]] = {}
    for p, k, _, _ in rows:
        by_position.setdefault(p, set()).add(k)
    for i in range(0, 800, 10):
        (p,) = {p for p, k, _, _ in rows if k == f"f:m{i}"}
        assert by_position[p] == {f"f:m{i}", f"f:n{i}"}, "a multi-key write is one position"
    last = {}
    for _p, k, kind, v in sorted(rows):
        last[k] = None if kind == "delete" else v
    now = lists(kv_cluster)
    assert {k: v for k, v in last.items() if v is not None} == {
        k: str(v) for k, v in now.items() if k.startswith("f:")
    }


def test_a_change_stream_takes_at_most_its_limit_of_changes_a_batch(
    spark: SparkSession, kv_cluster: Path, tmp_path: Path
) -> None:
    """``max_changes_per_batch``: every micro-batch takes at most that many changes, a
    multi-key write whole (its position is never split), and together they are every
    write once, in position order."""

    async def writes() -> int:
        rb = await client(kv_cluster)
        try:
            start = (await rb.changes(None)).position
            for i in range(0, 300, 10):
                await asyncio.gather(*(rb.put(f"h:{j:03d}", j) for j in range(i, i + 9)))
                await rb.put_many({f"h:m{i}": i + 9, f"h:n{i}": i + 9})
            return int(start)
        finally:
            await rb.close()

    start = asyncio.run(writes())
    batches: list[list[tuple[int, str]]] = []
    q = (
        changes(spark, kv_cluster, "h:", start, "position long, key string")
        .option("max_changes_per_batch", "25")
        .load()
        .writeStream.foreachBatch(
            lambda df, _id: batches.append(sorted((r.position, r.key) for r in df.collect()))
        )
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    assert q.exception() is None, q.exception()
    sizes = [len(b) for b in batches if b]
    assert len(sizes) >= 12 and max(sizes) <= 25, sizes
    rows = [r for b in batches for r in b]
    assert rows == sorted(rows) and len(rows) == len(set(rows)) == 330
    for i in range(0, 300, 10):  # the two keys of one write in one batch
        (together,) = [b for b in batches if (f"h:m{i}" in {k for _, k in b})]
        assert f"h:n{i}" in {k for _, k in together}


def test_a_batch_write_reads_back_as_a_sequential_read_returns_it(
    spark: SparkSession, scan_cluster: Path
) -> None:
    async def create() -> None:
        rb = await client(scan_cluster, "storage_adapters.scan:ScanOps")
        try:
            await rb.create_table(
                "purchases",
                schema=[("id", "int64"), ("customer", "varchar(12)"), ("amount", "float"),
                        ("day", "date")],
                key="id",
            )  # fmt: skip
        finally:
            await rb.close()

    asyncio.run(create())
    n = 20_000
    df = spark.range(n).select(
        F.col("id"),
        F.concat(F.lit("c"), (F.col("id") % 97).cast("string")).alias("customer"),
        (F.col("id") * 0.25).alias("amount"),
        F.date_add(F.lit("2026-01-01").cast("date"), (F.col("id") % 365).cast("int")).alias("day"),
    )
    options = {"state_dir": str(scan_cluster), "table": "purchases", "key": "id"}
    df.write.format("rubberband").options(**options).mode("append").save()

    async def sequential() -> list[tuple[Any, ...]]:
        rb = await client(scan_cluster, "storage_adapters.scan:ScanOps")
        try:
            rows = await rb.table("purchases", key="id").select()
            return sorted((r["id"], r["customer"], r["amount"], r["day"]) for r in rows)
        finally:
            await rb.close()

    expected = asyncio.run(sequential())
    assert len(expected) == n
    schema = "id long, customer string, amount double, day date"
    for isolation, extra in [("sequential", {}), ("snapshot", {}), ("basic", {}),
                             ("sequential", {"consistent": "true"})]:  # fmt: skip
        reader = spark.read.format("rubberband").schema(schema).options(**options, **extra)
        got_df = reader.option("isolation", isolation).load()
        if not extra:
            assert got_df.rdd.getNumPartitions() == 3  # one per storage segment
        got = sorted((r.id, r.customer, r.amount, r.day.isoformat()) for r in got_df.collect())
        assert got == expected, isolation


def test_the_example_pipelines_stream_orders_in_and_report_them(
    scan_cluster: Path, tmp_path: Path
) -> None:
    src = tmp_path / "orders"
    src.mkdir()
    with open(src / "o.json", "w") as out:
        for i in range(3000):
            row = {
                "order_id": 10**6 + i,
                "customer": f"c{i % 7}",
                "amount": 1.5,
                "day": "2026-11-27",
            }
            out.write(json.dumps(row) + "\n")
    root = Path(__file__).resolve().parents[2] / "examples"

    def run(script: str, *args: str) -> str:
        p = subprocess.run([PY, str(root / script), "--state-dir", str(scan_cluster), *args],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        return p.stdout

    out = run("spark_stream_orders.py", "--input", str(src), "--checkpoint", str(tmp_path / "ck"))
    assert "wrote 3000 orders" in out
    report = run("spark_orders_report.py", "--top", "7")
    # c0 has orders 0, 7, 14, ...: 429 of the 3,000, each of 1.5
    assert "orders: 3000, amount: 4500.00" in report, report
    assert re.search(r"c0 +429 orders +643\.50", report), report
