"""What ``ecast bench`` reports about memory: growth must be told from breathing."""

from __future__ import annotations

import math

from ecast.bench import _rss_summary


def test_a_breathing_heap_is_flat_and_a_leak_has_a_slope() -> None:
    warmup = [(0.25 * i, 40.0 + i, True) for i in range(4)]
    # A heap that swings by a megabyte around 45 MB for a minute: flat.
    breathing = [(5.0 + i, 45.0 + (i % 3 == 0) * 1.0, False) for i in range(60)]
    flat = _rss_summary(warmup + breathing)
    assert flat["warm"] == 43.0 and flat["min"] == 45.0 and flat["max"] == 46.0
    assert abs(flat["slope_mb_per_min"]) < 0.1  # its phase tilts the fit slightly
    # The same with a leak of 1 MB a minute under it.
    leak = [(t, mb + (t - 5.0) / 60, w) for t, mb, w in breathing]
    grown = _rss_summary(warmup + leak)
    assert math.isclose(grown["slope_mb_per_min"], 1.0 + flat["slope_mb_per_min"], abs_tol=1e-9)
    assert grown["end"] == leak[-1][1]


def test_a_run_too_short_for_a_trend_reports_what_it_has() -> None:
    assert _rss_summary([(0.0, 40.0, True)]) == {"warm": 40.0, "end": 40.0}
    one = _rss_summary([(0.0, 40.0, True), (6.0, 41.0, False)])
    assert one == {"warm": 40.0, "end": 41.0, "min": 41.0, "max": 41.0}
