"""The whole cluster restarts from its disks: every process SIGKILLed at once, then
``rubberband cluster up`` on the same state directory brings back a new E-Cast group,
the supers put the recorded ring back, and the storage processes rejoin with their
data (the durable log engine)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
from pathlib import Path

import rubberband.sdk as rbsdk
from tests.integration.test_rubberband import cli, state, status

UP = ("cluster", "up", "--routers", "3", "--supers", "1", "--storage", "4", "--engine", "log",
      "--no-auto-repair")  # fmt: skip


def power_cut(d: Path) -> None:
    """SIGKILL every process of the cluster at once."""
    for entry in json.loads((d / "processes.json").read_text()).values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(entry["pid"], signal.SIGKILL)


async def connect(d: Path, name: str) -> rbsdk.RubberbandClient:
    st = state(d)
    return await rbsdk.connect(st["routers"], name, credentials=st["client_credentials"])


def test_a_quiet_cluster_restarts_with_every_write_and_its_ring(tmp_path: Path) -> None:
    d = tmp_path / "rb"
    up = cli(*UP, "--state-dir", str(d))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        rng = random.Random(3)
        model: dict[int, str] = {}

        async def write() -> None:
            rb = await connect(d, "client:before")
            for i in range(0, 20_000, 1_000):
                batch = {k: f"v{k}" for k in range(i, i + 1_000)}
                await rb.put_many(batch)
                model.update(batch)
            gone = rng.sample(sorted(model), 500)
            await rb.write(("delete", tuple(gone)))
            for k in gone:
                del model[k]
            await rb.put(7, {"n": 7})
            model[7] = {"n": 7}  # type: ignore[assignment]
            await rb.close()

        asyncio.run(write())
        ring = [(r["name"], r["id"]) for r in status(d)["ring"]]
        power_cut(d)
        again = cli(*UP, "--state-dir", str(d))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "restored" in again.stdout, again.stdout
        assert [(r["name"], r["id"]) for r in status(d)["ring"]] == ring

        async def check() -> None:
            rb = await connect(d, "client:after")
            for level in ("sequential", "snapshot", "basic", "sequential", "sequential"):
                got = dict(await rb.scan(None, None, isolation=level))
                assert got == model, (level, len(got), len(model))
            await rb.put(20_001, "after")  # and the cluster takes writes again
            assert await rb.get(20_001) == "after"
            await rb.close()

        asyncio.run(check())
    finally:
        cli("cluster", "down", "--state-dir", str(d))
