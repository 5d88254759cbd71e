"""A Spark streaming job that upserts orders into a Rubberband table, exactly once.

Start a cluster on the scan engine, then run the job::

    rubberband cluster up --engine scan --state-dir /tmp/rb
    python examples/spark_stream_orders.py --state-dir /tmp/rb --rate 5000 --seconds 30
    python examples/spark_stream_orders.py --state-dir /tmp/rb --input DIR   # JSON files

With ``--rate`` Spark's ``rate`` source makes the orders (``order_id`` is its counter);
with ``--input`` every JSON-lines file in ``DIR`` is read once (``{"order_id": 1,
"customer": "c7", "amount": 12.5, "day": "2026-11-27"}`` per line) and the job stops when
they are all written (``trigger(availableNow)``).  Stop it with Ctrl-C and start it again
with the same ``--checkpoint``: it carries on where it stopped, and nothing is written
twice (docs/spark.md).  ``examples/spark_orders_report.py`` reads the table back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

SCHEMA = [("order_id", "int64"), ("customer", "varchar(16)"), ("amount", "float"),
          ("day", "date")]  # fmt: skip


async def create_table(state_dir: str) -> None:
    """Define the table (defining it again with the same schema changes nothing; with
    another schema it is refused, and the job stops here)."""
    import rubberband

    st = json.loads((Path(state_dir) / "cluster.json").read_text())
    rb = await rubberband.connect(
        st["routers"],
        f"client:orders-setup-{os.getpid()}",
        ops="storage_adapters.scan:ScanOps",
        credentials=st["client_credentials"],
    )
    try:
        await rb.create_table("orders", schema=SCHEMA, key="order_id")
        print("table orders is defined")
    finally:
        await rb.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state-dir", required=True, help="rubberband cluster up --state-dir")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--rate", type=int, help="orders per second from Spark's rate source")
    source.add_argument("--input", help="a directory of JSON-lines files")
    ap.add_argument("--seconds", type=float, default=30, help="how long --rate runs")
    ap.add_argument("--checkpoint", default="/tmp/rubberband-orders-checkpoint")
    args = ap.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    asyncio.run(create_table(args.state_dir))
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import rubberband.spark

    spark = SparkSession.builder.master("local[2]").appName("orders-stream").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rubberband.spark.register(spark)
    if args.rate:
        orders = (
            spark.readStream.format("rate").option("rowsPerSecond", args.rate).load()
            .select(
                F.col("value").alias("order_id"),
                F.concat(F.lit("c"), (F.col("value") % 1000).cast("string")).alias("customer"),
                ((F.col("value") % 9973) / 100).alias("amount"),
                F.to_date(F.col("timestamp")).alias("day"),
            )
        )  # fmt: skip
    else:
        orders = spark.readStream.schema(
            "order_id long, customer string, amount double, day date"
        ).json(args.input)
    writer = (
        orders.writeStream.format("rubberband")
        .option("state_dir", args.state_dir)
        .option("table", "orders")
        .option("key", "order_id")
        .option("operation", "upsert")
        .option("checkpointLocation", args.checkpoint)
    )
    if args.rate:
        query = writer.trigger(processingTime="1 second").start()
        query.awaitTermination(args.seconds)
        query.stop()
    else:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    print(f"wrote {rows} orders in {len(progress)} micro-batches")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
