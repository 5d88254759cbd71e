"""``rubberband views`` without a cluster: its command line and its metrics text."""

from __future__ import annotations

import math

import pytest

from rubberband.tools.views import main, metrics_text
from rubberband.views.steps import Figures


def test_each_metric_family_keeps_its_series_together_with_staleness_per_view() -> None:
    text = metrics_text({"b": Figures(position=7, fresh_as_of=10.0), "a": Figures()}, 12.5)
    lines = text.splitlines()
    names = [line.split("{")[0] for line in lines if not line.startswith("#")]
    # Prometheus's text format: a family's samples follow its HELP and TYPE, together.
    assert names == sorted(names, key=names.index) and len(set(names)) * 2 == len(names)
    assert 'rubberband_view_position{view="b"} 7' in lines
    assert 'rubberband_view_staleness_seconds{view="b"} 2.5' in lines
    never = next(ln for ln in lines if ln.startswith('rubberband_view_staleness_seconds{view="a"}'))
    assert math.isnan(float(never.split()[-1]))  # no progress yet: unknown, not fresh
    assert "# TYPE rubberband_view_starts_total counter" in lines


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
