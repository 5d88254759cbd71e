"""The dependency graph: Tarjan's components against brute force, and the cycle searches."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.checkers.graph import (
    ALL_KINDS,
    PROCESS,
    RW,
    WR,
    WW,
    DependencyGraph,
    cycle_kinds,
    find_cycle,
    find_cycle_with_one,
    kinds_from_names,
    strongly_connected,
)

KINDS = [WW, WR, PROCESS, RW]
edges_strategy = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 7), st.sampled_from(KINDS)), max_size=24
)


def build(edges, size=8):
    graph = DependencyGraph(size)
    for a, b, kind in edges:
        graph.add(a, b, kind)
    return graph


def reachable(graph, allowed):
    """Reflexive-transitive closure by brute force (Floyd-Warshall on booleans)."""
    n = len(graph)
    reach = [[i == j or bool(graph.kinds(i, j) & allowed) for j in range(n)] for i in range(n)]
    for k, i, j in itertools.product(range(n), repeat=3):
        if reach[i][k] and reach[k][j]:
            reach[i][j] = True
    return reach


def assert_is_cycle(graph, cycle, allowed):
    assert cycle, "a cycle has at least one step"
    nodes = [node for node, _ in cycle]
    assert len(set(nodes)) == len(nodes), "a short cycle visits each node once"
    for i, (node, kind) in enumerate(cycle):
        after = cycle[(i + 1) % len(cycle)][0]
        assert graph.kinds(node, after) & kind, "each step follows a real edge"
        assert kind & allowed and kind & (kind - 1) == 0, "of one allowed kind"


@settings(max_examples=300)
@given(edges=edges_strategy, allowed=st.sampled_from([WW, WW | WR, ALL_KINDS, WR | RW]))
def test_components_are_the_classes_of_mutual_reachability(edges, allowed):
    graph = build(edges)
    reach = reachable(graph, allowed)
    expected = set()
    for i in range(len(graph)):
        component = frozenset(j for j in range(len(graph)) if reach[i][j] and reach[j][i])
        if len(component) > 1:
            expected.add(component)
    found = strongly_connected(graph, allowed=allowed)
    assert {frozenset(c) for c in found} == expected
    assert sum(len(c) for c in found) == sum(len(c) for c in expected)


@settings(max_examples=300)
@given(edges=edges_strategy, allowed=st.sampled_from([WW, WW | WR, ALL_KINDS]))
def test_a_cycle_is_found_exactly_when_one_exists(edges, allowed):
    graph = build(edges)
    members = set(range(len(graph)))
    reach = reachable(graph, allowed)
    has_cycle = any(
        graph.kinds(a, b) & allowed and reach[b][a] for a in members for b in members if a != b
    )
    cycle = find_cycle(graph, members, allowed)
    assert (cycle is not None) == has_cycle
    if cycle is not None:
        assert_is_cycle(graph, cycle, allowed)


@settings(max_examples=300)
@given(edges=edges_strategy)
def test_a_cycle_with_exactly_one_special_edge(edges):
    graph = build(edges)
    members = set(range(len(graph)))
    base = WW | WR | PROCESS
    reach = reachable(graph, base)
    exists = any(
        graph.kinds(a, b) & RW and not graph.kinds(a, b) & base and reach[b][a]
        for a in members
        for b in members
        if a != b
    )
    cycle = find_cycle_with_one(graph, members, base | RW, RW)
    assert (cycle is not None) == exists
    if cycle is not None:
        assert_is_cycle(graph, cycle, base | RW)
        assert cycle_kinds(cycle)[RW] == 1


def test_self_edges_are_ignored_and_counts_are_per_kind():
    graph = DependencyGraph(3)
    graph.add(0, 0, WW)
    graph.add(0, 1, WW)
    graph.add(0, 1, WW)
    graph.add(0, 1, RW)
    assert graph.kinds(0, 0) == 0
    assert graph.kinds(0, 1) == WW | RW
    assert graph.edge_counts[WW] == 1 and graph.edge_counts[RW] == 1


def test_the_shortest_cycle_is_preferred():
    graph = build([(0, 1, WW), (1, 2, WW), (2, 3, WW), (3, 0, WW), (1, 0, WW)])
    cycle = find_cycle(graph, {0, 1, 2, 3}, WW)
    assert sorted(node for node, _ in cycle) == [0, 1]


def test_deep_chains_do_not_recurse():
    n = 50_000
    graph = DependencyGraph(n)
    for i in range(n - 1):
        graph.add(i, i + 1, WW)
    assert strongly_connected(graph) == []
    graph.add(n - 1, 0, WR)
    [component] = strongly_connected(graph)
    assert len(component) == n


def test_kind_names():
    assert kinds_from_names(["ww", "rw"]) == WW | RW
    try:
        kinds_from_names(["nope"])
    except ValueError as err:
        assert "nope" in str(err)
    else:
        raise AssertionError("an unknown edge kind must be refused")
