"""Client leases on real daemons: a dead or paused client cannot stall the group."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ecast
from ecast.core.config import ROUTERS
from ecast.tools.local import LocalCluster
from tests.integration.cluster import SECRET, Recorder, check_guarantees

# Acknowledgements must resume within the lease plus 1 s: measured with the machine to itself.
pytestmark = pytest.mark.exclusive

LEASE = 5.0  # the routers' default


@pytest.fixture
def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = LocalCluster(tmp_path, SECRET)
    yield c
    c.stop_all()


def start_victim(cluster: LocalCluster, name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.lease_client",
            "--routers",
            ",".join(cluster.addresses()),
            "--name",
            name,
            "--secret",
            SECRET,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert json.loads(line)["event"] == "joined", line
    return proc


async def keep_submitting(rec: Recorder, stop: asyncio.Event, acked_at: list[float]) -> None:
    i = 0
    pending: list[asyncio.Future[ecast.Ack]] = []

    def done(fut: asyncio.Future[ecast.Ack]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            ack = fut.result()
            rec.acked[ack.id] = ack.t
            acked_at.append(time.monotonic())

    while not stop.is_set():
        try:
            fut = await rec.client.enqueue(f"{rec.name}-{i}".encode(), timeout=LEASE * 3)
        except TimeoutError:
            break  # the group stalled: the test's assertions say so
        fut.add_done_callback(done)
        pending.append(fut)
        i += 1
        await asyncio.sleep(0.005)
    await asyncio.wait(pending, timeout=30)


def longest_gap(times: list[float], after: float) -> float:
    ts = sorted(t for t in times if t >= after)
    return max((b - a for a, b in itertools.pairwise(ts)), default=float("inf"))


async def survivors(cluster: LocalCluster) -> list[Recorder]:
    out = []
    for name in ("s1", "s2"):
        c = await ecast.connect(cluster.addresses(), name=name, secret=SECRET)
        out.append(Recorder(c))
    return out


async def test_a_killed_client_stalls_acknowledgements_for_at_most_its_lease(
    cluster: LocalCluster,
) -> None:
    cluster.start_group(3)
    victim = start_victim(cluster, "victim")
    recs = await survivors(cluster)
    stop = asyncio.Event()
    acked_at: list[float] = []
    tasks = [asyncio.create_task(keep_submitting(r, stop, acked_at)) for r in recs]
    await asyncio.sleep(2.0)
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.wait(5)
    await asyncio.sleep(LEASE + 4.0)
    stop.set()
    await asyncio.gather(*tasks)
    gap = longest_gap(acked_at, killed - 0.5)
    assert gap <= LEASE + 1.0, f"acknowledgements stopped for {gap:.2f} s after the kill"
    assert max(acked_at) > killed + LEASE  # and they did resume
    await asyncio.sleep(0.5)
    assert check_guarantees(recs, recs) == []  # nothing acknowledged was lost
    health = cluster.routers["r1"].health()
    assert health is not None and health["status"] == "ok"
    metrics = cluster.routers[cluster.leader() or "r1"].metrics_text()
    assert "ecast_suspects_issued_total 1" in metrics
    for r in recs:
        await r.client.close()


async def test_a_client_paused_past_its_lease_learns_it_was_suspected(
    cluster: LocalCluster,
) -> None:
    cluster.start_group(3)
    victim = start_victim(cluster, "sleeper")
    recs = await survivors(cluster)
    stop = asyncio.Event()
    acked_at: list[float] = []
    tasks = [asyncio.create_task(keep_submitting(r, stop, acked_at)) for r in recs]
    await asyncio.sleep(1.0)
    victim.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    await asyncio.sleep(LEASE + 2.5)
    stop.set()
    await asyncio.gather(*tasks)
    assert longest_gap(acked_at, paused - 0.5) <= LEASE + 1.0
    victim.send_signal(signal.SIGCONT)
    out, _ = await asyncio.to_thread(victim.communicate, timeout=15)
    assert victim.returncode == 3, out
    event = json.loads(out.strip().splitlines()[-1])
    assert event["event"] == "suspected" and "declared faulty" in event["error"]
    # Told where: the t at which the survivors delivered the routers' lease suspect.
    suspects = {t for t, sender, _i, _p in recs[0].delivered if sender == ROUTERS}
    assert event["at"] in suspects, (event, suspects)
    assert f"declared faulty at t={event['at']} " in event["error"]
    assert check_guarantees(recs, recs) == []
    for r in recs:
        await r.client.close()
