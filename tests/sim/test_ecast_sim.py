"""E-Cast under randomized faults: every checker on every schedule; planted bugs caught.

``ECAST_LONG=1`` runs thousands of schedules instead of 200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ecast.core import mutations
from ecast.history import LIVENESS, SAFETY, Ack, Submit
from ecast.sim.__main__ import ecast_config, replay_command
from ecast.sim.ecast_run import ECAST_SITUATIONS, EcastRun, EcastRunConfig, run_ecast
from tests import ecast_scenarios as sc
from tests import report

PLANTABLE = set(mutations.known("router")) | set(mutations.known("endpoint"))

LONG = os.environ.get("ECAST_LONG") == "1"
SCHEDULES = 3000 if LONG else 200
ALL_LEADER_SCHEDULES = 400 if LONG else 40

schedule = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "routers": st.sampled_from([3, 3, 4, 5]),
        "submitters": st.sampled_from([3, 4]),
        "receivers": st.sampled_from([1, 2, 3]),
        "replication": st.sampled_from([0, 0, 2]),
        "messages": st.integers(80, 300),
        "clumping": st.booleans(),
        "delayed_acks": st.booleans(),
        "durable_confirms": st.booleans(),
        # A group founded again after a restart of every router numbers from the clock.
        "origin": st.sampled_from([0, 0, 1_800_000_000_000_000]),
    }
)


def _run_schedules(n: int, all_leaders: bool, label: str) -> Counter[str]:
    reached: Counter[str] = Counter()
    ran = 0
    without_quorum = 0

    @settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(schedule)
    def one(kw: dict) -> None:
        nonlocal ran, without_quorum
        result = run_ecast(ecast_config(all_leaders=all_leaders, **kw))
        ran += 1
        without_quorum += not result.quorum
        reached.update(k for k, v in result.situations.items() if v)
        extra = {"all_leaders": True} if all_leaders else {}
        assert not result.violations, (
            f"violations in seed {kw['seed']}:\n  "
            + "\n  ".join(result.violations)
            + f"\nreplay: {replay_command('ecast', **kw, **extra)}"
        )

    one()
    report.SCHEDULES[label] += ran
    report.SITUATIONS[label] = reached
    report.CHECKERS_PASSED[label] = [*SAFETY, *LIVENESS, "bounded-memory", "quiescence"]
    assert ran >= n
    assert without_quorum <= ran // 20
    return reached


@pytest.mark.parametrize("half", range(2))
def test_randomized_schedules_pass_every_checker_and_reach_every_situation(half: int) -> None:
    """Two halves of the schedules, so that the suite's two workers share them; each
    half reaches every situation on its own."""
    reached = _run_schedules(SCHEDULES // 2, all_leaders=False, label="ecast")
    missing = [s for s in ECAST_SITUATIONS if not reached[s]]
    assert not missing, f"fault situations never reached: {missing}"


def test_every_router_acting_as_leader_at_once_is_still_safe() -> None:
    _run_schedules(ALL_LEADER_SCHEDULES, all_leaders=True, label="ecast, every router leads")


SCRIPTED = {
    "skip_learn_dedup": sc.resent_before_learned,
    "route_latest_config": sc.join_and_message_learned_together,
    "ignore_suspects": sc.suspected_destination,
    "join_without_sessions": sc.router_joins_then_traffic,
    "no_window_resend": sc.leader_crash_before_proposing,
    "no_duplicate_confirm": sc.leader_change_after_last_message,
    "unsafe_advances_t_max": sc.unsafe_then_safe,
    "no_lease_expiry": sc.silent_crash_caught_by_lease,
}


@pytest.mark.parametrize("mutation", sorted(PLANTABLE))
def test_planted_ecast_bug_is_caught(mutation: str) -> None:
    assert set(SCRIPTED) == PLANTABLE
    scenario = SCRIPTED[mutation]
    assert scenario().violations() == [], "the scenario must pass without the bug"
    planted = frozenset({mutation})
    with mutations.planted(planted):
        found = scenario().violations()
    assert found, f"{scenario.__name__} did not catch {mutation}"
    how = [f"scripted {scenario.__name__} ({found[0].split(':')[0]})"]
    # Evidence from the randomized simulator too, where its schedules reach the trap.
    for seed in range(12):
        result = run_ecast(ecast_config(seed=seed, mutations=planted))
        if result.violations:
            how.append(f"random seed {seed} ({result.violations[0].split(':')[0]})")
            break
    report.MUTANTS[mutation] = how


# Schedules the random search once failed, replayed as they were found.
PINNED = [
    # A departed process's part acknowledgement was lost with its channel; it resent the
    # part to a later leader, which then held a lease for it and suspected it after the
    # group went quiet (an unstable suspect left in every router's m-seq).
    {
        "seed": 24337,
        "routers": 4,
        "submitters": 4,
        "receivers": 1,
        "replication": 0,
        "messages": 109,
        "clumping": True,
        "delayed_acks": False,
    },
    # Every router leading: another leader's copies made a suspect stable and collected
    # (with the config before it) while one router's frontier still lay below it; that
    # router routed an unsafe copy with the wrapped-around latest config but tagged it
    # with its stale frontier (unsafe-cut).
    {
        "seed": 40425,
        "routers": 3,
        "submitters": 3,
        "receivers": 3,
        "replication": 2,
        "messages": 261,
        "clumping": False,
        "delayed_acks": True,
        "all_leaders": True,
    },
    # A submitter submitted its part and crashed before confirming it; the leader it had
    # talked to crashed before its lease ran out.  The next leaders never heard from it
    # and, its part having left the members, gave it no lease: nobody suspected it, and
    # its part stayed unstable (every destination the leader waits for holds a lease).
    {
        "seed": 1748,
        "routers": 3,
        "submitters": 3,
        "receivers": 3,
        "replication": 2,
        "messages": 176,
        "clumping": False,
        "delayed_acks": True,
    },
    # Once routers held their parts while they heard no majority: a command the router
    # about to lead handed on came back to it in the same tenure and was refused for
    # good, or two routers each believed the other led (never quiet).
    {
        "seed": 2107941,
        "routers": 3,
        "submitters": 3,
        "receivers": 1,
        "replication": 0,
        "messages": 190,
        "clumping": True,
        "delayed_acks": True,
        "durable_confirms": True,
    },
]


@pytest.mark.parametrize("kw", PINNED, ids=lambda kw: f"seed{kw['seed']}")
def test_pinned_schedule_passes_every_checker(kw: dict) -> None:
    result = run_ecast(ecast_config(**kw))
    assert not result.violations, replay_command("ecast", **kw)


def test_processes_told_an_old_view_by_a_removed_router_reach_the_current_group() -> None:
    """Seed 5341 with half the messages unsafe and 2.5 faults a second showed it: r2 was
    removed from the group while it was slow, and the routers that knew stopped since,
    so it lived on in view 0 naming r1 (stopped) as the leader.  The processes that
    talked to it cycled between r1 and r2 until the run ended, though their router
    lists named r4 and r5 of the current view.  They now try every router they know once
    the old succession made no progress (``tests/unit/test_ecast.py`` checks the endpoint
    alone, and ``tests/ecast_scenarios.py``'s ``zombie_router`` stages it).  Seeds that
    reach it change with the routers' schedules (5341, then 5086); in seed 5830 a
    process takes the way out (a switch to a router its succession does not name) and
    finishes."""
    run = EcastRun(EcastRunConfig(seed=5830, unsafe_fraction=0.5, fault_rate=2.5))
    result = run.run()
    assert not result.violations, result.violations
    assert any(h.ep.stats["beyond_succession"] for h in run.apps.values())  # the situation


def test_a_process_suspected_before_its_join_was_learned_never_joins() -> None:
    """Seed 820 with half the messages unsafe and 4 faults a second: s8 greeted a router
    and crashed; a lease suspect named it before its join was learned.  The config
    retired only members, so the join made s8 a member after the suspect, a destination
    of every later message that the routers, which had expelled it, never suspected
    again: nothing was stable from then on, and s2 was never acknowledged.  A suspect
    now retires everyone it names (``tests/unit/test_config_mseq.py`` checks the config
    alone)."""
    result = run_ecast(EcastRunConfig(seed=820, unsafe_fraction=0.5, fault_rate=4.0))
    assert not result.violations, result.violations


def test_a_closing_process_is_acknowledged_by_the_router_that_collected_its_part() -> None:
    """The router that learns a part is stable also collects the departure and drops the
    process's channel, in the same step as it acknowledges the part: that acknowledgement
    must still leave, not wait for the process to time out and ask another router."""
    timeout = ecast_config(seed=0).endpoint.progress_timeout
    parts = 0
    for seed in range(3):
        run = EcastRun(ecast_config(seed=seed, faults=("app_part",), messages=80))
        assert not run.run().violations
        for p, host in run.apps.items():
            part = getattr(host.ep, "_part_id", None)
            if part is None:
                continue
            events = host.events
            sent = next(e.time for e in events if type(e) is Submit and e.id == part)
            acked = next(e.time for e in events if type(e) is Ack and e.id == part)
            assert acked - sent < timeout / 4, (seed, p, acked - sent)
            parts += 1
    assert parts >= 3


def _cli(*args: str, hashseed: str = "0") -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    out = subprocess.run(
        [sys.executable, "-m", "ecast.sim", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    data = json.loads(out.stdout)
    data["returncode"] = out.returncode
    data.pop("wall_s")
    return data


def test_cli_runs_one_schedule_with_the_promised_fields_and_replays_exactly() -> None:
    args = (
        "--routers",
        "3",
        "--receivers",
        "16",
        "--replication",
        "3",
        "--messages",
        "3000",
        "--faults",
        "crash,join,partition",
        "--seed",
        "5",
    )
    first = _cli(*args)
    for key in ("messages", "delivered", "stable", "faults", "violations", "seed"):
        assert key in first
    assert first["violations"] == [] and first["returncode"] == 0
    assert first["messages"] == 3000
    assert first["delivered"] >= 3 * 3000 * 0.9  # three replicas of (almost) every message
    assert first == _cli(*args, hashseed="777")
    everything = ("--seed", "11", "--messages", "400")  # every fault kind, broadcast config
    assert _cli(*everything) == _cli(*everything, hashseed="31337")


def test_cli_exits_non_zero_on_violations() -> None:
    out = _cli("--seed", "0", "--mutations", "route_latest_config")
    assert out["returncode"] == 1 and out["violations"]
