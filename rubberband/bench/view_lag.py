"""How far views fall behind a benchmark's load, and how often their maintainer started
them over: ``rubberband bench views`` prints it beside each peak it measures with views,
since a cost figure stands only for views that were kept at that rate.  Read once the
load stopped alone, a view caught up in the moment before (it was 4 positions behind
after 8-s runs in which, over a minute, it fell behind by thousands of writes a
second), so the lag is sampled while the load runs."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

STARTS = "rubberband_view_starts_total{view="
HELD = "rubberband_intake_held_seconds_total"


def _text(metrics: str) -> str:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        return str(r.read().decode())


def starts(metrics: str) -> dict[str, int]:
    """Per view, how many times the maintainer serving ``/metrics`` at ``metrics``
    (``HOST:PORT``) started it from a snapshot (1: never over; a feed compacted under a
    maintainer that fell behind starts it over)."""
    text = _text(metrics)
    return {
        line[len(STARTS) + 1 : line.index('"}')]: int(float(line.split()[-1]))
        for line in text.splitlines()
        if line.startswith(STARTS)
    }


def storage_metrics(st: dict[str, Any]) -> list[str]:
    """The ``/metrics`` addresses of a local cluster's storage processes (``st``: its
    ``cluster.json``)."""
    return [f"127.0.0.1:{port}" for port in st["storage"].values()]


def held(storage: list[str]) -> float:
    """Seconds the storage processes serving ``/metrics`` at ``storage`` held their
    intake back for views' maintainers far behind them (``rubberband.holds``), summed:
    a view kept by slowing the writers, not by keeping up with them."""
    return sum(
        float(line.split()[-1])
        for address in storage
        for line in _text(address).splitlines()
        if line.startswith(HELD)
    )


async def lag(connect: Callable[[], Awaitable[Any]], metrics: str, during: threading.Event) -> Any:
    """Per view, the positions its progress is behind a sequential read, sampled every
    second until ``during`` is set (the most: ``behind_max``) and once more then
    (``behind``), and its starts; ``connect`` makes the client that reads them."""
    from rubberband.tools.views import view_status

    rb = await connect()
    most: dict[str, int] = {}
    try:
        views = await rb.views()  # (defined before the load: read once)
        while True:
            behind = {v.name: (await view_status(rb, v)).get("behind") for v in views}
            if during.is_set():
                break
            for name, b in behind.items():
                most[name] = max(most.get(name, 0), b or 0)
            await asyncio.sleep(1.0)
    finally:
        await rb.close()
    began = await asyncio.to_thread(starts, metrics)
    return {
        name: {"behind_max": most.get(name), "behind": b, "starts": began.get(name)}
        for name, b in sorted(behind.items())
    }


def watched(
    load: Callable[[], dict[str, Any]],
    connect: Callable[[], Awaitable[Any]],
    metrics: str,
    storage: list[str],
) -> dict[str, Any]:
    """``load()``'s figures, with the views' lag (:func:`lag`) watched meanwhile from a
    thread of its own, under ``views_at_end``, and how long the storage processes
    (``/metrics`` at ``storage``) held the writers back for them, ``writers_held_s``."""
    stop, seen = threading.Event(), {}
    before = held(storage)
    watch = threading.Thread(
        target=lambda: seen.update(asyncio.run(lag(connect, metrics, stop))), daemon=True
    )
    watch.start()
    try:
        r = load()
    finally:
        stop.set()
        watch.join(60)
    r["views_at_end"] = seen
    r["writers_held_s"] = round(held(storage) - before, 2)
    return r


def behind_text(r: dict[str, Any]) -> str:
    """How far behind the load each view fell (the most a sample found while it ran, in
    positions and in seconds of the run's writes), where it stood once the load stopped,
    and its starts: the writes/s beside it kept a view only where it stayed a moment
    behind, started once; and the seconds its holders held the writers back for it,
    summed over storage processes (a view kept at a rate slowed for it)."""
    rate = r["writes_per_s"] or 1
    parts = []
    for name, v in r["views_at_end"].items():
        most, after = v["behind_max"], v["behind"]
        during = "no sample" if most is None else f"{most:,} ({most / rate:.2f} s of writes)"
        parts.append(f"{name} behind at most {during}, {after} after; started {v['starts']}x")
    held_s = f"; writers held {r['writers_held_s']:.1f} s" if "writers_held_s" in r else ""
    return "views behind the load: " + "; ".join(parts) + held_s
