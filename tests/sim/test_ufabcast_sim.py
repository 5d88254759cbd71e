"""ufabcast under randomized faults: every checker, every schedule; every planted bug caught.

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
from ecast.sim.__main__ import replay_command, ufab_config
from ecast.sim.ufab import SITUATIONS, run_ufabcast
from ecast.sim.ufab_checks import SAFETY_CHECKS
from tests import report, scenarios

MUTATIONS = set(mutations.known("ufabcast"))

LONG = os.environ.get("ECAST_LONG") == "1"
SCHEDULES = 3000 if LONG else 200
LIVENESS = ("uniform-agreement", "termination", "bounded-memory")

schedule = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "routers": st.sampled_from([3, 3, 4, 5]),
        "commands": st.integers(50, 400),
        "max_active": st.sampled_from([4, 32768, 32768]),
        "clumping": st.booleans(),
    }
)


def test_randomized_schedules_pass_every_checker_and_reach_every_situation() -> None:
    reached: Counter[str] = Counter()
    ran = 0
    without_quorum = 0

    @settings(
        max_examples=SCHEDULES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(schedule)
    def one(kw: dict) -> None:
        nonlocal ran, without_quorum
        result = run_ufabcast(ufab_config(**kw))
        ran += 1
        without_quorum += not result.quorum
        reached.update(k for k, v in result.situations.items() if v)
        assert not result.violations, (
            f"violations in seed {kw['seed']}:\n  "
            + "\n  ".join(result.violations)
            + f"\nreplay: {replay_command(**kw)}"
        )

    one()
    report.SCHEDULES["ufabcast"] += ran
    report.SITUATIONS["ufabcast"] = reached
    report.CHECKERS_PASSED["ufabcast"] = [
        c.__name__.removeprefix("check_").replace("_", "-") for c in SAFETY_CHECKS
    ] + list(LIVENESS)
    assert ran >= SCHEDULES
    missing = [s for s in SITUATIONS if not reached[s]]
    assert not missing, f"fault situations never reached: {missing}"
    # Liveness is owed only with a majority of the latest view up; the nemesis must
    # leave that standing in almost every run, or the liveness checks prove little.
    assert without_quorum <= ran // 20


SCRIPTED = {
    "keep_void_instances": [scenarios.void_after_stop_sign],
    "renumber_reproposals": [scenarios.reproposal_after_leader_crash],
    "no_fifo_dedup": [scenarios.reproposal_after_leader_crash],
    "execute_parted": [scenarios.parted_router_late_command],
    "skip_phase1": [scenarios.chosen_then_leader_crash],
}
"""For each planted bug, the scripted scenario that stages the trap it falls into."""

RANDOMIZED = {
    "keep_void_instances": {"routers": 5, "commands": 1000},
    "renumber_reproposals": {"routers": 3, "commands": 300},
    "no_fifo_dedup": {"routers": 3, "commands": 300},
    "execute_parted": {"routers": 3, "commands": 300},
    "skip_phase1": {"routers": 3, "commands": 300},
}
"""For each planted bug, schedules of the randomized simulator that should expose it."""


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_planted_bug_is_caught(mutation: str) -> None:
    assert set(SCRIPTED) == set(MUTATIONS) == set(RANDOMIZED)
    how = []
    for scenario in SCRIPTED[mutation]:
        assert scenario().violations() == [], "the scenario must pass without the bug"
        with mutations.planted({mutation}):
            found = scenario().violations()
        assert found, f"{scenario.__name__} did not catch {mutation}"
        how.append(f"scripted {scenario.__name__} ({found[0].split(':')[0]})")
    # The randomized simulator finds it too, within a fixed set of seeds.
    for seed in range(60):
        result = run_ufabcast(
            ufab_config(seed=seed, mutations=frozenset({mutation}), **RANDOMIZED[mutation])
        )
        if result.violations:
            how.append(f"random seed {seed} ({result.violations[0].split(':')[0]})")
            break
    else:
        pytest.fail(f"no randomized schedule caught {mutation}")
    report.MUTANTS[mutation] = how


def _cli(seed: int, hashseed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ecast.sim",
            "--layer",
            "ufabcast",
            "--seed",
            str(seed),
            "--routers",
            "4",
            "--commands",
            "300",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    data = json.loads(out.stdout)
    data.pop("wall_s")
    return data


@pytest.mark.parametrize(
    "kw",
    [
        # Two routers each believed the other led, and neither ran phase 1.
        {"seed": 26731, "routers": 3, "commands": 50, "max_active": 4, "clumping": False},
        # A part the router about to lead handed on came back in the same tenure and
        # was refused for good: the dead r1 stayed a member.
        {"seed": 145, "routers": 4, "commands": 145, "max_active": 32768, "clumping": False},
    ],
    ids=lambda kw: f"seed{kw['seed']}",
)
def test_pinned_schedule_passes_every_checker(kw: dict) -> None:
    result = run_ufabcast(ufab_config(**kw))
    assert not result.violations, replay_command(**kw)


def test_a_seed_replays_byte_identically_under_any_hash_seed() -> None:
    first = _cli(7, "0")
    again = _cli(7, "0")
    other = _cli(7, "4242")
    assert first == again == other
    assert first["faults"], "the replayed run must contain faults to mean anything"
    assert first["digest"] != _cli(8, "0")["digest"]


def test_failing_seed_prints_a_replay_command_that_fails_the_same_way() -> None:
    # The first seed under which the planted bug shows, whichever it is today.
    base = {"routers": 4, "commands": 300, "max_active": 32768, "clumping": True}
    for seed in range(40):
        cfg = ufab_config(seed=seed, mutations=frozenset({"skip_phase1"}), **base)
        result = run_ufabcast(cfg)
        if result.violations:
            break
    else:
        raise AssertionError("skip_phase1 went unnoticed in 40 seeds")
    kw = {"seed": seed, **base}
    cmd = replay_command(**kw) + " --mutations skip_phase1 --json"
    assert cmd.startswith(f"python -m ecast.sim --layer ufabcast --seed {seed}")
    argv = cmd.split()[3:]
    out = subprocess.run([sys.executable, "-m", "ecast.sim", *argv], capture_output=True, text=True)
    assert out.returncode == 1
    assert json.loads(out.stdout)["violations"] == result.violations
