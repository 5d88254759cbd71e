"""Checkers for E-Cast's guarantees over what a simulated run recorded (3.3.2, 3.4.5).

The reference is rebuilt from the routers' records: the m-seq every router's learned
messages must be a prefix of, and, by replaying the initial ``Config`` over it, each
message's destination set according to its prefix (``destsetpfx``).  "Correct" means
never crashed and never suspected.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from ecast.core.config import ROUTERS, SUSPECT, Config, kind_of
from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId
from ecast.core.mseq import ConfigGuard

# Events an application process records, in the order they happened at the process:
#   ("sub", id, time)                          submitted (safe)
#   ("resub", id, time)                        submitted again by a session's next owner
#   ("dlv", t, id, time)                       delivered (safe)
#   ("uns", tag, frontier, message, accepted)  delivered (unsafe)
#   ("ack", id, t, delivered, time)            stable acknowledgement
Event = tuple


@dataclass
class AppRecord:
    role: str
    events: list[Event] = field(default_factory=list)
    crashed: bool = False
    terminated: str | None = None
    unsafe_submitted: set[MsgId] = field(default_factory=set)


@dataclass
class RouterRecord:
    learned: dict[int, Message] = field(default_factory=dict)
    first_seen: dict[int, float] = field(default_factory=dict)
    crashed: bool = False
    stopped: bool = False


@dataclass
class Reference:
    mseq: dict[int, Message]
    dest: dict[int, frozenset[NodeId]]
    suspected: dict[NodeId, int]
    """Process -> t of the first message suspecting it."""
    learned_at: dict[int, float]
    """t -> earliest virtual time any router learned it."""
    config_starts: list[int]
    configs: list[Config]
    index: dict[MsgId, int]
    problems: list[str]

    def config_at(self, t: int) -> Config:
        return self.configs[bisect_right(self.config_starts, t) - 1]


def build_reference(initial: Config, routers: dict[NodeId, RouterRecord]) -> Reference:
    problems: list[str] = []
    mseq: dict[int, Message] = {}
    learned_at: dict[int, float] = {}
    owner: dict[int, NodeId] = {}
    for r, rec in routers.items():
        for t, m in rec.learned.items():
            have = mseq.get(t)
            if have is None:
                mseq[t] = m
                owner[t] = r
            elif have.id != m.id and len(problems) < 5:
                problems.append(
                    f"prefix-agreement: t={t} is {have.id} at {owner[t]} but {m.id} at {r}"
                )
        for t, when in rec.first_seen.items():
            if t not in learned_at or when < learned_at[t]:
                learned_at[t] = when
    top = max(mseq, default=-1)
    missing = [t for t in range(top + 1) if t not in mseq]
    if missing:
        problems.append(f"prefix-agreement: no router learned t={missing[0]} (of {len(missing)})")
    dest: dict[int, frozenset[NodeId]] = {}
    suspected: dict[NodeId, int] = {}
    starts, configs = [0], [initial]
    config = initial
    index: dict[MsgId, int] = {}
    guard = ConfigGuard()  # a config that raises has the routers' defined outcome
    for t in range(top + 1):
        m = mseq.get(t)
        if m is None:
            continue
        if m.id in index and len(problems) < 5:
            problems.append(f"no-duplicates: {m.id} appears at t={index[m.id]} and t={t}")
        index[m.id] = t
        dest[t] = guard.destset(config, m)
        for p in guard.suspects(config, m):
            suspected.setdefault(p, t)
        nxt = guard.apply(config, m)
        if nxt is not config:
            config = nxt
            starts.append(t + 1)
            configs.append(config)
    return Reference(mseq, dest, suspected, learned_at, starts, configs, index, problems)


def _safe_deliveries(rec: AppRecord) -> list[Event]:
    return [e for e in rec.events if e[0] == "dlv"]


def check_prefix_and_timestamps(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    out = list(ref.problems)
    for p, rec in apps.items():
        for _k, t, mid, _when in _safe_deliveries(rec):
            m = ref.mseq.get(t)
            if m is None or m.id != mid:
                out.append(
                    f"prefix-agreement: {p} delivered {mid} as t={t}, the m-seq has "
                    f"{m.id if m else 'nothing'} there"
                )
                break
    return out[:5]


def check_validity(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    submitted = {e[1] for rec in apps.values() for e in rec.events if e[0] == "sub"}
    unsafe = set().union(*(rec.unsafe_submitted for rec in apps.values()))
    out = []
    for t, m in ref.mseq.items():
        if m.sender == ROUTERS:
            # The routers submit one kind of message themselves: a suspect for processes
            # whose lease ran out, in a session of the submitting router.
            h = m.header
            if not (type(h) is dict and h.get("lease") is True and kind_of(m) == SUSPECT):
                out.append(f"validity: t={t} {m.id} from the routers is no lease suspect")
                break
            if m.id[0][0] != ROUTERS:
                out.append(f"validity: t={t} lease suspect {m.id} outside a router session")
                break
        elif m.id not in submitted:
            out.append(f"validity: t={t} {m.id} was never submitted")
            break
    for p, rec in apps.items():
        for e in rec.events:
            if e[0] == "uns" and e[3].id not in unsafe:
                out.append(f"validity: {p} delivered unsafe {e[3].id}, never submitted")
                break
    return out[:5]


def check_no_duplicates(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    out = []
    for p, rec in apps.items():
        seen: set[MsgId] = set()
        for _k, _t, mid, _when in _safe_deliveries(rec):
            if mid in seen:
                out.append(f"no-duplicates: {p} delivered {mid} twice")
                break
            seen.add(mid)
    return out[:5]


def check_minimality(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    out = []
    for p, rec in apps.items():
        for _k, t, mid, _when in _safe_deliveries(rec):
            if p not in ref.dest.get(t, ()):
                out.append(f"minimality: {p} delivered t={t} {mid}, not in its destination set")
                break
    return out[:5]


def check_total_order(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    """Deliveries in increasing t everywhere; with t fixed by the m-seq that is one order."""
    out = []
    for p, rec in apps.items():
        last = -1
        for _k, t, mid, _when in _safe_deliveries(rec):
            if t <= last:
                out.append(f"total-order: {p} delivered t={t} {mid} after t={last}")
                break
            last = t
    return out[:5]


def check_gap_free(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    nxt: dict[object, int] = {}
    for t in sorted(ref.mseq):
        sess, seq = ref.mseq[t].id
        want = nxt.get(sess, 1)
        if seq != want:
            return [f"gap-free: session {sess} has #{seq} at t={t}, expected #{want}"]
        nxt[sess] = seq + 1
    return []


def check_causal_order(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    """A submission comes after everything its submitter submitted or delivered before it."""
    out = []
    index = ref.index
    for p, rec in apps.items():
        floor = -1
        for e in rec.events:
            if e[0] == "dlv":
                floor = max(floor, e[1])
            elif e[0] == "sub":
                t = index.get(e[1])
                if t is None:
                    continue
                if t <= floor:
                    out.append(f"causal-order: {p} submitted {e[1]} (t={t}) after seeing t={floor}")
                    break
                floor = t
    return out[:5]


def check_uniform_agreement(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    """A message delivered anywhere (even by a process that crashed) reaches every correct
    destination."""
    delivered: dict[NodeId, set[int]] = {
        p: {e[1] for e in _safe_deliveries(rec)} for p, rec in apps.items()
    }
    anywhere = set().union(*delivered.values()) if delivered else set()
    out = []
    for t in sorted(anywhere):
        for d in sorted(ref.dest.get(t, ())):
            rec = apps.get(d)
            if rec is None or rec.crashed or d in ref.suspected:
                continue
            if t not in delivered[d]:
                out.append(f"uniform-agreement: t={t} was delivered, correct {d} never got it")
                return out
    return out


def check_ack_safety(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    """When a message is acknowledged stable, every unsuspected destination delivered it."""
    when: dict[tuple[NodeId, int], float] = {}
    for p, rec in apps.items():
        for _k, t, _mid, at in _safe_deliveries(rec):
            when[(p, t)] = at
    out = []
    for p, rec in apps.items():
        for e in rec.events:
            if e[0] != "ack" or e[2] is None:
                continue
            _k, mid, t, delivered, at = e
            if ref.index.get(mid) != t:
                out.append(
                    f"ack-safety: {p} got an ack for {mid} at t={t}, m-seq says "
                    f"{ref.index.get(mid)}"
                )
                return out
            anyone = False
            for d in sorted(ref.dest.get(t, ())):
                got = when.get((d, t))
                if got is not None and got <= at:
                    anyone = True
                    continue
                ts = ref.suspected.get(d)
                if ts is not None and ref.learned_at.get(ts, float("inf")) <= at:
                    continue
                out.append(
                    f"ack-safety: {mid} (t={t}) acknowledged at {at:.4f} before "
                    f"unsuspected {d} delivered it"
                )
                return out
            if delivered and not anyone:
                out.append(f"ack-safety: {mid} acknowledged as delivered, nobody delivered it")
                return out
    return out


def check_termination(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    """Every submission of a correct process is acknowledged; every message reaches every
    correct destination."""
    out = []
    for p, rec in apps.items():
        if rec.crashed or p in ref.suspected:
            continue
        acked = {e[1] for e in rec.events if e[0] == "ack"}
        for e in rec.events:
            if e[0] not in ("sub", "resub") or e[1] in acked:
                continue
            if rec.terminated == "closed" and e[1] in ref.index:
                continue  # it left once its part was delivered, before later acks came
            out.append(f"termination: correct {p} never got an ack for {e[1]}")
            break
        got = {e[1] for e in _safe_deliveries(rec)}
        for t in sorted(ref.dest):
            if p in ref.dest[t] and t not in got:
                out.append(f"termination: correct {p} never delivered t={t} {ref.mseq[t].id}")
                break
    return out[:5]


def check_unsafe_cut(ref: Reference, apps: dict[NodeId, AppRecord]) -> list[str]:
    """An accepted unsafe message sees a consistent cut: the receiver had delivered exactly
    what the m-seq sent it up to the tag, nothing between the tag and the router's frontier
    was meant for it, and the config at that frontier routes the message to it."""
    out = []
    for p, rec in apps.items():
        mine = [t for t in sorted(ref.dest) if p in ref.dest[t]]
        count = 0
        for e in rec.events:
            if e[0] == "dlv":
                count += 1
            elif e[0] == "uns" and e[4]:
                _k, tag, frontier, msg, _acc = e
                before_frontier = bisect_right(mine, frontier - 1)
                # A tag of -1 (None on the wire): the leader had sent it nothing since it
                # took over; everything before the frontier must have been delivered.
                upto_tag = bisect_right(mine, tag) if tag >= 0 else before_frontier
                if count != upto_tag:
                    out.append(
                        f"unsafe-cut: {p} accepted {msg.id} at tag {tag} having "
                        f"delivered {count} of the {upto_tag} messages up to it"
                    )
                elif before_frontier != upto_tag:
                    out.append(
                        f"unsafe-cut: {p} accepted {msg.id} at tag {tag}, but a message "
                        f"before frontier {frontier} was meant for it"
                    )
                elif p not in ConfigGuard().destset(ref.config_at(frontier), msg):
                    out.append(
                        f"unsafe-cut: {p} accepted {msg.id}, not a destination at "
                        f"frontier {frontier}"
                    )
                else:
                    continue
                break
    return out[:5]


SAFETY = (
    check_prefix_and_timestamps,
    check_validity,
    check_no_duplicates,
    check_minimality,
    check_total_order,
    check_gap_free,
    check_causal_order,
    check_ack_safety,
    check_unsafe_cut,
)
LIVENESS = (check_uniform_agreement, check_termination)
