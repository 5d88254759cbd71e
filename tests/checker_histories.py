"""Histories for the checker tests: a builder for hand-made ones, a serial executor for many.

``HistoryBuilder`` writes ops the way a recorder would, so a test reads as the story it
tells.  ``list_append_history`` runs random transactions against an in-memory store that
applies each one atomically somewhere between its invocation and its completion, so
whatever it records is strictly serializable and must pass every model the checker
offers.  The mutations then plant one specific bug in such a history.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from rubberband.checkers.history import Op


def invoke_value(mops: list[list[Any]]) -> list[list[Any]]:
    """What a client asks for: the micro-ops with read results not yet known."""
    return [[f, k, None] if f == "r" else [f, k, v] for f, k, v in mops]


class HistoryBuilder:
    """Appends ops with consecutive indices and a clock that ticks a millisecond per op."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def op(
        self, process: str, op_type: str, f: str, value: Any, level: str | None = None
    ) -> HistoryBuilder:
        index = len(self.ops)
        self.ops.append(Op(process, op_type, f, value, index, index / 1000, level))  # type: ignore[arg-type]
        return self

    def invoke(self, process: str, f: str, value: Any, level: str | None = None) -> HistoryBuilder:
        return self.op(process, "invoke", f, value, level)

    def txn(
        self,
        process: str,
        mops: list[list[Any]],
        outcome: str = "ok",
        f: str = "txn",
        level: str | None = None,
    ) -> HistoryBuilder:
        """A whole transaction, invoked and completed at once; ``mops`` holds its results."""
        self.invoke(process, f, invoke_value(mops), level)
        if outcome == "ok":
            return self.op(process, "ok", f, mops, level)
        return self.op(process, outcome, f, invoke_value(mops), level)

    def complete(
        self, process: str, f: str, outcome: str, value: Any, level: str | None = None
    ) -> HistoryBuilder:
        return self.op(process, outcome, f, value, level)


# ---------------------------------------------------------------------- serial executor
def list_append_history(
    seed: int,
    transactions: int,
    processes: int = 4,
    active_keys: int = 4,
    appends_per_key: int = 16,
    crash_rate: float = 0.05,
    levels: bool = True,
) -> list[Op]:
    """A strictly serializable list-append history from ``transactions`` random calls.

    Processes take turns at random: each invokes, is applied atomically by the store at a
    later turn, then completes.  A call may fail (never applied) or end ``info`` (applied
    now, later, or never: the store keeps it as a zombie).  Keys retire after
    ``appends_per_key`` appends, as in Elle's workload, so reads stay short.  Two
    processes then read every key used (``final-read``).
    """
    rng = random.Random(seed)
    store: dict[int, list[int]] = {}
    next_key = active_keys
    active = list(range(active_keys))
    appended = dict.fromkeys(active, 0)
    ops: list[Op] = []

    def emit(process: str, op_type: str, f: str, value: Any, level: str | None) -> None:
        ops.append(Op(process, op_type, f, value, len(ops), len(ops) / 1000, level))  # type: ignore[arg-type]

    def apply(mops: list[list[Any]]) -> list[list[Any]]:
        done = []
        for f, k, v in mops:
            if f == "append":
                store.setdefault(k, []).append(v)
                done.append([f, k, v])
            else:
                done.append([f, k, list(store.get(k, []))])
        return done

    def new_txn() -> tuple[list[list[Any]], str | None]:
        nonlocal next_key
        mops: list[list[Any]] = []
        reading = rng.random() < 0.4
        for _ in range(rng.randint(1, 3)):
            k = rng.choice(active)
            if reading or rng.random() < 0.2:
                mops.append(["r", k, None])
                continue
            appended[k] += 1
            mops.append(["append", k, appended[k]])
            if appended[k] >= appends_per_key:
                active.remove(k)
                active.append(next_key)
                appended[next_key] = 0
                next_key += 1
        level = None
        if levels and all(f == "r" for f, _, _ in mops):
            level = rng.choice(["sequential", "sequential", "snapshot", "basic"])
        return mops, level

    # process -> (mops, level, fate, applied result or None)
    running: dict[str, tuple[list[list[Any]], str | None, str, list[list[Any]] | None]] = {}
    zombies: list[list[list[Any]]] = []
    names = [f"p{i}" for i in range(processes)]
    started = 0
    while started < transactions or running:
        if zombies and rng.random() < 0.05:
            apply(zombies.pop(rng.randrange(len(zombies))))
        process = rng.choice(names)
        state = running.get(process)
        if state is None:
            if started >= transactions:
                continue
            started += 1
            mops, level = new_txn()
            fate = rng.choices(["ok", "fail", "info"], [1 - 2 * crash_rate, crash_rate, crash_rate])
            running[process] = (mops, level, fate[0], None)
            emit(process, "invoke", "txn", mops, level)
            continue
        mops, level, fate, result = state
        if fate == "ok" and result is None:
            running[process] = (mops, level, fate, apply(mops))
            continue
        del running[process]
        if fate == "ok":
            emit(process, "ok", "txn", result, level)
        elif fate == "fail":
            emit(process, "fail", "txn", mops, level)
        else:
            when = rng.random()
            if when < 0.4:
                apply(mops)
            elif when < 0.7:
                zombies.append(mops)
            emit(process, "info", "txn", mops, level)
    every_key = sorted(appended)
    for final in range(2):
        process = names[final % len(names)]
        mops = [["r", k, None] for k in every_key]
        emit(process, "invoke", "final-read", mops, None)
        emit(process, "ok", "final-read", apply(mops), None)
    return ops


# ---------------------------------------------------------------------- mutations
def _reads(ops: list[Op]) -> list[tuple[int, int, list[Any]]]:
    """(position in ops, micro-op number, values) of every known non-empty read."""
    found = []
    for at, op in enumerate(ops):
        if op.type != "ok":
            continue
        for number, (f, _, v) in enumerate(op.value):
            if f == "r" and v:
                found.append((at, number, v))
    return found


def _with_read(ops: list[Op], at: int, number: int, values: list[Any]) -> list[Op]:
    mops = [list(m) for m in ops[at].value]
    mops[number][2] = values
    mutated = list(ops)
    mutated[at] = replace(ops[at], value=mops)
    return mutated


def drop_acked_element(ops: list[Op], rng: random.Random) -> tuple[list[Op], str] | None:
    """Remove an acknowledged append's element from a read that must have shown it.

    Must: the read is a final read, or the element is not the read's last one (the read
    is then no prefix of the key's order), or the reader is the appending process reading
    sequentially after the append completed (read-your-writes).
    """
    appender: dict[tuple[Any, Any], tuple[str, int]] = {}  # (key, value) -> (process, done)
    for op in ops:
        if op.type == "ok" and op.f == "txn":
            for f, k, v in op.value:
                if f == "append":
                    appender[(k, v)] = (op.process, op.index)
    start_of: dict[int, Op] = {}
    pending: dict[str, Op] = {}
    for at, op in enumerate(ops):
        if op.type == "invoke":
            pending[op.process] = op
        elif op.process in pending:
            start_of[at] = pending.pop(op.process)
    candidates = []
    for at, number, values in _reads(ops):
        op = ops[at]
        key = op.value[number][1]
        for i, value in enumerate(values):
            writer = appender.get((key, value))
            if writer is None:
                continue
            process, done = writer
            own_later = (
                process == op.process
                and (op.level or "sequential") == "sequential"
                and start_of[at].index > done
            )
            if op.f == "final-read" or i < len(values) - 1 or own_later:
                candidates.append((at, number, i))
    if not candidates:
        return None
    at, number, i = rng.choice(candidates)
    values = list(ops[at].value[number][2])
    dropped = values.pop(i)
    return _with_read(ops, at, number, values), f"dropped {dropped} from the read at op {at}"


def swap_elements(ops: list[Op], rng: random.Random) -> tuple[list[Op], str] | None:
    """Swap two elements of one read; every key is read again in full at the end."""
    candidates = [(at, number, v) for at, number, v in _reads(ops) if len(v) >= 2]
    if not candidates:
        return None
    at, number, values = rng.choice(candidates)
    i, j = sorted(rng.sample(range(len(values)), 2))
    swapped = list(values)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    return _with_read(ops, at, number, swapped), f"swapped positions {i} and {j} at op {at}"


def bank_history(
    seed: int,
    operations: int,
    accounts: int = 5,
    balance: int = 10,
    processes: int = 4,
    crash_rate: float = 0.05,
) -> list[Op]:
    """A strictly serializable bank history: each call applies atomically while it runs.

    A transfer that would overdraw fails.  Reads are of all accounts or of a random few,
    at a random level, and return JSON-style string keys as a real client would.
    """
    rng = random.Random(seed)
    store = dict.fromkeys(range(accounts), balance)
    ops: list[Op] = []

    def emit(process: str, op_type: str, f: str, value: Any, level: str | None) -> None:
        ops.append(Op(process, op_type, f, value, len(ops), len(ops) / 1000, level))  # type: ignore[arg-type]

    def transfer(value: dict[str, int]) -> bool:
        if store[value["from"]] < value["amount"]:
            return False
        store[value["from"]] -= value["amount"]
        store[value["to"]] += value["amount"]
        return True

    names = [f"p{i}" for i in range(processes)]
    running: dict[str, tuple[str, Any, str | None, str, Any]] = {}
    zombies: list[dict[str, int]] = []
    started = 0
    while started < operations or running:
        if zombies and rng.random() < 0.05:
            transfer(zombies.pop())
        process = rng.choice(names)
        state = running.get(process)
        if state is None:
            if started >= operations:
                continue
            started += 1
            if rng.random() < 0.5:
                source, target = rng.sample(range(accounts), 2)
                value: Any = {"from": source, "to": target, "amount": rng.randint(1, 5)}
                fate = rng.choices(["ok", "info"], [1 - crash_rate, crash_rate])[0]
                running[process] = ("transfer", value, None, fate, None)
                emit(process, "invoke", "transfer", value, None)
            else:
                level = rng.choice(["sequential", "snapshot", "basic"])
                chosen = sorted(rng.sample(range(accounts), rng.randint(1, accounts)))
                running[process] = ("read", chosen, level, "ok", None)
                emit(process, "invoke", "read", None, level)
            continue
        f, value, level, fate, result = state
        if fate == "ok" and result is None:
            if f == "transfer":
                result = "ok" if transfer(value) else "fail"
            else:
                result = {str(a): store[a] for a in value}
            running[process] = (f, value, level, fate, result)
            continue
        del running[process]
        if f == "read":
            emit(process, "ok", "read", result, level)
        elif fate == "ok":
            emit(process, result, "transfer", value, None)
        else:
            when = rng.random()
            if when < 0.4:
                transfer(value)
            elif when < 0.7:
                zombies.append(value)
            emit(process, "info", "transfer", value, None)
    return ops
