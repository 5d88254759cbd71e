"""``ecast router``'s settings: flags, a TOML file, and one-line errors with exit status 2."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import pytest

from ecast.tools.daemon import SETTINGS, load_initial_config, main
from ecast.tools.daemon_kit import UsageError, build_parser, load_settings


def parse(argv: list[str]) -> argparse.Namespace:
    return load_settings(build_parser("ecast router", "", SETTINGS), SETTINGS, argv)


@pytest.fixture(autouse=True)
def _in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon runs in the test process here: keep its process-wide settings out."""
    import ecast.tools.daemon as daemon

    monkeypatch.setattr(daemon, "tune_process", lambda: None)
    monkeypatch.setattr(daemon, "setup_logging", lambda level: None)
    monkeypatch.setenv("ECAST_SECRET", SECRET)


SECRET = "a-long-enough-cluster-secret-for-tests"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    os.environ.setdefault("ECAST_SECRET", SECRET)  # a daemon takes it out of its environment
    code = main(argv)
    return code, capsys.readouterr().err


def test_flags_win_over_the_file_and_the_file_fills_in_the_rest(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text('id = "r9"\nlisten = "127.0.0.1:17113"\nlog-level = "warning"\nheartbeat = 0.5\n')
    args = parse(["--listen", "127.0.0.1:17112", "--file", str(f)])
    assert args.listen == "127.0.0.1:17112"  # the flag, not the file
    assert args.id == "r9" and args.log_level == "warning" and args.heartbeat == 0.5
    assert parse(["--file", str(f)]).listen == "127.0.0.1:17113"
    # A flag equal to its default still wins over the file.
    assert parse(["--file", str(f), "--heartbeat", "0.25"]).heartbeat == 0.25
    assert parse(["--file", str(f), "--log-level", "info"]).log_level == "info"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('failure-timeout = "2s"\n', "failure-timeout: expected a number (s), got '2s'"),
        ("failure-timeout = [1\n", "not valid TOML"),
        ("no-such-setting = 1\n", "unknown setting 'no-such-setting'"),
        ("clumping = 1\n", "clumping: expected true or false"),
        ('listen = "7001"\n', "'7001' is not HOST:PORT"),
    ],
)
def test_a_bad_file_is_one_line_and_exit_status_2(
    tmp_path: Path, toml: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "r.toml"
    f.write_text(toml)
    code, err = run(["--id", "r1", "--listen", "127.0.0.1:1", "--file", str(f)], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--file", "/no/such/file.toml"], "no such file"),
        (["--listen", "7001"], "'7001' is not HOST:PORT"),
        (["--log-level", "loud"], "invalid choice: 'loud'"),
        (["--heartbeat", "fast"], "expected a number of s"),
        (["--failure-timeout", "-1"], "-1.0 is not positive"),
        (["--config-arg", "foo=1"], "BroadcastConfig takes no setting 'foo' (it takes: senders)"),
        (["--config-arg", "senders=everyone"], "senders is 'members' or 'anyone'"),
        (["--config", "no_such_package.mod:Config"], "cannot import no_such_package"),
        (["--config", "ecast.core.config:NoSuchClass"], "has no class NoSuchClass"),
        (["--config", "no-colon"], "package.module:Class"),
        (["--config", "json:JSONDecoder"], "is not a Config"),
        (["--origin", "yesterday"], "neither 'clock' nor an integer"),
        (["--origin", str(2**53)], "below 2**53"),
        (["--origin", "\u00b2"], "neither 'clock' nor an integer"),
    ],
)
def test_bad_flags_are_one_line_and_exit_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--id", "r1", "--listen", "127.0.0.1:1"]
    with pytest.raises(SystemExit) if "loud" in argv else _nothing() as e:
        code, err = run([*base, *argv], capsys)
    if e is not None:  # argparse's own choice check
        assert e.value.code == 2
        err = capsys.readouterr().err
    else:
        assert code == 2
    assert message in err and "Traceback" not in err


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def test_id_and_listen_are_required_from_one_or_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "r.toml"
    f.write_text('listen = "127.0.0.1:17113"\n')
    assert run(["--file", str(f)], capsys) == (
        2,
        "ecast router: --id is required (on the command line or in --file)\n",
    )
    code, err = run(["--id", "r1"], capsys)
    assert code == 2 and "--listen is required" in err


def test_ports_in_use_fail_before_anything_else(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(
            ["--id", "r1", "--listen", "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}"], capsys
        )
        assert code == 2 and f"--metrics 127.0.0.1:{port}" in err and "in use" in err
        code, err = run(["--id", "r1", "--listen", f"127.0.0.1:{port}"], capsys)
        assert code == 2 and f"--listen 127.0.0.1:{port}" in err


def test_a_secret_file_others_can_read_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a-long-enough-cluster-secret-for-tests")
    secret.chmod(0o644)
    code, err = run(["--id", "r1", "--listen", "127.0.0.1:0", "--secret-file", str(secret)], capsys)
    assert code == 2 and "chmod 600" in err


def test_help_shows_defaults_and_units_without_markup(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--failure-timeout" in out and "(default: 1.0 s)" in out
    assert "(default: 5.0 s)" in out  # --client-lease
    assert "``" not in out


def test_the_initial_config_is_strict() -> None:
    with pytest.raises(UsageError, match="takes no setting"):
        load_initial_config("ecast:KeyRingConfig", ["replication=3", "replicas=2"])
    assert load_initial_config("ecast:KeyRingConfig", ["replication=2"]).f == 2
