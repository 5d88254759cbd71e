"""The append-order checker: each client's appends stand in every list in the order the
client issued them, with no gap.

E-Cast delivers each sender's messages gap-free and in the order it submitted them
(3.3.1), and Rubberband applies every write in that order on every replica (4.5.1), so a
list built by appends is a record of that order.  For each key this checker takes the
longest read of the list (a final read, when the run made one) and, per process, checks
that

* the process's appends found in it appear in the order the process invoked them
  (``reordered``), and
* no acknowledged append of the process invoked before one that is present is missing
  (``gap``: a later message of a sender was applied and an earlier one, acknowledged,
  was not).

The list-append checker proves the same things through cycles of its dependency graph;
this one names them directly, per client and per list, for people reading a demo's
verdict.  A process runs one call at a time, so invocation order is its issue order;
an append that was not acknowledged may be present or absent, but wherever it stands it
must stand in order.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from rubberband.checkers.history import Call, Op, gc_paused, pair_calls
from rubberband.checkers.result import CheckResult, Findings


def _mops(call: Call) -> list[tuple[str, Hashable, Any]]:
    value = call.value
    if not isinstance(value, list | tuple):
        return []
    return [tuple(m) for m in value if isinstance(m, list | tuple) and len(m) == 3]  # type: ignore[misc]


def check_calls(calls: Iterable[Call], txn_fs: frozenset[str] = frozenset({"txn"})) -> CheckResult:
    """Check paired calls; unknown if no list was read."""
    findings = Findings()
    longest: dict[Hashable, list[Any]] = {}
    # Per process and key: (invocation index, value, acknowledged) of its appends.
    appends: dict[tuple[str, Hashable], list[tuple[int, Any, bool]]] = {}
    for call in calls:
        if call.f not in txn_fs and call.f != "final-read":
            continue
        if call.outcome == "fail":
            continue
        for f, key, arg in _mops(call):
            if f == "append" and call.f in txn_fs:
                appends.setdefault((call.process, key), []).append(
                    (call.invoke_index, arg, call.outcome == "ok")
                )
            elif (
                f == "r"
                and call.outcome == "ok"
                and isinstance(arg, list | tuple)
                and len(arg) > len(longest.get(key, ()))
            ):
                longest[key] = list(arg)
    sequences = 0
    for (process, key), mine in sorted(appends.items(), key=lambda kv: repr(kv[0])):
        final = longest.get(key)
        if final is None:
            continue
        sequences += 1
        position = {v: i for i, v in enumerate(final)}
        mine.sort()
        present = [(idx, v) for idx, v, _ in mine if v in position]
        order = [position[v] for _, v in present]
        for (ia, va), (ib, vb), pa, pb in zip(present, present[1:], order, order[1:], strict=False):
            if pb < pa:
                findings.anomaly(
                    "reordered",
                    f"process {process} appended {va!r} (index {ia}) before {vb!r} (index {ib}) "
                    f"to {key!r}, but the list holds {vb!r} at {pb} before {va!r} at {pa}.",
                )
        if present:
            last_present = present[-1][0]
            for idx, v, ok in mine:
                if ok and idx < last_present and v not in position:
                    findings.anomaly(
                        "gap",
                        f"process {process} appended {v!r} to {key!r} (index {idx}, "
                        f"acknowledged) and later appends of it are in the list, but {v!r} "
                        "is not.",
                    )
    stats = {"lists": len(longest), "client_sequences": sequences}
    return findings.result("append-order", stats, checked_anything=sequences > 0)


def check(history: Iterable[Op]) -> CheckResult:
    """Check a list-append history (the list-append checker's format)."""
    with gc_paused():
        return check_calls(pair_calls(history))
