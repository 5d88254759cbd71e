"""Spark jobs as Rubberband clients: the ``rubberband`` PySpark data source.

``pip install '.[spark]'``, then::

    import rubberband.spark
    rubberband.spark.register(spark)
    df.writeStream.format("rubberband").option("state_dir", DIR).option("table", "t")...

:mod:`rubberband.spark.chunks` (rows into deterministic messages) needs no Spark;
:mod:`rubberband.spark.source` is the data source itself.  ``docs/spark.md`` has the
options, the exactly-once guarantee and its limits.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``format("rubberband")`` known to ``spark`` (a SparkSession)."""
    from rubberband.spark.source import register as _register

    _register(spark)
