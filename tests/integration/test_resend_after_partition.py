"""A dial begun while the network drops its packets connects within about a second of
the heal: the runtime caps the kernel's resend wait before the SYN goes out
(``ecast.runtime.transport.RTO_MAX_MS``).  Linux resends a SYN a second apart four times
(``tcp_syn_linear_timeouts``; older kernels double from the first), then doubles the
wait: a dial begun 5.5 s before the heal connected 1.6 s after it.  The drop is an
nftables rule of this test's own, on the listening port alone, removed at the end."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time

import pytest

from ecast.core.endpoint import Endpoint
from ecast.runtime import Runtime
from tests.jepsen_rig import needs_net
from tests.unit.test_transport import _kernel_caps_resends

SECRET = b"integration-5c1e9a7b3d2f4e6a8c0b2d4f6a8c0e2a"
TABLE = "ecast_resend_test"
CUT = 5.5
"""Seconds the dial's packets are dropped."""


def _nft(*args: str) -> None:
    subprocess.run(["nft", *args], check=True, capture_output=True, timeout=10)


@needs_net
@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed")
@pytest.mark.skipif(not _kernel_caps_resends(), reason="the kernel has no TCP_RTO_MAX_MS")
def test_a_dial_begun_during_a_partition_connects_within_a_second_of_the_heal() -> None:
    async def run() -> float:
        server, dialer = Runtime(SECRET), Runtime(SECRET)
        server.add_node("r1", Endpoint("r1", ["x"]))  # a node list to announce
        address = await server.serve("127.0.0.1:0")
        port = address.rsplit(":", 1)[1]
        _nft("add", "table", "inet", TABLE)
        try:
            _nft("add", "chain", "inet", TABLE, "cut",
                 "{ type filter hook input priority 0; policy accept; }")  # fmt: skip
            _nft("add", "rule", "inet", TABLE, "cut", "tcp", "dport", port, "drop")
            dial = asyncio.create_task(dialer.connect(address, timeout=10.0))
            await asyncio.sleep(CUT)
            assert not dial.done()  # nothing got through
            _nft("delete", "table", "inet", TABLE)
            healed = time.monotonic()
            await dial
            return time.monotonic() - healed
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                _nft("delete", "table", "inet", TABLE)
            await dialer.close()
            await server.close()

    after = asyncio.run(run())
    # A SYN a second at most: connected within a second of the heal (1.6 s uncapped).
    assert after < 1.2, f"connected {after:.2f} s after the heal"
