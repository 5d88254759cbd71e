"""``ecast router --file``: a TOML file fills in settings, the command line wins."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ecast.tools.daemon import apply_toml, router_arguments


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    router_arguments(ap)
    args = ap.parse_args(argv)
    apply_toml(args, ap)
    return args


def test_flags_win_over_the_file_and_the_file_fills_in_the_rest(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text('id = "r9"\nlisten = "127.0.0.1:17113"\nlog-level = "warning"\n')
    args = parse(["--listen", "127.0.0.1:17112", "--file", str(f)])
    assert args.listen == "127.0.0.1:17112"  # the flag, not the file
    assert args.id == "r9" and args.log_level == "warning"  # from the file
    assert parse(["--file", str(f)]).listen == "127.0.0.1:17113"


def test_id_and_listen_are_required_from_one_or_the_other(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text('listen = "127.0.0.1:17113"\n')
    with pytest.raises(SystemExit):
        parse(["--file", str(f)])
    with pytest.raises(SystemExit):
        parse(["--id", "r1"])
    (tmp_path / "bad.toml").write_text("no-such-setting = 1\n")
    with pytest.raises(SystemExit):
        parse(["--id", "r1", "--listen", "x:1", "--file", str(tmp_path / "bad.toml")])


def test_a_config_that_cannot_be_loaded_is_a_clear_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ecast.tools.daemon import main

    for config in ("no_such_package.mod:Config", "ecast.core.config:NoSuchClass", "no-colon"):
        with pytest.raises(SystemExit) as e:
            main(["--id", "r1", "--listen", "127.0.0.1:1", "--config", config])
        assert e.value.code == 2
        assert f"--config {config}:" in capsys.readouterr().err
