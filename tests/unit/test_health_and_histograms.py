"""/metrics histograms in Prometheus' form, and /health that says degraded when a
storage process is behind or incomplete."""

from __future__ import annotations

import time
from types import SimpleNamespace

from ecast.tools.daemon_kit import Histogram, Metrics
from rubberband.storage import StorageCore
from rubberband.tools.daemons import BEHIND_AFTER, storage_health
from storage_adapters.memory import MemoryEngine


def test_a_histogram_exports_cumulative_buckets_sum_and_count() -> None:
    h = Histogram((0.01, 0.1, 1.0))
    for v in (0.005, 0.05, 0.05, 0.5, 7.0):
        h.observe(v)
    m = Metrics()
    m.histogram("x_seconds", h, "how long", role="storage")
    lines = m.text().splitlines()
    assert lines[:2] == ["# HELP x_seconds how long", "# TYPE x_seconds histogram"]
    assert lines[2:] == [
        'x_seconds_bucket{le="0.01",role="storage"} 1',
        'x_seconds_bucket{le="0.1",role="storage"} 3',
        'x_seconds_bucket{le="1",role="storage"} 4',
        'x_seconds_bucket{le="+Inf",role="storage"} 5',
        'x_seconds_sum{role="storage"} 7.605000',
        'x_seconds_count{role="storage"} 5',
    ]


def test_storage_health_is_degraded_when_behind_or_incomplete() -> None:
    core = StorageCore("storage:1", MemoryEngine())
    host = SimpleNamespace(queued_since=None)
    assert storage_health(core, host)["status"] == "ok"  # type: ignore[arg-type]
    host.queued_since = time.monotonic() - BEHIND_AFTER - 1
    h = storage_health(core, host)  # type: ignore[arg-type]
    assert h["status"] == "degraded" and "behind" in h["reasons"][0]
    host.queued_since = time.monotonic()  # waiting, but not for long: fine
    assert storage_health(core, host)["status"] == "ok"  # type: ignore[arg-type]
    core.incomplete = True
    h = storage_health(core, host)  # type: ignore[arg-type]
    assert h["status"] == "degraded" and "incomplete" in h["reasons"][0]
