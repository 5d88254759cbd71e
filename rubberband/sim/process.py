"""One Rubberband process in the simulator: E-Cast's endpoint and one shipped core.

The simulator's driver: it feeds the endpoint what the network brings, the core the
endpoint's upcalls (deliveries, acknowledgements, sheds), direct messages and the time,
and carries out the core's effects with :func:`rubberband.driver.carry_out`, as the
asyncio hosts and the SDK do.  Only the I/O differs: direct messages leave through the
simulated links, submissions go straight into the endpoint.

A storage process takes its deliveries in as its host does (:mod:`rubberband.host`):
it confirms them to its routers as it takes them (its endpoint confirms when told they
are durable), and takes no more while its holds pause the intake for a view's maintainer
far behind its change log (:mod:`rubberband.holds`); what waits meanwhile stays
unconfirmed, unstable at the routers, whose flow control slows the writers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ecast import (
    Acked,
    Delivery,
    Direct,
    Effects,
    Endpoint,
    NodeId,
    Rejected,
    Shed,
    Terminated,
)
from rubberband.client import ClientCore
from rubberband.driver import carry_out
from rubberband.outputs import Submit
from rubberband.proto import Ping, Pong
from rubberband.storage import StorageCore
from rubberband.super import SuperCore

if TYPE_CHECKING:
    from rubberband.sim.run import RubberbandRun

Core = StorageCore | SuperCore | ClientCore


class RbNode:
    """A simulated Rubberband process (``storage:``, ``super:`` or ``client:``)."""

    def __init__(self, run: RubberbandRun, pid: NodeId, routers: list[NodeId], core: Core) -> None:
        self.run = run
        self.pid = pid
        params = run.cfg.endpoint
        if isinstance(core, StorageCore):
            params = replace(params, confirm_when_durable=True)
        self.ep = Endpoint(pid, routers, params, incarnation=1, role_of=run.role_of)
        self.core = core
        self.role = pid.split(":")[0]
        self.tokens: dict[Any, Any] = {}
        """E-Cast message id -> the core's token."""
        self.on_upcall: Callable[[RbNode, Any, float], None] | None = None
        """Where the core's upcalls go (a client's workload, the run's records)."""
        self.next_wake: Callable[[], float | None] | None = None
        """An extra timer of the one who uses this node (the workload's next op)."""
        self.on_step: Callable[[float], None] | None = None
        """Called in each tick, after the core's (the workload issues its next op)."""
        self._fx: Effects = Effects()
        self._now = 0.0
        self._core_wake: float | None = None
        self.intake: list[Delivery] = []
        """A storage process's deliveries not taken in yet (held for a view)."""
        self._held_until = 0.0
        self.held_pauses = 0
        """Times its intake paused for a view's maintainer."""

    @property
    def storage(self) -> StorageCore | None:
        return self.core if isinstance(self.core, StorageCore) else None

    @property
    def super(self) -> SuperCore | None:
        return self.core if isinstance(self.core, SuperCore) else None

    @property
    def client(self) -> ClientCore | None:
        return self.core if isinstance(self.core, ClientCore) else None

    # ------------------------------------------------------------------ the driver's IO
    def send(self, dst: NodeId, msg: Any) -> None:
        self._fx.send.append((dst, msg))

    def submit(self, submissions: list[Submit]) -> None:
        ep, fx, now = self.ep, self._fx, self._now
        for s in submissions:
            if s.unsafe:
                ids, more = ep.submit_unsafe_numbered([(s.payload, s.header)], now)
                sid = ids[0] if ids else None
            else:
                sid, more = ep.submit(s.payload, s.header, now)
            fx.extend(more)
            if s.token is not None and sid is not None:
                self.tokens[sid] = s.token
            self.run.on_submit(self, s, sid)

    def suspect(self, who: tuple[NodeId, ...]) -> None:
        _, more = self.ep.suspect(list(who), self._now)
        self._fx.extend(more)

    def upcall(self, item: Any) -> None:
        if self.on_upcall is not None:
            self.on_upcall(self, item, self._now)

    def stop(self, reason: str) -> None:
        self.run.stopped[self.pid] = reason

    def wake(self, at: float | None) -> None:
        self._core_wake = at

    def feed(self, fx: Effects) -> None:
        """Carry out a core's effects in this step (a workload's request, say)."""
        carry_out(fx, self)

    # ------------------------------------------------------------------ E-Cast core protocol
    def on_messages(self, src: NodeId, msgs: tuple[Any, ...], now: float) -> Effects:
        self._begin(now)
        rest = [m for m in msgs if type(m) is not Direct]
        if rest:
            self._endpoint(self.ep.on_messages(src, rest, now))
        for m in msgs:
            if type(m) is Direct and self.ep.terminated is None:
                self._direct(src, m.payload, now)
        return self._end()

    def on_tick(self, now: float) -> Effects:
        self._begin(now)
        self._endpoint(self.ep.on_tick(now))
        if self.ep.terminated is None:
            if self.intake:
                self._take()
            carry_out(self.core.on_tick(now), self)
            if self.on_step is not None:
                self.on_step(now)
        return self._end()

    def call(self, fn: Callable[[Any, float], Effects], now: float) -> Effects:
        """Run ``fn(core, now)`` in a step of this node (the run's requests)."""
        self._begin(now)
        carry_out(fn(self.core, now), self)
        return self._end()

    def start(self, now: float, join: bool) -> Effects:
        self._begin(now)
        if join:
            sid, fx = self.ep.join(now)
            self.run.on_submit(self, None, sid)
            self._endpoint(fx)
        else:
            self._endpoint(self.ep.on_tick(now))
        return self._end()

    # ------------------------------------------------------------------ internals
    def _begin(self, now: float) -> None:
        self._fx = Effects()
        self._now = now

    def _end(self) -> Effects:
        fx = self._fx
        fx.wake(self._core_wake)
        if self.intake:
            fx.wake(self._held_until)
        if self.next_wake is not None:
            fx.wake(self.next_wake())
        return fx

    def _direct(self, src: NodeId, payload: Any, now: float) -> None:
        core = self.core
        if type(payload) is Ping and not isinstance(core, SuperCore):
            # A storage host answers heartbeats on its loop, never behind its engine.
            figures = {}
            if isinstance(core, StorageCore):
                figures = {"applied": core.stats.applied, "queued": len(core.queue)}
            self._fx.send.append((src, Direct(Pong(payload.sent_ms, figures))))
            return
        fx = core.on_direct(src, payload, now)
        self.run.observe_direct(self, src, payload, fx)
        carry_out(fx, self)

    def _endpoint(self, fx: Effects) -> None:
        """The endpoint's effects: its sends go out; its upcalls go to the core."""
        ups, fx.deliver = fx.deliver, []
        self._fx.extend(fx)
        if not ups:
            return
        core = self.core
        now = self._now
        deliveries: list[Delivery] = []
        for up in ups:
            t = type(up)
            if t is Delivery:
                deliveries.append(up)
                continue
            if deliveries:
                self._deliver(deliveries)
                deliveries = []
            if t is Acked:
                token = self.tokens.pop(up.id, None)
                self.run.on_ack(self, up, token)
                if token is not None:
                    carry_out(core.on_acked(token, up.delivered, now), self)
            elif t is Rejected:
                token = self.tokens.pop(up.id, None)
                if token is not None and isinstance(core, ClientCore):
                    carry_out(core.on_rejected(token, RuntimeError(up.reason), now), self)
            elif t is Shed:
                for mid in up.ids:
                    token = self.tokens.pop(mid, None)
                    if token is not None and isinstance(core, ClientCore):
                        carry_out(core.on_shed(token, now), self)
            elif t is Terminated:
                self.run.terminated[self.pid] = up.reason
        if deliveries:
            self._deliver(deliveries)

    def _deliver(self, deliveries: list[Delivery]) -> None:
        core = self.core
        if isinstance(core, StorageCore):
            self.intake.extend(deliveries)
            self._take()
        elif isinstance(core, SuperCore):
            carry_out(core.on_deliveries(deliveries, self._now), self)
            self.run.on_super_deliveries(self, deliveries)

    def _take(self) -> None:
        """A storage process takes in what waits, a batch at a time, each confirmed and
        then paused for as long as its holds say (the host's ``_on_taken``)."""
        now = self._now
        core = self.core
        assert isinstance(core, StorageCore)
        size = self.run.cfg.intake_batch
        while self.intake and now >= self._held_until:
            batch, self.intake = self.intake[:size], self.intake[size:]
            carry_out(core.on_deliveries(batch, now), self)
            self._endpoint(self.ep.durable(batch[-1].t, now))
            wait = core.holds.pause(batch[-1].t, now)
            if wait > 0:
                self.held_pauses += 1
                self._held_until = now + wait
