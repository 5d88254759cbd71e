"""The Spark data source under its first name: ``import rubberband_spark;
rubberband_spark.register(spark)`` keeps working.  It lives in :mod:`rubberband.spark`."""

from __future__ import annotations

from rubberband.spark import register

__all__ = ["register"]
