"""The simulated clients' workload: list-append over the shipped client core.

Each client is one process of the history (one operation at a time, as the checker's
process model wants): bulky puts first (data for migrations to move), then two-key...
one-key appends, reads at every isolation level and scans, with a think time between
operations; after the faults, a sequential read of every key (``final-read``).  Every
operation is a request of :class:`rubberband.client.ClientCore` (its retries, failover
and timeouts are the core's); with ``bundle`` the reads travel as
``read_batch`` bundles with a second read, and appends as ``write_batch`` bundles with a
put, as loaders and benchmarks send them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ecast import NodeId
from rubberband.client import ReadDone, WriteDone

if TYPE_CHECKING:
    from rubberband.sim.process import RbNode
    from rubberband.sim.run import RubberbandRun

KEYS = 16
"""List-append keys, integers spread over the ids the ring uses (0 to 10,000)."""
LEVELS = ("sequential", "snapshot", "basic")


def _never(op: Any) -> bool:
    return False


def key_of(i: int) -> int:
    return i * (10_000 // KEYS) + 37


@dataclass
class Op:
    """A client's operation in flight."""

    kind: str  # append | read | scan | put | mixed (an append to ``key`` and ``hi``)
    key: int
    value: Any = None
    level: str = "sequential"
    started: float = 0.0
    final: bool = False
    hi: int = 0
    """A scan's exclusive upper bound."""
    request: Any = None
    tries: int = 0
    refused_once: bool = False


class Client:
    """One simulated client process's workload."""

    def __init__(self, run: RubberbandRun, node: RbNode) -> None:
        self.run = run
        self.node = node
        self.pid: NodeId = node.pid
        self.op: Op | None = None
        self.next_op_at = 0.0
        self.seq = 0
        self.bulk_left = run.cfg.bulk // run.clients
        node.on_upcall = self._upcall
        node.next_wake = self._next_wake
        node.on_step = self.tick

    @property
    def busy(self) -> bool:
        return self.op is not None

    def _next_wake(self) -> float | None:
        return None if self.op is not None else self.next_op_at

    def tick(self, now: float) -> None:
        """Called in the node's step: issue the next operation when it is due."""
        if self.op is not None or now < self.next_op_at:
            return
        core = self.node.client
        assert core is not None
        if core.keyspace is None:
            self.next_op_at = now + 0.2
            self.node.feed(core.refresh(now))
            return
        run = self.run
        if run.final_phase:
            key = run.next_final_key()
            if key is None:
                self.next_op_at = now + 0.01  # look again soon, not at every step
                return
            self._start(Op("read", key, final=True), now)
            return
        rng = run.rng
        if run.cfg.views and not (run.follower is not None and run.follower.started):
            self.next_op_at = now + 0.01  # the views' base is known from the feed's start
            return
        if self.bulk_left > 0:
            # Load bulky data first, so that migrations take a while (and have a middle
            # to crash in); these puts are not part of the list-append history.
            self.bulk_left -= 1
            k = 3_001 + 160 * rng.randrange(24) if run.cfg.churn else rng.randrange(10_000)
            if k % (10_000 // KEYS) == 37:
                k += 1  # never a list-append key
            g = rng.randrange(5) if run.cfg.churn else k % 5  # churn: rows leave the views
            value: Any = {"g": g, "pad": "x" * 110} if run.cfg.views else "x" * 120
            if run.cfg.mixed_appends and rng.random() < 0.25:
                other = rng.randrange(10_000)
                if other % (10_000 // KEYS) == 37 or other == k:
                    other += 1
                self._start(Op("mixed", k, "m", hi=other), now)
                return
            self._start(Op("put", k, value), now)
            return
        if not run.may_issue():
            self.next_op_at = now + 0.01
            return
        if rng.random() < 0.15:
            a, b = sorted((rng.randrange(KEYS), rng.randrange(KEYS)))
            level = LEVELS[rng.randrange(3)]
            self._start(Op("scan", key_of(a), hi=key_of(b) + 1, level=level), now)
            return
        key = key_of(rng.randrange(KEYS))
        if rng.random() < 0.55:
            self.seq += 1
            value = int(self.pid.split("c")[-1]) * 100_000 + self.seq
            self._start(Op("append", key, value), now)
        else:
            self._start(Op("read", key, level=LEVELS[rng.randrange(3)]), now)

    # ------------------------------------------------------------------ requests
    def _start(self, op: Op, now: float) -> None:
        op.started = now
        self.op = op
        self.run.record(self.pid, "invoke", op)
        self._send(op, now)

    def _send(self, op: Op, now: float) -> None:
        core = self.node.client
        assert core is not None
        op.tries += 1
        bundle = self.run.cfg.bundle
        if op.kind == "mixed":
            op.request, fx = core.write(("append", ((op.key, "m"), (op.hi, "m"))), now)
            self.node.feed(fx)
            return
        if op.kind in ("append", "put"):
            write = (op.kind, ((op.key, op.value),))
            if bundle and op.kind == "append":
                pair = [write, ("put", ((op.key + 1, "x"),))]
                if self.run.rng.random() < 0.5:
                    pair.reverse()
                # As a loader that does not wait for an append's answer sends them
                # (the Spark writer): in one message with the put when both keys lie in
                # one piece of the ring.
                messages, fx = core.write_batch(pair, now, 2, alone=_never)
                ours = next(rid for indices, rid in messages if pair.index(write) in indices)
                op.request = ours
            else:
                op.request, fx = core.write(write, now)
            self.node.feed(fx)
            return
        query = ("scan", op.key, op.hi) if op.kind == "scan" else ("get", (op.key,))
        if bundle and op.level != "basic":
            other = ("get", (key_of(self.run.rng.randrange(KEYS)),))
            pair = [query, other] if self.run.rng.random() < 0.5 else [other, query]
            op.request = ("batch", op.tries)
            tag = op.request

            def done(got: Any, gather: Any, tag: Any = tag) -> None:
                if got is query and self.op is op and op.request == tag:
                    self._batch_done(op, gather)

            _, fx = core.read_batch(pair, op.level, done, now, bundle=2)
        else:
            op.request, fx = core.read(query, op.level, now)
        self.node.feed(fx)

    def _batch_done(self, op: Op, gather: Any) -> None:
        """A bundled read's outcome (``read_batch`` has no retries: the caller's)."""
        now = self.node._now
        if gather is None or (gather.error is not None and not gather.refused):
            self._finish(op, "info", now)
        elif gather.refused:
            op.refused_once = True
            if op.tries < 5:
                self._send(op, now)
            else:
                self._finish(op, "fail", now)
        else:
            try:
                self._read_value(op, self.node.client.result(gather))  # type: ignore[union-attr]
            except Exception:
                self._finish(op, "fail", now)
                return
            self._finish(op, "ok", now)

    def _upcall(self, node: RbNode, item: Any, now: float) -> None:
        op = self.op
        t = type(item)
        if op is None or (t is not ReadDone and t is not WriteDone) or item.request != op.request:
            return
        if t is WriteDone:
            self._finish(op, "ok" if item.error is None else self._outcome(item.error), now)
            return
        if item.error is not None:
            self._finish(op, self._outcome(item.error), now)
            return
        self._read_value(op, item.result)
        self._finish(op, "ok", now)

    @staticmethod
    def _outcome(error: Exception) -> str:
        """A write or read that surely did not happen fails; one that may have is unknown."""
        from rubberband.errors import Rejected, Unavailable

        return "fail" if isinstance(error, Rejected | Unavailable) else "info"

    def _read_value(self, op: Op, result: Any) -> None:
        if op.kind == "scan":
            keys = [k for k, _ in result]
            if keys != sorted(set(keys)):
                self.run.anomalies.append(
                    f"{self.pid}: a {op.level} scan returned keys twice or out of order: "
                    f"{keys[:12]}"
                )
            op.value = {k: list(v) for k, v in result if k % (10_000 // KEYS) == 37}
        else:
            op.value = list(result.get(op.key, ()))
        if op.level == "snapshot" and op.refused_once:
            self.run.situations["snapshot_rejected_then_accepted"] += 1

    def _finish(self, op: Op, outcome: str, now: float) -> None:
        self.run.record(self.pid, outcome, op)
        if op.kind in ("read", "scan") and op.level == "sequential" and outcome == "ok":
            self.run.read_latencies.append((op.started, now - op.started))
        self.op = None
        self.next_op_at = now if op.kind in ("put", "mixed") else now + self.run.think
