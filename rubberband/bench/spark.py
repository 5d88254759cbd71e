"""``python -m rubberband.bench.spark``: rows per second from a local Spark into a real
cluster, exactly once, with the E-Cast messages per second that carried them.

Starts a cluster with ``rubberband cluster up`` (or uses ``--state-dir`` of a running
one), then writes ``--rows`` rows of ``(key long, value long)`` with the batch writer
(``df.write``; into a table of the scan engine with ``--engine scan``), and again with
the streaming writer over as many other rows stored as Parquet files (``readStream ...
trigger(availableNow)``), and counts what arrived.  The time counted is the write alone
(Spark's start-up and the cluster's are not).  Each writer's first job in the Spark
application (one row) is timed apart, as ``first_job_seconds``: it starts Spark's Python
workers for the data source, a fixed cost an application pays once.  The last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rubberband.tools.cli import run

TABLE = "bench"


def _cli(*args: str) -> None:
    r = run(*args, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"rubberband {' '.join(args[:2])} failed: {r.stdout}{r.stderr}")


def _messages(trace: Path) -> int:
    n = 0
    for f in trace.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            n += int(json.loads(line).get("messages", 0))
    return n


async def _client(state: Path, table: bool) -> Any:
    import rubberband

    st = json.loads((state / "cluster.json").read_text())
    return await rubberband.connect(
        st["routers"],
        f"client:bench-{os.urandom(6).hex()}",
        credentials=st["client_credentials"],
        ops="storage_adapters.scan:ScanOps" if table else None,
        # A sequential count right after a bulk write waits until every holder applied
        # it: seconds at millions of rows, past the default answer timeout.
        answer_timeout=300.0,
    )


async def _create_table(state: Path) -> None:
    rb = await _client(state, True)
    try:
        await rb.create_table(TABLE, schema=[("key", "int64"), ("value", "int64")], key="key")
    finally:
        await rb.close()


async def _count(state: Path, lo: int, hi: int, table: bool) -> tuple[int, float]:
    """Rows found in ``[lo, hi)`` (counted on a table, estimated from a sample of keys),
    and the seconds the sequential read took: it waits until every holder has applied
    the writes before it."""
    rb = await _client(state, table)
    t0 = time.perf_counter()
    try:
        if table:
            t = rb.table(TABLE, key="key")
            found = await t.select(where=[("key", ">=", lo), ("key", "<", hi)], agg=("count", "*"))
            return int(found["count(*)"]), time.perf_counter() - t0
        keys = list(range(lo, hi, max(1, (hi - lo) // 2000)))
        got = await rb.get_many(keys)
        return len(got) * (hi - lo) // max(1, len(keys)), time.perf_counter() - t0
    finally:
        await rb.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rubberband.bench.spark", description=__doc__)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--storage", type=int, default=6)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--engine", default="memory")
    ap.add_argument("--partitioning", default="hash", choices=["hash", "range"])
    ap.add_argument("--rows-per-message", type=int, default=4000)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=2, help="Spark partitions (tasks)")
    ap.add_argument("--cores", type=int, default=2, help="local[N]")
    ap.add_argument("--state-dir", help="a running cluster (default: start one)")
    args = ap.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    work = Path(tempfile.mkdtemp(prefix="rb-spark-bench-"))
    state = Path(args.state_dir) if args.state_dir else work / "cluster"
    started = args.state_dir is None
    if started:
        _cli("cluster", "up", "--routers", str(args.routers), "--supers", "1",
             "--storage", str(args.storage), "--replication", str(args.replication),
             "--engine", args.engine, "--partitioning", args.partitioning,
             "--key-space", str(2 * args.rows), "--state-dir", str(state))  # fmt: skip
    table = args.engine == "scan"
    if table:
        asyncio.run(_create_table(state))
    from pyspark.sql import SparkSession

    import rubberband.spark

    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rubberband.spark.register(spark)
    results: dict[str, Any] = {
        "rows": args.rows,
        "routers": args.routers,
        "storage": args.storage,
        "replication": args.replication,
        "engine": args.engine,
        "partitioning": args.partitioning,
        "rows_per_message": args.rows_per_message,
        "buckets": args.buckets,
        "spark": f"local[{args.cores}], {args.partitions} partitions",
    }
    try:
        options = {
            "state_dir": str(state),
            "rows_per_message": str(args.rows_per_message),
            "buckets": str(args.buckets),
        }
        if table:
            options.update(table=TABLE, key="key")
        results.update(_writers(spark, args, options, work, state, table))
    finally:
        spark.stop()
        if started:
            _cli("cluster", "down", "--state-dir", str(state))
    print(json.dumps(results))
    return 0


def _writers(
    spark: Any, args: argparse.Namespace, options: dict[str, str], work: Path, state: Path,
    table: bool,
) -> dict[str, Any]:  # fmt: skip
    """The batch writer, then the streaming writer over the same number of rows as
    Parquet files: rows per second and messages each."""
    from pyspark.sql import functions as F

    n = args.rows
    out: dict[str, Any] = {}

    def frame(offset: int, rows: int = n) -> Any:
        return spark.range(offset, offset + rows, numPartitions=args.partitions).select(
            F.col("id").alias("key"), (F.col("id") * 3).alias("value")
        )

    def batch(offset: int, rows: int, trace: Path) -> float:
        t0 = time.perf_counter()
        frame(offset, rows).write.format("rubberband").options(**options, trace=str(trace)).mode(
            "append"
        ).save()
        return time.perf_counter() - t0

    def stream(files: Path, trace: Path, ck: Path) -> float:
        t0 = time.perf_counter()
        q = (
            spark.readStream.schema("key long, value long").parquet(str(files))
            .writeStream.format("rubberband").options(**options, trace=str(trace))
            .option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
        )  # fmt: skip
        q.awaitTermination()
        return time.perf_counter() - t0

    # Each writer's first job starts Spark's Python workers for the data source (the
    # writer's planning, the tasks, the commit): timed apart, with one row above the
    # counted ranges, so that the rows/s are those of a running application.
    frame(0).count()
    first = batch(2 * n, 1, work / "trace-first")
    out["batch"] = _report(n, batch(0, n, work / "trace-batch"), _messages(work / "trace-batch"),
                           asyncio.run(_count(state, 0, n, table)), first)  # fmt: skip
    print("batch writer:", out["batch"], flush=True)
    frame(2 * n + 1, 1).write.parquet(str(work / "in-first"))
    frame(n).write.parquet(str(work / "in"))
    first = stream(work / "in-first", work / "trace-first", work / "ck-first")
    seconds = stream(work / "in", work / "trace-stream", work / "ck")
    out["stream"] = _report(n, seconds, _messages(work / "trace-stream"),
                            asyncio.run(_count(state, n, 2 * n, table)), first)  # fmt: skip
    print("stream writer:", out["stream"], flush=True)
    return out


def _report(
    rows: int, seconds: float, messages: int, counted: tuple[int, float], first: float
) -> dict[str, Any]:
    found, count_seconds = counted
    return {
        "first_job_seconds": round(first, 2),
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "messages": messages,
        "messages_per_s": round(messages / seconds, 1),
        "rows_found_estimate": found,
        "count_seconds": round(count_seconds, 2),
    }


if __name__ == "__main__":
    raise SystemExit(main())
