"""``rubberband views`` without a cluster: its command line and its metrics text."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rubberband.tools.views import main, metrics_text
from rubberband.views.steps import Figures


def test_each_metric_family_keeps_its_series_together_with_staleness_per_view() -> None:
    b = Figures(position=7, fresh_as_of=10.0, page_seconds=0.25, page_changes=40, pages=12,
                dead_rows=3_000)  # fmt: skip
    text = metrics_text({"b": b, "a": Figures()}, 12.5)
    lines = text.splitlines()
    names = [line.split("{")[0] for line in lines if not line.startswith("#")]
    # Prometheus's text format: a family's samples follow its HELP and TYPE, together.
    assert names == sorted(names, key=names.index) and len(set(names)) * 2 == len(names)
    assert 'rubberband_view_position{view="b"} 7' in lines
    assert 'rubberband_view_staleness_seconds{view="b"} 2.5' in lines
    assert 'rubberband_view_page_seconds{view="b"} 0.25' in lines  # its rounds
    assert 'rubberband_view_page_changes{view="b"} 40' in lines
    assert 'rubberband_view_pages_total{view="b"} 12' in lines  # its rounds so far
    assert 'rubberband_view_dead_rows{view="b"} 3000' in lines  # held by every replica
    assert "# TYPE rubberband_view_dead_rows gauge" in lines
    never = next(ln for ln in lines if ln.startswith('rubberband_view_staleness_seconds{view="a"}'))
    assert math.isnan(float(never.split()[-1]))  # no progress yet: unknown, not fresh
    assert "# TYPE rubberband_view_starts_total counter" in lines
    stopped = metrics_text({"c": Figures(stopped="view 'c' stopped at position 3: ...")}, 1.0)
    assert 'rubberband_view_halted{view="c"} 1' in stopped.splitlines()
    assert 'rubberband_view_halted{view="b"} 0' in lines


@pytest.mark.parametrize(
    "argv",
    [
        ["create", "v", "--kind", "index", "--on", "g"],
        ["create", "v", "--from", "0", "9", "--kind", "aggregate", "--agg", "bad"],
        ["create", "v", "--from", "9", "0", "--kind", "selection"],
        ["create", "v", "--from", "0", "9", "--kind", "projection"],
        ["create", "v", "--from", "0", "9", "--over", "w", "--kind", "selection"],
        ["create", "v", "--over", "v", "--kind", "selection"],
        ["create", "v", "--from", "-", "-", "--kind", "selection", "--table", "t"],
        ["create", "v", "--from", "-", "-", "--kind", "selection", "--right-table", "t:k"],
        ["read", "--routers", "127.0.0.1:1"],
        ["drop"],
        ["maintain", "--shard", "2/2"],
        ["maintain", "--shard", "one"],
    ],
)
def test_a_command_line_that_cannot_run_says_why_and_exits_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--routers", "127.0.0.1:1"]) == 2  # refused before connecting
    assert "rubberband views" in capsys.readouterr().err


def test_the_base_range_and_the_source_address_are_two_options() -> None:
    from rubberband.tools.views import parser

    args = parser().parse_args(["create", "v", "--from", "0", "9", "--source", "10.0.0.2"])
    assert args.base == ["0", "9"] and args.source == "10.0.0.2"


def test_a_view_over_a_table_names_it_and_its_key_column() -> None:
    from rubberband.tools.views import _spec, parser

    args = parser().parse_args(["create", "v", "--from", "-", "-", "--kind", "index",
                                "--on", "g", "--table", "tickets:rloc"])  # fmt: skip
    assert _spec(args)["table"] == ("tickets", "rloc")


def test_shards_split_the_groups_of_views_and_never_a_group() -> None:
    """N maintainers with ``--shard I/N`` keep every view exactly once between them,
    and views over the same sources (one group, one feed) in the same shard."""
    from rubberband.tools.views import in_shard
    from rubberband.views import view_def
    from rubberband.views.steps import group_of

    views = [view_def(f"v{i}", "index", (i % 20, 100), on="g") for i in range(40)]
    for n in (1, 2, 3):
        kept = [[v.name for v in views if in_shard(v, (i, n))] for i in range(n)]
        assert sorted(name for names in kept for name in names) == sorted(v.name for v in views)
        for v in views:
            shards = {i for i in range(n) if in_shard(v, (i, n))}
            same_group = [w for w in views if group_of(w) == group_of(v)]
            assert all({i for i in range(n) if in_shard(w, (i, n))} == shards for w in same_group)
    assert len({i for v in views for i in range(3) if in_shard(v, (i, 3))}) == 3


def test_the_parts_of_a_split_view_go_to_shards_of_their_own() -> None:
    """``--split-at`` takes JSON (an index's split point is a tuple); N maintainers keep
    the N parts of one view apart, and every part exactly once."""
    from rubberband.tools.views import _spec, in_shard, parser
    from rubberband.views import view_def
    from rubberband.views.define import units

    argv = ["create", "v", "--from", "0", "100", "--kind", "index", "--on", "g"]
    args = parser().parse_args([*argv, "--split-at", '["K"]', "--split-at", '["T"]'])
    spec = _spec(args)
    view = view_def("v", "index", (0, 100), on="g", parts=spec["parts"])
    assert view.parts == (("K",), ("T",))
    for n in (1, 2, 3, 4):
        shards = [[i for i in range(n) if in_shard(u, (i, n))] for u in units(view)]
        assert all(len(s) == 1 for s in shards)
        assert len({s[0] for s in shards}) == min(n, 3)


def test_a_maintainer_connects_anew_once_its_client_finds_no_router_for_long() -> None:
    """Its own client's verdict (unavailable: no router reachable for 10 s) is enough;
    otherwise it waits for ``RECONNECT_AFTER`` without an answer and a router down, so
    a leader's failover (routers reachable) is ridden out however long a read fails."""
    from types import SimpleNamespace

    from rubberband.tools.views import RECONNECT_AFTER, _lost

    def rb(state: str, terminated: str | None = None) -> Any:
        return SimpleNamespace(ecast=SimpleNamespace(state=state, terminated=terminated))

    later = RECONNECT_AFTER + 1
    assert _lost(rb("unavailable"), 0.0)
    assert _lost(rb("connected", terminated="suspected"), 0.0)
    assert not _lost(rb("reconnecting"), RECONNECT_AFTER - 1)
    assert _lost(rb("reconnecting"), later)
    assert not _lost(rb("connected"), 10 * later)
