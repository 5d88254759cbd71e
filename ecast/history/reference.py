"""The m-seq a history implies, and the destination sets a config gives it (3.3.2, 3.5.3).

With the routers' records (``Learned`` events) the m-seq is what they learned: every
router's log must be a prefix of one sequence.  Without them (a real run records only
what processes saw) it is rebuilt from deliveries and acknowledgements: each names one
message at one ``t``, so the m-seq has one message per ``t`` and one ``t`` per message,
and a ``t`` that no process delivered or had acknowledged is *unknown*.

Given the initial ``Config``, replaying it over the m-seq gives each message's
destination set according to its prefix (``destsetpfx``) and who is suspected from
where.  Replay goes through :class:`ecast.core.mseq.ConfigGuard`, so a config that raises
has the routers' defined outcome.  A message whose sender and header are unknown (an
unknown ``t``, or one only acknowledged) is replayed as changing no config, and has no
known destination set: checks that need one skip it, and a violation they find after
such a message says so.

One kind of unknown message is pinned down all the same: a suspect.  Under a config
that delivers a suspect only to the processes it names (``KeyRingConfig``), nobody may
deliver it, since its destinations are declared faulty; but each of them, told by a router
that it was suspected, records where (``Terminate.t``).  An unknown ``t`` that
suspected processes name is replayed as the routers' suspect of exactly those processes
(:data:`INFERRED`); a known message there that does not suspect them is a disagreement
between the routers and the sequence processes saw.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from ecast.core.config import KIND, ROUTERS, SUSPECT, WHO, Config, kind_of, suspected_in
from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId
from ecast.core.mseq import ConfigGuard
from ecast.history.events import Ack, Deliver, History, Submit, Terminate

MAX_PROBLEMS = 5
INFERRED = "~inferred"
"""The stream of the session that a suspect rebuilt from ``Terminate.t`` is given."""


@dataclass(slots=True)
class Reference:
    ids: dict[int, MsgId]
    """t -> message id, for every t the history pins down."""
    index: dict[MsgId, int]
    """message id -> t."""
    messages: dict[int, Message]
    """t -> message, where its sender and header are known."""
    from_routers: bool
    """The m-seq is the routers' (complete); else rebuilt from what processes saw."""
    first: int
    """The lowest t known: the group's origin (a group founded again after a restart
    of every router starts above the last one's positions, ``RouterParams.origin``)."""
    top: int
    """The highest t known (-1: none)."""
    unknown: list[int]
    """t from ``first`` to ``top`` whose message is unknown (not even its id), sorted."""
    dest: dict[int, frozenset[NodeId]] | None
    """t -> destination set, where the message is known; None without a config."""
    suspected: dict[NodeId, int | None]
    """Process -> t of the first message suspecting it (None: suspected, t unknown)."""
    known_at: dict[int, float]
    """t -> the earliest time the routers can have had it (a lower bound, where known)."""
    config_starts: list[int]
    configs: list[Config]
    problems: list[tuple[str, str]]
    """(check name, explanation) found while building: routers or processes that
    disagree on a t, a message at two t."""
    first_unreplayed: int | None
    """The first t replayed without its message (None: every message was known)."""
    inferred: dict[int, Message]
    """t -> the suspect replayed there, rebuilt from what suspected processes were told."""
    config_errors: int

    def config_at(self, t: int) -> Config | None:
        if not self.configs:
            return None
        # (before the first position, a frontier below the group's origin: the first)
        return self.configs[max(0, bisect_right(self.config_starts, t) - 1)]

    def unknown_between(self, lo: int, hi: int) -> int:
        """How many unknown timestamps lie strictly between ``lo`` and ``hi``."""
        u = self.unknown
        return bisect_left(u, hi) - bisect_right(u, lo)

    def caveat(self, t: int) -> str:
        """What a finding at ``t`` assumed, if the replay lacked a message before it."""
        first = self.first_unreplayed
        if first is None or first >= t or self.dest is None:
            return ""
        return f" (assuming the unknown message at t={first} and any later ones changed no config)"


def build_reference(history: History, config: Config | None = None) -> Reference:
    """The m-seq (the routers' if recorded, else rebuilt) and, with ``config``, its
    destination sets and suspicions."""
    from_routers = any(log.learned for log in history.routers.values())
    problems: list[tuple[str, str]] = []
    if from_routers:
        ids, messages, known_at = _from_routers(history, problems)
    else:
        ids, messages, known_at = _rebuild(history, problems)
    first, top = min(ids, default=0), max(ids, default=-1)
    unknown = []
    if len(ids) <= top - first:
        unknown = [t for t in range(first, top + 1) if t not in ids]
    index: dict[MsgId, int] = {}
    for t in sorted(ids):
        mid = ids[t]
        had = index.get(mid)
        if had is not None:
            if from_routers and len(problems) < 2 * MAX_PROBLEMS:
                problems.append(("no-duplicates", f"{mid} appears at t={had} and t={t}"))
            continue  # the first t stays: that is where the routers ordered it
        index[mid] = t
    ref = Reference(
        ids=ids,
        index=index,
        messages=messages,
        from_routers=from_routers,
        first=first,
        top=top,
        unknown=unknown,
        dest=None,
        suspected={},
        known_at=known_at,
        config_starts=[],
        configs=[],
        problems=problems,
        first_unreplayed=None,
        config_errors=0,
        inferred={},
    )
    # Processes told they were suspected, and where if a router said (``Terminate.t``).
    told = {} if from_routers else _told_suspected(history)
    if told:
        ref.inferred = _rebuilt_suspects(told, ids, messages, problems)
    if config is not None:
        _replay(ref, config)
    else:
        _suspects_without_config(ref)
    # A process told it was suspected was suspected, whether or not the suspect message
    # is among what the history shows.
    for p in told:
        ref.suspected.setdefault(p, None)
    return ref


def _from_routers(
    history: History, problems: list[tuple[str, str]]
) -> tuple[dict[int, MsgId], dict[int, Message], dict[int, float]]:
    mseq: dict[int, Message] = {}
    owner: dict[int, NodeId] = {}
    known_at: dict[int, float] = {}
    for r, log in history.routers.items():
        for t, m in log.learned.items():
            have = mseq.get(t)
            if have is None:
                mseq[t] = m
                owner[t] = r
            elif have.id != m.id and len(problems) < MAX_PROBLEMS:
                problems.append(
                    ("prefix-agreement", f"t={t} is {have.id} at {owner[t]} but {m.id} at {r}")
                )
        for t, when in log.first_seen.items():
            if t not in known_at or when < known_at[t]:
                known_at[t] = when
    first, top = min(mseq, default=0), max(mseq, default=-1)
    missing = []
    if len(mseq) <= top - first:
        missing = [t for t in range(first, top + 1) if t not in mseq]
    if missing:
        problems.append(
            ("prefix-agreement", f"no router learned t={missing[0]} (of {len(missing)})")
        )
    return {t: m.id for t, m in mseq.items()}, mseq, known_at


def _rebuild(
    history: History, problems: list[tuple[str, str]]
) -> tuple[dict[int, MsgId], dict[int, Message], dict[int, float]]:
    """One message per t and one t per message, from deliveries and acknowledgements."""
    ids: dict[int, MsgId] = {}
    at: dict[MsgId, int] = {}
    messages: dict[int, Message] = {}
    submitted_at: dict[MsgId, float] = {}
    for p, events in history.processes.items():
        for e in events:
            kind = type(e)
            if kind is Deliver:
                t, mid = e.t, e.id
                if e.sender is not None and t not in messages:
                    messages[t] = Message(e.sender, mid, e.header, None)
            elif kind is Ack:
                t, mid = e.t, e.id
                if t is None:
                    continue
            elif kind is Submit:
                # A suspect's submission bounds from below when the routers had it.
                if e.time is not None and e.id[0][0][:1] == "@":
                    submitted_at.setdefault(e.id, e.time)
                continue
            else:
                continue
            have = ids.get(t)
            if have is None:
                ids[t] = mid
            elif have != mid and len(problems) < MAX_PROBLEMS:
                problems.append(("prefix-agreement", f"t={t} is {have} elsewhere but {mid} at {p}"))
            where = at.get(mid)
            if where is None:
                at[mid] = t
            elif where != t and len(problems) < MAX_PROBLEMS:
                problems.append(("no-duplicates", f"{mid} appears at t={where} and t={t} ({p})"))
    known_at = {t: submitted_at[mid] for t, mid in ids.items() if mid in submitted_at}
    return ids, messages, known_at


def _replay(ref: Reference, config: Config) -> None:
    guard = ConfigGuard()  # a config that raises has the routers' defined outcome
    dest: dict[int, frozenset[NodeId]] = {}
    suspected = ref.suspected
    starts, configs = [ref.first], [config]
    messages = ref.messages
    first_unreplayed = None
    inferred = ref.inferred
    for t in range(ref.first, ref.top + 1):
        m = messages.get(t)
        if m is None:
            m = inferred.get(t)
        if m is None:
            if first_unreplayed is None:
                first_unreplayed = t
            continue
        dest[t] = guard.destset(config, m)
        for p in guard.suspects(config, m):
            suspected.setdefault(p, t)
        nxt = guard.apply(config, m)
        if nxt is not config:
            config = nxt
            starts.append(t + 1)
            configs.append(config)
    ref.dest = dest
    ref.config_starts = starts
    ref.configs = configs
    ref.first_unreplayed = first_unreplayed
    ref.config_errors = guard.errors


def _told_suspected(history: History) -> dict[NodeId, int | None]:
    """Process -> where a router said it was suspected (None: not said), for every
    process that recorded being told."""
    told: dict[NodeId, int | None] = {}
    for p, events in history.processes.items():
        for e in events:
            if type(e) is Terminate and e.reason == "suspected":
                told[p] = e.t
    return told


def _rebuilt_suspects(
    told: dict[NodeId, int | None],
    ids: dict[int, MsgId],
    messages: dict[int, Message],
    problems: list[tuple[str, str]],
) -> dict[int, Message]:
    """The suspects that processes were told of where no process saw the message: each
    rebuilt as the routers' suspect of the processes told that t."""
    at: dict[int, list[NodeId]] = {}
    for p, t in told.items():
        if t is not None:
            at.setdefault(t, []).append(p)
    out: dict[int, Message] = {}
    for t, who in sorted(at.items()):
        m = messages.get(t)
        if m is not None:
            agrees = kind_of(m) == SUSPECT and set(who) <= set(suspected_in(m))
            if not agrees and len(problems) < MAX_PROBLEMS:
                problems.append(
                    (
                        "prefix-agreement",
                        f"{', '.join(sorted(who))} told suspected at t={t}, but t={t} is "
                        f"{m.id}, which does not suspect them",
                    )
                )
            continue
        if t in ids:
            continue  # acknowledged only: its id is known, its sender not; leave it unknown
        header = {KIND: SUSPECT, WHO: sorted(who), "lease": True}
        out[t] = Message(ROUTERS, ((ROUTERS, 0, INFERRED), t), header, None)
    return out


def _suspects_without_config(ref: Reference) -> None:
    """Everyone a suspect message names counts as suspected: without the config it is not
    known whose suspicions count, and counting more only excuses more."""
    known = ref.inferred | ref.messages
    for t in sorted(known):
        m = known[t]
        if kind_of(m) == SUSPECT:
            for p in suspected_in(m):
                ref.suspected.setdefault(p, t)
