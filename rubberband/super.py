"""The super process core: a replica of the configuration, and reconfiguration plans.

Sans-IO (dissertation 4.2.1, 4.4).  A super receives every message that changes the
configuration (joins, parts, votes, keyspace messages, ``ready`` and ``incomplete``
reports: the Config routes all of them to the supers), so applying each delivered
message to the state its own join carried keeps an exact replica of the routers' config,
at the same position in the history.

:meth:`SuperCore.plan` turns an administrator's request into a keyspace message stamped
with the version it was computed from, with the instruction list of the optimizer
(Algorithm 13) and the refusals a careful operator wants: a contract below the replication
factor, a reconfiguration that would lose data (no holder of some range left)
unless forced, a process that is not standby or not on the ring.  A keyspace message that
E-Cast acknowledges without delivery was stale (another reconfiguration came first); the
host plans it again from the newer configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ecast import Direct, Effects, NodeId
from rubberband.config import MAINTAINER, STORAGE, RubberbandConfig
from rubberband.engine import Placement
from rubberband.errors import MustWait, Refused
from rubberband.exposure import judge, why_wait
from rubberband.keys import EKey, RangeSet, decode_key, describe, difference, encode_key, json_key
from rubberband.optimizer import Plan, optimize
from rubberband.outputs import Submit
from rubberband.placement import BadReconfiguration, Keyspace
from rubberband.proto import (
    Describe,
    Described,
    H,
    Leave,
    Levelled,
    LevelTail,
    Ping,
    Pong,
    ViewProgress,
    keyspace_header,
)
from rubberband.restart import Leveller
from rubberband.supervision import Reconfigurations, Watch

RESTORE_AGAIN = 2.0
"""Seconds before a restore that was not delivered is asked again."""


@dataclass(frozen=True)
class Proposal:
    """A keyspace message ready to submit, and the plan it carries (for a dry run)."""

    header: dict[str, Any]
    plan: Plan
    before: Keyspace
    after: Keyspace

    def describe(self) -> list[str]:
        h = self.header
        return [f"op {h[H.OP][0]} at version {h[H.VERSION]}", *self.plan.describe()]


class SuperCore:
    """A super: its replica of the configuration, the plans it makes, and what it does
    over time (:mod:`rubberband.supervision`: heartbeats and votes, reconfigurations
    followed to the end, repairs)."""

    def __init__(
        self,
        me: str,
        *,
        heartbeat: float = 0.5,
        suspect_after: float = 3.0,
        auto_repair: bool = True,
        repair_after: float = 2.0,
        restore: Any = None,
        restore_wait: float = 120.0,
    ) -> None:
        """``restore``: a ring recorded by :meth:`record` (of a cluster that lost every
        process), put back once every holder has joined this new group; a holder whose
        data no process claims ``restore_wait`` seconds after the first try is lost, if
        the others hold a copy of every range."""
        if not me.startswith("super:"):
            raise ValueError(f"a super process is named super:..., not {me!r}")
        self.me = me
        self.config: RubberbandConfig | None = None
        self.restore = restore
        self.restore_waits_for: list[NodeId] = []
        """The recorded holders that have not joined yet (the restore waits for them)."""
        self._restore_asked = float("-inf")
        self._leveller: Leveller | None = None
        self.restore_wait = restore_wait
        self._restore_since: float | None = None
        self._given_up: tuple[str, ...] = ()
        """Recorded holders given up as lost (no process claimed them in time)."""
        self.position = -1
        """The newest position delivered to this super."""
        self.watch = Watch(self, heartbeat, suspect_after)
        self.reconfigurations = Reconfigurations(self, auto_repair, repair_after)
        self.views = ViewReports()

    # ------------------------------------------------------------------ inputs
    def on_deliveries(self, deliveries: Any, now: float) -> Effects:
        """E-Cast's deliveries: our own join hands us the configuration, every other
        message moves the replica on (unsafe ones are reads, never for a super)."""
        fx = Effects()
        me = self.me
        for d in deliveries:
            if d.unsafe:
                continue
            m = d.message
            self.position = d.t
            if m.sender == me and m.kind == "join":
                self.joined(m.payload)
            else:
                self.deliver([(d.t, m)])
        self.reconfigurations.progress(now, fx)
        self._restore(now, fx)
        self._wake(now, fx)
        return fx

    def on_direct(self, src: NodeId, msg: Any, now: float) -> Effects:
        fx = Effects()
        t = type(msg)
        if t is Pong:
            self.watch.heard_from(src, now, msg.sent_ms, msg.figures)
        elif t is Ping:
            fx.send.append((src, Direct(Pong(msg.sent_ms, {}))))
        elif t is Describe:
            c = self.config
            if c is not None:
                answer = Described(msg.request, c.version, c.keyspace.to_state(), c.partitioning)
                fx.send.append((src, Direct(answer)))
        elif t is Leave and src.startswith(STORAGE):
            self.reconfigurations.leave(src, msg.request, msg.replace_with, now, fx)
        elif t is ViewProgress and src.startswith(MAINTAINER):
            self.views.report(src, msg.views, now)
        elif (t is LevelTail or t is Levelled) and src.startswith(STORAGE):
            lev = self._leveller
            if lev is not None:
                lev.on_tail(src, msg, now, fx) if t is LevelTail else lev.on_levelled(src, msg, now)
                self._restore(now, fx)
        return fx

    def on_acked(self, token: Any, delivered: bool, now: float) -> Effects:
        """A submission of ours was acknowledged (``token``: what :class:`Submit` said)."""
        fx = Effects()
        if type(token) is tuple and token[:1] == ("reconfigure",):
            self.reconfigurations.on_acked(token[1], delivered, now, fx)
        return fx

    def on_tick(self, now: float) -> Effects:
        fx = Effects()
        if self.config is not None:
            self.watch.beat(now, fx)
            self.reconfigurations.repair(now, fx)
        self.reconfigurations.progress(now, fx)
        self._restore(now, fx)
        self._wake(now, fx)
        return fx

    # ------------------------------------------------------------------ restart
    def record(self) -> Any:
        """What a restart needs of the keyspace: ``(f, partitioning, version, ring,
        partial)``, ``partial`` the holders whose data may lack ranges (receivers of
        unfinished reconfigurations, incomplete processes); None before our join, and
        while a recorded ring waits to be restored (written then, this group's empty
        ring would take the place of the only record of it: a restart that failed
        before its restore lost the ring, and the next dropped every holder's data).
        The host writes it down at every change."""
        c = self.config
        if c is None or self.restore is not None:
            return None
        partial = set(c.incomplete)
        for p in c.pending.values():
            partial |= p.receivers
        return (c.f, c.partitioning, c.version, tuple(c.keyspace.ring()), tuple(sorted(partial)))

    def _restore(self, now: float, fx: Effects) -> None:
        """Put the recorded ring back into this new group: by the coordinator, into an
        empty ring, once every recorded holder has joined (each brings its ranges on
        its own disk) and the holders are level (:class:`Leveller`); asked again every
        ``RESTORE_AGAIN`` s until it is delivered."""
        r, c = self.restore, self.config
        if r is None or c is None:
            return
        if c.version != 0 or c.keyspace.processes:
            self.restore, self.restore_waits_for = None, []  # restored, or moved on
            return
        f, partitioning, _version, ring, partial, *rest = r
        lost = (*(rest[0] if rest else ()), *self._given_up)
        if (f, partitioning) != (c.f, c.partitioning):
            self.restore_waits_for = [f"a group of replication {f}, {partitioning} partitioning"]
            return
        recorded = sorted({p for _, p in ring} - set(lost))
        if c.coordinator() != self.me:  # as far as a super that does not level can tell
            self.restore_waits_for = sorted(set(recorded) - c.storage())
            return
        candidates = sorted(c.storage())  # each may hold a recorded holder's data
        lev = self._leveller
        if lev is None or lev.holders != candidates or lev.recorded != recorded:
            ks, placement = Keyspace(f, ring), Placement(partitioning)
            rounds = 0 if lev is None else lev.round  # answers to old rounds stay old
            lev = self._leveller = Leveller(candidates, recorded, ks, placement, rounds)
        self.restore_waits_for = lev.unclaimed
        self._restore_since = now if self._restore_since is None else self._restore_since
        waited = now - self._restore_since >= self.restore_wait
        if lev.unclaimed and lev.claims_known and waited and lev.covered_without(lev.unclaimed):
            self._given_up += tuple(lev.unclaimed)  # their disks are gone: restore without
            self._restore(now, fx)  # them, their ranges on the others' copies until repaired
            return
        if not lev.done:
            lev.step(now, fx)
            return
        if lev.highest >= self.position:
            # The group numbers its positions below what the holders hold (a clock set
            # back, a smaller --origin): restored now, two writes would share a
            # position.  The holders wait with their data; /status says why.
            lev.error = (f"the holders hold positions up to {lev.highest} and this group "
                         f"is at {self.position}: restart the routers' group with --origin "
                         f"above {lev.highest}")  # fmt: skip
            return
        if now - self._restore_asked < RESTORE_AGAIN:
            return
        self._restore_asked = now
        names = lev.renamed(p for _, p in ring)  # the processes that hold the data now
        op = ("restore", tuple(zip((e for e, _ in ring), names, strict=True)),
              lev.renamed(partial), lost, lev.next_epoch)  # fmt: skip
        header = keyspace_header(0, op, ())
        fx.deliver.append(Submit(header, None, ("restore",)))
        fx.wake(now + RESTORE_AGAIN)

    def reconfigure(
        self,
        request: Any,
        op: str,
        *args: Any,
        now: float,
        force: bool = False,
        dry_run: bool = False,
        wait: bool = True,
        timeout: float = 60.0,
    ) -> Effects:
        """Start a reconfiguration (the admin API's): planned, submitted, planned again
        while stale, followed until every receiver is ready (``wait``); a
        :class:`~rubberband.supervision.Reconfigured` upcall names ``request`` at the end."""
        fx = Effects()
        self.reconfigurations.start(
            request, op, tuple(args), now=now, force=force, dry_run=dry_run, wait=wait,
            timeout=timeout, fx=fx,
        )  # fmt: skip
        self._wake(now, fx)
        return fx

    def _wake(self, now: float, fx: Effects) -> None:
        fx.wake(self.watch.next_beat if self.config is not None else now + self.watch.heartbeat)
        fx.wake(self.reconfigurations.next_deadline())

    def joined(self, state: Any) -> None:
        """Our own join was delivered with the config's state (``joiner_state``)."""
        rb = state.get("rubberband") if isinstance(state, dict) else None
        self.config = RubberbandConfig.from_state(rb)

    def deliver(self, items: Any) -> None:
        """Deliveries in order; each configuration message moves the replica on."""
        c = self.config
        if c is None:
            return
        for _, msg in items:
            c = c.apply(msg)
        self.config = c

    # ------------------------------------------------------------------ planning
    def plan(self, op: str, *args: Any, force: bool = False) -> Proposal:
        """``expand NAME KEY``, ``contract NAME``, ``replace OLD NEW``, ``rebalance NAME
        KEY`` (KEY a user key); raises :class:`Refused` with the reason, or its
        :class:`MustWait` when only copies still in flight make the plan unsafe
        (``rubberband.exposure``: a request waits and plans again)."""
        c = self.config
        if c is None:
            raise Refused("this super has not joined yet")
        if self.restore is not None:  # a placement now would drop what the holders kept
            raise Refused(
                "this super is restoring the ring a whole cluster recorded (waiting for "
                f"{', '.join(self.restore_waits_for) or 'the holders to be level'})"
            )
        ks = c.keyspace
        try:
            if op == "expand":
                name, key = args
                self._standby(c, name)
                ek = _ekey(key)
                after = ks.expand(ek, name)
                wire_op: tuple[Any, ...] = ("expand", name, ek)
            elif op == "contract":
                after = self._contracted(c, args)
                wire_op = ("contract", *args)
            elif op == "replace":
                old, new = args
                if old not in ks:
                    raise Refused(f"{old} is not on the ring")
                self._standby(c, new)
                after = ks.replace(old, new)
                wire_op = ("replace", old, new)
            elif op == "rebalance":
                name, key = args
                ek = _ekey(key)
                after = ks.rebalance(name, ek)
                wire_op = ("rebalance", name, ek)
            else:
                raise Refused(
                    f"unknown reconfiguration {op!r} (expand, contract, replace, rebalance)"
                )
        except (BadReconfiguration, ValueError) as e:
            if isinstance(e, Refused):
                raise
            raise Refused(str(e)) from None
        # An incomplete process gets no copies: a range handed to it is a replica short
        # until it is repaired.  Repair first, unless forced.
        if not force and (gains := _gains_of_incomplete(c, after)):
            p, gained = next(iter(gains.items()))
            raise Refused(
                f"{p} is incomplete and would take on {describe(gained)} without "
                "data: replace or contract it first, or with it (or force)"
            )
        # A source must hold what it sends: a suspected process holds nothing we can
        # reach, an incomplete one what it did not say it lacks.
        suspected = c.excluded() | c.incomplete
        flight = c.copies_in_flight()  # none to an incomplete receiver: nothing to wait for
        gone = frozenset(src for src, _, _ in flight if src not in c.storage())
        partial = c.sources_in_part()
        safe = judge(ks, after, suspected | gone, partial, flight)
        plan = optimize(ks, after, suspected, partial=partial, busy=c.receiving(), safe=safe)
        if plan.lost and not force:
            raise Refused(
                f"no holder of {describe(plan.lost)} is left (each failed, or is incomplete "
                "and lacks it): that data is lost; force the reconfiguration to go on "
                "without it"
            )
        if not force and (
            why := why_wait(
                ks, after, plan, suspected, gone, partial, flight, c.receiving() & c.incomplete
            )
        ):
            raise MustWait(why)
        header = keyspace_header(c.version, wire_op, plan.to_wire())
        return Proposal(header, plan, ks, after)

    # ------------------------------------------------------------------ repair
    def repairs(self) -> list[tuple[str, tuple[Any, ...]]]:
        """What this super should do on its own about broken holders (4.2.3, 5.4): a
        process on the ring that was suspected (failed) or is *incomplete* (its copy
        broke off when a source failed) is a replica short for its ranges.

        Only the coordinator (the oldest member super, the same on every replica) repairs,
        so supers do not race each other (a second proposal computed from the same version
        would be stale and ignored anyway); when it parts or is suspected, the next
        oldest takes over.  Nothing is planned while a reconfiguration still makes progress (some
        process it waits for is neither incomplete nor gone: an incomplete one never
        finishes, so waiting for it would wait for ever).  Each broken
        holder is replaced by a standby process (fresh copies from the complete
        replicas), or, with no standby left, contracted while the ring keeps at least
        ``f`` processes; together with every incomplete process that would inherit
        its ranges (it would get them without data, which :meth:`plan` refuses: two
        incomplete neighbours and no standby would otherwise wait for an operator for
        ever, the simulator's seed 2334 with automatic repair).  A repair that would lose
        data is refused by :meth:`plan` (never forced here): another broken holder's may
        go first, or an operator must decide."""
        c = self.config
        if c is None or c.coordinator() != self.me:
            return []
        if any(p.waiting - c.incomplete for p in c.pending.values()):
            return []
        ring = c.keyspace.processes
        # Incomplete holders first (they hold nothing a repair could need), then failed
        # ones; the first whose repair can be planned without losing data, one at a time
        # (each repair changes the version).  A failed source of an unfinished copy
        # cannot be contracted while its receiver is incomplete: the receiver would be
        # left with ranges and no data, so the receiver goes first.
        broken = sorted(p for p in ring if p in c.incomplete)
        broken += sorted(p for p in ring if p not in c.storage() and p not in c.incomplete)
        spares = sorted(c.standby() - c.incomplete)
        for victim in broken:
            if spares:
                repair: tuple[str, tuple[Any, ...]] = ("replace", (victim, spares[0]))
            elif len(ring) - 1 >= c.f:
                repair = ("contract", _with_incomplete_heirs(c, victim))
            else:
                continue
            try:
                self.plan(repair[0], *repair[1])
            except Refused:
                continue
            return [repair]
        return []

    @staticmethod
    def _contracted(c: RubberbandConfig, names: tuple[Any, ...]) -> Keyspace:
        """The ring without ``names``, taken off together: a range of one goes to its
        next successor that stays, never to another of them."""
        ks = c.keyspace
        if not names or not all(type(n) is str for n in names) or len(set(names)) != len(names):
            raise Refused("contract takes one or more distinct names of processes on the ring")
        for name in names:
            if name not in ks:
                raise Refused(f"{name} is not on the ring")
        left = len(ks) - len(names)
        if left < c.f and any(name in c.storage() for name in names):
            raise Refused(
                f"contracting {' and '.join(names)} leaves {left} storage processes, fewer "
                f"than the replication factor {c.f}: replace instead"
            )
        return ks.contract(*names)

    @staticmethod
    def _standby(c: RubberbandConfig, name: str) -> None:
        if name not in c.storage():
            raise Refused(f"{name} is not a storage process of this cluster (has it joined?)")
        if name in c.keyspace:
            raise Refused(f"{name} is already on the ring")

    # ------------------------------------------------------------------ status
    def status(self, now: float | None = None) -> dict[str, Any]:
        """For the admin API; with ``now``, each storage process's load and size (from
        its heartbeat answers) and their age."""
        c = self.config
        if c is None:
            return {"joined": False}
        out = self._status(c)
        if now is not None:
            at_work = self.watch.active_clients(now) | c.clients()
            out["clients"] = len(at_work)
            out["client_names"] = sorted(at_work)[:50]
            out["load"] = {
                p: {k: v for k, v in f.items() if k not in ("at", "applied")}
                | {"age_s": round(now - f["at"], 1)}
                for p, f in sorted(self.watch.loads.items())
            }
            out["views"] = self.views.status(now)
        return out

    def _status(self, c: RubberbandConfig) -> dict[str, Any]:
        return {
            "joined": True,
            "restoring": None if self.restore is None else self.restore_waits_for,
            "levelled": None if self._leveller is None else self._leveller.applied,
            "levelling_error": None if self._leveller is None else self._leveller.error,
            "version": c.version,
            "replication": c.f,
            "partitioning": c.partitioning,
            "ring": [
                {
                    "name": p,
                    "id": repr(decode_key(e)),
                    "suspected": p not in c.storage(),
                    "partition": describe(c.keyspace.partition(p)),
                }
                for e, p in c.keyspace.ring()
            ],
            "standby": sorted(c.standby()),
            "busy": sorted(c.busy()),
            "incomplete": sorted(c.incomplete),
            "pending": {v: sorted(p.waiting) for v, p in sorted(c.pending.items())},
            "supers": list(c.seniority()),
            "coordinator": c.coordinator(),
            "clients": len(c.clients()),
        }


REPORTERS = 64
"""Maintainers whose view reports a super keeps (the newest)."""
REPORTED_VIEWS = 256
"""Views one report may name; a longer report is refused whole."""
REPORT_AGE = 60.0
"""Seconds a maintainer's report is shown after it came."""


class ViewReports:
    """What views maintainers say of their views (:class:`ViewProgress`), for the
    console and ``/status``: each report labelled with its sender's proven name, bounded
    in size and number, and checked field by field (a malformed report is dropped)."""

    def __init__(self) -> None:
        self._by: dict[NodeId, tuple[float, list[dict[str, Any]]]] = {}
        self.refused = 0

    def report(self, src: NodeId, views: Any, now: float) -> None:
        rows = _view_rows(views)
        if rows is None:
            self.refused += 1
            return
        self._by.pop(src, None)
        self._by[src] = (now, rows)
        while len(self._by) > REPORTERS:
            del self._by[next(iter(self._by))]

    def status(self, now: float) -> list[dict[str, Any]]:
        out = []
        for src, (at, rows) in sorted(self._by.items()):
            if now - at <= REPORT_AGE:
                age = round(now - at, 1)
                out += [{**r, "maintainer": src, "age_s": age} for r in rows]
        return sorted(out, key=lambda r: (r["name"], r["maintainer"]))


UNIT_NAME = 64 + 3
"""Longest name a maintainer reports a view by: a view's (64), ``#`` and a part's."""


def _view_rows(views: Any) -> list[dict[str, Any]] | None:
    if type(views) not in (tuple, list) or len(views) > REPORTED_VIEWS:
        return None
    rows = []
    for v in views:
        if type(v) not in (tuple, list) or len(v) != 5:
            return None
        name, position, behind, stale, count = v
        if type(name) is not str or not 0 < len(name) <= UNIT_NAME or not name.isprintable():
            return None
        if any(type(x) is not int for x in (position, behind, count)):
            return None
        if type(stale) not in (int, float) or not 0 <= stale < 1e9:
            return None
        rows.append({"name": name, "position": position, "behind": behind,
                     "staleness_s": round(float(stale), 3), "rows": count})  # fmt: skip
    return rows


def _ekey(key: Any) -> EKey:
    """An admin request's key, encoded: a JSON array is a tuple key (a view's rows)."""
    return encode_key(json_key(key))


def _gains_of_incomplete(c: RubberbandConfig, after: Keyspace) -> dict[NodeId, RangeSet]:
    """What each incomplete process would take on in ``after`` (gets no copies: without
    data)."""
    ks = c.keyspace
    gains = {}
    for p in sorted(c.incomplete):
        if p in after:
            gained = difference(after.partition(p), ks.partition(p))
            if gained:
                gains[p] = gained
    return gains


def _with_incomplete_heirs(c: RubberbandConfig, victim: NodeId) -> tuple[NodeId, ...]:
    """``victim`` and the incomplete processes that contracting it (and them) would hand
    ranges to, so that the contraction hands none of them anything."""
    names = [victim]
    while True:
        heirs = [p for p in _gains_of_incomplete(c, c.keyspace.contract(*names)) if p not in names]
        if not heirs:
            return tuple(names)
        names += heirs
