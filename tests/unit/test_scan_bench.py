"""The scan benchmark runs end to end on a small table and reports what it promises."""

from __future__ import annotations

import json

import pytest

from storage_adapters.scan.bench import main


@pytest.mark.exclusive  # 0.2 s per cell: a starved run applies no update in it
def test_the_benchmark_prints_one_json_object_with_every_engine_and_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    engines = ["scan", "sqlite", "duckdb"]  # duckdb comes with the dev extra
    argv = [
        "--rows",
        "10000",
        "--seconds",
        "0.2",
        "--outstanding",
        "200",
        "--updates",
        "0,100,1000",
        "--engines",
        ",".join(engines),
        "--json",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1  # --json: the JSON object is all of stdout
    result = json.loads(out[-1])
    assert result["rows"] == 10000
    assert set(result["updates_per_s"]) == {"0", "100", "1000"}
    for rate, cells in result["updates_per_s"].items():
        assert set(cells) == set(engines)
        for cell in cells.values():
            assert cell["qps"] > 0
            assert 0 < cell["p50_ms"] <= cell["p99_ms"]
            if rate != "0":
                assert cell["updates"] > 0
    # Every engine answered the check queries alike, and they have answers.
    assert result["answers_agree"] is True
    assert result["rows_per_checked_query"] >= 1
    assert 0 <= result["unindexed_fraction"] <= 1
    # The send cursor sent every row it had when it opened.
    migration = result["migration"]
    assert 9000 <= migration["rows"] <= 11000 and migration["chunks_of_1mb"] >= 1
    assert migration["open_ms"] >= 0 and migration["drain_s"] > 0
