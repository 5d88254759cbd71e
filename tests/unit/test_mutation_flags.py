"""The command-line tools that plant bugs send each to the process whose core consults it.
A fresh interpreter each: which cores are imported decides which mutations are declared,
and a tool that asks before the core is loaded sends a storage bug to the routers (which
refuse it and never start)."""

from __future__ import annotations

import subprocess
import sys


def fresh(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_cluster_up_sends_storage_mutations_to_the_storage_processes() -> None:
    out = fresh("from rubberband.tools import cluster; print(sorted(cluster.storage_mutations()))")
    assert "'mute_answers'" in out and "'delete_before_send'" in out, out
    assert "'skip_learn_dedup'" not in out, out  # a router's


def test_the_multicast_runs_send_endpoint_mutations_to_the_clients() -> None:
    out = fresh(
        "from jepsen_like.runner import mutation_args;"
        "print(mutation_args(['no_window_resend', 'skip_learn_dedup']))"
    )
    assert out == (
        "['--client-arg=--mutation=no_window_resend', '--router-arg=--mutation=skip_learn_dedup']"
    ), out


def test_e_cast_s_mutations_are_known_before_any_core_is_loaded() -> None:
    """``ecast bench worker --mutation`` checks the name while parsing its flags."""
    out = fresh(
        "from ecast.core import mutations;"
        "print(sorted(mutations.check(['no_window_resend', 'skip_phase1', 'ignore_suspects'])))"
    )
    assert out == "['ignore_suspects', 'no_window_resend', 'skip_phase1']", out
