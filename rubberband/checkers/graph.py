"""A dependency graph between transactions, its strongly connected components, and cycles.

Nodes are integers ``0..n-1``.  Each edge carries a bit mask of the reasons it exists,
because one pair of transactions may be ordered for several reasons and a cycle is
classified by the weakest reasons that still close it.  The bits are ordered by how
much they say about the system: a write-write edge (``WW``) is the plainest evidence,
then write-read (``WR``), then the session orders (``PROCESS``, ``REALTIME``) and last
the inferred anti-dependency (``RW``).  When a cycle is reported, each step names the
lowest bit it was allowed to use, so an explanation prefers plain evidence.

The search is Elle's: Tarjan's algorithm finds the strongly connected components (every
cycle lies inside one), and a breadth-first search inside a component, restricted to
some edge kinds, extracts a short cycle to show people.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

WW = 1
"""T1 appended an element and T2 appended the next one to the same key."""
WR = 2
"""T2 read a state whose last element T1 appended."""
PROCESS = 4
"""T1 and T2 ran on the same process, T1 first."""
REALTIME = 8
"""T1 completed before T2 was invoked."""
RW = 16
"""T1 read a state that lacks the element T2 appended next (an anti-dependency)."""

ALL_KINDS = WW | WR | PROCESS | REALTIME | RW
KIND_NAMES: dict[int, str] = {
    WW: "ww",
    WR: "wr",
    PROCESS: "process",
    REALTIME: "realtime",
    RW: "rw",
}

Step = tuple[int, int]
"""A node of a cycle and the single edge kind that leads from it to the next node."""


def kinds_from_names(names: Iterable[str]) -> int:
    """The mask for edge kind names such as ``{"ww", "wr", "rw", "process"}``."""
    by_name = {name: bit for bit, name in KIND_NAMES.items()}
    mask = 0
    for name in names:
        if name not in by_name:
            raise ValueError(f"unknown edge kind {name!r}; known: {sorted(by_name)}")
        mask |= by_name[name]
    return mask


class DependencyGraph:
    """Directed edges with kind masks, stored as one dict of successors per node."""

    __slots__ = ("edge_counts", "out")

    def __init__(self, size: int) -> None:
        self.out: list[dict[int, int]] = [{} for _ in range(size)]
        self.edge_counts: dict[int, int] = dict.fromkeys(KIND_NAMES, 0)
        """How many ordered pairs carry each kind (a pair with two kinds counts twice)."""

    def __len__(self) -> int:
        return len(self.out)

    def add(self, a: int, b: int, kind: int) -> None:
        """Add ``a -> b`` for reason ``kind``; self-edges say nothing and are ignored."""
        if a == b:
            return
        successors = self.out[a]
        before = successors.get(b, 0)
        if not before & kind:
            successors[b] = before | kind
            self.edge_counts[kind] += 1

    def kinds(self, a: int, b: int) -> int:
        return self.out[a].get(b, 0)


def strongly_connected(
    graph: DependencyGraph,
    nodes: Iterable[int] | None = None,
    allowed: int = ALL_KINDS,
    members: set[int] | None = None,
    keep_singletons: bool = False,
) -> list[list[int]]:
    """Tarjan's strongly connected components, iteratively (histories are deep).

    Only edges with a kind in ``allowed`` and, if ``members`` is given, only nodes in it
    take part.  Components of one node hold no cycle (there are no self-edges) and are
    left out unless ``keep_singletons``.
    """
    out = graph.out
    roots = range(len(out)) if nodes is None else nodes
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    found: list[list[int]] = []
    counter = 0
    for root in roots:
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(out[root].items()))]
        while work:
            v, successors = work[-1]
            descended = False
            for w, mask in successors:
                if not mask & allowed or (members is not None and w not in members):
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(out[w].items())))
                    descended = True
                    break
                if w in on_stack and index[w] < low[v]:
                    low[v] = index[w]
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[v] < low[parent]:
                    low[parent] = low[v]
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if keep_singletons or len(component) > 1:
                    found.append(component)
    return found


def _path(
    graph: DependencyGraph, src: int, dst: int, members: set[int], allowed: int
) -> list[Step] | None:
    """A shortest path ``src -> ... -> dst`` inside ``members`` using ``allowed`` kinds.

    Returns the steps taken (each node with the kind of edge it left by), ending with the
    node that has the edge into ``dst``; ``src == dst`` asks for a shortest cycle.
    """
    out = graph.out
    parent: dict[int, Step | None] = {src: None}
    frontier = deque([src])
    while frontier:
        u = frontier.popleft()
        for w, mask in out[u].items():
            usable = mask & allowed
            if not usable or w not in members:
                continue
            if w == dst:
                steps = [(u, usable & -usable)]
                back = parent[u]
                while back is not None:
                    steps.append(back)
                    back = parent[back[0]]
                steps.reverse()
                return steps
            if w not in parent:
                parent[w] = (u, usable & -usable)
                frontier.append(w)
    return None


def find_cycle(graph: DependencyGraph, members: set[int], allowed: int) -> list[Step] | None:
    """A short cycle among ``members`` that uses only ``allowed`` edge kinds, if any."""
    for component in strongly_connected(graph, members, allowed, members):
        start = min(component)
        return _path(graph, start, start, set(component), allowed)
    return None


def find_cycle_with_one(
    graph: DependencyGraph,
    members: set[int],
    allowed: int,
    special: int,
    max_searches: int = 1000,
) -> list[Step] | None:
    """A cycle with exactly one ``special`` edge, the rest of ``allowed`` kinds.

    This is how a G-single (one anti-dependency) is told from a G2: for a special edge
    ``a -> b``, look for a way back from ``b`` to ``a`` without special edges.  Edges whose
    ends share a component of the non-special graph surely close such a cycle and are
    tried first; the others cost a search each, and at most ``max_searches`` are made.
    """
    allowed &= ~special
    component_of: dict[int, int] = {}
    for number, component in enumerate(
        strongly_connected(graph, members, allowed, members, keep_singletons=True)
    ):
        for node in component:
            component_of[node] = number
    out = graph.out
    candidates: list[tuple[int, int]] = []
    for a in sorted(members):
        for b, mask in out[a].items():
            if mask & special and not mask & allowed and b in members:
                candidates.append((a, b))
    candidates.sort(key=lambda edge: component_of[edge[0]] != component_of[edge[1]])
    for searches, (a, b) in enumerate(candidates):
        if searches >= max_searches and component_of[a] != component_of[b]:
            break
        back = _path(graph, b, a, members, allowed)
        if back is not None:
            return [(a, special), *back]
    return None


def cycle_kinds(cycle: list[Step]) -> dict[int, int]:
    """How many steps of each kind a cycle has."""
    counts = dict.fromkeys(KIND_NAMES, 0)
    for _, kind in cycle:
        counts[kind] += 1
    return counts
