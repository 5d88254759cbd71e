"""The simulator runs any config and any application core: here a topic config and cores
that answer every delivery with a direct message; and schedules through the real codec."""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ecast.core.config import EMPTY, KIND, Membership
from ecast.core.effects import NodeId
from ecast.core.message import Message
from ecast.history import Deliver
from ecast.sim.__main__ import ecast_config
from ecast.sim.ecast_run import AppHost, Application, EcastRun, run_ecast
from tests import report

TOPICS = ("a", "b")


class TopicConfig(Membership):
    """Processes name the topics they subscribe to when they join; a data message goes to
    the subscribers of its ``header["topic"]`` (a config written with the toolkit)."""

    __slots__ = ("_subs",)

    def __init__(
        self,
        members: frozenset[NodeId] = EMPTY,
        retired: frozenset[NodeId] = EMPTY,
        subs: tuple[tuple[NodeId, tuple[str, ...]], ...] = (),
    ) -> None:
        super().__init__(members, retired)
        self._subs = subs

    @classmethod
    def initial(cls) -> TopicConfig:
        return cls()

    @classmethod
    def from_state(cls, state: Any) -> TopicConfig:
        members, retired, subs = state
        return cls(frozenset(members), frozenset(retired), tuple((p, tuple(t)) for p, t in subs))

    def to_state(self) -> Any:
        return [sorted(self._members), sorted(self._retired), [list(x) for x in self._subs]]

    def _joined(self, p: NodeId, header: dict[str, Any]) -> TopicConfig:
        topics = header.get("topics")
        mine = tuple(sorted(t for t in topics if t in TOPICS)) if type(topics) is tuple else ()
        subs = tuple(sorted((*self._subs, (p, mine))))
        return TopicConfig(self._members | {p}, self._retired, subs)

    def _left(self, gone: frozenset[NodeId]) -> TopicConfig:
        subs = tuple(x for x in self._subs if x[0] not in gone)
        return TopicConfig(self._members - gone, self._retired | gone, subs)

    def destset(self, msg: Message) -> frozenset[NodeId]:
        h = msg.header
        if type(h) is dict and KIND in h:
            dests = self.join_destset(msg)
            return dests if dests is not None else EMPTY
        if msg.sender not in self._members or type(h) is not dict:
            return EMPTY
        topic = h.get("topic")
        return frozenset(p for p, topics in self._subs if topic in topics)

    def __eq__(self, other: object) -> bool:
        return type(other) is TopicConfig and other.to_state() == self.to_state()

    def __hash__(self) -> int:
        return hash((self._members, self._retired, self._subs))


def _topics_of(pid: NodeId) -> tuple[str, ...]:
    n = zlib.crc32(pid.encode()) % 3
    return (("a",), ("b",), ("a", "b"))[n]


class EchoApp(Application):
    """Every process that delivers a data message sends its sender a direct echo; the
    check: between processes alive at the end, every delivery was echoed, in delivery
    order, and nothing else was."""

    situations = ("echo_round_trip",)

    def initial_config(self) -> TopicConfig:
        return TopicConfig.initial()

    def join_header(self, role: str, pid: NodeId) -> dict[str, Any]:
        return {"role": role, "topics": _topics_of(pid)}

    def header_for(self, payload: Any) -> Any:
        return {"topic": TOPICS[zlib.crc32(str(payload).encode()) % 2]}

    def on_delivery(self, host: AppHost, m: Message, now: float) -> list[tuple[NodeId, Any]]:
        if m.kind is None and m.sender != host.pid:
            return [(m.sender, ("echo", m.id))]
        return []

    def check(self, run: EcastRun, quiescent: bool) -> list[str]:
        out: list[str] = []
        alive = {p for p in run.apps if run._app_alive(p)}
        index = {}
        for log in run.history.routers.values():
            for m in log.learned.values():
                index[m.id] = m
        for d, host in run.apps.items():
            delivered = [
                index[e.id]
                for e in host.events
                if type(e) is Deliver and e.id in index and index[e.id].kind is None
            ]
            for s in sorted({m.sender for m in delivered} & alive - {d}):
                if d not in alive or not quiescent:
                    continue
                want = [("echo", m.id) for m in delivered if m.sender == s]
                got = [p for src, p in run.apps[s].received if src == d]
                if got != want:
                    out.append(
                        f"echo: {s} got {len(got)} echoes from {d} for the {len(want)} "
                        f"messages {d} delivered from it (or out of order)"
                    )
                elif want:
                    run.situations["echo_round_trip"] += 1
        for s, host in run.apps.items():
            for src, payload in host.received:
                m = index.get(payload[1]) if type(payload) is tuple else None
                if m is None or m.sender != s:
                    out.append(f"echo: {s} got an echo from {src} for no message of its own")
                    break
        return out[:5]


schedule = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "routers": st.sampled_from([3, 4]),
        "submitters": st.sampled_from([3, 4]),
        "receivers": st.sampled_from([1, 2]),
        "messages": st.integers(60, 160),
    }
)


def _family(n: int, label: str, **extra: Any) -> dict[str, int]:
    reached: dict[str, int] = {}
    ran = 0

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(schedule)
    def one(kw: dict[str, Any]) -> None:
        nonlocal ran
        cfg = ecast_config(**kw, codec=extra.get("codec", False))
        if "app" in extra:
            cfg = replace(cfg, app=extra["app"]())
        result = run_ecast(cfg)
        ran += 1
        for k, v in result.situations.items():
            if v:
                reached[k] = reached.get(k, 0) + 1
        assert not result.violations, (
            f"{label}, seed {kw['seed']}: " + "; ".join(result.violations) + f" ({kw})"
        )

    one()
    report.SCHEDULES[label] += ran
    report.SITUATIONS[label] = reached  # type: ignore[assignment]
    return reached


def test_a_custom_config_and_application_cores_exchanging_direct_messages() -> None:
    reached = _family(40, "ecast, topic config and echoing cores", app=EchoApp)
    assert reached.get("echo_round_trip", 0) >= 20


def test_schedules_through_the_real_codec() -> None:
    reached = _family(20, "ecast, every frame through the codec", codec=True)
    assert reached.get("leader_crash_unstable", 0) + reached.get("isolated_leader", 0) > 0


def test_the_echo_check_catches_a_lost_echo() -> None:
    class Forgetful(EchoApp):
        def on_delivery(self, host: AppHost, m: Message, now: float) -> list[tuple[NodeId, Any]]:
            echoes = super().on_delivery(host, m, now)
            return [] if m.id[1] == 3 else echoes

    result = run_ecast(replace(ecast_config(seed=3, messages=80), app=Forgetful()))
    assert any(v.startswith("echo:") for v in result.violations)
