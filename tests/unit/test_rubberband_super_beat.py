"""A super's failure detector (4.2.3) does not blame others for its own stall, and still
votes out a process that stays silent: the core, driven with virtual time."""

from __future__ import annotations

from typing import Any

from ecast import Effects
from rubberband.outputs import Suspect
from rubberband.proto import Ping, Pong
from rubberband.super import SuperCore
from rubberband.supervision import Stalled, Voted
from tests.unit.test_rubberband_config import joined

STORAGE = ("storage:1", "storage:2")


def _core() -> SuperCore:
    # super:s0 coordinates (repairs are its business), super:s1 is the one watched here.
    config = joined("super:s0", "super:s1", *STORAGE)
    assert config.coordinator() == "super:s0"
    core = SuperCore("super:s1", heartbeat=0.05, suspect_after=0.3)
    core.config = config
    return core


def _run(core: SuperCore, until: float, silent: set[str], start: float = 0.0) -> list[Any]:
    """Tick every 10 ms from ``start`` to ``until``; every pinged process answers at once
    unless it is ``silent``.  Returns the upcalls and submissions."""
    out: list[Any] = []
    now = start
    while now <= until:
        fx: Effects = core.on_tick(now)
        out += fx.deliver
        for dst, msg in fx.send:
            assert type(msg.payload) is Ping
            if dst not in silent:
                out += core.on_direct(dst, Pong(msg.payload.sent_ms, {}), now).deliver
        now = round(now + 0.01, 6)
    return out


def test_a_super_that_stalled_votes_against_nobody() -> None:
    core = _core()
    assert _run(core, 0.2, set()) == []
    # The super's own loop stalls for a second while everyone else would answer on
    # time: its next beat finds nothing it may blame anyone for.
    out = _run(core, 1.6, set(), start=1.2)
    assert [type(x) for x in out] == [Stalled]
    assert core.watch.voted == set() and core.watch.votes == 0


def test_a_silent_storage_process_is_still_voted_against() -> None:
    core = _core()
    out = _run(core, 0.8, {"storage:2"})
    votes = [x for x in out if type(x) is Suspect]
    assert votes == [Suspect(("storage:2",))]
    assert [x.process for x in out if type(x) is Voted] == ["storage:2"]
    assert core.watch.voted == {"storage:2"}
    # Once is enough: later beats do not vote again.
    assert not [x for x in _run(core, 1.5, {"storage:2"}, start=0.81) if type(x) is Suspect]


def test_a_storage_process_answering_late_but_within_the_bound_is_not_voted_against() -> None:
    core = _core()
    out: list[Any] = []
    now = 0.0
    pending: list[tuple[float, str, Ping]] = []
    while now <= 2.0:
        fx = core.on_tick(now)
        out += fx.deliver
        pending += [(now + 0.2, d, m.payload) for d, m in fx.send]  # 200 ms round trips
        for due, d, ping in [p for p in pending if p[0] <= now]:
            out += core.on_direct(d, Pong(ping.sent_ms, {}), now).deliver
            pending.remove((due, d, ping))
        now = round(now + 0.01, 6)
    assert out == [] and core.watch.voted == set()


def test_clients_at_work_are_counted_from_fresh_figures_only() -> None:
    """Light clients join no group: a super counts those the storage processes heard in
    figures at most three heartbeats old, and trusts only client names from them."""
    core = _core()
    core.on_tick(0.0)
    names = ["client:a", "client:b", "storage:9", 7, "client:" + "x" * 300]
    fresh = {"applied": 5, "clients": names, "client_count": 2, "age_s": 0.05}
    core.on_direct("storage:1", Pong(0, fresh), 0.1)
    core.on_direct("storage:2", Pong(0, {**fresh, "clients": ["client:c"], "age_s": 1.0}), 0.1)
    st = core.status(0.1)
    assert st["clients"] == 2 and st["client_names"] == ["client:a", "client:b"]
    assert st["load"]["storage:1"]["clients"] == 2 and st["load"]["storage:2"]["clients"] == 0
    core.on_direct("storage:1", Pong(0, {**fresh, "age_s": 0.0}), 0.3)
    assert core.status(0.3)["clients"] == 2
    assert core.status(0.5)["clients"] == 0  # nobody reported them for three heartbeats


def test_a_storage_process_reports_the_clients_it_heard_once() -> None:
    from rubberband.proto import REPORTED_CLIENTS
    from rubberband.storage import StorageCore
    from storage_adapters.memory import MemoryEngine

    core = StorageCore("storage:1", MemoryEngine())
    core.senders.update({"client:z", "super:s1", *(f"client:{i:03}" for i in range(100))})
    f = core.figures()
    assert f["client_count"] == 101 and len(f["clients"]) == REPORTED_CLIENTS
    assert f["clients"][0] == "client:000" and "super:s1" not in f["clients"]
    assert core.figures()["client_count"] == 0  # counted since the last figures only
