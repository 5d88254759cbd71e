"""What views maintainers report to a super (:class:`rubberband.proto.ViewProgress`) for
its console: shown under the sender's proven name, checked field by field, bounded, and
forgotten when old; from anyone but a client, or malformed, dropped."""

from __future__ import annotations

from ecast.wire.codec import pack, unpack
from rubberband.proto import ViewProgress
from rubberband.super import REPORT_AGE, REPORTED_VIEWS, REPORTERS, SuperCore
from tests.unit.test_rubberband_config import joined


def _core() -> SuperCore:
    core = SuperCore("super:s1")
    core.config = joined("super:s1", "storage:1")
    return core


def test_a_maintainers_report_shows_under_its_name_until_it_is_old() -> None:
    core = _core()
    core.on_direct("maintainer:m1", ViewProgress((("by_g", 900, 12, 0.25, 40),)), 10.0)
    core.on_direct("maintainer:m2", ViewProgress((("by_g", 880, 30, 1.5, 40),)), 11.0)
    views = core.status(12.0)["views"]
    assert views == [
        {"name": "by_g", "position": 900, "behind": 12, "staleness_s": 0.25, "rows": 40,
         "maintainer": "maintainer:m1", "age_s": 2.0},
        {"name": "by_g", "position": 880, "behind": 30, "staleness_s": 1.5, "rows": 40,
         "maintainer": "maintainer:m2", "age_s": 1.0},
    ]  # fmt: skip
    assert [v["maintainer"] for v in core.status(10.5 + REPORT_AGE)["views"]] == ["maintainer:m2"]


def test_a_bad_report_is_dropped_and_nothing_else_changes() -> None:
    core = _core()
    good = ViewProgress((("v", 5, 0, 0.1, 1),))
    core.on_direct("maintainer:m", good, 0.0)
    bad = [
        ("v", 5, 0, 0.1),  # a field short
        ("", 5, 0, 0.1, 1),
        ("v" * 68, 5, 0, 0.1, 1),  # a view name is 64 at most, a unit name 3 more
        ("v\n", 5, 0, 0.1, 1),
        ("v", "5", 0, 0.1, 1),
        ("v", 5, 0, float("nan"), 1),
        ("v", 5, 0, -1.0, 1),
        ("v", 5, 0, 0.1, 1.5),
    ]
    for row in bad:
        core.on_direct("maintainer:m", ViewProgress((row,)), 1.0)
    many = (("v", 1, 0, 0.0, 1),) * (REPORTED_VIEWS + 1)
    core.on_direct("maintainer:m", ViewProgress(many), 1.0)
    core.on_direct("maintainer:m", ViewProgress("not a list"), 1.0)
    assert core.views.refused == len(bad) + 2
    assert [v["position"] for v in core.status(2.0)["views"]] == [5]
    core.on_direct("storage:1", good, 1.0)  # only clients maintain views
    assert len(core.status(2.0)["views"]) == 1
    core.on_direct("maintainer:m", ViewProgress(many[:REPORTED_VIEWS]), 1.0)
    assert len(core.status(2.0)["views"]) == REPORTED_VIEWS


def test_a_super_keeps_the_newest_reporters_only() -> None:
    core = _core()
    for i in range(REPORTERS + 10):
        core.on_direct(f"maintainer:m{i:03d}", ViewProgress((("v", i, 0, 0.0, 0),)), 1.0)
    shown = {v["maintainer"] for v in core.status(2.0)["views"]}
    assert len(shown) == REPORTERS and "maintainer:m000" not in shown and "maintainer:m073" in shown


def test_the_report_travels_through_the_wire_codec() -> None:
    msg = ViewProgress((("by_g", 900, 12, 0.25, 40),))
    assert unpack(pack(msg)) == msg
