"""Latency histograms kept by the protocol cores and exported by the daemons.

Pure data (no clock: the caller passes durations it measured with the time it was
given), so the sans-IO cores can count what only they see, such as how long a batch
waited for Paxos or for its destinations' acknowledgements.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


class Histogram:
    """Durations in seconds, counted in fixed buckets (Prometheus' cumulative form is
    made when exported): cheap enough to observe once per batch."""

    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
               2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)  # fmt: skip

    def __init__(self, buckets: Sequence[float] = BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        i = bisect.bisect_left(self.buckets, seconds)
        if i < len(self.counts):
            self.counts[i] += 1
