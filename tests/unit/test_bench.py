"""What the benchmarks report: memory growth told from breathing, cost per message per role."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ecast.tools.bench import _rss_summary
from ecast.tools.cost import main as cost_main


def test_a_breathing_heap_is_flat_and_a_leak_has_a_slope() -> None:
    warmup = [(0.25 * i, 40.0 + i, True) for i in range(4)]
    # A heap that swings by a megabyte around 45 MB for a minute: flat.
    breathing = [(5.0 + i, 45.0 + (i % 3 == 0) * 1.0, False) for i in range(60)]
    flat = _rss_summary(warmup + breathing)
    assert flat["warm"] == 43.0 and flat["min"] == 45.0 and flat["max"] == 46.0
    assert abs(flat["slope_mb_per_min"]) < 0.1  # its phase tilts the fit slightly
    # The same with a leak of 1 MB a minute under it.
    leak = [(t, mb + (t - 5.0) / 60, w) for t, mb, w in breathing]
    grown = _rss_summary(warmup + leak)
    assert math.isclose(grown["slope_mb_per_min"], 1.0 + flat["slope_mb_per_min"], abs_tol=1e-9)
    assert grown["end"] == leak[-1][1]


def test_a_run_too_short_for_a_trend_reports_what_it_has() -> None:
    assert _rss_summary([(0.0, 40.0, True)]) == {"warm": 40.0, "end": 40.0}
    one = _rss_summary([(0.0, 40.0, True), (6.0, 41.0, False)])
    assert one == {"warm": 40.0, "end": 41.0, "min": 41.0, "max": 41.0}


def test_the_cost_benchmark_charges_every_role_and_its_workload_is_deterministic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--rounds", "60", "--warmup-rounds", "20", "--receivers", "4", "--json"]
    runs = []
    for _ in range(2):
        assert cost_main(argv) == 0
        runs.append(json.loads(capsys.readouterr().out))
    first, second = runs
    assert first["stable_messages"] == second["stable_messages"] > 1000
    per = first["us_per_message"]
    assert set(per) == {"leader", "followers", "client", "receivers"}
    # Every role runs its core and decodes what it gets; all but the receivers encode.
    assert all(parts["core"] > 0 and parts["decode"] > 0 for parts in per.values())
    assert all(per[r]["encode"] > 0 for r in ("leader", "followers", "client"))
    total = sum(parts["total"] for parts in per.values())
    assert math.isclose(first["total_us_per_message"], total, abs_tol=0.05)


def test_a_load_option_of_zero_is_passed_and_only_false_or_none_leave_a_flag_out() -> None:
    from rubberband.bench.harness import load_flags

    flags = load_flags(
        {"snapshot_share": 0.0, "rate": 0, "unsafe": True, "bundle": None, "check": False}
    )
    assert flags == ["--snapshot-share", "0.0", "--rate", "0", "--unsafe"]


def test_a_bench_that_ends_with_an_error_kills_its_load_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An experiment that raises (a reconfiguration refused) leaves the ``with`` block
    with its load processes still writing: the bench kills them as it takes the cluster
    down, or they write on beside the next experiment's measurements."""
    import subprocess
    import sys

    from rubberband.bench import harness

    downs: list[tuple[str, ...]] = []
    monkeypatch.setattr(harness, "_cli", lambda *a, **kw: downs.append(a))
    monkeypatch.setattr(harness.Bench, "up", lambda self: None)
    load = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    with pytest.raises(RuntimeError), harness.Bench(tmp_path) as b:
        b.load_procs += [load, done]
        raise RuntimeError("reconfiguration refused")
    assert load.poll() is not None, "the load process still runs"
    assert done.returncode == 0
    assert downs and downs[0][:2] == ("cluster", "down")


def test_a_busy_machine_is_measured_and_told_before_a_benchmark(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second job halves a two-core benchmark's figures without any error: the
    harness measures how busy the machine is before it starts, warns above a quarter,
    and records the share with the machine."""
    import os
    import subprocess
    import sys

    from rubberband.bench import harness

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = harness.cpu_busy(0.5)
    finally:
        hog.kill()
        hog.wait()
    assert busy is not None and 0.4 / (os.cpu_count() or 1) <= busy <= 1.0

    monkeypatch.setattr(harness, "_busy", [])
    monkeypatch.setattr(harness, "cpu_busy", lambda seconds=0.5: 0.6)
    assert harness.check_idle() == 0.6
    assert "60% busy before this benchmark started" in capsys.readouterr().err
    assert harness.machine()["busy_before"] == 0.6
    monkeypatch.setattr(harness, "_busy", [])
    monkeypatch.setattr(harness, "cpu_busy", lambda seconds=0.5: 0.1)
    assert harness.check_idle() == 0.1
    assert capsys.readouterr().err == ""


def test_the_views_bench_reports_the_median_run_of_each_count_and_its_cost() -> None:
    """``rubberband bench views --repeat N``: on a machine whose speed drifts between
    runs, one run of each count said a view cost 5 % once and 48 % the next; the median
    of interleaved runs, with every run shown, says what a view costs."""
    from rubberband.bench.views import _median_run

    def run(w: int) -> dict[str, float]:
        return {"writes_per_s": w, "p50_ms": w / 100, "cost": 0.9}

    without = [run(4000), run(5300), run(4100)]
    one = [run(3900), run(2750), run(2700)]
    r = _median_run(one, without)
    assert r["writes_per_s"] == 2750 and r["p50_ms"] == 27.5  # the median run, whole
    assert r["runs"] == [3900, 2750, 2700]  # in the order they ran
    assert r["cost"] == round(1 - 2750 / 4100, 3)  # against the median run without views
    base = _median_run(without, without)
    assert base["writes_per_s"] == 4100 and "cost" not in base
    assert "cost" not in _median_run(one, None)


def test_the_views_bench_refuses_a_lookup_that_answers_other_rows() -> None:
    """The lookups' speed counts only if each answer is its key's rows, all of them."""
    from rubberband.bench.views import _check_found

    data = [(1, 7, 10), (2, 8, 20), (3, 7, 30)]  # (key, secondary key, n)
    _check_found(data, [7, 8], [[(3, {"n": 30}), (1, {"n": 10})], [(2, {"n": 20})]])
    for wrong in (
        [[(1, {"n": 10})], [(2, {"n": 20})]],  # a row missing
        [[(1, {"n": 10}), (3, {"n": 30})], [(2, {"n": 21})]],  # a stale value
        [[(1, {"n": 10}), (3, {"n": 30})], [(2, {"n": 20}), (1, {"n": 10})]],  # one too many
    ):
        with pytest.raises(AssertionError, match="lookup of"):
            _check_found(data, [7, 8], wrong)


def test_the_maintainer_benchmark_measures_each_kind_and_prints_json_last(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rubberband bench maintainer``: a maintainer's core alone, its CPU per change
    and the row versions a change made (an index moves a row: two versions of most)."""
    from rubberband.bench import maintainer
    from rubberband.bench.maintainer import KINDS, main, measure

    monkeypatch.setattr(maintainer, "tune_process", lambda **_: None)  # (not this process's)

    for kind in KINDS:
        r = measure(kind, keys=300, page=30, rounds=2)
        assert 0 < r["us_per_change_min"] <= r["us_per_change_median"], r
        assert 0 < r["row_versions_per_change"] <= 2, r
    assert measure("index", keys=300, page=30, rounds=2)["row_versions_per_change"] > 1.5
    assert main(["--keys", "300", "--page", "30", "--rounds", "2", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "µs of CPU a base change" in out[0]
    assert json.loads(out[-1])["experiment"] == "maintainer"
