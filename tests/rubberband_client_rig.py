"""A Rubberband client core wired to the storage-core model: the driver's IO over
:class:`tests.rubberband_model.Model`, with virtual time.

The rig carries out the core's effects with the one driver (``carry_out``): safe
submissions enter the model's order (their acknowledgement says whether any holder
delivered them), unsafe ones reach the holders as of the model's current position,
direct messages go to the storage cores (basic reads) or to the model's super (keyspace
questions).  What comes back to the client waits in an inbox until :meth:`pump`, so a
test can reorder, drop or forge answers between the two.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ecast import Effects, Message
from rubberband.client import ClientCore
from rubberband.driver import carry_out
from rubberband.outputs import Submit
from rubberband.proto import Describe, Described
from storage_adapters.memory import KVOps
from tests.rubberband_model import SUPER, Model


class Rig:
    name = "client:c"

    def __init__(
        self,
        m: Model,
        *,
        answer_timeout: float = 5.0,
        retry_after: float = 1.0,
        learn: bool = True,
    ) -> None:
        self.m = m
        self.core = ClientCore(KVOps(), answer_timeout=answer_timeout, retry_after=retry_after)
        self.core.supers = [SUPER]
        if learn:
            self.core.learn(m.config.version, m.config.keyspace.to_state())
        self.now = 0.0
        self.upcalls: list[Any] = []
        self.submitted: list[Submit] = []
        self.inbox: deque[tuple[str, Any]] = deque()
        """Messages to the client not yet handed to the core: ``(source, message)``."""
        self.acks: deque[tuple[Any, bool]] = deque()
        self.silent = False
        """Storage processes take nothing this client sends (nothing is answered)."""
        self.lose_acks = False
        self.mute_answers = False
        """Storage processes apply what this client sends, but their answers are lost."""
        self.answer_delay = 0.0
        """Seconds each answer takes to reach the client (a loaded cluster's)."""
        self.delayed: list[tuple[float, str, Any]] = []
        self.wake_at: float | None = None
        self.batched = True
        """Answers from one process in a row go to the core in one call, as the SDK
        hands it a frame's (``on_directs``), and the acknowledgements waiting too
        (``on_acks``); False: one at a time (``on_direct``, ``on_acked``)."""

    # ------------------------------------------------------------------ the driver's IO
    def send(self, dst: str, direct: Any) -> None:
        msg = direct.payload
        if dst == SUPER:
            if type(msg) is Describe:
                c = self.m.config
                answer = Described(msg.request, c.version, c.keyspace.to_state(), "range")
                self.inbox.append((SUPER, answer))
            return
        if self.silent or dst in self.m.dead:
            return
        self.m._outputs(dst, self.m.storage[dst].on_direct(self.name, msg))
        self._collect()

    def submit(self, submissions: list[Submit]) -> None:
        m = self.m
        for s in submissions:
            self.submitted.append(s)
            if self.silent:
                continue
            if s.unsafe:
                msg = Message(self.name, (("u", 0, self.name), next(m.seq)), s.header, s.payload)
                for d in sorted(m.config.destset(msg)):
                    if d not in m.dead:
                        # The frontier is the next position the router forwards.
                        m._outputs(d, m.storage[d].deliver_unsafe(msg, m.t + 1, True))
            else:
                dests = m.submit(self.name, dict(s.header), s.payload)
                m.settle()
                if s.token is not None and not self.lose_acks:
                    self.acks.append((s.token, bool(dests - m.dead)))
        self._collect()

    def suspect(self, who: tuple[str, ...]) -> None:
        raise AssertionError("a client core never votes")

    def upcall(self, item: Any) -> None:
        self.upcalls.append(item)

    def stop(self, reason: str) -> None:
        raise AssertionError(f"a client core never stops itself ({reason})")

    def wake(self, at: float | None) -> None:
        self.wake_at = at

    # ------------------------------------------------------------------ running
    def _collect(self) -> None:
        mine = [(src, msg) for src, dst, msg in self.m.to_clients if dst == self.name]
        self.m.to_clients[:] = [x for x in self.m.to_clients if x[1] != self.name]
        if self.mute_answers:
            return
        if self.answer_delay:
            self.delayed += [(self.now + self.answer_delay, src, msg) for src, msg in mine]
        else:
            self.inbox.extend(mine)

    def run(self, fx: Effects) -> None:
        carry_out(fx, self)

    def pump(self) -> None:
        """Hand the core everything waiting for it, answers first, until nothing is."""
        core = self.core
        while self.inbox or self.acks:
            while self.inbox:
                src, msg = self.inbox.popleft()
                if not self.batched:
                    self.run(core.on_direct(src, msg, self.now))
                    continue
                run = [msg]
                while self.inbox and self.inbox[0][0] == src:
                    run.append(self.inbox.popleft()[1])
                self.run(core.on_directs(src, run, self.now))
            if self.batched and self.acks and not self.inbox:
                acks = list(self.acks)  # (as E-Cast hands a client its acks: in batches)
                self.acks.clear()
                self.run(core.on_acks(acks, self.now))
            while self.acks and not self.inbox:
                token, delivered = self.acks.popleft()
                self.run(core.on_acked(token, delivered, self.now))

    def tick(self, dt: float) -> None:
        self.now += dt
        due = [(src, msg) for at, src, msg in self.delayed if at <= self.now]
        self.delayed = [x for x in self.delayed if x[0] > self.now]
        self.inbox.extend(due)
        self.pump()
        self.run(self.core.on_tick(self.now))
        self.pump()

    def done(self, rid: int) -> Any:
        """The upcall that ended request ``rid`` (None while it runs)."""
        return next((u for u in self.upcalls if getattr(u, "request", None) == rid), None)

    def until_done(self, rid: int, limit: float = 60.0, step: float = 0.05) -> Any:
        self.pump()
        while self.done(rid) is None:
            assert self.now < limit, f"request {rid} never ended"
            self.tick(step)
        return self.done(rid)

    def read(self, op: Any, level: str, **kw: Any) -> int:
        rid, fx = self.core.read(op, level, self.now, **kw)
        self.run(fx)
        return rid

    def write(self, op: Any) -> int:
        rid, fx = self.core.write(op, self.now)
        self.run(fx)
        return rid
