"""Run one seeded simulation and print the checkers' verdict.

    python -m ecast.sim --layer ufabcast --routers 3 --commands 1000 \\
        --faults crash,join,partition --seed 7 --json

Exits 1 when any checker reports a violation, so a failing seed from the test suite
replays with the printed command line; the output is identical under any
``PYTHONHASHSEED`` (the ``digest`` field covers every upcall and fault of the run).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ecast.core import mutations as planted_bugs
from ecast.core.endpoint import EndpointParams
from ecast.core.router import RouterParams
from ecast.core.ufabcast import UfabParams
from ecast.sim.ecast_run import ECAST_FAULTS, EcastRunConfig, run_ecast
from ecast.sim.engine import NetParams
from ecast.sim.ufab import FAULT_KINDS, UfabRunConfig, run_ufabcast


def ufab_config(
    seed: int,
    routers: int = 3,
    commands: int = 300,
    faults: tuple[str, ...] = FAULT_KINDS,
    max_active: int = 32768,
    clumping: bool = True,
    fault_time: float = 8.0,
    mutations: frozenset[str] = frozenset(),
) -> UfabRunConfig:
    """The one place that turns run parameters into a config (CLI and tests share it)."""
    params = UfabParams(
        max_active=max_active,
        clump_trigger=3 if clumping else 1,
        clump_delay=0.010 if clumping else 0.0,
    )
    return UfabRunConfig(
        seed=seed,
        routers=routers,
        commands=commands,
        faults=faults,
        fault_time=fault_time,
        ufab=params,
        mutations=planted_bugs.check(mutations),
    )


def ecast_config(
    seed: int,
    routers: int = 3,
    submitters: int = 3,
    receivers: int = 2,
    replication: int = 0,
    messages: int = 300,
    faults: tuple[str, ...] = ECAST_FAULTS,
    clumping: bool = True,
    delayed_acks: bool = True,
    all_leaders: bool = False,
    fault_time: float = 8.0,
    mutations: frozenset[str] = frozenset(),
    codec: bool = False,
    durable_confirms: bool = False,
    origin: int = 0,
) -> EcastRunConfig:
    return EcastRunConfig(
        net=NetParams(codec=codec),
        seed=seed,
        routers=routers,
        submitters=submitters,
        receivers=receivers,
        replication=replication,
        messages=messages,
        faults=faults,
        fault_time=fault_time,
        ufab=UfabParams(clump_trigger=3 if clumping else 1, clump_delay=0.010 if clumping else 0.0),
        router=RouterParams(delayed_acks=delayed_acks, all_leaders=all_leaders, origin=origin),
        endpoint=EndpointParams(confirm_when_durable=durable_confirms),
        mutations=planted_bugs.check(mutations),
    )


def replay_command(layer: str = "ufabcast", **kw: Any) -> str:
    """The command line that reruns a schedule given as ``*_config`` keywords."""
    parts = [f"python -m ecast.sim --layer {layer}"]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{key.replace('_', '-')}")
        elif isinstance(value, (tuple, frozenset, set)):
            if value:
                parts.append(f"{flag} {','.join(sorted(value))}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ecast.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--layer", choices=["ecast", "ufabcast"], default="ecast")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--faults", type=_csv, default=None, help="comma-separated fault kinds")
    ap.add_argument("--clumping", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--fault-time", type=float, default=8.0)
    ap.add_argument("--mutations", type=_csv, default=(), help="planted bugs (tests only)")
    ap.add_argument(
        "--codec",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="send every frame through the real wire codec (slower; catches what it cannot carry)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--progress", action="store_true", help="print faults as they happen")
    e = ap.add_argument_group("ecast layer")
    e.add_argument("--messages", type=int, default=300)
    e.add_argument("--submitters", type=int, default=3)
    e.add_argument("--receivers", type=int, default=2)
    e.add_argument(
        "--replication",
        type=int,
        default=0,
        help="0: broadcast config; f: key-ring config with f successors",
    )
    e.add_argument("--delayed-acks", action=argparse.BooleanOptionalAction, default=True)
    e.add_argument("--all-leaders", action="store_true", help="every router acts as leader")
    e.add_argument(
        "--durable-confirms",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="processes confirm deliveries once written down (a tick later), not on arrival",
    )
    e.add_argument(
        "--origin", type=int, default=0, help="the position of the group's first message"
    )
    u = ap.add_argument_group("ufabcast layer")
    u.add_argument("--commands", type=int, default=300)
    u.add_argument("--max-active", type=int, default=32768)
    args = ap.parse_args(argv)
    kinds = ECAST_FAULTS if args.layer == "ecast" else FAULT_KINDS
    faults = kinds if args.faults is None else tuple(args.faults)
    unknown = set(faults) - set(kinds)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)}; choose from {','.join(kinds)}")
    mutations = frozenset(args.mutations)
    layers = {"ecast": ("router", "endpoint"), "ufabcast": ("ufabcast",)}[args.layer]
    mine = {n for layer in layers for n in planted_bugs.known(layer)}
    if mutations - mine:
        ap.error(f"unknown mutations {sorted(mutations - mine)}; known: {', '.join(sorted(mine))}")
    if mutations:
        import os

        os.environ.setdefault(planted_bugs.ENV, "1")  # this command exists to plant bugs
    if args.layer == "ecast":
        cfg: Any = ecast_config(
            seed=args.seed,
            routers=args.routers,
            submitters=args.submitters,
            receivers=args.receivers,
            replication=args.replication,
            messages=args.messages,
            faults=faults,
            clumping=args.clumping,
            delayed_acks=args.delayed_acks,
            all_leaders=args.all_leaders,
            fault_time=args.fault_time,
            mutations=mutations,
            codec=args.codec,
            durable_confirms=args.durable_confirms,
            origin=args.origin,
        )
        runner: Any = run_ecast
    else:
        cfg = ufab_config(
            seed=args.seed,
            routers=args.routers,
            commands=args.commands,
            faults=faults,
            max_active=args.max_active,
            clumping=args.clumping,
            fault_time=args.fault_time,
            mutations=mutations,
        )
        cfg.net.codec = args.codec
        runner = run_ufabcast
    if args.progress:
        cfg.progress = lambda line: print(line, flush=True)
    result = runner(cfg)
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True))
    else:
        for key, value in result.to_json().items():
            if key not in ("faults", "stats", "violations", "situations"):
                print(f"{key}: {value}")
        reached = [k for k, v in result.situations.items() if v]
        print(f"situations reached: {', '.join(reached) or 'none'}")
        if result.violations:
            print("VIOLATIONS:")
            for v in result.violations:
                print(f"  {v}")
        else:
            print("every checker passed")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
