"""A run's throughput and latency over time as a PNG, with the fault windows shaded.

Operations are ``(invoked, completed, ok)`` in seconds since the run's clients started
(``completed`` None for an operation that never completed).  Each second shows how many
operations completed successfully in it and the median and 99th percentile latency of
those; a fault is a shaded band from its start to its heal (a line for instantaneous
faults such as a kill), coloured by kind, so a dip in throughput or a latency spike can
be read against what caused it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

COLOURS = {
    "kill": "#d62728",
    "pause": "#9467bd",
    "partition": "#ff7f0e",
    "slow": "#8c564b",
    "loss": "#e377c2",
    "reconfigure": "#2ca02c",
}


def per_second(
    ops: Iterable[tuple[float, float | None, bool]],
) -> list[dict[str, float | None]]:
    """Per second of the run: ``ok`` operations completed, their p50 and p99 latency
    (None in a second where none completed: no latency, not a latency of 0)."""
    buckets: dict[int, list[float]] = {}
    for invoked, completed, ok in ops:
        if ok and completed is not None:
            buckets.setdefault(int(completed), []).append(completed - invoked)
    if not buckets:
        return []
    out = []
    for s in range(0, max(buckets) + 1):
        lat = sorted(buckets.get(s, ()))
        out.append(
            {
                "t": float(s),
                "ok": float(len(lat)),
                "p50_ms": 1000 * lat[len(lat) // 2] if lat else None,
                "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
            }
        )
    return out


def plot(
    path: Path, title: str, series: list[dict[str, float | None]], faults: list[dict[str, Any]]
) -> str:
    """Write the PNG; returns why it could not (matplotlib missing), or ''."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install .[dev])"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    ts = [p["t"] for p in series]
    top.plot(ts, [p["ok"] for p in series], color="#1f77b4", lw=1.2)
    top.set_ylabel("ok operations / s")
    # A second without a completed operation has no latency: NaN leaves a gap in the line.
    nan = float("nan")
    p50 = [nan if p["p50_ms"] is None else p["p50_ms"] for p in series]
    p99 = [nan if p["p99_ms"] is None else p["p99_ms"] for p in series]
    bottom.plot(ts, p50, color="#1f77b4", lw=1.0, label="p50")
    bottom.plot(ts, p99, color="#d62728", lw=1.0, label="p99")
    bottom.set_yscale("symlog", linthresh=10)
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds")
    seen: set[str] = set()
    for f in faults:
        colour = COLOURS.get(f["kind"], "#7f7f7f")
        label = f["kind"] if f["kind"] not in seen else None
        seen.add(f["kind"])
        start, end = f["start"], f.get("end")
        for ax in (top, bottom):
            if end is None or end - start < 0.2:
                ax.axvline(
                    start, color=colour, lw=1.5, alpha=0.8, label=label if ax is top else None
                )
            else:
                ax.axvspan(start, end, color=colour, alpha=0.18, label=label if ax is top else None)
    if seen:
        top.legend(loc="upper right", fontsize=8, ncol=len(seen))
    bottom.legend(loc="upper left", fontsize=8)
    top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return ""
