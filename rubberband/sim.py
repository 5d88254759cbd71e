"""Rubberband in E-Cast's deterministic simulator: routers, a super, storage processes
and clients under faults, checked (``python -m rubberband.sim``).

Every process is a real core: routers run E-Cast's router with Rubberband's Config,
storage processes the storage core over the in-memory engine, the super the super core
with heartbeats and votes, clients the client core with a list-append workload at all
three isolation levels.  The network is E-Cast's simulated one (delays, loss,
reordering across connections, partitions, crashes), seeded, so a run replays exactly.

The nemesis crashes routers and storage processes (the super votes a silent one out and
the run replaces it from standby, as an operator would), partitions the routers, kills
the leader, and reconfigures: expand, contract, replace, rebalance, sometimes two at
once so that one is planned from a stale version.  After the fault phase everything
heals, the run waits for quiescence, reads every key once more, and checks:

* the list-append checker (Elle-style cycles, lost appends) over every client operation,
  sequential reads held to sequential consistency, snapshot reads to consistent cuts,
  basic reads key by key;
* every live, complete holder of a range holds the same data;
* the super's replica equals the routers' configuration.

``--mutation NAME`` plants a bug (``MUTATIONS``) so the tests can show it is caught.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ecast import (
    Acked,
    Delivery,
    Direct,
    EcastGroupRun,
    Effects,
    Endpoint,
    EndpointParams,
    GroupRunConfig,
    Message,
    NodeId,
    RouterParams,
    Terminated,
)
from jepsen_like.checkers.history import Op
from jepsen_like.checkers.list_append import check
from rubberband.client import ClientCore, Gather
from rubberband.config import RubberbandConfig, vote_header
from rubberband.keys import NOTHING, describe, difference, encode_key, intersect
from rubberband.sdk import load_ops
from rubberband.storage import BASIC, RESULT, RESULTS, STALE, WHOLE, StorageCore
from rubberband.super import Refused, SuperCore

SUPER = "super:s1"
PING, PONG, DESCRIBE, CONFIG = "ping", "pong", "describe", "config"
RB_FAULTS = ("crash", "partition", "leader", "expand", "contract", "replace", "rebalance")
SITUATIONS = (
    "expand_under_load",
    "source_crash_mid_migration",
    "stale_keyspace_message",
    "leader_takeover",
    "snapshot_rejected_then_accepted",
    "automatic_repair",
)
MUTATIONS = (
    "reads_to_busy",  # the config sends reads to busy receivers as if they were complete
    "skip_version_check",  # storage answers basic reads whatever the client's version
    "delete_before_send",  # a delete runs before the sends that precede it
    "no_receive_buffering",  # writes to a range being received are applied at once
    "aborted_receive_ready",  # a receive whose source died says ready, not incomplete
    "no_duplicate_filter",  # the client keeps every answer, ranges answered twice too
    "bundle_unclipped",  # a bundle's read is answered for all its ranges, held or not
    "bundle_last_write_dropped",  # a write bundle's last write is applied nowhere
)
KEYS = 16
"""List-append keys, integers spread over the ids the ring uses (0 to 10,000)."""


def key_of(i: int) -> int:
    return i * (10_000 // KEYS) + 37


@dataclass
class RbRunConfig(GroupRunConfig):
    storage: int = 6
    replication: int = 3
    clients: int | None = None
    """Closed-loop clients (None: one per 200 operations, at least 4)."""
    ops: int = 600
    think: float | None = None
    """Pause between a client's operations (None: spread ``ops`` over the fault phase)."""
    heartbeat: float = 0.1
    suspect_after: float = 0.6
    answer_timeout: float = 1.0
    scenario: str | None = None
    """``expand``: no faults; the keyspace grows from ``storage - 2`` to ``storage``
    processes under load at 3 s, and sequential reads started while it does must meet
    ``availability`` (the share completing within 50 ms of virtual time)."""
    availability: float = 0.99
    bulk: int = 240
    """Bulky puts the clients make first, together (data for migrations to move)."""
    chunk_bytes: int = 400
    auto_repair: bool = False
    """The super repairs broken holders on its own (``SuperCore.repairs``, never forced),
    as ``rubberband super --auto-repair`` does; the nemesis only provisions standby
    processes and never repairs (without it, the nemesis replaces them as an operator)."""
    repair_after: float = 0.3
    """With ``auto_repair``: how long a holder stays broken before the super acts."""
    engine: str = "storage_adapters.memory:MemoryEngine"
    """The storage engine, by path (any engine answering the key-value operations:
    ``storage_adapters.scan.kv:ScanKVEngine`` runs the same schedules on the scan engine)."""
    bundle: bool = False
    """Sequential and snapshot reads travel as bundles (``read_batch``'s messages): each
    with a second read of a random key in the same message, whose answer the client
    takes apart from its own (the checkers see only the read asked for).  Appends
    travel as write bundles (``write_batch``'s messages) with a put to the next key,
    which is no list-append key, before or after them."""
    mutation: str | None = None
    router: RouterParams = field(default_factory=RouterParams)
    endpoint: EndpointParams = field(default_factory=EndpointParams)
    faults: tuple[str, ...] = RB_FAULTS


@dataclass(kw_only=True)
class RbRunResult:
    seed: int
    ops: int
    acked: int
    failed: int
    indeterminate: int
    reconfigurations: int
    faults: list[tuple[float, str]]
    violations: list[str]
    situations: dict[str, int]
    availability: dict[str, Any]
    virtual_s: float
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "ops": self.ops,
            "acked": self.acked,
            "failed": self.failed,
            "indeterminate": self.indeterminate,
            "reconfigurations": self.reconfigurations,
            "faults": len(self.faults),
            "violations": self.violations,
            "situations": self.situations,
            "availability": self.availability,
            "virtual_s": round(self.virtual_s, 3),
            "wall_s": round(self.wall_s, 2),
        }


@dataclass
class _Op:
    """A client's operation in flight."""

    kind: str  # append | read | scan | put
    key: int
    value: Any = None
    level: str = "sequential"
    started: float = 0.0
    deadline: float = 0.0
    gather: Gather | None = None
    sid: Any = None
    rid: Any = None
    tries: int = 0
    refused_once: bool = False
    final: bool = False
    hi: int = 0
    """A scan's exclusive upper bound."""
    index: int = 0
    """The read's place in its bundle (``RbRunConfig.bundle``)."""


class RbProcess:
    """One Rubberband application process in the simulator: an endpoint and its role."""

    def __init__(self, run: RubberbandRun, pid: NodeId, routers: list[NodeId]) -> None:
        self.run = run
        self.pid = pid
        self.ep = Endpoint(pid, routers, run.cfg.endpoint, incarnation=1, role_of=run.role_of)
        self.role = pid.split(":")[0]
        self.storage: StorageCore | None = None
        self.super: SuperCore | None = None
        self.client: ClientCore | None = None
        if self.role == "storage":
            engine = load_ops(run.cfg.engine)
            self.storage = StorageCore(pid, engine, chunk_bytes=run.cfg.chunk_bytes)
        elif self.role == "super":
            self.super = SuperCore(pid)
            self.heard: dict[NodeId, float] = {}
            self.voted: set[NodeId] = set()
            self.broken_since: dict[NodeId, float] = {}
            self.next_beat = 0.0
        else:
            self.client = ClientCore(load_ops(None))
            self.op: _Op | None = None
            self.next_op_at = 0.0
            self.seq = 0
            self.pending_acks: dict[Any, _Op] = {}
            self.retry_at: tuple[_Op, float] | None = None
            self.bulk_left = run.cfg.bulk // run.clients

    # ------------------------------------------------------------------ core protocol
    def on_messages(self, src: NodeId, msgs: tuple[Any, ...], now: float) -> Effects:
        rest = [m for m in msgs if type(m) is not Direct]
        fx = self.ep.on_messages(src, rest, now) if rest else Effects()
        for m in msgs:
            if type(m) is Direct and self.ep.terminated is None:
                self._direct(src, m.payload, now, fx)
        return self._absorb(fx, now)

    def on_tick(self, now: float) -> Effects:
        fx = self.ep.on_tick(now)
        if self.ep.terminated is None:
            if self.super is not None:
                self._beat(now, fx)
            elif self.client is not None:
                self._client_tick(now, fx)
        return self._absorb(fx, now)

    def _absorb(self, fx: Effects, now: float) -> Effects:
        ups, fx.deliver = fx.deliver, []
        run_: list[tuple[int, Message]] = []
        for up in ups:
            t = type(up)
            if t is Delivery:
                if self.storage is not None:
                    m = up.message
                    if up.unsafe:
                        self._storage_out(self._flush(run_), now, fx)
                        run_ = []
                        out = self.storage.deliver_unsafe(m, up.frontier, up.accepted)
                        self._storage_out(out, now, fx)
                    elif m.kind == "join" and m.sender == self.pid:
                        self._storage_out(self.storage.joined(m.payload), now, fx)
                    else:
                        run_.append((up.t, m))
                elif self.super is not None and not up.unsafe:
                    m = up.message
                    if m.kind == "join" and m.sender == self.pid:
                        self.super.joined(m.payload)
                    else:
                        self.super.deliver([(up.t, m)])
                        self.run.on_super_delivery(m)
            elif t is Acked:
                if self.client is not None:
                    self._client_acked(up, now, fx)
                elif self.super is not None:
                    self.run.on_super_ack(up)
            elif t is Terminated:
                self.run.terminated[self.pid] = up.reason
        if run_:
            self._storage_out(self._flush(run_), now, fx)
        if self.super is not None:
            fx.wake(now + 0.01)
        elif self.client is not None:
            if self.op is None:
                fx.wake(max(now, self.next_op_at))  # the next operation without delay
            else:
                fx.wake(now + 0.05)  # deadlines and retries
        return fx

    def _flush(self, run_: list[tuple[int, Message]]) -> list[tuple[Any, ...]]:
        assert self.storage is not None
        return self.storage.deliver(run_) if run_ else []

    def _storage_out(self, outs: list[tuple[Any, ...]], now: float, fx: Effects) -> None:
        for o in outs:
            if o[0] == "direct":
                fx.send.append((o[1], Direct(o[2])))
            elif o[0] == "submit":
                _, more = self.ep.submit(o[2], o[1], now)
                fx.extend(more)
            else:
                self.run.stopped[self.pid] = str(o[1])

    # ------------------------------------------------------------------ direct messages
    def _direct(self, src: NodeId, p: Any, now: float, fx: Effects) -> None:
        if type(p) is not tuple or not p:
            return
        if p[0] == PING:
            fx.send.append((src, Direct((PONG,))))
        elif self.storage is not None:
            outs = self.storage.direct(src, p)
            if p[0] == BASIC:
                self._check_basic(outs)
            self._storage_out(outs, now, fx)
        elif self.super is not None:
            if p[0] == PONG:
                self.heard[src] = now
            elif p[0] == DESCRIBE and self.super.config is not None:
                c = self.super.config
                fx.send.append((src, Direct((CONFIG, c.version, c.keyspace.to_state()))))
        elif self.client is not None:
            self._client_direct(p, now, fx)

    def _check_basic(self, outs: list[tuple[Any, ...]]) -> None:
        """Basic reads are configuration-consistent: an answer covers only ranges this
        process holds in full at the moment it answers."""
        s = self.storage
        assert s is not None
        whole = NOTHING if s.incomplete else difference(s.owned, s.receiving)
        for o in outs:
            if o[0] == "direct" and o[2][0] == RESULT and o[2][4] is None:
                covered = o[2][2]
                if difference(covered, whole):
                    self.run.anomalies.append(
                        f"{self.pid} answered a basic read for ranges it does not hold: "
                        f"{describe(difference(covered, whole))}"
                    )

    # ------------------------------------------------------------------ super
    def _beat(self, now: float, fx: Effects) -> None:
        sup = self.super
        assert sup is not None
        if sup.config is None or now < self.next_beat:
            return
        self.next_beat = now + self.run.cfg.heartbeat
        watched = sorted(sup.config.storage() - {self.pid})
        for p in watched:
            fx.send.append((p, Direct((PING,))))
            last = self.heard.setdefault(p, now)
            if now - last > self.run.cfg.suspect_after and p not in self.voted:
                self.voted.add(p)
                _, more = self.ep.submit(None, vote_header(p), now)
                fx.extend(more)
                self.run.note(f"super votes {p} out after {now - last:.2f}s of silence")
        if self.run.cfg.auto_repair:
            self._auto_repair(now, fx)

    def _auto_repair(self, now: float, fx: Effects) -> None:
        """What ``SuperHost._repair`` does on real daemons: the first repair the core
        proposes, once the holder has been broken for ``repair_after``, never forced;
        one keyspace message in flight at a time (a second, planned from the same
        version, would only be stale)."""
        sup = self.super
        assert sup is not None
        todo = sup.repairs()
        if not todo:
            self.broken_since.clear()
            return
        kind, args = todo[0]
        first = self.broken_since.setdefault(args[0], now)
        if now - first < self.run.cfg.repair_after or self.run.keyspace_sent:
            return
        self.run.note(f"super repairs on its own: {kind} {' '.join(args)}")
        self.run.situations["automatic_repair"] += 1
        fx.extend(self.plan_and_submit((kind, *args), now, again=lambda: None))

    def plan_and_submit(
        self, op: tuple[Any, ...], now: float, again: Any = None, force: bool = False
    ) -> Effects:
        """Plan ``op`` and submit it; ``again`` is what to do if it turns out stale
        (default: the same request, planned from the newer configuration)."""
        sup = self.super
        assert sup is not None
        fx = Effects()
        try:
            proposal = sup.plan(*op, force=force)
        except Refused as e:
            self.run.refused.append(f"{op}: {e}")
            return fx
        sid, more = self.ep.submit(None, proposal.header, now)
        self.run.keyspace_sent[sid] = (op, again)
        edges = [(i.src, i.dst) for i in proposal.plan.instructions if hasattr(i, "src")]
        self.run.planned.append((proposal.header["v"] + 1, edges))
        fx.extend(more)
        return fx

    # ------------------------------------------------------------------ client
    def _client_tick(self, now: float, fx: Effects) -> None:
        run = self.run
        c = self.client
        assert c is not None
        if c.keyspace is None:
            if now >= self.next_op_at:
                self.next_op_at = now + 0.2
                fx.send.append((SUPER, Direct((DESCRIBE,))))
            return
        op = self.op
        if op is not None:
            retry = self.retry_at
            if retry is not None and retry[0] is op and now >= retry[1]:
                self.retry_at = None
                self._send_read(op, now, fx)
            elif now >= op.deadline:
                self._finish(op, "info", now)
            return
        if now < self.next_op_at:
            return
        final = run.final_phase
        if final:
            key = run.next_final_key()
            if key is None:
                self.next_op_at = now + 0.01  # look again soon, not at every step
                return
            self._start(_Op("read", key, level="sequential", final=True), now, fx)
            return
        rng = run.rng
        if self.bulk_left > 0:
            # Load bulky data first, so that migrations take a while (and have a middle
            # to crash in); these puts are not part of the list-append history.
            self.bulk_left -= 1
            k = rng.randrange(10_000)
            if k % (10_000 // KEYS) == 37:
                k += 1  # never a list-append key
            self._start(_Op("put", k, "x" * 120), now, fx)
            return
        if not run.may_issue():
            # Nothing to issue until the final reads begin: look again soon (waking at
            # once would step this client through every tenth of a millisecond).
            self.next_op_at = now + 0.01
            return
        if rng.random() < 0.15:
            a, b = sorted((rng.randrange(KEYS), rng.randrange(KEYS)))
            level = ("sequential", "snapshot", "basic")[rng.randrange(3)]
            self._start(_Op("scan", key_of(a), hi=key_of(b) + 1, level=level), now, fx)
            return
        key = key_of(rng.randrange(KEYS))
        if rng.random() < 0.55:
            self.seq += 1
            value = int(self.pid.split("c")[-1]) * 100_000 + self.seq
            self._start(_Op("append", key, value), now, fx)
        else:
            level = ("sequential", "snapshot", "basic")[rng.randrange(3)]
            self._start(_Op("read", key, level=level), now, fx)

    def _start(self, op: _Op, now: float, fx: Effects) -> None:
        c = self.client
        assert c is not None
        op.started = now
        op.deadline = now + self.run.cfg.answer_timeout * 3
        self.op = op
        self.run.record(self.pid, "invoke", op)
        if op.kind in ("append", "put"):
            write = (op.kind, ((op.key, op.value),))
            payload, header = c.write(write)
            if self.run.cfg.bundle and op.kind == "append":
                pair = [write, ("put", ((op.key + 1, "x"),))]
                if self.run.rng.random() < 0.5:
                    pair.reverse()
                messages = c.writes(pair, 2, 1 << 16, alone=lambda _: False)
                if len(messages) == 1:  # the two keys are in one piece of the ring
                    _, payload, header = messages[0]
            sid, more = self.ep.submit(payload, header, now)
            op.sid = sid
            self.pending_acks[sid] = op
            fx.extend(more)
            return
        self._send_read(op, now, fx)

    def _send_read(self, op: _Op, now: float, fx: Effects) -> None:
        c = self.client
        assert c is not None
        query = ("scan", op.key, op.hi) if op.kind == "scan" else ("get", (op.key,))
        payload, header, gather = c.read(query)
        if self.run.cfg.mutation == "no_duplicate_filter":
            gather.__class__ = _NoFilterGather
        op.gather = gather
        op.tries += 1
        if self.run.cfg.bundle and op.level != "basic":
            other = ("get", (key_of(self.run.rng.randrange(KEYS)),))
            pair = [(query, gather), (other, c.gather(other))]
            op.index = int(self.run.rng.random() < 0.5)  # where in the bundle ours is
            payload, header = c.bundle(pair if op.index == 0 else pair[::-1])
        op.rid = ("q", self.pid, self.run.next_rid())
        header["q"] = op.rid
        if op.level == "sequential":
            sid, more = self.ep.submit(payload, header, now)
            op.sid = sid
            self.pending_acks[sid] = op
            fx.extend(more)
        elif op.level == "snapshot":
            fx.extend(self.ep.submit_unsafe(payload, header, now))
        else:
            try:
                targets = c.basic_targets(gather)
            except Exception:
                # The keyspace we know has no holder for it (an old one): ask the super
                # again and retry, as the SDK does.
                fx.send.append((SUPER, Direct((DESCRIBE,))))
                if op.tries >= 5:
                    self._finish(op, "fail", now)
                else:
                    self.retry_at = (op, now + 0.05)
                return
            for target, ranges in targets.items():
                fx.send.append((target, Direct((BASIC, op.rid, payload, ranges, c.version))))

    def _client_acked(self, up: Acked, now: float, fx: Effects) -> None:
        op = self.pending_acks.pop(up.id, None)
        if op is None or self.op is not op:
            return
        if not up.delivered:
            self._finish(op, "fail", now)
        elif op.kind in ("append", "put"):
            self._finish(op, "ok", now)
        elif op.gather is not None and op.gather.complete:
            self._read_done(op, now, fx)

    def _client_direct(self, p: tuple[Any, ...], now: float, fx: Effects) -> None:
        c = self.client
        assert c is not None
        if p[0] == CONFIG and len(p) == 3:
            c.learn(p[1], p[2])
            return
        op = self.op
        if op is None or op.kind not in ("read", "scan") or op.gather is None:
            return
        if p[0] == STALE and len(p) == 4 and p[1] == op.rid:
            c.learn(p[2], p[3])
            if op.level == "basic":
                self._send_read(op, now, fx)
            return
        if p[0] == WHOLE and len(p) == 4 and p[1] == op.rid:  # a bundle answered whole
            if 0 <= op.index < len(p[3]):
                op.gather.add(None, p[3][op.index], None, p[2], True)
        elif p[0] == RESULTS and len(p) == 5 and p[1] == op.rid:  # a bundle's answers
            for i, covered, result, error in p[4]:
                if i == op.index:
                    op.gather.add(covered, result, error, p[2], p[3])
        elif p[0] != RESULT or len(p) != 7 or p[1] != op.rid:
            return
        else:
            op.gather.add(p[2], p[3], p[4], p[5], p[6])
        if not op.gather.complete:
            return
        if op.level == "sequential" and op.sid in self.pending_acks:
            return  # complete once the read is also stable (ordered for sure)
        self._read_done(op, now, fx)

    def _read_done(self, op: _Op, now: float, fx: Effects) -> None:
        g = op.gather
        assert g is not None and self.client is not None
        if g.refused:
            op.refused_once = True
            if op.tries < 5:
                self._send_read(op, now, fx)
            else:
                self._finish(op, "fail", now)
            return
        try:
            result = self.client.result(g)
        except Exception:
            self._finish(op, "fail", now)
            return
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
        self._finish(op, "ok", now)

    def _finish(self, op: _Op, outcome: str, now: float) -> None:
        self.run.record(self.pid, outcome, op)
        if op.kind in ("read", "scan") and op.level == "sequential" and outcome == "ok":
            self.run.read_latencies.append((op.started, now - op.started))
        for sid in [s for s, o in self.pending_acks.items() if o is op]:
            del self.pending_acks[sid]
        self.op = None
        self.next_op_at = now if op.kind == "put" else now + self.run.think


class _NoFilterGather(Gather):
    """Planted bug: every answer counts, ranges answered twice included."""

    __slots__ = ()

    def add(self, covered: Any, result: Any, error: Any, position: Any, ok: bool) -> None:
        if not ok or error is not None:
            super().add(covered, result, error, position, ok)
            return
        whole = self.ranges if covered is None else intersect(covered, self.ranges)
        self.pieces.append((whole, result))
        super().add(covered, result, error, position, ok)


class RubberbandRun(EcastGroupRun):
    leader_crash_situation = "leader_takeover"

    def __init__(self, cfg: RbRunConfig) -> None:
        super().__init__(cfg, SITUATIONS)
        self.cfg = cfg
        self.initial = RubberbandConfig.initial(replication=cfg.replication)
        self.procs: dict[NodeId, RbProcess] = {}
        self.history: list[dict[str, Any]] = []
        self.read_latencies: list[tuple[float, float]] = []
        self.reconfig_windows: list[tuple[float, float]] = []
        self._open_windows: dict[int, float] = {}
        self.keyspace_sent: dict[Any, tuple[tuple[Any, ...], float]] = {}
        self.refused: list[str] = []
        self.stopped: dict[NodeId, str] = {}
        self.anomalies: list[str] = []
        self._next_quiet_check = 0.0
        self.planned: list[tuple[int, list[tuple[NodeId, NodeId]]]] = []
        """Copies of submitted plans not yet finished: what a crash would break."""
        self.terminated: dict[NodeId, str] = {}
        self.final_phase = False
        self._final_keys: list[str] = []
        self._issued = 0
        self._rid = 0
        self._storage_n = 0
        self.reconfigurations = 0
        for extra in ("join_during_view_change", "isolated_leader", "mutual_parts"):
            self.situations.setdefault(extra, 0)  # the router nemesis counts these too
        self.clients = cfg.clients or max(4, cfg.ops // 200)
        self.think = cfg.think or max(0.001, 0.8 * cfg.fault_time * self.clients / max(1, cfg.ops))
        self._mutate()

    # ------------------------------------------------------------------ planted bugs
    def _mutate(self) -> None:
        m = self.cfg.mutation
        if m is None:
            return
        if m not in MUTATIONS:
            raise ValueError(f"unknown mutation {m!r}; known: {', '.join(MUTATIONS)}")
        self._undo: list[Any] = []

        def patch(obj: Any, name: str, value: Any) -> None:
            self._undo.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        if m == "reads_to_busy":
            patch(RubberbandConfig, "busy", lambda self: frozenset())
        elif m == "skip_version_check":
            # Trusts the client's keyspace: answers the ranges asked for, whatever its
            # own version and whatever it still holds.
            def basic(core: StorageCore, src: Any, payload: Any, out: Any) -> None:
                _, rid, op, ranges, _version = payload
                core._answer(src, rid, op, ranges, core.version, out)

            patch(StorageCore, "_basic", basic)
        elif m in StorageCore.MUTATIONS:
            self._undo.append((StorageCore, "_keyspace", StorageCore._keyspace))
            StorageCore.plant(m)
        elif m == "bundle_unclipped":
            # Each read of a bundle is answered from every piece this process holds of
            # the bundle, as if the piece held all of the read (a missing clip).
            def unclipped(core: StorageCore, msg: Any, mine: Any) -> Any:
                import msgpack

                subs = msgpack.unpackb(msg.payload, use_list=False)
                pieces = core._pieces(mine)
                return [(i, s[0], p, s[1]) for i, s in enumerate(subs) for p in pieces], False

            patch(StorageCore, "_bundle_items", unclipped)
        elif m == "bundle_last_write_dropped":
            # An off-by-one: the last write of each bundle is checked and never applied.
            write_items = StorageCore._write_items

            def dropped(core: StorageCore, msg: Any, mine: Any) -> Any:
                items = write_items(core, msg, mine)
                last = msg.header.get("n", 0) - 1
                return None if items is None else [t for t in items if t[0] != last]

            patch(StorageCore, "_write_items", dropped)
        elif m == "no_receive_buffering":
            patch(StorageCore, "_blocked", lambda core, ranges, t: False)
        elif m == "aborted_receive_ready":
            # A receive whose source is gone counts as done: ready, never incomplete.
            def abort(core: StorageCore, tid: Any, rec: Any, out: Any) -> None:
                del core.incoming[tid]
                core._maybe_ready(rec.version, out)

            patch(StorageCore, "_abort_incoming", abort)

    def _unmutate(self) -> None:
        for obj, name, value in reversed(getattr(self, "_undo", [])):
            setattr(obj, name, value)

    # ------------------------------------------------------------------ processes
    def _make_router(
        self, rid: NodeId, founders: list[NodeId] | None, seeds: list[NodeId] | None
    ) -> Any:
        params = replace(self.cfg.router, ufab=self.ufab_params())
        return self.add_router(rid, founders, seeds, self.initial, params)

    def add_process(self, pid: NodeId, join: bool = True) -> RbProcess:
        routers = self.live() or list(self.routers)
        proc = RbProcess(self, pid, routers)
        self.procs[pid] = proc
        self.sim.add(pid, proc)
        if join:
            self.sim.call(pid, lambda h, now: h.ep.join(now)[1])
        else:
            self.sim.call(pid, lambda h, now: h.on_tick(now))
        return proc

    def add_storage(self) -> NodeId:
        self._storage_n += 1
        pid = f"storage:{self._storage_n}"
        self.add_process(pid)
        return pid

    def _replenish(self) -> None:
        super()._replenish()
        live = self.live()
        for proc in self.procs.values():
            if live and not set(proc.ep.succession) & set(live):
                proc.ep.add_routers(live)

    # ------------------------------------------------------------------ hooks
    def note(self, what: str) -> None:
        self._note(what)

    def next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def may_issue(self) -> bool:
        if self._issued >= self.cfg.ops or self.sim.now >= self.cfg.fault_time:
            return False
        self._issued += 1
        return True

    def record(self, pid: NodeId, outcome: str, op: _Op) -> None:
        if op.kind == "put":
            return  # bulk data, outside the list-append history
        if op.kind == "append":
            value: Any = [["append", op.key, op.value]]
        elif op.kind == "scan":
            keys = [key_of(i) for i in range(KEYS) if op.key <= key_of(i) < op.hi]
            got = op.value if outcome == "ok" and isinstance(op.value, dict) else None
            value = [["r", k, got.get(k, []) if got is not None else None] for k in keys]
        else:
            value = [["r", op.key, op.value if outcome == "ok" else None]]
        rec: dict[str, Any] = {
            "process": pid,
            "type": outcome,
            "f": "final-read" if op.final else "txn",
            "value": value,
            "index": len(self.history),
            "time": round(self.sim.now, 6),
        }
        if op.kind in ("read", "scan"):
            rec["level"] = op.level
        self.history.append(rec)

    def next_final_key(self) -> int | None:
        return self._final_keys.pop() if self._final_keys else None

    def on_super_delivery(self, m: Message) -> None:
        """Reconfiguration windows: from a keyspace message's delivery until every
        involved storage process said ready."""
        c = self._config()
        now = self.sim.now
        h = m.header
        if c is not None and type(h) is dict and h.get("kind") == "keyspace":
            self.reconfigurations += 1
            self._open_windows[c.version] = now
        if c is not None:
            for v in [v for v in self._open_windows if v not in c.pending]:
                self.reconfig_windows.append((self._open_windows.pop(v), now))

    def on_super_ack(self, up: Acked) -> None:
        sent = self.keyspace_sent.pop(up.id, None)
        if sent is None:
            return
        op, again = sent
        if not up.delivered:
            self.situations["stale_keyspace_message"] += 1
            self._note(f"keyspace message {op[0]} was stale: planned again")
            self.sim.at(self.sim.now + 0.02, again or (lambda: self._admin(op)))

    def _super(self) -> RbProcess | None:
        p = self.procs.get(SUPER)
        return p if p is not None and self.sim.nodes[SUPER].alive else None

    def _config(self) -> RubberbandConfig | None:
        s = self._super()
        return s.super.config if s is not None and s.super is not None else None

    def _admin(self, op: tuple[Any, ...], again: Any = None, force: bool = False) -> None:
        if self._super() is None:
            return
        self.sim.call(SUPER, lambda h, now: h.plan_and_submit(op, now, again, force))
        if (
            "crash" in self.cfg.faults
            and self.sim.now < self.cfg.fault_time
            and self.rng.random() < 0.3
        ):
            self.sim.at(self.sim.now + self.rng.uniform(0.01, 0.08), self._crash_storage)

    # ------------------------------------------------------------------ nemesis
    def _ring_healthy(self, c: RubberbandConfig) -> bool:
        """Every holder alive, a member and complete: the nemesis reconfigures and
        crashes only then.  Reconfiguring around a holder that died unnoticed, or that is
        incomplete, hands its ranges on with fewer complete copies than f; compounding
        that is the correlated failure of f holders that no replication survives."""
        return all(
            self.sim.nodes[p].alive and p in c.storage() and p not in c.incomplete
            for p in c.keyspace.processes
        )

    def _busy_clients(self) -> bool:
        return any(p.op is not None for p in self.procs.values() if p.client is not None)

    def _fault_expand(self) -> None:
        c = self._config()
        if c is None or self.sim.now >= self.cfg.fault_time or not self._ring_healthy(c):
            return
        standby = sorted(p for p in c.standby() if self.sim.nodes[p].alive)
        if not standby:
            self.add_storage()
            self.sim.at(self.sim.now + 0.1, self._fault_expand)
            return
        at = self.rng.randrange(0, 10_000)
        if self._busy_clients():
            self.situations["expand_under_load"] += 1
        self._note(f"expand {standby[0]} at {at}")
        self._admin(("expand", standby[0], at))
        if self.rng.random() < 0.4 and len(standby) > 1:
            # A second one at once: planned from the same version, so one is stale.
            at2 = self.rng.randrange(0, 10_000)
            self._note(f"expand {standby[1]} at {at2} right behind")
            self._admin(("expand", standby[1], at2))

    def _fault_contract(self) -> None:
        c = self._config()
        if c is None or len(c.keyspace) <= c.f + 1 or not self._ring_healthy(c):
            return
        victim = c.keyspace.processes[self.rng.randrange(len(c.keyspace))]
        self._note(f"contract {victim}")
        self._admin(("contract", victim))

    def _fault_replace(self) -> None:
        c = self._config()
        if c is None or not len(c.keyspace) or self.sim.now >= self.cfg.fault_time:
            return
        if not self._ring_healthy(c):
            return
        standby = sorted(p for p in c.standby() if self.sim.nodes[p].alive)
        if not standby:
            self.add_storage()
            self.sim.at(self.sim.now + 0.1, self._fault_replace)
            return
        victim = c.keyspace.processes[self.rng.randrange(len(c.keyspace))]
        self._note(f"replace {victim} with {standby[0]}")
        self._admin(("replace", victim, standby[0]))

    def _fault_rebalance(self) -> None:
        c = self._config()
        if c is None or len(c.keyspace) < 2 or not self._ring_healthy(c):
            return
        i = self.rng.randrange(len(c.keyspace))
        ids = c.keyspace.ids
        lo = ids[i - 1][1] if i > 0 and len(ids[i - 1]) == 2 else -1000
        hi = ids[i + 1][1] if i + 1 < len(ids) and len(ids[i + 1]) == 2 else 20_000
        if type(lo) is not int or type(hi) is not int or hi - lo < 3:
            return
        at = self.rng.randrange(lo + 1, hi)
        self._note(f"rebalance {c.keyspace.processes[i]} to {at}")
        self._admin(("rebalance", c.keyspace.processes[i], at))

    def _fault_crash(self) -> None:
        if self.rng.random() < 0.5:
            super()._fault_crash()
        else:
            self._crash_storage()

    def _crash_storage(self) -> None:
        """Crash a storage process, a source of a migration if there is one; never the
        last holders of a range."""
        c = self._config()
        if c is None or self.sim.now < 1.5:
            return  # not while the initial keyspace is being built
        alive = [p for p in c.keyspace.processes if p in c.storage() and self.sim.nodes[p].alive]
        if len(alive) <= c.f:
            return
        # A holder that is dead, suspected, incomplete or still receiving does not hold
        # all its data, and a crash also breaks whoever receives from the victim (and
        # from them, in turn: the flood of 4.4.2).  f such holders of one range and the
        # range is gone, the one loss Rubberband does not promise to survive: never.
        weak = {
            p
            for p in c.keyspace.processes
            if not self.sim.nodes[p].alive
            or p not in c.storage()
            or p in c.incomplete
            or self.procs[p].storage.incoming  # type: ignore[union-attr]
            or self.procs[p].storage.incomplete  # type: ignore[union-attr]
        }
        if any(
            not self.sim.nodes[p].alive or p not in c.storage() or p in c.incomplete
            for p in c.keyspace.processes
        ):
            return  # one failure at a time: the last one is not repaired yet
        ks = c.keyspace
        self.planned = [(v, e) for v, e in self.planned if v > c.version or v in c.pending]

        def safe(victim: NodeId) -> bool:
            hit = set(weak)
            todo = [victim]
            while todo:
                p = todo.pop()
                if p in hit and p != victim:
                    continue
                hit.add(p)
                core = self.procs[p].storage
                if core is None:
                    continue
                todo += [o.dst for o in core.outgoing.values()]
                todo += [q.action[2] for q in core.queue if q.action and q.action[0] == "send"]
                todo += [dst for _, edges in self.planned for src, dst in edges if src == p]
            return all(
                sum(1 for h in ks.holders_of_segment(i) if h in hit) < c.f for i in range(len(ks))
            )

        alive = [p for p in alive if safe(p)]
        if not alive:
            return
        sending = [p for p in alive if self.procs[p].storage.outgoing]  # type: ignore[union-attr]
        pool = sending if sending and self.rng.random() < 0.7 else alive
        victim = pool[self.rng.randrange(len(pool))]
        if self.procs[victim].storage.outgoing:  # type: ignore[union-attr]
            self.situations["source_crash_mid_migration"] += 1
        self.sim.crash(victim)
        self._note(f"crash storage {victim}")
        if self.cfg.auto_repair:
            # The super repairs; an operator only keeps a standby process ready for it.
            if not any(self.sim.nodes[p].alive for p in c.standby()):
                self.add_storage()
            return
        self.sim.at(self.sim.now + self.cfg.suspect_after + 0.5, lambda: self._repair(victim))

    def _repair(self, victim: NodeId) -> None:
        """As an operator: replace a suspected or incomplete process from standby."""
        c = self._config()
        if c is None or victim not in c.keyspace:
            return
        if victim in c.storage() and victim not in c.incomplete:
            self.sim.at(self.sim.now + 0.3, lambda: self._repair(victim))
            return
        standby = sorted(p for p in c.standby() if self.sim.nodes[p].alive)
        if not standby:
            self.add_storage()
            self.sim.at(self.sim.now + 0.2, lambda: self._repair(victim))
            return
        self._note(f"replace suspected {victim} with {standby[0]}")
        # A repair goes on even if data is lost (the operator's choice; the checkers then
        # say what was lost).
        self._admin(("replace", victim, standby[0]), lambda: self._repair(victim), force=True)

    def _repair_incomplete(self) -> None:
        """Replace every holder that is suspected, dead or incomplete (after the faults,
        as an operator would; with ``auto_repair`` the super must have done it)."""
        c = self._config()
        if c is None or self.cfg.auto_repair:
            return
        for p in c.keyspace.processes:
            if p not in c.storage() or p in c.incomplete or not self.sim.nodes[p].alive:
                self._repair(p)

    # ------------------------------------------------------------------ run
    def _quiet_now_and_then(self) -> bool:
        """``quiet`` at most every 10 ms of virtual time: the simulator asks after every
        event, and the check walks every process."""
        now = self.sim.now
        if now < self._next_quiet_check:
            return False
        self._next_quiet_check = now + 0.01
        return self.quiet()

    def quiet(self) -> bool:
        correct = self.correct_routers()
        if not correct or not self.group_quiescent(correct):
            return False
        if any(self.routers[r].unstable() for r in correct):
            return False
        for pid, proc in self.procs.items():
            if not self.sim.nodes[pid].alive or proc.ep.terminated is not None:
                continue
            ep = proc.ep
            if ep.window or ep.queued or ep.control:
                return False
            s = proc.storage
            busy = s is not None and (s.incoming or s.outgoing or s.queue)
            if busy and not s.stopped and not s.incomplete:  # type: ignore[union-attr]
                return False
            if proc.client is not None and proc.op is not None:
                return False
        c = self._config()
        if c is None or c.pending or self.keyspace_sent:
            return False
        # Every holder is a live, complete member: nothing is left for an operator (the
        # run's repairs) to replace.
        return all(
            p in c.storage() and p not in c.incomplete and self.sim.nodes[p].alive
            for p in c.keyspace.processes
        )

    def run(self) -> RbRunResult:
        cfg = self.cfg
        started = time.perf_counter()
        try:
            self.founders = self.start_founders()
            self.add_process(SUPER)
            for _ in range(cfg.storage):
                self.add_storage()
            for i in range(cfg.replication):
                self.sim.at(
                    0.2 + 0.05 * i,
                    lambda i=i: self._admin(("expand", f"storage:{i + 1}", i * 2500)),
                )
            placed = cfg.storage - 2 if cfg.scenario == "expand" else cfg.storage
            for i in range(cfg.replication, placed):
                self.sim.at(
                    0.5 + 0.1 * i,
                    lambda i=i: self._admin(("expand", f"storage:{i + 1}", i * 1000 + 500)),
                )
            for i in range(self.clients):
                self.add_process(f"client:c{i + 1}", join=False)
            if cfg.scenario == "expand":
                for n, i in enumerate(range(placed, cfg.storage)):
                    self.sim.at(
                        3.0 + 0.3 * n,
                        lambda i=i: self._admin(("expand", f"storage:{i + 1}", i * 1000 + 250)),
                    )
            self.schedule_background()
            self.sim.run(cfg.fault_time)
            self.heal_everything()
            self._repair_incomplete()
            self.sim.run(cfg.fault_time + cfg.settle_time / 2, stop=self._quiet_now_and_then)
            self._repair_incomplete()
            self.sim.run(cfg.fault_time + cfg.settle_time, stop=self._quiet_now_and_then)
            settled = self.quiet()
            self.final_phase = True
            self._final_keys = [key_of(i) for i in range(KEYS)]
            self.sim.run(
                self.sim.now + 5.0, stop=lambda: not self._final_keys and not self._busy_clients()
            )
            return self._verdict(settled, time.perf_counter() - started)
        finally:
            self._unmutate()

    def _verdict(self, settled: bool, wall: float) -> RbRunResult:
        violations: list[str] = []
        if not settled:
            violations.append("liveness: the cluster did not become quiet after healing")
        for pid, why in sorted(self.stopped.items()):
            violations.append(f"stopped: {pid}: {why}")
        violations += self.anomalies[:5]
        avail = self._availability()
        if self.cfg.scenario == "expand":
            share = avail["share"]
            if not avail["reads_during_reconfiguration"]:
                violations.append("availability: no sequential read ran during the expand")
            elif share < self.cfg.availability:
                violations.append(
                    f"availability: {share:.1%} of {avail['reads_during_reconfiguration']} "
                    f"sequential reads during the expand completed within 50 ms "
                    f"(target {self.cfg.availability:.0%})"
                )
            if avail["reads_held"]:
                violations.append(
                    f"availability: {avail['reads_held']} sequential read(s) waited for a "
                    "copy at a replica still receiving its ranges, though another replica "
                    "of every range was complete (4.4.1)"
                )
        result = check(Op.from_json(r) for r in self.history)
        if result.valid is not True:
            for name, examples in sorted(result.anomalies.items()):
                violations.append(f"list-append {name}: {examples[0][:300]}")
        violations += self._replica_violations()
        c = self._config()
        correct = self.correct_routers()
        if c is not None and correct:
            routers_config = self.routers[correct[0]].state.mseq.config_for(
                self.routers[correct[0]].state.mseq.next_t
            )
            if routers_config != c:
                violations.append("the super's replica differs from the routers' configuration")
        outcomes = {"ok": 0, "fail": 0, "info": 0}
        for r in self.history:
            if r["type"] in outcomes and r["f"] == "txn":
                outcomes[r["type"]] += 1
        return RbRunResult(
            seed=self.cfg.seed,
            ops=sum(1 for r in self.history if r["type"] == "invoke" and r["f"] == "txn"),
            acked=outcomes["ok"],
            failed=outcomes["fail"],
            indeterminate=outcomes["info"],
            reconfigurations=self.reconfigurations,
            faults=self.faults,
            violations=violations,
            situations=dict(self.situations),
            availability=avail,
            virtual_s=self.sim.now,
            wall_s=wall,
        )

    def _replica_violations(self) -> list[str]:
        c = self._config()
        if c is None:
            return []
        out = []
        ks = c.keyspace
        for s, segment in enumerate(ks.segments()):
            holders = [
                p
                for p in ks.holders_of_segment(s)
                if self.sim.nodes[p].alive
                and p in c.storage()
                and p not in c.incomplete
                and not self.procs[p].storage.incomplete  # type: ignore[union-attr]
            ]
            views = {}
            for p in holders:
                engine = self.procs[p].storage.engine  # type: ignore[union-attr]
                items = {
                    k: tuple(v) if isinstance(v, list | tuple) else v
                    for k, v in engine.items()
                    if _in_segment(k, segment)
                }
                views[p] = items
            distinct = {
                json.dumps(sorted(v.items(), key=repr), default=str) for v in views.values()
            }
            if len(distinct) > 1:
                out.append(f"replicas of segment {s} ({', '.join(holders)}) differ")
        return out

    def _availability(self) -> dict[str, Any]:
        """Sequential reads that started during a reconfiguration, and how many completed
        within 50 ms (virtual time)."""
        during = [
            lat
            for start, lat in self.read_latencies
            if any(a <= start <= b for a, b in self.reconfig_windows)
        ]
        fast = sum(1 for lat in during if lat <= 0.05)
        return {
            "reads_held": sum(
                p.storage.stats.reads_held for p in self.procs.values() if p.storage is not None
            ),
            "reads_during_reconfiguration": len(during),
            "within_50ms": fast,
            "share": round(fast / len(during), 4) if during else None,
        }


def _in_segment(key: Any, segment: Any) -> bool:
    e = encode_key(key)
    return any(lo <= e < hi for lo, hi in segment)


def run_rubberband(cfg: RbRunConfig) -> RbRunResult:
    return RubberbandRun(cfg).run()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rubberband.sim", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--storage", type=int, default=6)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--clients", type=int, help="default: one per 200 operations, at least 4")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--faults", default=",".join(RB_FAULTS))
    ap.add_argument("--fault-time", type=float, default=8.0)
    ap.add_argument("--mutation", choices=MUTATIONS)
    ap.add_argument("--scenario", choices=["expand"], help="a fixed schedule instead of faults")
    ap.add_argument(
        "--engine",
        default="storage_adapters.memory:MemoryEngine",
        help="module:Class of an engine answering the key-value operations "
        "(storage_adapters.scan.kv:ScanKVEngine: the scan engine)",
    )
    ap.add_argument(
        "--auto-repair",
        action="store_true",
        help="the super repairs broken holders on its own (the nemesis does not)",
    )
    ap.add_argument(
        "--bundle",
        action="store_true",
        help="reads and appends travel in bundles of two (read_batch's, write_batch's)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in RB_FAULTS]
    if unknown:
        print(f"unknown faults {unknown}; known: {', '.join(RB_FAULTS)}", file=sys.stderr)
        return 2
    cfg = RbRunConfig(
        seed=args.seed,
        routers=args.routers,
        storage=args.storage,
        replication=args.replication,
        clients=args.clients,
        ops=args.ops,
        faults=faults,
        fault_time=args.fault_time,
        mutation=args.mutation,
        scenario=args.scenario,
        engine=args.engine,
        auto_repair=args.auto_repair,
        bundle=args.bundle,
    )
    if args.scenario:
        cfg.faults = ()
    res = run_rubberband(cfg)
    out = res.to_json()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 1 if res.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
