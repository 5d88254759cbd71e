"""The multicast workload: E-Cast's guarantees checked on a recorded history.

A thin adapter: the history format (JSON lines of ``submit``, ``ack``, ``deliver``,
``deliver_unsafe``, ``crash``, ``terminate``, ``resubmit``, ``learned``) and the checks
are :mod:`ecast.history`'s, shared with the simulator, ``ecast bench --check`` and the
demo; this module turns its verdict into a :class:`CheckResult` so the checkers' command
line and reports treat every workload alike.  A workload description::

    {"name": "multicast"}
    {"name": "multicast", "config": "ecast:KeyRingConfig", "config_args": {"replication": 3}}
    {"name": "multicast", "config": "ecast:BroadcastConfig", "liveness": true,
     "time_tolerance": 0.0, "only": ["total-order", "ack-safety"]}

``config`` names the routers' initial config (``package.module:Class``, built with
``initial(**config_args)``); without it the checks that need destination sets skip or
narrow (the report says which).  By default, as suits a real run stopped at its end,
only the safety checks run and no times are compared across processes
(``"liveness": true`` adds uniform agreement and termination, owed once a run quiesced;
``"time_tolerance": s`` compares acknowledgement and delivery times within ``s``).
Each violated check is an anomaly kind; what a check could not see, or why it did not
run, is an observation.  A history with no events is ``unknown``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rubberband.checkers.history import HistoryError
from rubberband.checkers.result import DEFAULT_MAX_EXAMPLES, CheckResult


@dataclass(frozen=True, slots=True)
class MulticastOptions:
    config: str | None = None
    """The routers' initial config, ``package.module:Class`` (None: not known)."""
    config_args: Mapping[str, Any] = field(default_factory=dict)
    liveness: bool = False
    time_tolerance: float | None = None
    only: tuple[str, ...] | None = None
    max_examples: int = DEFAULT_MAX_EXAMPLES

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> MulticastOptions:
        """From a workload description without its ``name``; unknown fields are errors."""
        spec = dict(spec)
        options: dict[str, Any] = {}
        for key in ("config", "config_args", "liveness", "time_tolerance", "max_examples"):
            if key in spec:
                options[key] = spec.pop(key)
        if "only" in spec:
            options["only"] = tuple(spec.pop("only"))
        if spec:
            raise ValueError(f"the multicast workload has no setting {sorted(spec)}")
        if options.get("config_args") and not options.get("config"):
            raise ValueError("config_args without a config")
        return cls(**options)


def check(history: Any, options: MulticastOptions | None = None) -> CheckResult:
    """Check a history: an :class:`ecast.history.History`, or the path of its file."""
    from ecast import history as hist

    options = options or MulticastOptions()
    started = time.perf_counter()
    if isinstance(history, str | os.PathLike):
        try:
            history = hist.read_history(history)
        except hist.HistoryError as err:
            raise HistoryError(str(err)) from None
    config = None
    if options.config is not None:
        try:
            config = hist.load_config(options.config, **dict(options.config_args))
        except (ImportError, TypeError) as err:
            raise ValueError(f"config {options.config}: {err}") from None
    verdict = hist.check_history(
        history,
        config,
        liveness=options.liveness,
        time_tolerance=options.time_tolerance,
        only=options.only,
    )
    cap = options.max_examples
    anomalies = {name: texts[:cap] for name, texts in verdict.violations.items()}
    observations: dict[str, list[str]] = {}
    for name, why in verdict.skipped.items():
        observations.setdefault("not-checked", []).append(f"{name}: {why}")
    for name, what in verdict.limits.items():
        observations.setdefault("partly-checked", []).append(f"{name}: {what}")
    stats = dict(verdict.stats)
    stats["checks_ran"] = len(verdict.ran)
    stats["elapsed_s"] = round(time.perf_counter() - started, 3)
    stats["anomaly_counts"] = {name: len(texts) for name, texts in verdict.violations.items()}
    stats["observation_counts"] = {k: len(v) for k, v in observations.items()}
    if anomalies:
        valid: Any = False
    elif stats["events"] and verdict.ran:
        valid = True
    else:
        valid = "unknown"
    return CheckResult("multicast", valid, anomalies, observations, stats)
