"""A Crescando-style scan engine (dissertation chapters 2 and 5): main-memory tables with
no index on the data, answered by shared Clock Scans with predicate indexes.

:class:`ScanEngine` is the storage engine (:mod:`rubberband.engine` protocol);
:class:`ScanOps` is its pure client half: builders, ``part_fun`` and ``combine``.
"""

from storage_adapters.scan.client import ScanOps
from storage_adapters.scan.engine import ScanEngine

__all__ = ["ScanEngine", "ScanOps"]
