"""The Memcached engine's own rules: key encoding, item limits, TTLs, a given server,
its figures, and its benchmark's JSON (the shared rules are in the conformance suite)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ecast import local
from rubberband.engine import EVERYTHING, BadOperation, Placement, encode_key
from storage_adapters.memcached import MAX_KEY_BYTES, MemcachedEngine, memcached_key
from storage_adapters.memory import MAX_VALUE_BYTES, KVOps

keys = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.tuples(inner, inner),
    max_leaves=6,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(a=keys, b=keys)
@example(a=(0, 0), b=(0, 0.0))  # equal keys, one an int and one a float: one memcached key
@example(a=1.5, b=1)
def test_memcached_keys_are_legal_and_tell_keys_apart(a: object, b: object) -> None:
    ka, kb = memcached_key(encode_key(a)), memcached_key(encode_key(b))
    assert 0 < len(ka) <= MAX_KEY_BYTES
    assert all(33 <= c < 127 for c in ka)  # no spaces, no control characters
    assert (ka == kb) == (encode_key(a) == encode_key(b))


def test_a_key_too_long_for_memcached_is_hashed_and_still_works() -> None:
    e = MemcachedEngine(memory_mb=16)
    try:
        long_key = "x" * 5000
        assert memcached_key(encode_key(long_key)).startswith(b"h")
        e.apply([(("put", ((long_key, 1), ("short", 2))), EVERYTHING)])
        assert e.apply([(("get", (long_key, "short")), EVERYTHING)]) == [{long_key: 1, "short": 2}]
        assert e.items() == [("short", 2), (long_key, 1)]
    finally:
        e.close()


def test_any_value_the_client_lets_through_is_stored_and_a_smaller_server_is_refused() -> None:
    """A value at the key-value limit passes the client's check and is held, with the
    longest key memcached takes; one byte more is refused at the call.  A server that
    could not hold it is refused when the engine starts, not write by write."""
    ops = KVOps()
    at_limit = b"v" * (MAX_VALUE_BYTES - 5)  # bin 32: 5 bytes of header
    assert len(msgpack.packb(at_limit)) == MAX_VALUE_BYTES
    key = "k" * 180  # its memcached form is just within 250 bytes
    assert len(memcached_key(encode_key(key))) <= 250 and memcached_key(encode_key(key))[:1] == b"k"
    ops.part_fun(("put", ((key, at_limit),)), Placement())
    with pytest.raises(BadOperation, match="over the key-value limit of 1,048,576 bytes"):
        ops.part_fun(("put", ((key, at_limit + b"v"),)), Placement())
    with pytest.raises(BadOperation, match="over the key-value limit"):
        ops.part_fun(("append", (("a", ["x" * (1 << 19), "y" * (1 << 19)]),)), Placement())
    e = MemcachedEngine(memory_mb=16)
    try:
        assert e.apply([(("put", ((key, at_limit),)), EVERYTHING)]) == [None]
        assert e.apply([(("get", (key,)), EVERYTHING)]) == [{key: at_limit}]
    finally:
        e.close()
    with pytest.raises(ValueError, match="holds items of at most 1,048,576 bytes"):
        MemcachedEngine(memory_mb=16, item_limit_mb=1)


def test_values_over_the_item_limit_and_ttls_are_refused_whole() -> None:
    """What a client that skips the check sends: the engine refuses it at every replica."""
    e = MemcachedEngine(memory_mb=16)
    try:
        big = b"x" * (2 << 20)
        (res,) = e.apply([(("put", (("a", 1), ("b", big))), EVERYTHING)])
        assert isinstance(res, BadOperation) and "item limit" in str(res)
        (res,) = e.apply([(("put", (("a", 1),), 60), EVERYTHING)])
        assert isinstance(res, BadOperation) and "TTL" in str(res)
        assert e.items() == []  # nothing of either was stored
        (res,) = e.apply([(("put", (("a", object()),)), EVERYTHING)])
        assert isinstance(res, BadOperation) and "cannot be stored" in str(res)
        stats = e.stats()
        assert stats["evictions"] == 0 and stats["rejected"] == 3
        # An append past the limit, and a version of a key that holds no chain, are
        # refused as answers that hold no frame (nor the refused value, while they wait).
        e.apply([(("put", (("a", [1]), ("k", [1, 2]))), EVERYTHING)])
        (grown,) = e.apply([(("append", (("a", big),)), EVERYTHING)])
        (versioned,) = e.apply([(("version", (("k", [0]),), 0), EVERYTHING)])
        assert isinstance(grown, BadOperation) and "item limit" in str(grown)
        assert isinstance(versioned, BadOperation) and "no version chain" in str(versioned)
        assert grown.__traceback__ is None and versioned.__traceback__ is None
        assert versioned.__context__ is None
    finally:
        e.close()


def test_an_engine_can_use_a_server_of_ones_own_and_flushes_it() -> None:
    owner = MemcachedEngine(memory_mb=16)
    try:
        owner.apply([(("put", (("left", "over"),)), EVERYTHING)])
        e = MemcachedEngine(address=owner.address)
        assert e._server is None  # not ours: closing leaves it running
        assert e._mc.get(memcached_key(encode_key("left"))) is None  # a new process holds no data
        e.apply([(("put", (("k", "v"),)), EVERYTHING)])
        e.close()
        assert owner._mc.get(memcached_key(encode_key("k"))) is not None  # still running
        # The first engine's key is gone from under it: that is lost data, and a failure
        # of the replica (raised, so the storage process stops), never an empty answer.
        with pytest.raises(RuntimeError, match="lost the value"):
            owner.apply([(("get", ("left",)), EVERYTHING)])
    finally:
        owner.close()
    assert not os.path.exists(owner.address)  # the private server's socket went with it
    with pytest.raises(ValueError, match="HOST:PORT"):
        MemcachedEngine(address="nowhere")


def test_a_new_engine_removes_the_socket_directory_of_a_killed_one() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id that no longer runs: a SIGKILLed storage process's
    stale = Path(tempfile.gettempdir()) / f"rb-memcached-{gone.pid}-x"
    stale.mkdir()
    (stale / "memcached.sock").touch()
    e = MemcachedEngine(memory_mb=16)
    try:
        assert not stale.exists()
        assert Path(e.address).parent.name.startswith(f"rb-memcached-{os.getpid()}-")
    finally:
        e.close()


def test_an_engine_reaches_a_server_by_host_and_port() -> None:
    """The private server listens on a Unix socket; an operator's may be on TCP."""
    port = local.free_port()
    cmd = [shutil.which("memcached") or "memcached", "-l", "127.0.0.1", "-p", str(port)]
    cmd += ["-U", "0", "-m", "16", "-I", "2m"] + (["-u", "root"] if os.geteuid() == 0 else [])
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "memcached did not start"
                time.sleep(0.05)
        e = MemcachedEngine(address=f"127.0.0.1:{port}")
        try:
            assert e.address == f"127.0.0.1:{port}" and e._server is None
            e.apply([(("put", (("k", "v"),)), EVERYTHING)])
            assert e.apply([(("get", ("k",)), EVERYTHING)]) == [{"k": "v"}]
        finally:
            e.close()
    finally:
        server.kill()
        server.wait()


def test_the_memcached_benchmark_prints_json_last() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rubberband.tools.cli", "bench", "memcached", "--json",
         "--keys", "3000", "--migrate-mb", "4", "--index-keys", "2000"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    res = json.loads(lines[-1])
    assert res["writes_per_s"] > 0 and res["reads_per_s"] > 0
    assert res["migration"]["mb"] == 4 and res["migration"]["mb_per_s"] > 0
    assert 50 < res["index"]["bytes_per_key"] < 2000
