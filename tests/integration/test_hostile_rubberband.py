"""Hostile input against a real Rubberband cluster (``rubberband cluster up``, per-process
credentials): what a holder of an ordinary client credential tries beyond it changes
nothing, and the cluster keeps serving."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import rubberband.sdk as rbsdk
from ecast import local
from rubberband.placement import Keyspace
from rubberband.storage import RESULT, STALE, WHOLE
from rubberband.tools.cli import run as cli


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    d = tmp_path / "rb"
    up = cli("cluster", "up", "--routers", "1", "--supers", "1", "--storage", "3",
             "--replication", "2", "--state-dir", str(d))  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield d
    finally:
        cli("cluster", "down", "--state-dir", str(d))


def state(d: Path) -> dict[str, Any]:
    return dict(json.loads((d / "cluster.json").read_text()))


async def connect(d: Path, name: str, exact: bool = False) -> rbsdk.RubberbandClient:
    """A client under the cluster's client credential, or one of its own (``exact``)."""
    st = state(d)
    cred = st["client_credentials"]
    if exact:
        cred = str(local.StateDir(d).issue("application", [name], name.replace(":", "-")))
    return await rbsdk.connect(st["routers"], name, credentials=cred)


def test_a_client_takes_answers_only_from_holders_and_the_keyspace_only_from_a_super(
    cluster: Path,
) -> None:
    """Probe: one ``STALE`` from another client, carrying a keyspace at version 10^9 that
    named the attacker as the only holder, took effect: alice's basic reads then returned
    the attacker's data 5 times out of 5."""

    async def go() -> None:
        alice = await connect(cluster, "client:alice")
        await alice.put_many({k: f"v{k}" for k in range(20)})
        mallory = await connect(cluster, "client:mallory", exact=True)
        ks = alice.core.keyspace
        assert ks is not None
        forged = Keyspace(1, ((ks.ring()[0][0], "client:mallory"),)).to_state()
        send = mallory.ecast.send_direct_nowait
        for i in range(1, 300):
            send("client:alice", (STALE, ("b", i), 10**9, forged))
            for rid in (("b", i), ("q", i)):
                send("client:alice", (RESULT, rid, None, "evil", None, 10**9, True))
            send("client:alice", (WHOLE, ("b", i), 10**9, ("evil",) * 32))
        await asyncio.sleep(1.0)
        for level in ("basic", "sequential", "snapshot"):
            for k in range(5):
                assert await alice.get(k, isolation=level) == f"v{k}"
        assert alice.core.version < 10**9
        assert alice.refused_answers >= 300
        await mallory.close()
        await alice.close()

    asyncio.run(go())
