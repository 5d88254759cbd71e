"""What a super does over time: watch the others, and see reconfigurations through.

Sans-IO parts of :class:`rubberband.super.SuperCore`, each with its own timers.

:class:`Watch` (4.2.3): every ``heartbeat`` the super pings every storage process and
every other super; one silent for ``suspect_after`` gets this super's vote (a suspect
message; the config counts the votes).  A super that itself did not run for that long
(paused, starved of CPU) suspects nobody on that evidence and listens afresh.  The pongs
carry a storage process's figures, turned into load (operations per second, items,
bytes, queue, round trip) for the admin API.

:class:`Reconfigurations`: each request (an operator's, a storage process's leave, or a
repair the super decides on its own) is planned, submitted, planned again while stale
(another keyspace message came first: acknowledged without delivery), and followed
until every receiver is ready, within its deadline; then its requester hears the result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ecast import Direct, Effects, NodeId
from ecast.core import mutations
from rubberband.config import CLIENTS
from rubberband.errors import MustWait, Refused
from rubberband.outputs import Submit, Suspect
from rubberband.proto import REPORTED_CLIENTS, H, Leave, Left, Ping, Pong

if TYPE_CHECKING:
    from rubberband.super import SuperCore

MAX_NAME = 255
"""The longest client name taken from a heartbeat answer (E-Cast's limit on names)."""
FRESH_BEATS = 3
"""Heartbeats after which a storage process's report of its clients is too old to count."""

NO_VOTES = mutations.declare("no_votes", "super", "a super never votes a silent process out")
NO_REPAIR = mutations.declare(
    "no_repair", "super", "the repair timer never runs out: broken holders wait for ever"
)


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """Upcall: a reconfiguration request ended.  ``result`` as the admin API answers it
    (op, args, version, instructions, ...), or ``error`` (a ``Refused`` or a
    ``TimeoutError``)."""

    request: Any
    result: dict[str, Any] | None
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class Voted:
    """Upcall: this super voted ``process`` out after ``silent`` seconds of silence."""

    process: NodeId
    silent: float


class Watch:
    """Heartbeats, load, and votes against the silent."""

    def __init__(self, core: SuperCore, heartbeat: float, suspect_after: float) -> None:
        self.core = core
        self.heartbeat = heartbeat
        self.suspect_after = suspect_after
        self.heard: dict[NodeId, float] = {}
        self.loads: dict[NodeId, dict[str, Any]] = {}
        self.clients: dict[NodeId, tuple[float, frozenset[NodeId]]] = {}
        """Per storage process: when it last reported, and the clients it had heard."""
        self.voted: set[NodeId] = set()
        self.votes = 0
        self._started: float | None = None
        self._previous: float | None = None
        self.next_beat = 0.0

    def beat(self, now: float, fx: Effects) -> None:
        """Every ``heartbeat``: ping the watched, vote against the silent."""
        if now < self.next_beat:
            return
        self.next_beat = now + self.heartbeat
        c = self.core.config
        if c is None:
            return
        if self._started is None:
            self._started = now
        prev = self._previous if self._previous is not None else now
        if now - prev > self.suspect_after:
            # This super itself did not run (paused, or starved of CPU or memory): the
            # silence it would measure is its own, and answers may be waiting unread.
            # Nobody is suspected on that evidence; listen afresh.
            fx.deliver.append(Stalled(now - prev))
            for p in self.heard:
                self.heard[p] = now
        self._previous = now
        watched = (c.storage() | c.supers()) - {self.core.me}
        ping = Direct(Ping(int(time.time() * 1000)))  # the wall clock: echoed, not read here
        for p in sorted(watched):
            fx.send.append((p, ping))
            last = self.heard.setdefault(p, max(now, self._started))
            if now - last > self.suspect_after and p not in self.voted:
                if mutations.on(NO_VOTES):
                    continue
                self.voted.add(p)
                self.votes += 1
                fx.deliver.append(Suspect((p,)))
                fx.deliver.append(Voted(p, now - last))
        for p in [p for p in self.heard if p not in watched]:
            del self.heard[p]
            self.voted.discard(p)
        for p in [p for p in self.loads if p not in watched]:
            del self.loads[p]
            self.clients.pop(p, None)

    def heard_from(self, src: NodeId, now: float, sent_ms: int, figures: dict[str, Any]) -> None:
        """A pong: ``src`` is alive; its figures (a storage process's) give its load."""
        self.heard[src] = now
        if not figures:
            return
        prev = self.loads.get(src)
        rate = 0.0
        applied = figures.get("applied")
        if prev is not None and type(applied) is int and now > prev["at"]:
            rate = max(0.0, (applied - prev["applied"]) / (now - prev["at"]))
            rate = 0.5 * rate + 0.5 * prev["ops_per_s"]  # smooth over two beats
        rtt = max(0.0, time.time() * 1000 - sent_ms) if type(sent_ms) is int else None
        names = figures.get("clients")
        age = figures.get("age_s")
        at = now - age if type(age) in (int, float) and 0 <= age < 3600 else now
        self.clients[src] = (
            at,
            frozenset(
                n for n in names[:REPORTED_CLIENTS]
                if type(n) is str and n.startswith(CLIENTS) and len(n) <= MAX_NAME
            )
            if type(names) in (list, tuple)
            else frozenset(),
        )  # fmt: skip
        count = figures.get("client_count")
        if now - at > FRESH_BEATS * self.heartbeat:  # idle: the clients of its last work
            count = 0
        self.loads[src] = {
            "at": now,
            "applied": applied if type(applied) is int else 0,
            "ops_per_s": round(rate, 1),
            "items": figures.get("items"),
            "bytes": figures.get("bytes"),
            "queued": figures.get("queued"),
            "rtt_ms": None if rtt is None else round(rtt, 2),
            "clients": count if type(count) is int else None,
        }

    def active_clients(self, now: float) -> frozenset[NodeId]:
        """Clients some storage process heard from in figures at most ``FRESH_BEATS``
        heartbeats old (a light client joins no group: this is how the supers know it is at
        work)."""
        recent = now - FRESH_BEATS * self.heartbeat
        out: frozenset[NodeId] = frozenset()
        for at, names in self.clients.values():
            if at >= recent:
                out |= names
        return out


@dataclass(frozen=True, slots=True)
class Stalled:
    """Upcall: this super did not run for ``seconds`` (its heartbeats were late)."""

    seconds: float


@dataclass(slots=True)
class _Request:
    request: Any
    op: str
    args: tuple[Any, ...]
    force: bool
    wait: bool
    deadline: float
    started: float
    attempts: int
    summary: dict[str, Any] = field(default_factory=dict)
    version: int | None = None
    """The version the keyspace message makes, once it was delivered (not stale)."""
    submitted_from: int | None = None
    """The version the message in flight was planned from (None: none in flight)."""
    stale_from: int | None = None
    """Stale at this version: plan again once the replica passed it."""
    reply_to: NodeId | None = None
    """A storage process that asked to leave (``Leave``): told with ``Left``."""
    waits_on: Any = None
    """The configuration under which the plan had to wait (:class:`MustWait`): plan
    again once it changed."""
    waits_why: str = ""


class Reconfigurations:
    """Requests in flight, and the repairs this super makes on its own."""

    def __init__(self, core: SuperCore, auto_repair: bool, repair_after: float) -> None:
        self.core = core
        self.auto_repair = auto_repair
        self.repair_after = repair_after
        self.requests: dict[Any, _Request] = {}
        self._next_internal = 0
        self.broken_since: dict[tuple[str, tuple[Any, ...]], float] = {}
        self.repair_paused_until = 0.0
        self.repairing: Any = None
        self.counts = {"repairs": 0, "repairs_refused": 0, "reconfigurations": 0, "waited": 0}
        self.pending_since: dict[int, float] = {}
        """When each pending keyspace version was first seen pending."""
        self.seconds: list[float] = []
        """Durations of completed reconfigurations, planning to every receiver ready
        (the host turns them into a histogram)."""

    def start(
        self,
        request: Any,
        op: str,
        args: tuple[Any, ...],
        *,
        now: float,
        force: bool = False,
        dry_run: bool = False,
        wait: bool = True,
        timeout: float = 60.0,
        attempts: int = 8,
        reply_to: NodeId | None = None,
        fx: Effects,
    ) -> None:
        r = _Request(request, op, args, force, wait, now + timeout, now, attempts)
        r.reply_to = reply_to
        if dry_run:
            try:
                proposal = self.core.plan(op, *args, force=force)
            except Exception as e:
                self._end(r, None, e, fx)
                return
            self._end(r, {**self._summary(r, proposal), "submitted": False}, None, fx)
            return
        self.requests[request] = r
        self._plan(r, fx)

    def leave(
        self, src: NodeId, request: int, replace_with: str | None, now: float, fx: Effects
    ) -> None:
        """A storage process asked to leave (SIGTERM): contract it, or replace it with
        ``replace_with``; answered once that completed.  Only the process itself asks:
        the sender is the name its connection proved."""
        c = self.core.config
        key = ("leave", src, request)
        if key in self.requests:
            return
        if c is None:
            fx.send.append((src, Direct(Left(request, "this super has not joined yet", None))))
            return
        if src in c.keyspace:
            op, args = ("replace", (src, replace_with)) if replace_with else ("contract", (src,))
            self.start(key, op, args, now=now, timeout=240.0, reply_to=src, fx=fx)
            return
        # Already off the ring (a repeated request): answer once nothing is pending.
        r = _Request(key, "wait", (), False, True, now + 240.0, now, 0, reply_to=src)
        r.version = c.version
        self.requests[key] = r

    def _summary(self, r: _Request, proposal: Any) -> dict[str, Any]:
        return {
            "op": r.op,
            "args": list(r.args),
            "version_from": proposal.header[H.VERSION],
            "instructions": proposal.plan.describe(),
            "lost": bool(proposal.plan.lost),
        }

    def _plan(self, r: _Request, fx: Effects, waited: bool = False) -> None:
        if r.attempts <= 0:
            why = f"the configuration kept changing under the plans of {r.op}; try again"
            self._end(r, None, Refused(why), fx)
            return
        if not waited:  # waiting for copies in flight is no failed attempt
            r.attempts -= 1
        try:
            proposal = self.core.plan(r.op, *r.args, force=r.force)
        except MustWait as e:
            if not r.waits_why:
                self.counts["waited"] += 1  # requests that waited for copies in flight
            r.waits_on, r.waits_why = self.core.config, str(e)
            return
        except Exception as e:
            self._end(r, None, e, fx)
            return
        r.summary = self._summary(r, proposal)
        r.submitted_from = proposal.header[H.VERSION]
        fx.deliver.append(Submit(proposal.header, None, ("reconfigure", r.request)))

    def on_acked(self, request: Any, delivered: bool, now: float, fx: Effects) -> None:
        r = self.requests.get(request)
        if r is None or r.submitted_from is None:
            return
        planned_from, r.submitted_from = r.submitted_from, None
        if delivered:
            r.version = planned_from + 1
            self.counts["reconfigurations"] += 1
        else:
            r.stale_from = planned_from  # plan again once the replica moved past it
        self.progress(now, fx)

    def progress(self, now: float, fx: Effects) -> None:
        """After deliveries or time: plan stale requests again, end finished ones, time
        out late ones."""
        c = self.core.config
        if c is not None:
            self.pending_since = {v: self.pending_since.get(v, now) for v in c.pending}
        for r in list(self.requests.values()):
            if c is None:
                continue
            if r.waits_on is not None:
                if now > r.deadline:
                    self._end(r, None, TimeoutError(f"still waiting: {r.waits_why}"), fx)
                elif c is not r.waits_on:
                    r.waits_on = None
                    self._plan(r, fx, waited=True)
                continue
            if r.stale_from is not None:
                if c.version > r.stale_from:
                    r.stale_from = None
                    self._plan(r, fx)
                elif now > r.deadline:
                    why = f"the configuration did not move past version {r.stale_from}"
                    self._end(r, None, TimeoutError(why), fx)
                continue
            if r.version is None:
                if now > r.deadline and r.submitted_from is None:
                    self._end(r, None, TimeoutError(f"{r.op} was not submitted in time"), fx)
                continue
            if c.version < r.version:
                if now > r.deadline:
                    why = f"the configuration did not reach version {r.version}"
                    self._end(r, None, TimeoutError(why), fx)
                continue
            if r.op == "wait":
                if not c.pending:
                    self._end(r, {"version": c.version}, None, fx)
                elif now > r.deadline:
                    why = "reconfigurations still pending after 240 s"
                    self._end(r, None, TimeoutError(why), fx)
                continue
            if not r.wait or r.version not in c.pending:
                if r.wait:
                    self.seconds.append(now - r.started)
                self._end(r, {**r.summary, "submitted": True, "version": r.version}, None, fx)
            elif now > r.deadline:
                why = f"version {r.version} not ready in {r.deadline - r.started:.0f} s"
                self._end(r, None, TimeoutError(why), fx)

    def _end(
        self, r: _Request, result: dict[str, Any] | None, error: Exception | None, fx: Effects
    ) -> None:
        self.requests.pop(r.request, None)
        if r.reply_to is not None:
            version = result.get("version") if result else None
            message = None if error is None else str(error)
            fx.send.append((r.reply_to, Direct(Left(r.request[2], message, version))))
            return
        if r.request == self.repairing:
            self.repairing = None
            if isinstance(error, Refused):
                self.counts["repairs_refused"] += 1
                self.repair_paused_until = r.started + 5 * self.repair_after
            elif error is None:
                self.counts["repairs"] += 1
        fx.deliver.append(Reconfigured(r.request, result, error))

    def repair(self, now: float, fx: Effects) -> None:
        """The first repair :meth:`SuperCore.repairs` proposes, once the holder has been
        broken for ``repair_after`` (never forced: one that would lose data waits for an
        operator); one at a time, and after a refusal, not again for five times as long."""
        if not self.auto_repair or self.repairing is not None or now < self.repair_paused_until:
            return
        todo = self.core.repairs()
        self.broken_since = {r: self.broken_since.get(r, now) for r in todo}
        for r, since in self.broken_since.items():
            if now - since < self.repair_after or mutations.on(NO_REPAIR):
                continue
            op, args = r
            self._next_internal += 1
            self.repairing = ("repair", self._next_internal)
            self.broken_since = {}
            self.start(self.repairing, op, args, now=now, wait=False, timeout=30.0, fx=fx)
            return

    def next_deadline(self) -> float | None:
        if not self.requests:
            return None
        return min(r.deadline for r in self.requests.values())


# ---------------------------------------------------------------------- the storage side
def pong(src: NodeId, ping: Ping, figures: dict[str, Any]) -> Effects:
    """A heartbeat answered with this process's ``figures`` (its load and size)."""
    return Effects(send=[(src, Direct(Pong(ping.sent_ms, figures)))])


@dataclass(frozen=True, slots=True)
class LeaveDone:
    """Upcall: the leave ended: this process is off the ring (``error`` None; ``version``
    the keyspace that took it off, None when it held nothing), or why not."""

    error: str | None
    version: int | None = None


class Leaving:
    """A storage process asking to be taken off the ring before it stops (on SIGTERM): a
    super contracts it, or replaces it with the standby ``replace_with``, and answers
    once every receiver has its data.  Supers are asked one at a time, in name order,
    each given ``patience`` seconds to answer; the whole leave ends by ``deadline``."""

    def __init__(
        self, replace_with: str | None, now: float, timeout: float, patience: float = 30.0
    ) -> None:
        self.replace_with = replace_with
        self.deadline = now + timeout
        self.patience = patience
        self.request = 0
        self.asked: NodeId | None = None
        self.asked_at = 0.0
        self.tried: set[NodeId] = set()
        self.last = "no super answered"
        self.done = False

    def on_tick(self, supers: list[NodeId], now: float) -> Effects:
        """Ask a super (again, another one) when none was asked or the last one was
        silent for ``patience``; give up at the deadline."""
        fx = Effects()
        if self.done:
            return fx
        if now >= self.deadline:
            self.done = True
            fx.deliver.append(LeaveDone(f"not taken off the ring in time ({self.last})"))
            return fx
        if self.asked is None or now - self.asked_at >= self.patience:
            if self.asked is not None:
                self.last = f"{self.asked}: no answer in {self.patience:g} s"
            fresh = [s for s in sorted(supers) if s not in self.tried] or sorted(supers)
            if fresh:
                self.tried = set() if len(self.tried) >= len(supers) else self.tried
                self.request += 1
                self.asked, self.asked_at = fresh[0], now
                self.tried.add(fresh[0])
                fx.send.append((fresh[0], Direct(Leave(self.request, self.replace_with))))
            else:
                self.asked, self.asked_at = None, now
        fx.wake(min(self.deadline, now + min(self.patience, 1.0)))
        return fx

    def on_left(self, src: NodeId, msg: Left) -> Effects:
        """A super's answer: taken only from the super asked, to the request asked."""
        fx = Effects()
        if self.done or src != self.asked or msg.request != self.request:
            return fx
        self.done = True
        error = None if msg.error is None else str(msg.error)
        fx.deliver.append(LeaveDone(error, msg.version))
        return fx
