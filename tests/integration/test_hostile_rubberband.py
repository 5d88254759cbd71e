"""Hostile input against a real Rubberband cluster (``rubberband cluster up``, per-process
credentials): what a holder of an ordinary client credential tries beyond it changes
nothing, and the cluster keeps serving."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import rubberband.sdk as rbsdk
from ecast import local
from rubberband.placement import Keyspace
from rubberband.proto import Answer, Described, Stale, Whole
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
    """Probe: one stale-keyspace notice from another client, carrying a keyspace at
    version 10^9 that named the attacker as the only holder, took effect: alice's basic
    reads then returned the attacker's data 5 times out of 5.  Now a keyspace comes only
    from the super asked, answers only from holders, and a message of the old untyped
    wire is no message."""

    async def go() -> None:
        alice = await connect(cluster, "client:alice")
        await alice.put_many({k: f"v{k}" for k in range(20)})
        mallory = await connect(cluster, "client:mallory", exact=True)
        ks = alice.core.keyspace
        assert ks is not None
        forged = Keyspace(1, ((ks.ring()[0][0], "client:mallory"),)).to_state()
        send = mallory.ecast.send_direct_nowait
        for i in range(1, 300):
            send("client:alice", Stale(i, 10**9))
            send("client:alice", Described(i, 10**9, forged, "range"))
            send("client:alice", Answer(i, None, "evil", None, 10**9, True))
            send("client:alice", Whole(i, 10**9, ("evil",) * 32))
            send("client:alice", ("result", i, None, "evil", None, 10**9, True))
        await asyncio.sleep(1.0)
        for level in ("basic", "sequential", "snapshot"):
            for k in range(5):
                assert await alice.get(k, isolation=level) == f"v{k}"
        assert alice.core.version < 10**9
        assert alice.refused_answers >= 300
        await mallory.close()
        await alice.close()

    asyncio.run(go())


def super_with_token(tmp_path: Path, content: str, mode: int) -> Any:
    token = tmp_path / "token"
    token.write_text(content)
    token.chmod(mode)
    return subprocess.run(
        [sys.executable, "-m", "rubberband.tools.cli", "super", "--name", "super:x",
         "--routers", "127.0.0.1:1", "--admin", "127.0.0.1:0", "--admin-token-file", str(token)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("content", "mode", "text"),
    [
        ("a" * 32 + "\n", 0o644, "can be read by other users"),
        ("a" * 32 + " \n", 0o600, "nothing else in the file"),
        (" " + "a" * 32, 0o600, "nothing else in the file"),
        ("short\n", 0o600, "16 to 512 characters"),
    ],
)
def test_the_super_refuses_a_token_file_others_can_read_or_with_spaces(
    tmp_path: Path, content: str, mode: int, text: str
) -> None:
    """Probe: a super accepted a 0644 token file, and a token with a trailing space."""
    out = super_with_token(tmp_path, content, mode)
    assert out.returncode == 2, out.stderr
    assert text in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_cluster_files_are_the_owners_and_health_says_nothing_of_the_layout(
    cluster: Path,
) -> None:
    """Probe: ``cluster up`` wrote cluster.json (the admin token inside) at 0644 in a 0755
    directory; the super's unauthenticated /health returned the ring, partitions, supers
    and coordinator."""
    assert cluster.stat().st_mode & 0o777 == 0o700
    for f in ("cluster.json", "admin_token"):
        assert (cluster / f).stat().st_mode & 0o777 == 0o600, f
    st = state(cluster)
    (address,) = st["supers"].values()
    with urllib.request.urlopen(f"http://{address}/health", timeout=5) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["joined"] is True
    text = json.dumps(health)
    assert not {"ring", "supers", "coordinator", "standby"} & set(health)
    assert "storage:" not in text and "super:" not in text
    for path in ("/status", "/history", "/history?since=0"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{address}{path}", timeout=5)
        assert e.value.code == 401, path
    bad = urllib.request.Request(
        f"http://{address}/history?since=x",
        headers={"Authorization": f"Bearer {st['admin_token']}"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=5)
    assert e.value.code == 400
    with urllib.request.urlopen(f"http://{address}/console", timeout=5) as r:
        headers = r.headers
    assert headers["X-Frame-Options"] == "DENY"
    csp = headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp


def test_no_credential_covers_every_name(tmp_path: Path) -> None:
    """Probe: ``credentials issue --role application --name '*'`` succeeded silently."""
    ca = tmp_path / "ca.json"
    init = subprocess.run([sys.executable, "-m", "ecast", "credentials", "init", "--ca", str(ca)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert init.returncode == 0, init.stderr
    for role in ("application", "router"):
        out = subprocess.run(
            [sys.executable, "-m", "ecast", "credentials", "issue", "--ca", str(ca), "--role",
             role, "--name", "*", "--out", str(tmp_path / "x.cred")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode != 0 and "covers every name" in out.stderr, out.stderr
        assert not (tmp_path / "x.cred").exists()
