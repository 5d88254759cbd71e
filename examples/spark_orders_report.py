"""A Spark batch job that reads the ``orders`` table back from Rubberband and aggregates it.

    python examples/spark_orders_report.py --state-dir /tmp/rb [--isolation snapshot]

One Spark partition per storage segment, each one read at the chosen isolation
(``sequential`` by default; docs/spark.md says what each level guarantees across
partitions, and ``--consistent`` reads the whole table as one cut instead).
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--isolation", default="sequential",
                    choices=["sequential", "snapshot", "basic"])  # fmt: skip
    ap.add_argument("--consistent", action="store_true", help="one read, one cut")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import rubberband.spark

    spark = SparkSession.builder.master("local[2]").appName("orders-report").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rubberband.spark.register(spark)
    orders = (
        spark.read.format("rubberband")
        .schema("order_id long, customer string, amount double, day date")
        .option("state_dir", args.state_dir)
        .option("table", "orders")
        .option("key", "order_id")
        .option("isolation", args.isolation)
        .option("consistent", str(args.consistent).lower())
        .load()
    )
    total = orders.agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")).first()
    print(f"orders: {total['orders']}, amount: {total['amount'] or 0:.2f}")
    top = (
        orders.groupBy("customer")
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("amount"))
        .orderBy(F.desc("amount"), "customer")
        .limit(args.top)
    )
    for row in top.collect():
        print(f"  {row['customer']:<8} {row['orders']:>6} orders  {row['amount']:>12.2f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
