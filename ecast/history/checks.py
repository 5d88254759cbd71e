"""E-Cast's guarantees checked on a history (3.3.2, 3.4.5).

Each check is named by the guarantee it judges and returns the first few explanations of
what violates it.  The safety checks hold on every prefix of a run; the liveness checks
(``uniform-agreement``, ``termination``) hold only once a run quiesced with a majority of
the routers up, so a caller asks for them.  "Correct" means never crashed and never
suspected.

What each check needs:

* the routers' m-seq (``Learned`` events) makes the m-seq complete: without it the
  m-seq is rebuilt from what processes saw (:mod:`ecast.history.reference`) and
  ``prefix-agreement`` (no router disagreement or hole to see), ``validity`` (messages
  nobody delivered or had acknowledged are unseen) and ``gap-free`` (an unknown ``t``
  may hold a missing sequence number) check what that rebuilt m-seq allows;
* the initial config gives destination sets: ``minimality`` and ``uniform-agreement``
  need it; without it ``ack-safety`` checks only that a message acknowledged as
  delivered was delivered somewhere, ``termination`` only acknowledgements, and
  ``unsafe-cut`` takes what each process delivered for what was meant for it;
* ``total-order``, ``no-duplicates`` and ``causal-order`` need neither.

Times are compared across processes only by ``ack-safety``: a delivery must be recorded
no later than ``time_tolerance`` after the acknowledgement (0 where one clock records
everything, as in the simulator).  With ``time_tolerance=None`` no times are compared:
every unsuspected destination must deliver the message at some point (real runs, whose
recorders note a delivery after the endpoint already confirmed it).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ecast.core.config import ROUTERS, SUSPECT, Config, kind_of
from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId, Session
from ecast.core.mseq import ConfigGuard
from ecast.history.events import (
    Ack,
    Crash,
    Deliver,
    DeliverUnsafe,
    History,
    Resubmit,
    Submit,
    SubmitUnsafe,
    Terminate,
)
from ecast.history.reference import Reference, build_reference

FEW = 5
"""Explanations kept per check: a systematic bug need not print thousands."""

_MISSING = object()


@dataclass(frozen=True, slots=True)
class CheckOptions:
    liveness: bool = True
    """Check ``uniform-agreement`` and ``termination`` (owed once a run quiesced)."""
    time_tolerance: float | None = 0.0
    """Seconds a delivery may be recorded after the acknowledgement it precedes; None:
    compare no times across processes."""


class Observed:
    """What every process saw, indexed in one pass over its events."""

    __slots__ = (
        "acks",
        "crashed",
        "delivered_at",
        "deliveries",
        "events",
        "submitted",
        "terminated",
        "unsafe",
        "unsafe_accepted",
        "unsafe_submitted",
    )

    def __init__(self, history: History) -> None:
        self.events = history.processes
        self.deliveries: dict[NodeId, list[Deliver]] = {}
        self.delivered_at: dict[NodeId, dict[int, float | None]] = {}
        """Process -> t -> when it first delivered t."""
        self.acks: dict[NodeId, list[Ack]] = {}
        self.submitted: set[MsgId] = set()
        self.unsafe_submitted: set[MsgId] = set()
        self.unsafe: dict[NodeId, list[DeliverUnsafe]] = {}
        self.unsafe_accepted: set[NodeId] = set()
        self.crashed: set[NodeId] = set()
        self.terminated: dict[NodeId, str] = {}
        submitted = self.submitted
        for p, events in history.processes.items():
            dl: list[Deliver] = []
            at: dict[int, float | None] = {}
            acks: list[Ack] = []
            for e in events:
                kind = type(e)
                if kind is Deliver:
                    dl.append(e)
                    if e.t not in at:
                        at[e.t] = e.time
                elif kind is Ack:
                    acks.append(e)
                elif kind is Submit or kind is Resubmit:
                    submitted.add(e.id)
                elif kind is SubmitUnsafe:
                    self.unsafe_submitted.add(e.id)
                elif kind is DeliverUnsafe:
                    self.unsafe.setdefault(p, []).append(e)
                    if e.accepted:
                        self.unsafe_accepted.add(p)
                elif kind is Crash:
                    self.crashed.add(p)
                elif kind is Terminate:
                    self.terminated[p] = e.reason
            self.deliveries[p] = dl
            self.delivered_at[p] = at
            self.acks[p] = acks

    def correct(self, p: NodeId, ref: Reference) -> bool:
        return p in self.events and p not in self.crashed and p not in ref.suspected


Check = Callable[[Reference, Observed, CheckOptions], list[str]]


def _problems(ref: Reference, name: str) -> list[str]:
    return [text for kind, text in ref.problems if kind == name]


# ====================================================================== safety
def check_prefix_agreement(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """One message per t everywhere: routers' logs are prefixes of one m-seq, and every
    delivery is the m-seq's message at its t."""
    out = _problems(ref, "prefix-agreement")
    if ref.from_routers:
        ids = ref.ids
        for p, dl in obs.deliveries.items():
            for e in dl:
                have = ids.get(e.t)
                if have != e.id:
                    out.append(
                        f"{p} delivered {e.id} as t={e.t}, the m-seq has "
                        f"{have if have is not None else 'nothing'} there"
                    )
                    break
    return out[:FEW]


def check_validity(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """Every message in the m-seq was submitted by a process, or is a lease suspect the
    routers submitted in a router session; every unsafe delivery was submitted unsafe."""
    out: list[str] = []
    submitted = obs.submitted
    ids = ref.ids
    for t in sorted(ids):
        mid = ids[t]
        m = ref.messages.get(t)
        if m is not None and m.sender == ROUTERS:
            # The routers submit one kind of message themselves: a suspect for processes
            # whose lease ran out, in a session of the submitting router.
            h = m.header
            if not (type(h) is dict and h.get("lease") is True and kind_of(m) == SUSPECT):
                out.append(f"t={t} {mid} from the routers is no lease suspect")
                break
            if mid[0][0] != ROUTERS:
                out.append(f"t={t} lease suspect {mid} outside a router session")
                break
        elif m is None and mid[0][0] == ROUTERS:
            continue  # a router's message whose content nobody recorded
        elif mid not in submitted:
            out.append(f"t={t} {mid} was never submitted")
            break
    unsafe = obs.unsafe_submitted
    for p, events in obs.unsafe.items():
        for e in events:
            if e.id not in unsafe:
                out.append(f"{p} delivered unsafe {e.id}, never submitted")
                break
    return out[:FEW]


def check_no_duplicates(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """No message twice in the m-seq, none delivered twice by a process."""
    out = _problems(ref, "no-duplicates")
    for p, dl in obs.deliveries.items():
        if len(obs.delivered_at[p]) == len(dl) and len({e.id for e in dl}) == len(dl):
            continue
        seen: set[MsgId] = set()
        for e in dl:
            if e.id in seen:
                out.append(f"{p} delivered {e.id} twice")
                break
            seen.add(e.id)
    return out[:FEW]


def check_minimality(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """Nothing delivered to a process outside the message's destination set."""
    dest = ref.dest
    assert dest is not None
    out = []
    empty: frozenset[NodeId] = frozenset()
    for p, dl in obs.deliveries.items():
        for e in dl:
            ds = dest.get(e.t, empty if ref.from_routers else None)
            if ds is None:
                continue  # the message is unknown: so is where it went
            if p not in ds:
                out.append(
                    f"{p} delivered t={e.t} {e.id}, not in its destination set" + ref.caveat(e.t)
                )
                break
    return out[:FEW]


def check_total_order(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """Deliveries in increasing t everywhere; with t fixed by the m-seq that is one order."""
    out = []
    for p, dl in obs.deliveries.items():
        last = -1
        for e in dl:
            if e.t <= last:
                out.append(f"{p} delivered t={e.t} {e.id} after t={last}")
                break
            last = e.t
    return out[:FEW]


def check_gap_free(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """A session's messages are in the m-seq in sequence order from 1, none missing (an
    unknown t may hold a missing one)."""
    last: dict[Session, tuple[int, int]] = {}
    ids = ref.ids
    unknown = bool(ref.unknown)
    for t in sorted(ids):
        sess, seq = ids[t]
        prev_t, prev_seq = last.get(sess, (-1, 0))
        if seq <= prev_seq:
            return [f"session {sess} has #{seq} at t={t}, after #{prev_seq} at t={prev_t}"]
        if seq != prev_seq + 1 and (
            not unknown or seq - prev_seq - 1 > ref.unknown_between(prev_t, t)
        ):
            return [f"session {sess} has #{seq} at t={t}, expected #{prev_seq + 1}"]
        last[sess] = (t, seq)
    return []


def check_causal_order(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """A submission comes after everything its submitter submitted or delivered before it.
    (A resubmission is not: the message's place was fixed when its first owner sent it.)"""
    out = []
    index = ref.index
    for p, events in obs.events.items():
        floor = -1
        for e in events:
            kind = type(e)
            if kind is Deliver:
                if e.t > floor:
                    floor = e.t
            elif kind is Submit:
                t = index.get(e.id)
                if t is None:
                    continue
                if t <= floor:
                    out.append(f"{p} submitted {e.id} (t={t}) after seeing t={floor}")
                    break
                floor = t
    return out[:FEW]


def check_ack_safety(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """When a message is acknowledged stable, every unsuspected destination delivered it."""
    tol = opts.time_tolerance
    dest = ref.dest
    delivered_at = obs.delivered_at
    suspected = ref.suspected
    never = float("inf") if ref.from_routers else float("-inf")
    anyone_at: dict[int, float | None] | None = None
    for p, acks in obs.acks.items():
        for a in acks:
            t = a.t
            if t is None:
                continue
            at = a.time
            if ref.from_routers and ref.index.get(a.id) != t:
                return [f"{p} got an ack for {a.id} at t={t}, m-seq says {ref.index.get(a.id)}"]
            ds = dest.get(t) if dest is not None else None
            if ds is None:
                if not a.delivered:
                    continue
                if anyone_at is None:
                    anyone_at = _first_deliveries(obs)
                got = anyone_at.get(t, _MISSING)
                if got is _MISSING or not _in_time(got, at, tol):  # type: ignore[arg-type]
                    return [f"{a.id} (t={t}) acknowledged as delivered, nobody delivered it"]
                continue
            anyone = False
            for d in sorted(ds):
                got = delivered_at.get(d, {}).get(t, _MISSING)
                if got is not _MISSING and _in_time(got, at, tol):  # type: ignore[arg-type]
                    anyone = True
                    continue
                ts = suspected.get(d, _MISSING)
                if ts is not _MISSING:
                    if tol is None or at is None or ts is None:
                        continue
                    bound = ref.known_at.get(ts, never)  # type: ignore[arg-type]
                    if bound <= at + tol:
                        continue
                when = f" at {at:.4f}" if at is not None else ""
                return [
                    f"{a.id} (t={t}) acknowledged{when} before unsuspected {d} delivered it"
                    + ref.caveat(t)
                ]
            if a.delivered and not anyone:
                return [f"{a.id} acknowledged as delivered, nobody delivered it"]
    return []


def _in_time(got: float | None, at: float | None, tol: float | None) -> bool:
    return tol is None or got is None or at is None or got <= at + tol


def _first_deliveries(obs: Observed) -> dict[int, float | None]:
    first: dict[int, float | None] = {}
    for at in obs.delivered_at.values():
        for t, when in at.items():
            have = first.get(t, _MISSING)
            if have is _MISSING or (
                have is not None and (when is None or when < have)  # type: ignore[operator]
            ):
                first[t] = when
    return first


def check_unsafe_cut(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """An accepted unsafe message sees a consistent cut: the receiver had delivered exactly
    what the m-seq sent it up to the tag, nothing between the tag and the router's frontier
    was meant for it, and the config at that frontier routes the message to it."""
    needed = obs.unsafe_accepted
    if not needed:
        return []
    # What was meant for each receiver: its destination sets where known; a t whose
    # destination set is unknown counts as meant for whoever delivered it.
    dest = ref.dest
    if dest is None:
        mine: dict[NodeId, set[int]] = {p: set(obs.delivered_at[p]) for p in needed}
    else:
        mine = {p: {t for t in obs.delivered_at[p] if t not in dest} for p in needed}
        for t, ds in dest.items():
            for d in ds:
                if d in needed:
                    mine[d].add(t)
    guard = ConfigGuard()
    out = []
    for p in sorted(needed):
        meant = sorted(mine[p])
        count = 0
        for e in obs.events[p]:
            kind = type(e)
            if kind is Deliver:
                count += 1
            elif kind is DeliverUnsafe and e.accepted:
                tag, frontier = e.tag, e.frontier
                before_frontier = bisect_right(meant, frontier - 1)
                # A tag of -1 (None on the wire): the leader had sent it nothing since it
                # took over; everything before the frontier must have been delivered.
                upto_tag = bisect_right(meant, tag) if tag >= 0 else before_frontier
                config = ref.config_at(frontier)
                if count != upto_tag:
                    out.append(
                        f"{p} accepted {e.id} at tag {tag} having delivered {count} of the "
                        f"{upto_tag} messages up to it"
                    )
                elif before_frontier != upto_tag:
                    out.append(
                        f"{p} accepted {e.id} at tag {tag}, but a message before frontier "
                        f"{frontier} was meant for it"
                    )
                elif (
                    config is not None
                    and e.sender is not None
                    and p not in guard.destset(config, Message(e.sender, e.id, e.header, e.payload))
                ):
                    out.append(
                        f"{p} accepted {e.id}, not a destination at frontier {frontier}"
                        + ref.caveat(frontier)
                    )
                else:
                    continue
                break
    return out[:FEW]


# ====================================================================== liveness
def check_uniform_agreement(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """A message delivered anywhere (even by a process that crashed) reaches every correct
    destination."""
    dest = ref.dest
    assert dest is not None
    anywhere: set[int] = set()
    for at in obs.delivered_at.values():
        anywhere.update(at)
    delivered_at = obs.delivered_at
    for t in sorted(anywhere):
        for d in sorted(dest.get(t, ())):
            if not obs.correct(d, ref):
                continue
            if t not in delivered_at[d]:
                return [f"t={t} was delivered, correct {d} never got it" + ref.caveat(t)]
    return []


def check_termination(ref: Reference, obs: Observed, opts: CheckOptions) -> list[str]:
    """Every submission of a correct process is acknowledged; every message reaches every
    correct destination."""
    out = []
    for p, events in obs.events.items():
        if not obs.correct(p, ref):
            continue
        acked = {a.id for a in obs.acks[p]}
        closed = obs.terminated.get(p) == "closed"
        for e in events:
            kind = type(e)
            if (kind is not Submit and kind is not Resubmit) or e.id in acked:
                continue
            if closed and e.id in ref.index:
                continue  # it left once its part was delivered, before later acks came
            out.append(f"correct {p} never got an ack for {e.id}")
            break
    if ref.dest is not None:
        reported: set[NodeId] = set()
        delivered_at = obs.delivered_at
        for t in sorted(ref.dest):
            for d in ref.dest[t]:
                if d in reported or not obs.correct(d, ref) or t in delivered_at[d]:
                    continue
                reported.add(d)
                out.append(f"correct {d} never delivered t={t} {ref.ids[t]}" + ref.caveat(t))
    return out[:FEW]


# ====================================================================== running them
SAFETY: dict[str, Check] = {
    "prefix-agreement": check_prefix_agreement,
    "validity": check_validity,
    "no-duplicates": check_no_duplicates,
    "minimality": check_minimality,
    "total-order": check_total_order,
    "gap-free": check_gap_free,
    "causal-order": check_causal_order,
    "ack-safety": check_ack_safety,
    "unsafe-cut": check_unsafe_cut,
}
LIVENESS: dict[str, Check] = {
    "uniform-agreement": check_uniform_agreement,
    "termination": check_termination,
}
NEEDS_CONFIG = frozenset({"minimality", "uniform-agreement"})


@dataclass(slots=True)
class Verdict:
    """What the checks found: explanations per violated check, what could not run."""

    violations: dict[str, list[str]]
    """Check name -> its first few explanations (only checks that found something)."""
    ran: list[str]
    skipped: dict[str, str]
    """Check name -> why it did not run."""
    limits: dict[str, str]
    """Check name -> what it could not see in this history (it ran on the rest)."""
    reference: Reference
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def messages(self) -> list[str]:
        """``"check: explanation"`` lines, in check order."""
        return [f"{name}: {text}" for name, texts in self.violations.items() for text in texts]


def check_history(
    history: History,
    config: Config | None = None,
    *,
    liveness: bool = True,
    time_tolerance: float | None = 0.0,
    only: tuple[str, ...] | None = None,
) -> Verdict:
    """Run every check (``only``: these) on ``history``; ``config`` is the initial config
    the routers started with, replayed over the m-seq for destination sets."""
    started = time.perf_counter()
    opts = CheckOptions(liveness=liveness, time_tolerance=time_tolerance)
    ref = build_reference(history, config)
    obs = Observed(history)
    checks = dict(SAFETY)
    if liveness:
        checks.update(LIVENESS)
    if only is not None:
        unknown = set(only) - set(SAFETY) - set(LIVENESS)
        if unknown:
            raise ValueError(f"unknown checks {sorted(unknown)}; known: {[*SAFETY, *LIVENESS]}")
        checks = {k: v for k, v in checks.items() if k in only}
    violations: dict[str, list[str]] = {}
    ran: list[str] = []
    skipped: dict[str, str] = {}
    for name, check in checks.items():
        if name in NEEDS_CONFIG and ref.dest is None:
            skipped[name] = "needs the config (destination sets)"
            continue
        found = check(ref, obs, opts)
        ran.append(name)
        if found:
            violations[name] = found
    stats = {
        "processes": len(history.processes),
        "events": sum(len(v) for v in history.processes.values()),
        "deliveries": sum(len(v) for v in obs.deliveries.values()),
        "acks": sum(len(v) for v in obs.acks.values()),
        "mseq_known": len(ref.ids),
        "mseq_unknown": len(ref.unknown),
        "from_routers": ref.from_routers,
        "config_errors": ref.config_errors,
        "check_s": round(time.perf_counter() - started, 3),
    }
    return Verdict(violations, ran, skipped, _limits(ref, opts, ran), ref, stats)


def _limits(ref: Reference, opts: CheckOptions, ran: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if not ref.from_routers:
        out["prefix-agreement"] = "no routers' m-seq: only that processes agree on each t they saw"
        out["validity"] = "no routers' m-seq: messages nobody delivered or had acknowledged"
        if ref.unknown:
            out["gap-free"] = f"{len(ref.unknown)} unknown t may hold missing messages"
    if ref.dest is None:
        out["ack-safety"] = "no config: only that messages acknowledged as delivered were"
        out["termination"] = "no config: only acknowledgements"
        out["unsafe-cut"] = "no config: what each process delivered stands for what it was sent"
    elif ref.first_unreplayed is not None:
        out["destination sets"] = (
            f"the config was replayed without the message at t={ref.first_unreplayed} "
            "(and any other unknown one), taken to change no config"
        )
    if opts.time_tolerance is None:
        out.setdefault("ack-safety", "times not compared: deliveries at any time count")
    return {k: v for k, v in out.items() if k in ran or k == "destination sets"}
