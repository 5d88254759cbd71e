"""Correct E-Cast histories made by hand: an m-seq replayed through a config, every
destination delivering, every submitter acknowledged.  Tests then plant one anomaly."""

from __future__ import annotations

from typing import Any

from ecast.core.config import JOIN, KIND, PART, ROUTERS, SUSPECT, WHO, Config
from ecast.core.message import Message, MsgId
from ecast.history import Ack, Deliver, History, Submit, Terminate


def data(p: str, seq: int, header: Any = None, payload: Any = None) -> Message:
    """Process ``p``'s data message ``seq`` in its own session."""
    return Message(p, ((p, 0, ""), seq), header, payload if payload is not None else f"{p}{seq}")


def control(p: str, seq: int, header: dict[str, Any]) -> Message:
    """A message in ``p``'s control session (join, part, suspect)."""
    return Message(p, (("@" + p, 0, ""), seq), header, None)


def join(p: str, **extra: Any) -> Message:
    return control(p, 1, {KIND: JOIN, **extra})


def part(p: str, seq: int = 2) -> Message:
    return control(p, seq, {KIND: PART})


def suspect(p: str, who: list[str], seq: int = 2) -> Message:
    return control(p, seq, {KIND: SUSPECT, WHO: who})


def lease_suspect(router: str, who: list[str], seq: int = 1) -> Message:
    return Message(
        ROUTERS, ((ROUTERS, 0, router), seq), {KIND: SUSPECT, WHO: who, "lease": True}, None
    )


def run(
    mseq: list[Message],
    config: Config,
    *,
    learned: bool = False,
    crashed: dict[str, int] | None = None,
) -> History:
    """The history of a correct run of ``mseq``: message ``t`` submitted at time ``t``,
    delivered by its destinations at ``t + 0.1``, acknowledged at ``t + 0.2``.
    ``crashed`` maps a process to the t from which it is gone (it neither delivers nor
    is acknowledged from there; a suspect must follow for the run to stay live)."""
    h = History()
    crashed = crashed or {}
    gone: set[str] = set()
    parted: set[str] = set()
    for t, m in enumerate(mseq):
        for p, at in crashed.items():
            if at == t and p not in gone:
                gone.add(p)
                from ecast.history import Crash

                h.add(p, Crash(t - 0.5))
        base = float(t)
        by = m.sender
        if by != ROUTERS and by not in gone:
            h.add(by, Submit(m.id, base))
        dests = config.destset(m)
        for d in sorted(dests):
            if d not in gone:
                h.add(d, Deliver(t, m.id, base + 0.1, m.sender, m.header, m.payload))
        if learned:
            h.router("r1").learn(t, m, base + 0.05)
            h.router("r2").learn(t, m, base + 0.06)
        if by != ROUTERS and by not in gone and by not in parted:
            h.add(by, Ack(m.id, t, bool(dests), base + 0.2))
        if type(m.header) is dict and m.header.get(KIND) == PART and by in dests:
            h.add(by, Terminate("closed", base + 0.15))
            parted.add(by)
        for p in sorted(config.suspects(m)):
            if p not in gone and p not in parted:
                h.add(p, Terminate("suspected", base + 0.1))
                gone.add(p)
        config = config.apply(m)
    return h


def ids_of(h: History, p: str, kind: type) -> list[MsgId]:
    return [e.id for e in h.of_kind(p, kind)]
