"""Elle's list-append checker: anomalies of transactions over append-only lists.

Each key holds a list; a transaction is a list of micro-operations, ``["append", k, v]``
or ``["r", k, [v1, v2, ...]]``, executed atomically.  Values appended to one key are
unique, so every element of a read names the transaction that appended it, and because
lists only grow, every state of a key is a prefix of its final state.  That makes the
order of each key's versions observable: it is the longest read of that key, and every
other read must be a prefix of it (``incompatible-order`` otherwise).

From the version orders the checker builds a dependency graph between the transactions
that happened or may have happened (``ok`` and ``info``; a ``fail`` must be invisible):

* ``ww``: T1 appended an element and T2 appended the next one to the same key;
* ``wr``: T2 read a state whose last element T1 appended;
* ``rw``: T1 read a state, and T2 appended the element that follows it (T1 did not see
  T2's append, so T1 comes first: an anti-dependency);
* ``process``: one process ran T1 and then T2 (sequential consistency, 3.3.1 and 4.5.1);
* ``realtime`` (off by default): T1 completed before T2 was invoked.

A cycle in this graph means no single order of the transactions explains what was
observed.  Cycles are found per strongly connected component and named as Elle names
them: G0 (``ww`` only), G1c (``ww`` and ``wr``), G-single (exactly one ``rw``), G2-item (more
``rw``), with ``-process`` or ``-realtime`` appended when a session edge is needed to close
the cycle.  Other anomalies need no graph: G1a (a read saw an element of a failed
append), G1b (a read's last element was not the final append of its transaction to that
key), duplicate elements, garbage (an element nobody appended), ``internal`` (a
transaction's read disagrees with its own earlier appends and reads), and
``lost-append``: the runner's final reads (``f`` ``final-read``, after faults are healed)
must contain every acknowledged append that completed before they were invoked.

An ``info`` transaction may or may not have happened: its appends can explain a read
(which adds edges from it) but its reads are unknown and it is never counted as
acknowledged.  Reads carry Rubberband's isolation level (4.5.2) in the op's ``level``:
``sequential`` reads are held to everything above; ``snapshot`` reads see a consistent
cut but get no ``process`` edges (no per-client order is promised); ``basic`` reads give no
edges at all, since a multi-key basic read may mix states, and each of their keys is
only checked on its own; a basic read that saw part of a multi-key append is reported
as the observation ``torn-basic-read``, never as a failure.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rubberband.checkers.graph import (
    KIND_NAMES,
    PROCESS,
    REALTIME,
    RW,
    WR,
    WW,
    DependencyGraph,
    Step,
    cycle_kinds,
    find_cycle,
    find_cycle_with_one,
    kinds_from_names,
    strongly_connected,
)
from rubberband.checkers.history import Call, HistoryError, Op, gc_paused, pair_calls
from rubberband.checkers.result import DEFAULT_MAX_EXAMPLES, CheckResult, Findings

MODELS: dict[str, frozenset[str]] = {
    "sequential": frozenset(("ww", "wr", "rw", "process")),
    "serializable": frozenset(("ww", "wr", "rw")),
    "strict-serializable": frozenset(("ww", "wr", "rw", "process", "realtime")),
}
"""Edge sets for the consistency models one may ask for; Rubberband promises the first."""

CYCLE_MEANINGS = {
    "G0": "a write cycle: appends ordered both ways",
    "G1c": "circular information flow: each transaction saw or overwrote the next",
    "G-single": "one anti-dependency: a transaction missed a write that came before it",
    "G2-item": "an anti-dependency cycle: several transactions each missed the next one's write",
}

Mop = tuple[str, Hashable, Any]
"""A micro-operation: ``("append", key, value)`` or ``("r", key, list | None)``."""


@dataclass(frozen=True, slots=True)
class ListAppendOptions:
    """What to check, and which history records are transactions."""

    edges: frozenset[str] = MODELS["sequential"]
    """Edge kinds of the model: any of ww, wr, rw, process, realtime (see ``MODELS``)."""
    txn_fs: frozenset[str] = frozenset(("txn",))
    final_read_fs: frozenset[str] = frozenset(("final-read",))
    max_examples: int = DEFAULT_MAX_EXAMPLES
    max_cycle_searches: int = 100
    """Per component, how many anti-dependency edges may cost a search for a G-single."""

    @classmethod
    def for_model(cls, model: str, **kwargs: Any) -> ListAppendOptions:
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known: {sorted(MODELS)}")
        return cls(edges=MODELS[model], **kwargs)


class Txn:
    """A transaction that happened (ok) or may have (info); a node of the graph."""

    __slots__ = ("appends", "call", "final", "level", "mops", "node", "ok", "reads")

    def __init__(self, node: int, call: Call, final: bool) -> None:
        self.node = node
        self.call = call
        self.final = final
        self.ok = call.outcome == "ok"
        self.level = call.level
        self.mops: list[Mop] = []
        self.appends: list[tuple[Hashable, Hashable]] = []
        self.reads: list[tuple[Hashable, list[Any]]] = []
        """Reads whose result is known: ok transactions only."""
        self._parse()

    def _parse(self) -> None:
        """Validate the micro-ops; the reads of a call that is not ok have unknown results."""
        call = self.call
        completion = call.completion
        if self.ok and completion is not None and completion.value is not None:
            value, reads_known = completion.value, True
        else:
            value, reads_known = call.invoke.value, False
        if not isinstance(value, list | tuple):
            raise HistoryError(f"{call.describe()}: a transaction must be a list, not {value!r}")
        mops, appends, reads = self.mops, self.appends, self.reads
        for mop in value:
            if not isinstance(mop, list | tuple) or len(mop) != 3:
                raise HistoryError(f"{call.describe()}: micro-op {mop!r} is not [f, key, value]")
            f, key, arg = mop
            try:
                hash(key)
            except TypeError:
                raise HistoryError(f"{call.describe()}: key {key!r} is not a scalar") from None
            if f == "append":
                try:
                    hash(arg)
                except TypeError:
                    raise HistoryError(
                        f"{call.describe()}: appended {arg!r} is not a scalar"
                    ) from None
                mops.append(("append", key, arg))
                appends.append((key, arg))
            elif f == "r":
                if not reads_known or arg is None:
                    mops.append(("r", key, None))
                elif isinstance(arg, list | tuple):
                    values = list(arg)
                    mops.append(("r", key, values))
                    reads.append((key, values))
                else:
                    raise HistoryError(f"{call.describe()}: read of {key!r} returned {arg!r}")
            else:
                raise HistoryError(f"{call.describe()}: micro-op {f!r} is neither append nor r")


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if len(value) > 10:
            head = " ".join(_fmt(v) for v in value[:2])
            tail = " ".join(_fmt(v) for v in value[-5:])
            return f"[{head} ...{len(value) - 7} more... {tail}]"
        return "[" + " ".join(_fmt(v) for v in value) + "]"
    return repr(value)


def _window(order: list[Any], first: int, last: int) -> str:
    """Positions ``first..last`` of a long list, with a neighbour each side for context."""
    start, end = max(0, first - 1), min(len(order), last + 2)
    head = "... " if start > 0 else ""
    tail = " ..." if end < len(order) else ""
    return "[" + head + " ".join(_fmt(v) for v in order[start:end]) + tail + "]"


def _fmt_mops(txn: Txn) -> str:
    parts = []
    for f, key, arg in txn.mops:
        if f == "append":
            parts.append(f"[append {_fmt(key)} {_fmt(arg)}]")
        else:
            parts.append(f"[r {_fmt(key)} {'?' if arg is None else _fmt(arg)}]")
    return " ".join(parts)


class _KeyOrder:
    """The version order of one key: its longest read, with who appended each element."""

    __slots__ = ("last_position", "last_writer", "next_writer", "order", "position", "writers")

    def __init__(self, order: list[Any], writers_of_key: dict[Any, int]) -> None:
        self.order = order
        self.position = {value: i for i, value in enumerate(order)}
        self.writers: list[int | None] = [writers_of_key.get(value) for value in order]
        """Node of each element's appender; None for elements of failed or no appends."""
        nxt: list[int | None] = [None] * (len(order) + 1)
        following: int | None = None
        for i in range(len(order) - 1, -1, -1):
            if self.writers[i] is not None:
                following = self.writers[i]
            nxt[i] = following
        self.next_writer = nxt
        """``next_writer[i]``: appender of the first graph element at position >= i."""
        self.last_position = next(
            (i for i in range(len(order) - 1, -1, -1) if self.writers[i] is not None), -1
        )
        """Position of the last graph element: every unobserved append follows it."""
        self.last_writer = None if self.last_position < 0 else self.writers[self.last_position]


class _Checker:
    """One run of the checker over one history; holds the indexes explanations need."""

    def __init__(self, calls: Sequence[Call], options: ListAppendOptions) -> None:
        self.options = options
        self.allowed = kinds_from_names(options.edges)
        self.findings = Findings(options.max_examples)
        self.txns: list[Txn] = []
        self.failed: list[Txn] = []
        """Failed transactions: not graph nodes, only kept to recognise aborted reads."""
        self.ignored_calls = 0
        txn_fs, final_read_fs = options.txn_fs, options.final_read_fs
        for call in calls:
            f = call.invoke.f
            if f not in txn_fs and f not in final_read_fs:
                self.ignored_calls += 1
                continue
            if call.outcome == "fail":
                self.failed.append(Txn(-1, call, False))
            else:
                self.txns.append(Txn(len(self.txns), call, f in final_read_fs))
        self.writers: dict[Hashable, dict[Any, int]] = {}
        """key -> appended value -> node of the ok or info transaction that appended it."""
        self.failed_writers: dict[Hashable, dict[Any, Call]] = {}
        self.intermediate: dict[Hashable, dict[Any, int]] = {}
        """key -> value that was not its transaction's last append to key -> node."""
        self.orders: dict[Hashable, _KeyOrder] = {}
        self.incompatible: set[Hashable] = set()
        self.graph = DependencyGraph(len(self.txns))

    # ------------------------------------------------------------------ indexes
    def index_appends(self) -> None:
        """Who appended what; an element appended twice makes the history unusable."""
        writers = self.writers
        for txn in self.txns:
            seen_keys: dict[Hashable, Any] = {}
            for key, value in txn.appends:
                by_value = writers.setdefault(key, {})
                if value in by_value:
                    raise HistoryError(f"{_fmt(value)} was appended to {_fmt(key)} twice")
                by_value[value] = txn.node
                if key in seen_keys:
                    self.intermediate.setdefault(key, {})[seen_keys[key]] = txn.node
                seen_keys[key] = value
        for failed in self.failed:
            call = failed.call
            for key, value in failed.appends:
                if value in writers.get(key, ()) or value in self.failed_writers.get(key, ()):
                    raise HistoryError(f"{_fmt(value)} was appended to {_fmt(key)} twice")
                self.failed_writers.setdefault(key, {})[value] = call

    # ------------------------------------------------------------------ single reads
    def check_reads(self) -> dict[Hashable, list[tuple[Txn, list[Any]]]]:
        """Anomalies visible in one read; returns every known read per key."""
        reads_by_key: dict[Hashable, list[tuple[Txn, list[Any]]]] = {}
        writers, failed, intermediate = self.writers, self.failed_writers, self.intermediate
        empty: dict[Any, int] = {}
        for txn in self.txns:
            for key, values in txn.reads:
                reads_by_key.setdefault(key, []).append((txn, values))
                if not values:
                    continue
                distinct = set(values)
                if len(distinct) != len(values):
                    self._duplicates(txn, key, values)
                unknown = distinct.difference(writers.get(key, empty))
                for value in [v for v in dict.fromkeys(values) if v in unknown] if unknown else ():
                    writer = failed.get(key, {}).get(value)
                    if writer is not None:
                        self.findings.anomaly(
                            "G1a",
                            f"{txn.call.describe()} read {_fmt(key)} = {_fmt(values)}, which "
                            f"holds {_fmt(value)}, appended only by the call that failed "
                            f"({writer.describe()}).",
                        )
                    else:
                        self.findings.anomaly(
                            "garbage-read",
                            f"{txn.call.describe()} read {_fmt(key)} = {_fmt(values)}, but "
                            f"no transaction appended {_fmt(value)} to {_fmt(key)}.",
                        )
                last = values[-1]
                writer_node = intermediate.get(key, empty).get(last)
                if writer_node is not None and writer_node != txn.node:
                    writer_txn = self.txns[writer_node]
                    later = [v for k, v in writer_txn.appends if k == key]
                    self.findings.anomaly(
                        "G1b",
                        f"{txn.call.describe()} read {_fmt(key)} = {_fmt(values)}, ending with "
                        f"{_fmt(last)}, an intermediate state of {writer_txn.call.describe()}, "
                        f"which appended {_fmt(later)} to {_fmt(key)} in that order.",
                    )
            if len(txn.mops) > 1 and txn.ok:
                self._check_internal(txn)
        return reads_by_key

    def _duplicates(self, txn: Txn, key: Hashable, values: list[Any]) -> None:
        seen: set[Any] = set()
        twice = []
        for value in values:
            if value in seen and value not in twice:
                twice.append(value)
            seen.add(value)
        self.findings.anomaly(
            "duplicate-elements",
            f"{txn.call.describe()} read {_fmt(key)} = {_fmt(values)}, which holds "
            f"{_fmt(twice)} more than once; each value was appended once.",
        )

    def _check_internal(self, txn: Txn) -> None:
        """A transaction must see its own appends, on top of what it read before.

        One report per transaction: after the first disagreement, later reads of the
        transaction are compared with a state already known to be wrong.
        """
        known: dict[Hashable, tuple[bool, list[Any]]] = {}  # key -> (whole list?, values)
        read_so_far: dict[Hashable, set[Any]] = {}
        for f, key, arg in txn.mops:
            if f == "append":
                whole, values = known.get(key, (False, []))
                known[key] = (whole, [*values, arg])
                if arg in read_so_far.get(key, ()):
                    self.findings.anomaly(
                        "internal",
                        f"{txn.call.describe()} read {_fmt(arg)} in {_fmt(key)} before it "
                        f"appended {_fmt(arg)} itself: {_fmt_mops(txn)}.",
                    )
                    return
                continue
            if arg is None:
                continue
            expected = known.get(key)
            if expected is not None:
                whole, values = expected
                fits = arg == values if whole else arg[len(arg) - len(values) :] == values
                if not fits or len(arg) < len(values):
                    shape = _fmt(values) if whole else f"[... {_fmt(values)[1:]}"
                    self.findings.anomaly(
                        "internal",
                        f"{txn.call.describe()} read {_fmt(key)} = {_fmt(arg)}, but its own "
                        f"earlier micro-ops imply {shape}: {_fmt_mops(txn)}.",
                    )
                    return
            known[key] = (True, arg)
            read_so_far.setdefault(key, set()).update(arg)

    # ------------------------------------------------------------------ version orders
    def infer_orders(self, reads_by_key: dict[Hashable, list[tuple[Txn, list[Any]]]]) -> None:
        """Each key's order is its longest read; every other read must be a prefix."""
        for key, reads in reads_by_key.items():
            longest_txn, order = max(reads, key=lambda read: len(read[1]))
            for txn, values in reads:
                if order[: len(values)] != values:
                    self.incompatible.add(key)
                    at = next(i for i, value in enumerate(values) if value != order[i])
                    self.findings.anomaly(
                        "incompatible-order",
                        f"reads of {_fmt(key)} disagree on its order: {txn.call.describe()} "
                        f"read {_fmt(values)}, but {longest_txn.call.describe()} read "
                        f"{_fmt(order)}; at position {at} one has {_fmt(values[at])} and the "
                        f"other {_fmt(order[at])}, and lists only grow at the end.",
                    )
                    break
            if key not in self.incompatible:
                self.orders[key] = _KeyOrder(order, self.writers.get(key, {}))

    # ------------------------------------------------------------------ edges
    def build_edges(self, reads_by_key: dict[Hashable, list[tuple[Txn, list[Any]]]]) -> None:
        graph = self.graph
        for key, by_value in self.writers.items():
            order = self.orders.get(key)
            if order is None:
                continue
            previous: int | None = None
            for writer in order.writers:
                if writer is None:
                    continue
                if previous is not None and previous != writer:
                    graph.add(previous, writer, WW)
                previous = writer
            if order.last_writer is not None and len(by_value) > len(order.position):
                for value, writer in by_value.items():
                    if value not in order.position:
                        graph.add(order.last_writer, writer, WW)
        unobserved_cache: dict[Hashable, list[int]] = {}
        for key, reads in reads_by_key.items():
            writers = self.writers.get(key, {})
            order = self.orders.get(key)
            for txn, values in reads:
                if txn.level == "basic":
                    continue
                writer = writers.get(values[-1]) if values else None
                if writer is not None:
                    graph.add(writer, txn.node, WR)
                if order is None:
                    continue
                following = order.next_writer[len(values)]
                if following is not None:
                    # An intermediate read (G1b, reported on its own) would also give
                    # the 2-cycle writer -> reader -> writer; leave that edge out.
                    if following != writer:
                        graph.add(txn.node, following, RW)
                    continue
                unobserved = unobserved_cache.get(key)
                if unobserved is None:
                    unobserved = [w for v, w in writers.items() if v not in order.position]
                    unobserved_cache[key] = unobserved
                for writer in unobserved:
                    graph.add(txn.node, writer, RW)
        if self.allowed & PROCESS:
            self._process_edges()
        if self.allowed & REALTIME:
            self._realtime_edges()

    def _process_edges(self) -> None:
        """A process's sequential transactions in order; an info one only has a past."""
        last: dict[str, int] = {}
        for txn in self.txns:
            if txn.level != "sequential":
                continue
            process = txn.call.process
            before = last.get(process)
            if before is not None:
                self.graph.add(before, txn.node, PROCESS)
            if txn.ok:
                last[process] = txn.node

    def _realtime_edges(self) -> None:
        """T1 -> T2 when T1 completed before T2 was invoked, transitively reduced.

        The frontier holds completed transactions that no later completed one follows
        yet.  A new invocation gets an edge from each; once it completes it replaces
        every transaction it was linked from, so edges stay proportional to concurrency.
        """
        events: list[tuple[int, int]] = []  # (history index, node); completions after invokes
        for txn in self.txns:
            events.append((txn.call.invoke_index, txn.node))
            if txn.ok and txn.call.complete_index is not None:
                events.append((txn.call.complete_index, ~txn.node))
        events.sort()
        frontier: set[int] = set()
        linked_from: dict[int, list[int]] = {}
        for _, tagged in events:
            if tagged >= 0:
                linked_from[tagged] = list(frontier)
                for before in frontier:
                    self.graph.add(before, tagged, REALTIME)
            else:
                node = ~tagged
                frontier.difference_update(linked_from.pop(node, ()))
                frontier.add(node)

    # ------------------------------------------------------------------ cycles
    def find_cycles(self) -> tuple[int, int]:
        """Report each kind of cycle found in each component; returns (components, largest)."""
        allowed = self.allowed
        components = strongly_connected(self.graph, allowed=allowed)
        data = allowed & (WW | WR | RW)
        session = allowed & (PROCESS | REALTIME)
        searches: list[tuple[int, int]] = [(WW, 0), (WW | WR, 0), (WW | WR, RW), (WW | WR | RW, 0)]
        for component in components:
            members = set(component)
            found_bases: set[str] = set()
            for extra in (0, session) if session else (0,):
                for base, special in searches:
                    mask = (base | extra) & allowed
                    if special:
                        if not special & data:
                            continue
                        cycle = find_cycle_with_one(
                            self.graph, members, mask, special, self.options.max_cycle_searches
                        )
                    else:
                        cycle = find_cycle(self.graph, members, mask)
                    if cycle is None:
                        continue
                    name, base_name = _classify(cycle)
                    if base_name in found_bases:
                        continue
                    found_bases.add(base_name)
                    self.findings.anomaly(name, self._explain_cycle(name, base_name, cycle))
        largest = max((len(c) for c in components), default=0)
        return len(components), largest

    def _explain_cycle(self, name: str, base_name: str, cycle: list[Step]) -> str:
        first_invoked = cycle.index(min(cycle))  # nodes are numbered in invocation order
        cycle = cycle[first_invoked:] + cycle[:first_invoked]
        names = {node: f"T{i + 1}" for i, (node, _) in enumerate(cycle)}
        lines = [f"{name}, {CYCLE_MEANINGS[base_name]}; a cycle of {len(cycle)} transactions."]
        lines.append("Let:")
        for node, _ in cycle:
            txn = self.txns[node]
            lines.append(f"  {names[node]} = {txn.call.describe()}: {_fmt_mops(txn)}")
        lines.append("Then:")
        for i, (node, kind) in enumerate(cycle):
            after = cycle[(i + 1) % len(cycle)][0]
            reason = self._explain_edge(node, after, kind, names)
            lines.append(f"  - {names[node]} < {names[after]} ({KIND_NAMES[kind]}): {reason}")
        first = names[cycle[0][0]]
        lines.append(f"  - so {first} < {first}: no order of these transactions explains them.")
        return "\n".join(lines)

    def _explain_edge(self, a: int, b: int, kind: int, names: dict[int, str]) -> str:
        ta, tb = self.txns[a], self.txns[b]
        na, nb = names[a], names[b]
        if kind == PROCESS:
            return f"process {ta.call.process} ran {na} and then {nb}."
        if kind == REALTIME:
            return (
                f"{na} completed at index {ta.call.complete_index} before {nb} was invoked "
                f"at index {tb.call.invoke_index}."
            )
        if kind == WW:
            for key, value in tb.appends:
                order = self.orders.get(key)
                if order is None:
                    continue
                at = order.position.get(value)
                if at is None:
                    if order.last_writer == a:
                        last = order.order[order.last_position]
                        return (
                            f"{nb} appended {_fmt(value)} to {_fmt(key)}, which no read saw, so "
                            f"it follows the last element read, {_fmt(last)}, which {na} "
                            "appended."
                        )
                    continue
                for before in range(at - 1, -1, -1):
                    writer = order.writers[before]
                    if writer is None or writer == b:
                        continue
                    if writer == a:
                        return (
                            f"{na} appended {_fmt(order.order[before])} to {_fmt(key)} and "
                            f"{nb} appended {_fmt(value)} after it (the longest read of "
                            f"{_fmt(key)} has {_window(order.order, before, at)})."
                        )
                    break
        if kind == WR:
            writers_needed = {key: values[-1] for key, values in tb.reads if values}
            for key, last in writers_needed.items():
                if self.writers.get(key, {}).get(last) == a:
                    values = next(v for k, v in tb.reads if k == key and v and v[-1] == last)
                    return (
                        f"{nb} read {_fmt(key)} = {_fmt(values)}, whose last element "
                        f"{_fmt(last)} {na} appended."
                    )
        if kind == RW:
            for key, values in ta.reads:
                order = self.orders.get(key)
                if order is None:
                    continue
                following = order.next_writer[len(values)]
                seen = f"{na} read {_fmt(key)} = {_fmt(values)}"
                if following == b:
                    missed = next(
                        order.order[i]
                        for i in range(len(values), len(order.order))
                        if order.writers[i] == b
                    )
                    where = (
                        f"right after {_fmt(values[-1])}"
                        if values
                        else f"as the first element of {_fmt(key)}"
                    )
                    return f"{seen} and missed {_fmt(missed)}, which {nb} appended {where}."
                if following is None:
                    for k, value in tb.appends:
                        if k == key and value not in order.position:
                            return (
                                f"{seen} and missed {_fmt(value)}, which {nb} appended; no read "
                                f"saw it, so it follows every element that was read."
                            )
        return f"{na} precedes {nb} ({KIND_NAMES[kind]})."

    # ------------------------------------------------------------------ lost appends
    def check_final_reads(self) -> tuple[int, int]:
        """Acknowledged appends missing from final reads; returns (final reads, unobserved)."""
        acked: dict[Hashable, list[tuple[Any, Txn]]] = {}
        for key, by_value in self.writers.items():
            for value, node in by_value.items():
                if self.txns[node].ok:
                    acked.setdefault(key, []).append((value, self.txns[node]))
        final_reads = 0
        for txn in self.txns:
            if not (txn.final and txn.ok):
                continue
            final_reads += 1
            for key, values in txn.reads:
                present = set(values)
                for value, writer in acked.get(key, ()):
                    done = writer.call.complete_index
                    if value in present or done is None or done > txn.call.invoke_index:
                        continue
                    self.findings.anomaly(
                        "lost-append",
                        f"{writer.call.describe()} appended {_fmt(value)} to {_fmt(key)} and was "
                        f"acknowledged at index {done}, but the final read, "
                        f"{txn.call.describe()}, found {_fmt(key)} = {_fmt(values)} without it.",
                    )
        unobserved = sum(
            1
            for key, pairs in acked.items()
            for value, _ in pairs
            if key in self.orders and value not in self.orders[key].position
        )
        return final_reads, unobserved

    # ------------------------------------------------------------------ basic reads
    def check_torn_basic_reads(self) -> None:
        """A basic read that saw one part of a multi-key append and missed another."""
        for txn in self.txns:
            if txn.level != "basic" or len(txn.reads) < 2:
                continue
            seen = {key: set(values) for key, values in txn.reads}
            torn = self._torn(txn, seen)
            if torn is not None:
                self.findings.observation("torn-basic-read", torn)

    def _torn(self, txn: Txn, seen: dict[Hashable, set[Any]]) -> str | None:
        for key, values in txn.reads:
            writers = self.writers.get(key, {})
            for value in values:
                writer = writers.get(value)
                if writer is None or writer == txn.node:
                    continue
                for other_key, other_value in self.txns[writer].appends:
                    if other_key == key or other_key not in seen:
                        continue
                    if other_value not in seen[other_key]:
                        return (
                            f"{txn.call.describe()} (a basic read) saw {_fmt(value)} in "
                            f"{_fmt(key)} but not {_fmt(other_value)} in {_fmt(other_key)}, both "
                            f"appended by {self.txns[writer].call.describe()}."
                        )
        return None


def _classify(cycle: list[Step]) -> tuple[str, str]:
    """Elle's name for a cycle, and the name without its session suffix."""
    counts = cycle_kinds(cycle)
    if counts[RW] == 1:
        base = "G-single"
    elif counts[RW] > 1:
        base = "G2-item"
    elif counts[WR]:
        base = "G1c"
    else:
        base = "G0"
    if counts[REALTIME]:
        return base + "-realtime", base
    if counts[PROCESS]:
        return base + "-process", base
    return base, base


def check_calls(calls: Sequence[Call], options: ListAppendOptions | None = None) -> CheckResult:
    """Check already paired calls (see ``check`` for the verdict's meaning)."""
    started = time.perf_counter()
    with gc_paused():
        checker = _Checker(calls, options or ListAppendOptions())
        checker.index_appends()
        reads_by_key = checker.check_reads()
        checker.infer_orders(reads_by_key)
        checker.build_edges(reads_by_key)
        components, largest = checker.find_cycles()
        final_reads, unobserved = checker.check_final_reads()
        checker.check_torn_basic_reads()
    outcomes = {"ok": 0, "info": 0}
    for txn in checker.txns:
        outcomes[txn.call.outcome] += 1
    read_count = sum(len(reads) for reads in reads_by_key.values())
    stats: dict[str, Any] = {
        "model": sorted(checker.options.edges),
        "transactions_ok": outcomes["ok"],
        "transactions_info": outcomes["info"],
        "transactions_fail": len(checker.failed),
        "other_calls": checker.ignored_calls,
        "reads": read_count,
        "keys": len(checker.writers.keys() | reads_by_key.keys()),
        "incompatible_keys": len(checker.incompatible),
        "edges": {KIND_NAMES[k]: n for k, n in checker.graph.edge_counts.items()},
        "cyclic_components": components,
        "largest_component": largest,
        "final_reads": final_reads,
        "acked_appends_never_read": unobserved,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return checker.findings.result("list-append", stats, checked_anything=read_count > 0)


def check(history: Iterable[Op], options: ListAppendOptions | None = None) -> CheckResult:
    """Check a list-append history; invalid if any anomaly, unknown if nothing was read."""
    with gc_paused():
        return check_calls(pair_calls(history), options)
