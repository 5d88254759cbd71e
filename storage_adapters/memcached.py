"""Memcached under Rubberband: each storage process drives its own real ``memcached``.

The engine speaks the key-value operations of :mod:`storage_adapters.memory` (the same
:class:`~storage_adapters.memory.KVOps` on the client side: ``put``, ``append``,
``delete``, ``delete_range``, ``get``, ``scan``), so the Rubberband SDK's ``put`` /
``get`` / ``scan`` work unchanged, and it stores the values in a memcached server.

What memcached lacks, the engine adds:

* **Ordered keys.**  Memcached cannot list its keys, let alone in order, so the engine
  keeps an exact ordered index of the keys it holds (placement, then key order: one
  slice per range of placement space, whatever the partitioning).  Range reads, range
  deletes and partial live migration (dissertation 5.4) work on it; the dissertation's
  Memcached/RB prototype could not migrate.  The index costs memory per key (measured
  in docs/storage.md); the values, which are most of the data, live in memcached.
* **No silent loss.**  The server runs with ``-M`` (an error instead of an eviction when
  memory is full) and every store waits for its reply, so "out of memory" is an error,
  not a lost write.  Any error of the server or the connection, and a key the index has
  but the server lost, is a failure of this replica: it propagates, and the storage
  process stops (fail-stop) and is replaced.  It never skips a write and carries on.
* **Snapshots for migration.**  :meth:`open_send` takes the key set of the ranges at the
  call; a write that would change a key the cursor has not sent yet first saves the old
  value into the cursor (copy on write, one extra multi-get per write batch that touches
  it), so later writes never leak into the copy and writes never wait for the copy.

Keys become memcached keys by a fixed encoding within memcached's limits: ``k`` and the
URL-safe base64 of the msgpack form of the key's canonical encoding (at most 250 bytes,
no spaces or control characters), or for a longer key ``h`` and the base64 of its
SHA-256.  Values are msgpack-encoded.  The server is started to hold any value up to the
key-value limit (:data:`~storage_adapters.memory.MAX_VALUE_BYTES`, which clients check at
the call) with its longest key: items of 2 MB (``item_limit_mb``); a server of one's own
that holds less is refused at start, so no replica rejects an acknowledged put for its
size.  An append that grows a list past the server's limit is a :class:`BadOperation`
(the same at every replica), answered to the writer as every append is.  TTLs are
refused: an expiring item would be a replica silently dropping data.

Requests are pipelined: a multi-key operation is one round trip (pymemcache's
``set_many`` / ``get_many`` / ``delete_many`` write every command and then read every
reply).  The client is synchronous; Rubberband runs every engine call on the storage
process's worker thread, never on its event loop.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack
from pymemcache.client.base import Client as _Memcache

from rubberband.engine import (
    INVALID,
    BadOperation,
    EKey,
    Placement,
    RangeSet,
    ReportsChanges,
    check_reclaim_op,
    check_version_op,
    dead_by,
    encode_key,
    merge,
    refuse_row_key,
    refuse_view_keys,
    rejection,
)
from storage_adapters.leafmap import LeafMap
from storage_adapters.memory import (
    MAX_KEYS,
    MAX_VALUE_BYTES,
    READS,
    WRITES,
    KVOps,
    deltas,
    inside,
    is_read,
    within_bounds,
)

__all__ = ["KVOps", "MemcachedEngine", "memcached_key"]

MAX_KEY_BYTES = 250
"""Memcached's key limit."""
ITEM_OVERHEAD = 96
"""Bytes an item takes beyond its key and value (header, CAS, suffix), from above."""
FETCH = 512
"""Keys per multi-get while scanning or sending: a round trip each, memory bounded."""
Slot = tuple[EKey, EKey]


def _same_number(e: Any) -> Any:
    """``e`` with every integral float as the int it equals: keys that compare equal
    (``0`` and ``0.0`` are one key of the keyspace) must be one memcached key."""
    if type(e) is float and e.is_integer() and -(2**63) <= e < 2**64:
        return int(e)
    if type(e) is tuple:
        return tuple(_same_number(x) for x in e)
    return e


def memcached_key(ekey: EKey) -> bytes:
    """The memcached key of a key whose canonical encoding is ``ekey``."""
    packed = msgpack.packb(_same_number(ekey), use_bin_type=True)
    short = b"k" + base64.urlsafe_b64encode(packed).rstrip(b"=")
    if len(short) <= MAX_KEY_BYTES:
        return short
    return b"h" + base64.urlsafe_b64encode(hashlib.sha256(packed).digest()).rstrip(b"=")


_DIR_PREFIX = "rb-memcached-"


def _remove_stale_dirs() -> None:
    """Remove the socket directories of storage processes that died without closing
    their engine (SIGKILL): each directory's name carries its process id."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if not name.startswith(_DIR_PREFIX):
            continue
        pid = name[len(_DIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the storage process dies, however it dies (a
    SIGKILLed storage process must not leave its memcached behind)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Snapshot:
    """A send cursor: the key set at the call, values read as it goes, except those a
    later write would change, which the engine saved into it first.  Values read ahead
    of the chunk being built are kept in ``saved`` as well: they are the snapshot's
    values, so a later write need not save them again and the next chunk need not read
    them again."""

    def __init__(self, engine: MemcachedEngine, slots: list[Slot], keys: list[Any]) -> None:
        self._engine = engine
        self._slots = slots
        self._keys = keys
        self._pending = set(slots)
        """Slots not sent yet: a write to one of these saves its value first."""
        self.saved: dict[Slot, bytes] = {}
        self._i = 0

    def wants(self, slot: Slot) -> bool:
        return slot in self._pending and slot not in self.saved

    def next_chunk(self, max_bytes: int) -> Any | None:
        if self._i >= len(self._slots):
            return None
        out: list[list[Any]] = []
        size = 0
        while self._i < len(self._slots) and (not out or size < max_bytes):
            j = min(self._i + FETCH, len(self._slots))
            slots = self._slots[self._i : j]
            keys = self._keys[self._i : j]
            self.saved.update(self._engine._fetch([s for s in slots if s not in self.saved]))
            for slot, key in zip(slots, keys, strict=True):
                value = self.saved.pop(slot)
                self._pending.discard(slot)
                out.append([key, value])
                size += len(value) + 32
                self._i += 1
                if size >= max_bytes:
                    break
        return out

    def close(self) -> None:
        self._engine._cursors.discard(self)
        self._slots, self._keys, self.saved, self._pending = [], [], {}, set()


class MemcachedEngine(ReportsChanges):
    """Ordered key-value data: the key order in the process, the values in memcached."""

    is_read = staticmethod(is_read)

    def __init__(
        self,
        placement: Placement | None = None,
        *,
        address: str | None = None,
        memory_mb: int = 1024,
        item_limit_mb: int = 2,
        binary: str = "memcached",
        threads: int = 2,
        timeout: float = 10.0,
    ) -> None:
        """Start a private memcached on a Unix socket of its own (or use ``address``, a
        server of one's own: ``HOST:PORT`` or a socket path), and flush it: a new storage
        process holds no data."""
        self.placement = placement or Placement()
        self._server: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        server: tuple[str, int] | str
        if address is None:
            server = self._start(binary, memory_mb, item_limit_mb, threads)
            self.address = server
        elif str(address).startswith("/"):
            server = self.address = str(address)
        else:
            host, _, p = str(address).rpartition(":")
            if not host or not p.isdigit():
                raise ValueError(f"address is HOST:PORT or a socket path, not {address!r}")
            server = (host, int(p))
            self.address = f"{host}:{p}"
        self._mc = _Memcache(
            server, connect_timeout=timeout, timeout=timeout, no_delay=True,
            default_noreply=False,
        )  # fmt: skip
        self._mc.flush_all(noreply=False)
        settings = self._mc.stats("settings")
        self.item_limit = int(settings.get(b"item_size_max", 1 << 20))
        if self.item_limit < MAX_VALUE_BYTES + MAX_KEY_BYTES + ITEM_OVERHEAD:
            self.close()
            raise ValueError(
                f"memcached at {self.address} holds items of at most {self.item_limit:,} "
                f"bytes: too few for a value at the key-value limit of {MAX_VALUE_BYTES:,} "
                "bytes with its key (start it with -I 2m, or item_limit_mb=2)"
            )
        self._index = LeafMap()
        """(placement, encoded key) -> key, for every key this replica holds."""
        self._cursors: set[_Snapshot] = set()
        self.counts = {"writes": 0, "reads": 0, "rejected": 0, "saved_for_send": 0}

    def _start(self, binary: str, memory_mb: int, item_limit_mb: int, threads: int) -> str:
        """The path of the private server's socket.  A Unix socket in a directory of its
        own, not a TCP port: a port picked as free can be taken by any other process
        before memcached binds it (and then a readiness check could reach that process
        instead), and a local socket is faster too."""
        exe = shutil.which(binary)
        if exe is None:
            raise RuntimeError(
                f"no {binary!r} on PATH: install memcached (apt-get install memcached) "
                "or give the engine address=HOST:PORT"
            )
        _remove_stale_dirs()
        self._dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
        path = os.path.join(self._dir, "memcached.sock")
        cmd = [exe, "-s", path, "-a", "0600", "-M"]
        cmd += ["-m", str(int(memory_mb)), "-I", f"{int(item_limit_mb)}m", "-t", str(threads)]
        if os.geteuid() == 0:
            cmd += ["-u", "root"]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        self._server = proc
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and proc.poll() is None:
            with socket.socket(socket.AF_UNIX) as probe, contextlib.suppress(OSError):
                probe.settimeout(0.2)
                probe.connect(path)
                return path
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
            err = b""
        else:
            err = proc.stderr.read() if proc.stderr else b""
        proc.wait()
        self._server = None
        shutil.rmtree(self._dir, ignore_errors=True)
        raise RuntimeError(f"memcached did not start: {err.decode(errors='replace').strip()}")

    # ------------------------------------------------------------------ helpers
    def _slot(self, key: Any) -> Slot:
        if type(key) is tuple:
            refuse_row_key(key)
        return (self.placement.ekey(key), encode_key(key))

    def _mine(self, keys: Iterable[Any], ranges: RangeSet) -> list[tuple[Slot, Any]]:
        out = []
        for key in keys:
            slot = self._slot(key)
            if inside(ranges, slot[0]):
                out.append((slot, key))
        return out

    def _range_slots(self, ranges: RangeSet) -> list[Slot]:
        index = self._index
        out: list[Slot] = []
        for lo, hi in ranges:
            out.extend(index.irange((lo,), (hi,), inclusive=(True, False)))
        return out

    def _fetch(self, slots: Sequence[Slot]) -> dict[Slot, bytes]:
        """Values of ``slots`` in one round trip per :data:`FETCH` keys.  A key the index
        holds but the server does not is lost data: that fails the replica."""
        out: dict[Slot, bytes] = {}
        for i in range(0, len(slots), FETCH):
            part = slots[i : i + FETCH]
            by_mkey = {memcached_key(s[1]): s for s in part}
            got = self._mc.get_many(list(by_mkey))
            for mkey, slot in by_mkey.items():
                value = got.get(mkey)
                if value is None:
                    raise RuntimeError(
                        f"memcached at {self.address} lost the value of "
                        f"{self._index.get(slot, slot)!r} (restarted, or evicting?)"
                    )
                out[slot] = value
        return out

    def _before_write(self, slots: Iterable[Slot]) -> None:
        """Copy on write: save the values open send cursors still owe, before a write
        changes them."""
        if not self._cursors:
            return
        wanted: dict[Slot, list[_Snapshot]] = {}
        for slot in slots:
            for cur in self._cursors:
                if cur.wants(slot):
                    wanted.setdefault(slot, []).append(cur)
        if not wanted:
            return
        values = self._fetch(list(wanted))
        for slot, curs in wanted.items():
            for cur in curs:
                cur.saved[slot] = values[slot]
        self.counts["saved_for_send"] += len(wanted)

    def _pack(self, key: Any, value: Any) -> bytes:
        try:
            data = msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            raise BadOperation(f"value of {key!r:.60} cannot be stored: {e}") from None
        if len(data) + MAX_KEY_BYTES + ITEM_OVERHEAD > self.item_limit:
            raise BadOperation(
                f"value of {key!r:.60} is {len(data)} bytes: over memcached's item limit "
                f"of {self.item_limit} bytes"
            )
        return data

    def _store(
        self, items: dict[Slot, tuple[Any, bytes]], values: dict[Slot, Any] | None = None
    ) -> None:
        """Store packed ``items``; ``values`` are theirs unpacked (for a change log)."""
        if not items:
            return
        self._before_write(items)
        failed = self._mc.set_many(
            {memcached_key(s[1]): v for s, (_k, v) in items.items()}, noreply=False
        )
        if failed:
            raise RuntimeError(f"memcached at {self.address} refused {len(failed)} stores")
        for slot, (key, _v) in items.items():
            self._index[slot] = key
        if self._changes is not None and values is not None:
            self._changes.extend((items[s][0], "put", v) for s, v in values.items())

    def _remove(self, slots: list[Slot]) -> None:
        slots = list(dict.fromkeys(s for s in slots if s in self._index))
        if not slots:
            return
        self._before_write(slots)
        for i in range(0, len(slots), FETCH):
            part = slots[i : i + FETCH]
            self._mc.delete_many([memcached_key(s[1]) for s in part], noreply=False)
        if self._changes is not None:
            self._changes.extend((self._index[s], "delete", None) for s in slots)
        for s in slots:
            del self._index[s]

    # ------------------------------------------------------------------ the protocol
    def apply(self, batch: Sequence[tuple[Any, RangeSet]]) -> list[Any]:
        return [self._one(op, ranges) for op, ranges in batch]

    def _one(self, op: Any, ranges: RangeSet) -> Any:
        try:
            plan = self._prepare(op, ranges)
        except INVALID as e:
            self.counts["rejected"] += 1
            return rejection(op, e)
        # Past validation, every error is the backend's: it propagates (fail-stop).
        return plan()

    def _prepare(self, op: Any, ranges: RangeSet) -> Any:
        """Validate ``op`` completely (so a rejection leaves nothing half done) and
        return what carries it out."""
        name = op[0] if type(op) in (tuple, list) and op else None
        if name not in WRITES and name not in READS:
            raise BadOperation(f"not a key-value operation: {op!r:.80}")
        refuse_view_keys(op)
        if name == "add":
            if len(op) != 2:
                raise BadOperation("add takes (key, delta) pairs, and no TTL")
            pairs = deltas(op[1])
            if len(pairs) > MAX_KEYS:
                raise BadOperation(f"add names more than {MAX_KEYS} keys")
            adds = [(self._slot(k), k, d) for k, d in pairs]
            return lambda: self._add([(s, k, d) for s, k, d in adds if inside(ranges, s[0])])
        if name in ("put", "append"):
            if len(op) != 2:
                raise BadOperation(f"{name} takes (key, value) pairs, and no TTL")
            pairs = list(op[1])
            if len(pairs) > MAX_KEYS or not all(len(p) == 2 for p in pairs):
                raise BadOperation(f"{name} takes (key, value) pairs")
            mine = [(self._slot(k), k, v) for k, v in pairs]
            mine = [(s, k, v) for s, k, v in mine if inside(ranges, s[0])]
            if name == "put":
                packed = {s: (k, self._pack(k, v)) for s, k, v in mine}
                values = {s: v for s, _k, v in mine}
                return lambda: self._write(lambda p: self._store(p, values), packed)
            return lambda: self._append(mine)
        if name == "version":
            pairs, floor = check_version_op(op)
            if len(pairs) > MAX_KEYS:
                raise BadOperation(f"version names more than {MAX_KEYS} keys")
            mine = [(self._slot(k), k, e) for k, e in pairs]
            mine = [(s, k, e) for s, k, e in mine if inside(ranges, s[0])]
            return lambda: self._version(mine, floor)
        if name == "reclaim":
            keys, upto = check_reclaim_op(op)
            if len(keys) > MAX_KEYS:
                raise BadOperation(f"reclaim names more than {MAX_KEYS} keys")
            reclaimed = self._mine(keys, ranges)
            return lambda: self._reclaim(reclaimed, upto)
        if name in ("delete", "get"):
            keys = list(op[1])
            if len(keys) > MAX_KEYS:
                raise BadOperation(f"{name} names more than {MAX_KEYS} keys")
            mine_keys = self._mine(keys, ranges)
            if name == "delete":
                return lambda: self._write(self._remove, [s for s, _k in mine_keys])
            return lambda: self._get(mine_keys)
        if len(op) != 3 and not (name == "scan" and len(op) == 4):
            raise BadOperation(f"{name} takes lo and hi")
        if name == "delete_range":
            return lambda: self._write(self._remove, self._range_slots(ranges))
        if self.placement.ordered:
            return lambda: self._scan(ranges, op[3] if len(op) > 3 else None)
        return lambda: within_bounds(op, self._scan(ranges))

    def _write(self, how: Any, what: Any) -> None:
        self.counts["writes"] += 1
        how(what)

    def _append(self, mine: list[tuple[Slot, Any, Any]]) -> None:
        self.counts["writes"] += 1
        present = [s for s, _k, _v in mine if s in self._index]
        old = {s: msgpack.unpackb(b, raw=False) for s, b in self._fetch(present).items()}
        new: dict[Slot, list[Any]] = {}
        for slot, key, value in mine:
            cur = new.get(slot, old.get(slot, []))
            if type(cur) not in (list, tuple):
                self.counts["rejected"] += 1
                return BadOperation(  # type: ignore[return-value]
                    f"append to {key!r}, which holds a {type(cur).__name__}"
                )
            new[slot] = [*cur, value]
        keys = {s: k for s, k, _v in mine}
        try:
            packed = {s: (keys[s], self._pack(keys[s], v)) for s, v in new.items()}
        except BadOperation as e:
            self.counts["rejected"] += 1
            return rejection(mine, e)  # type: ignore[return-value]
        self._store(packed, new)

    def _version(self, mine: list[tuple[Slot, Any, list[Any]]], floor: int) -> Any:
        self.counts["writes"] += 1
        present = list({s for s, _k, _e in mine if s in self._index})
        old = {s: msgpack.unpackb(b, raw=False) for s, b in self._fetch(present).items()}
        entries: dict[Slot, list[list[Any]]] = {}
        keys: dict[Slot, Any] = {}
        for slot, key, entry in mine:
            entries.setdefault(slot, []).append(entry)
            keys[slot] = key
        try:
            new = {s: merge(old.get(s), es, floor, keys[s]) for s, es in entries.items()}
            packed = {s: (keys[s], self._pack(keys[s], v)) for s, v in new.items()}
        except BadOperation as e:
            self.counts["rejected"] += 1
            return rejection(mine, e)
        self._store(packed, new)
        return None

    def _reclaim(self, mine: list[tuple[Slot, Any]], upto: int) -> None:
        self.counts["writes"] += 1
        values = self._fetch([s for s, _k in mine if s in self._index])
        self._remove([s for s, b in values.items() if dead_by(msgpack.unpackb(b, raw=False), upto)])

    def _add(self, mine: list[tuple[Slot, Any, int]]) -> Any:
        self.counts["writes"] += 1
        present = list({s for s, _k, _d in mine if s in self._index})
        old = {s: msgpack.unpackb(b, raw=False) for s, b in self._fetch(present).items()}
        new: dict[Slot, int] = {}
        keys: dict[Slot, Any] = {}
        for slot, key, delta in mine:
            cur = new.get(slot, old.get(slot, 0))
            if type(cur) is not int:
                self.counts["rejected"] += 1
                return BadOperation(f"add to {key!r}, which holds a {type(cur).__name__}")
            new[slot] = cur + delta
            keys[slot] = key
        self._store({s: (keys[s], self._pack(keys[s], v)) for s, v in new.items()}, new)
        return None

    def _get(self, mine: list[tuple[Slot, Any]]) -> dict[Any, Any]:
        self.counts["reads"] += 1
        present = [(s, k) for s, k in mine if s in self._index]
        values = self._fetch([s for s, _k in present])
        return {k: msgpack.unpackb(values[s], raw=False) for s, k in present}

    def _scan(self, ranges: RangeSet, limit: int | None = None) -> list[tuple[Any, Any]]:
        self.counts["reads"] += 1
        slots = self._range_slots(ranges)
        if limit is not None:
            del slots[limit:]
        values = self._fetch(slots)
        index = self._index
        return [(index[s], msgpack.unpackb(values[s], raw=False)) for s in slots]

    def open_send(self, ranges: RangeSet) -> _Snapshot:
        slots = self._range_slots(ranges)
        cur = _Snapshot(self, slots, [self._index[s] for s in slots])
        self._cursors.add(cur)
        return cur

    def receive(self, chunk: Any, ranges: RangeSet) -> None:
        items: dict[Slot, tuple[Any, bytes]] = {}
        try:
            for entry in chunk:
                key, value = entry
                if type(value) is not bytes:
                    raise ValueError(f"a received value is {type(value).__name__}, not bytes")
                slot = self._slot(key)
                if not inside(ranges, slot[0]):
                    raise ValueError(f"key {key!r:.40} is outside the copy")
                items[slot] = (key, value)
        except (TypeError, ValueError) as e:
            raise BadOperation(f"a refused chunk: {e}") from None
        self._store(items)

    def delete(self, ranges: RangeSet) -> None:
        self._remove(self._range_slots(ranges))

    def stats(self) -> dict[str, int | float]:
        s = self._mc.stats()
        return {
            "items": len(self._index),
            "bytes": int(s.get(b"bytes", 0)),
            "memcached_items": int(s.get(b"curr_items", 0)),
            "evictions": int(s.get(b"evictions", 0)),
            "limit_bytes": int(s.get(b"limit_maxbytes", 0)),
            "open_sends": len(self._cursors),
            **self.counts,
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._mc.close()
        if self._server is not None:
            self._server.terminate()
            try:
                self._server.wait(5)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def items(self) -> list[tuple[Any, Any]]:
        """Every (key, value) in placement order: what replicas compare."""
        slots = self._index.ordered_keys()
        values = self._fetch(slots)
        return [(self._index[s], msgpack.unpackb(values[s], raw=False)) for s in slots]

    def __del__(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None and server.poll() is None:
            with contextlib.suppress(Exception):
                server.kill()
