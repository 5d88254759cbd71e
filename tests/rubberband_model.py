"""A model of a Rubberband cluster for storage-core tests: the total order is the
config itself (one sequencer, no routers), direct messages travel on FIFO links
delivered in a seeded random interleaving, and configuration messages that storage
processes submit (ready, incomplete) enter the order at random later steps.  What it
leaves out (routers, E-Cast's faults) the E-Cast simulator covers; what it checks is the
storage processes' ordering, migration and failure handling against a reference."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict, deque
from typing import Any

from ecast import Message
from rubberband.config import RubberbandConfig
from rubberband.engine import Placement, merge
from rubberband.keys import encode_key
from rubberband.outputs import Stop, Submit
from rubberband.proto import Answer, H, vote_header
from rubberband.storage import StorageCore
from rubberband.super import SuperCore
from rubberband.versions import names_catalog
from storage_adapters.memory import KVOps, MemoryEngine

SUPER = "super:s"


class Model:
    def __init__(
        self, f: int = 3, seed: int = 0, chunk_bytes: int = 200, partitioning: str = "range"
    ) -> None:
        self.rng = random.Random(seed)
        self.config = RubberbandConfig.initial(replication=f, partitioning=partitioning)
        self.t = 0
        self.seq = itertools.count(1)
        self.storage: dict[str, StorageCore] = {}
        self.links: dict[tuple[str, str], deque[Any]] = defaultdict(deque)
        self.later: list[tuple[str, Any]] = []
        self.results: dict[Any, list[tuple[Any, Any, Any]]] = defaultdict(list)
        self.replies: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
        """Every direct message to a client, whole, by request id."""
        self.to_clients: list[tuple[str, str, Any]] = []
        """Every direct message to a client: ``(source, client, message)``, in order."""
        self.stopped: dict[str, str] = {}
        self.chunk_bytes = chunk_bytes
        self.ops = KVOps()
        self.placement = Placement(partitioning)  # type: ignore[arg-type]
        self.reference: dict[Any, Any] = {}
        self.dead: set[str] = set()
        self.super = SuperCore(SUPER)
        self.submit(SUPER, {"kind": "join"})

    # ------------------------------------------------------------------ the order
    def submit(self, sender: str, header: Any, payload: Any = None) -> frozenset[str]:
        return self.send(sender, header, payload)[1]

    def send(self, sender: str, header: Any, payload: Any = None) -> tuple[Any, frozenset[str]]:
        m = Message(sender, (("m", 0, sender), next(self.seq)), header, payload)
        dests = self.config.destset(m) - self.config.suspects(m)
        after = self.config.apply(m)
        self.t += 1
        t = self.t
        if type(header) is dict and header.get("kind") == "join" and sender.startswith("storage:"):
            self.storage[sender] = StorageCore(
                sender, MemoryEngine(self.placement), chunk_bytes=self.chunk_bytes
            )
            self._outputs(sender, self.storage[sender].joined(after.joiner_state()))
        if sender == SUPER and type(header) is dict and header.get("kind") == "join":
            self.super.joined(after.joiner_state())
        elif SUPER in dests:
            self.super.deliver([(t, m)])
        self.config = after
        for d in sorted(dests):
            core = self.storage.get(d)
            if core is not None and d not in self.dead:
                self._outputs(d, core.deliver([(t, m)]))
        return m.id, dests

    def _outputs(self, me: str, fx: Any) -> None:
        """A storage core's effects: direct messages travel (to a client: recorded),
        submissions enter the order at a random later step, a stop is recorded."""
        for dst, direct in fx.send:
            payload = direct.payload
            if dst.startswith("storage:"):
                self.links[(me, dst)].append(payload)
                continue
            self.to_clients.append((me, dst, payload))
            if type(payload) is Answer:  # a read's (or a write's) one answer
                a = payload
                self.results[a.request].append((me, a.covered, a.result, a.error))
            self.replies[payload.request].append(payload)
        for item in fx.deliver:
            if type(item) is Submit:
                self.later.append((me, item.header))
            elif type(item) is Stop:
                self.stopped[me] = item.reason

    def step(self) -> bool:
        """Deliver one direct message or one deferred submission; False when idle."""
        links = [k for k, q in self.links.items() if q]
        choices = len(links) + len(self.later)
        if not choices:
            return False
        i = self.rng.randrange(choices)
        if i < len(links):
            src, dst = links[i]
            payload = self.links[(src, dst)].popleft()
            if dst not in self.dead and src not in self.dead:
                self._outputs(dst, self.storage[dst].on_direct(src, payload))
        else:
            sender, header = self.later.pop(i - len(links))
            if sender not in self.dead:
                self.submit(sender, header)
        return True

    def settle(self, limit: int = 100_000) -> None:
        for _ in range(limit):
            if not self.step():
                return
        raise AssertionError("the model did not settle")

    # ------------------------------------------------------------------ operations
    def join_storage(self, name: str) -> None:
        self.submit(name, {"kind": "join"})

    def ring_of(self, n: int) -> Model:
        """``n`` storage processes joined and expanded at ids 0, 100, 200, ..., one after
        another, settled: a ring to test against."""
        for i in range(n):
            self.join_storage(f"storage:{i}")
            self.reconfigure(("expand", f"storage:{i}", i * 100))
            self.settle()
        return self

    def reconfigure(self, op: tuple[Any, ...], force: bool = True) -> frozenset[str]:
        """Planned by the super's replica, as an administrator's request is."""
        proposal = self.super.plan(*op, force=force)
        return self.submit(SUPER, proposal.header)

    def write(self, op: Any, client: str = "client:c") -> None:
        part = self.ops.part_fun(op, self.placement)
        self.submit(client, {H.WRITES: part.ranges}, op)
        self.expect(op, client)

    def write_batch(
        self, ops: list[Any], core: Any, limit: int = 8, max_bytes: int = 1 << 16
    ) -> list[tuple[tuple[int, ...], frozenset[str]]]:
        """Writes sent as the SDK's ``write_batch`` sends them, with ``core``'s copy of
        the keyspace (a :class:`ClientCore`, maybe stale); the reference takes them in
        batch order, which replicas must agree with.  Each message's indices and
        destinations."""
        sent = []
        for indices, payload, header in core.writes_of(ops, limit, max_bytes):
            sent.append((indices, self.submit("client:c", header, payload)))
        for op in ops:
            self.expect(op)
        return sent

    def expect(self, op: Any, sender: str = "client:c") -> None:
        """The reference takes ``op`` from ``sender`` as every replica should (views'
        rows and definitions are written by maintainers alone:
        ``rubberband.applying.refusal``)."""
        maintainer = sender.startswith("maintainer:")
        if not maintainer and (op[0] in ("version", "reclaim") or names_catalog(op)):
            return
        if op[0] == "put":
            for k, v in op[1]:
                self.reference[k] = v
        elif op[0] == "append":
            # Applied segment by segment: a segment's part is refused whole where one of
            # its keys holds no list, the other segments' parts are applied.
            ks = self.config.keyspace
            parts: dict[int, list[Any]] = defaultdict(list)
            for k, v in op[1]:
                parts[ks.segment_of(self.placement.ekey(k)) if ks else 0].append((k, v))
            for pairs in parts.values():
                if any(type(self.reference.get(k, [])) is not list for k, _ in pairs):
                    continue
                for k, v in pairs:
                    self.reference[k] = [*self.reference.get(k, ()), v]
        elif op[0] == "version":
            for k, entry in op[1]:
                self.reference[k] = merge(self.reference.get(k), [list(entry)], op[2], k)
        elif op[0] == "delete":
            for k in op[1]:
                self.reference.pop(k, None)
        elif op[0] == "delete_range":
            ((lo, hi),) = self.ops.part_fun(op, self.placement).ranges
            for k in [k for k in self.reference if lo <= self.placement.ekey(k) < hi]:
                if maintainer or type(k) is not tuple or not k or k[0] not in ("~view", "~views"):
                    del self.reference[k]

    def read(self, op: Any, offset: int = 0, client: str = "client:c") -> Any:
        part = self.ops.part_fun(op, self.placement)
        m_id, dests = self.send(client, {H.READS: part.ranges, H.OFFSET: offset}, op)
        return m_id, dests, part.ranges

    def answer(self, m_id: Any, op: Any, ranges: Any) -> Any:
        """The combined answer of a read, once its responders covered ``ranges``
        (duplicates dropped by range, as the client does); None while incomplete."""
        from rubberband.keys import covers, difference, intersect, union

        covered: Any = ()
        answers = []
        for _, got, result, error in self.results.get(m_id, ()):
            if error is not None:
                raise AssertionError(error)
            fresh = difference(got, covered)
            if not fresh:
                continue
            answers.append(self._restrict(op, result, fresh))
            covered = union(covered, fresh)
        if not covers(covered, intersect(ranges, ranges)):
            return None
        return self.ops.combine(op, answers)

    def _restrict(self, op: Any, result: Any, ranges: Any) -> Any:
        def inside(k: Any) -> bool:
            e = encode_key(k)
            return any(lo <= e < hi for lo, hi in ranges)

        if op[0] == "get":
            return {k: v for k, v in result.items() if inside(k)}
        return [kv for kv in result if inside(kv[0])]

    def suspect(self, name: str) -> None:
        self.dead.add(name)
        self.submit(SUPER, vote_header(name))

    # ------------------------------------------------------------------ checks
    def replica_violations(self) -> list[str]:
        """Every live, unbroken holder of a key agrees with the reference."""
        out = []
        ks = self.config.keyspace
        for name in ks.processes:
            core = self.storage[name]
            if name in self.dead or core.incomplete or core.stopped:
                continue
            engine = core.engine
            assert isinstance(engine, MemoryEngine)
            got = dict(engine.items())
            part = ks.partition(name)
            want = {
                k: v
                for k, v in self.reference.items()
                if any(lo <= self.placement.ekey(k) < hi for lo, hi in part)
            }
            if got != want:
                missing = sorted(set(want) - set(got))[:5]
                extra = sorted(set(got) - set(want))[:5]
                wrong = [k for k in want if k in got and got[k] != want[k]][:5]
                out.append(f"{name}: missing {missing} extra {extra} wrong {wrong}")
        return out
