"""Checkers for ufabcast's guarantees over what a simulated run recorded.

Each checker takes the recorded facts and returns a list of violation strings (empty when
the guarantee held).  "Correct" means never crashed and never parted (3.3.4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ecast.core.effects import NodeId

Entry = tuple[NodeId, int, str]
"""(proposer, seq, payload) of one released command."""


@dataclass
class RouterRecord:
    log: list[Entry] = field(default_factory=list)
    parted_at: dict[NodeId, int] = field(default_factory=dict)
    """Proposer -> length of this router's log when that proposer's part executed."""
    jump_conflicts: int = 0
    """State transfers whose log did not extend what this router had executed."""
    crashed: bool = False
    stopped: bool = False
    installed: bool = False

    @property
    def correct(self) -> bool:
        return not self.crashed and not self.stopped


@dataclass
class Facts:
    routers: dict[NodeId, RouterRecord]
    proposals: dict[str, tuple[NodeId, int]]
    """payload -> (proposer, seq it was given when proposed)."""


def check_state_transfers(f: Facts) -> list[str]:
    return [
        f"total-order: {r} received a snapshot that contradicts what it had executed"
        for r, rec in f.routers.items()
        if rec.jump_conflicts
    ][:5]


def check_validity(f: Facts) -> list[str]:
    out = []
    for r, rec in f.routers.items():
        for proposer, seq, payload in rec.log:
            want = f.proposals.get(payload)
            if want is None:
                out.append(f"validity: {r} executed {payload!r}, which nobody proposed")
            elif want != (proposer, seq):
                out.append(
                    f"validity: {r} executed {payload!r} as {proposer}#{seq}, "
                    f"proposed as {want[0]}#{want[1]}"
                )
    return out[:5]


def check_no_duplicates(f: Facts) -> list[str]:
    out = []
    for r, rec in f.routers.items():
        seen: set[str] = set()
        for _p, _s, payload in rec.log:
            if payload in seen:
                out.append(f"no-duplicates: {r} executed {payload!r} twice")
            seen.add(payload)
    return out[:5]


def check_fifo(f: Facts) -> list[str]:
    out = []
    for r, rec in f.routers.items():
        nxt: dict[NodeId, int] = {}
        for proposer, seq, payload in rec.log:
            want = nxt.get(proposer, 1)
            if seq != want:
                out.append(f"fifo: {r} executed {proposer}#{seq} ({payload!r}) expecting #{want}")
            nxt[proposer] = max(want, seq + 1)
    return out[:5]


def check_total_order(f: Facts) -> list[str]:
    """Every router's executed sequence is a prefix of one sequence."""
    logs = sorted(f.routers.items(), key=lambda kv: (-len(kv[1].log), kv[0]))
    if not logs:
        return []
    ref_name, ref = logs[0][0], [e[2] for e in logs[0][1].log]
    out = []
    for r, rec in logs[1:]:
        mine = [e[2] for e in rec.log]
        if mine != ref[: len(mine)]:
            i = next(k for k, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b)
            out.append(
                f"total-order: {r} and {ref_name} differ at position {i}: {mine[i]!r} vs {ref[i]!r}"
            )
    return out[:5]


def check_uniform_agreement(f: Facts) -> list[str]:
    """A command executed anywhere (even by a router that crashed) reaches every correct one."""
    everywhere: dict[str, NodeId] = {}
    for r, rec in f.routers.items():
        for _p, _s, payload in rec.log:
            everywhere.setdefault(payload, r)
    out = []
    for r, rec in f.routers.items():
        if not rec.correct:
            continue
        have = {e[2] for e in rec.log}
        for payload, who in everywhere.items():
            if payload not in have:
                out.append(f"uniform-agreement: {who} executed {payload!r}, correct {r} did not")
                break
    return out[:5]


def check_termination(f: Facts) -> list[str]:
    """Every command proposed by a correct router is executed by every correct router."""
    out = []
    for r, rec in f.routers.items():
        if not rec.correct:
            continue
        if not rec.installed:
            out.append(f"termination: correct router {r} never installed")
            continue
        have = {e[2] for e in rec.log}
        for payload, (proposer, _seq) in f.proposals.items():
            prec = f.routers.get(proposer)
            if prec is not None and prec.correct and payload not in have:
                out.append(f"termination: {r} never executed {payload!r} from correct {proposer}")
                break
    return out[:5]


def check_parted_proposers(f: Facts) -> list[str]:
    """Commands of a router executed after its own part are ignored (3.5.5)."""
    out = []
    for r, rec in f.routers.items():
        for i, (proposer, seq, payload) in enumerate(rec.log):
            cut = rec.parted_at.get(proposer)
            if cut is not None and i >= cut:
                out.append(
                    f"parted-proposer: {r} executed {proposer}#{seq} ({payload!r}) "
                    f"after {proposer}'s part"
                )
                break
    return out[:5]


SAFETY_CHECKS = (
    check_validity,
    check_no_duplicates,
    check_fifo,
    check_total_order,
    check_parted_proposers,
    check_state_transfers,
)
