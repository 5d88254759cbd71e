"""What every daemon of the project shares: settings, errors, logs, metrics, health.

- **Settings** come from flags or a TOML file (``--file``), declared once as
  :class:`Setting` s with a type, a default and a unit.  A flag given on the command line
  always wins, even when it equals its default; the file fills in the rest; a wrong type,
  an unknown key or bad TOML syntax is a one-line error.
- **Errors** a user can fix (a setting, a port in use, a missing file) are one line on
  stderr and exit status 2 (:class:`UsageError`), never a traceback.
- **Logs** are one ``key=value`` line per event.
- **Metrics** are Prometheus text with escaped label values and a cap on the series a
  label may create (a peer's chosen name must neither inject lines nor grow memory);
  ``/health`` answers JSON, 200 when healthy and 503 otherwise, over the small HTTP
  server of :mod:`ecast.tools.http` (its types re-exported here for Rubberband's).

Rubberband's daemons use it too (through ``ecast``'s public exports).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import socket
import sys
import time
import tomllib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ecast.core.histogram import Histogram
from ecast.security.secret import private_file_problem
from ecast.tools.http import HttpServer as HttpServer
from ecast.tools.http import Request as Request
from ecast.tools.http import Response as Response
from ecast.tools.http import json_response as json_response
from ecast.tools.http import text_response as text_response

log = logging.getLogger("ecast.daemon")

LOG_LEVELS = ("debug", "info", "warning", "error")


class UsageError(Exception):
    """A mistake in how the daemon was started: one line on stderr, exit status 2."""


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Setting:
    name: str
    """The flag without dashes, and the TOML key (``failure-timeout``)."""
    type: type
    default: Any
    help: str
    unit: str = ""
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], str | None] | None = None
    """Returns what is wrong with a value, or None."""
    repeat: bool = False
    """A list of values (the flag may be given several times)."""
    secret: bool = False
    """Never logged."""

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


def address(value: str) -> str | None:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"{value!r} is not HOST:PORT (for example 127.0.0.1:7001)"
    return None


def positive(value: float) -> str | None:
    return None if value > 0 else f"{value} is not positive"


def _convert(s: Setting, value: Any, origin: str) -> Any:
    if s.repeat:
        values = value if isinstance(value, list) else [value]
        return [_convert_one(s, v, origin) for v in values]
    return _convert_one(s, value, origin)


def _convert_one(s: Setting, value: Any, origin: str) -> Any:
    where = f"{origin} {s.name}"
    if s.type is bool:
        if type(value) is not bool:
            raise UsageError(f"{where}: expected true or false, got {value!r}")
    elif s.type is float:
        if type(value) is str and origin == "--":
            try:
                value = float(value)
            except ValueError:
                raise UsageError(f"{where}: expected a number of {s.unit}, got {value!r}") from None
        if type(value) not in (int, float):
            raise UsageError(f"{where}: expected a number ({s.unit or 'unitless'}), got {value!r}")
        value = float(value)
    elif s.type is int:
        if type(value) is str and origin == "--":
            try:
                value = int(value)
            except ValueError:
                raise UsageError(f"{where}: expected an integer, got {value!r}") from None
        if type(value) is not int:
            raise UsageError(f"{where}: expected an integer ({s.unit or 'count'}), got {value!r}")
    elif type(value) is not str:
        raise UsageError(f"{where}: expected a string, got {value!r}")
    if s.choices is not None and value not in s.choices:
        raise UsageError(f"{where}: {value!r} is not one of {', '.join(map(str, s.choices))}")
    if s.check is not None and value is not None:
        problem = s.check(value)
        if problem:
            raise UsageError(f"{where}: {problem}")
    return value


def build_parser(
    prog: str, description: str, settings: Sequence[Setting]
) -> argparse.ArgumentParser:
    """A parser whose flags are ``settings``, plus ``--file``; defaults and units shown."""
    ap = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for s in settings:
        shown = (
            ""
            if s.default in (None, [], "")
            else f" (default: {s.default}{' ' + s.unit if s.unit else ''})"
        )
        unit = f" [{s.unit}]" if s.unit and s.default in (None, [], "") else ""
        kw: dict[str, Any] = {
            "dest": s.dest,
            "default": argparse.SUPPRESS,
            "help": s.help + unit + shown,
        }
        if s.type is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif s.repeat:
            kw["action"] = "append"
            kw["metavar"] = s.name.upper().replace("-", "_")
        else:
            kw["metavar"] = (s.unit or s.name).upper().replace("-", "_").replace(" ", "_")
            if s.choices is not None:
                kw["choices"] = s.choices
                kw.pop("metavar")
        ap.add_argument(f"--{s.name}", **kw)
    ap.add_argument(
        "--file",
        dest="file",
        default=argparse.SUPPRESS,
        help="TOML file with any of these settings, keys spelled as the flags without "
        "dashes (failure-timeout = 2.0); a flag on the command line always wins",
    )
    return ap


def load_settings(
    ap: argparse.ArgumentParser, settings: Sequence[Setting], argv: Sequence[str] | None
) -> argparse.Namespace:
    """Defaults, then the TOML file, then every flag given: each step checked."""
    given = vars(ap.parse_args(argv))
    values: dict[str, Any] = {s.dest: s.default for s in settings}
    by_key = {s.name: s for s in settings}
    path = given.pop("file", None)
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise UsageError(f"--file {path}: no such file") from None
        except OSError as e:
            raise UsageError(f"--file {path}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"--file {path}: not valid TOML ({e})") from None
        for key, value in data.items():
            s = by_key.get(key) or by_key.get(key.replace("_", "-"))
            if s is None:
                raise UsageError(f"--file {path}: unknown setting {key!r}")
            values[s.dest] = _convert(s, value, f"{path}:")
    for s in settings:
        if s.dest in given:
            values[s.dest] = _convert(s, given[s.dest], "--")
    values["file"] = path
    return argparse.Namespace(**values)


def effective(args: argparse.Namespace, settings: Sequence[Setting]) -> str:
    """``key=value`` of every setting (secrets hidden), for the start-up log line."""
    parts = []
    for s in settings:
        v = getattr(args, s.dest)
        if s.secret and v:
            v = "***"
        parts.append(f"{s.dest}={v if not isinstance(v, list) else ','.join(map(str, v))}")
    return " ".join(parts)


def run_main(main: Callable[[], int], prog: str) -> int:
    """Turn a :class:`UsageError` into one line on stderr and exit status 2."""
    try:
        return main()
    except UsageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2


def check_port_free(addr: str, what: str) -> None:
    """Fail before doing anything else if ``addr`` cannot be listened on."""
    host, _, port = addr.rpartition(":")
    if int(port) == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), int(port)))
        except OSError as e:
            raise UsageError(
                f"{what} {addr}: {e.strerror or e} (is another process using it?)"
            ) from None


secret_file_problem = private_file_problem
"""A secret file that other users can read is refused (``chmod 600`` it)."""


# ------------------------------------------------------------------ logs
class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... event=...``: one line per event, easy to grep and parse."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} {record.getMessage()}"
        )
        if record.exc_info:
            line += " traceback=" + json.dumps(self.formatException(record.exc_info))
        return line


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


# ------------------------------------------------------------------ metrics
MAX_LABEL_VALUES = 256
"""Series per metric and label beyond which peers are folded into ``other``."""


def escape_label(value: Any) -> str:
    """A Prometheus label value: backslash, quote and newline escaped (exposition format)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Prometheus text, families kept together, label values escaped and capped."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._seen: set[str] = set()

    def add(self, name: str, value: float, help_: str, kind: str = "gauge", **labels: Any) -> None:
        if name not in self._seen:
            self._seen.add(name)
            self.lines.append(f"# HELP {name} {help_}")
            self.lines.append(f"# TYPE {name} {kind}")
        lab = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

    def per_label(
        self,
        name: str,
        values: dict[str, float],
        help_: str,
        label: str,
        kind: str = "gauge",
    ) -> None:
        """One series per label value, the largest ``MAX_LABEL_VALUES``; the rest summed
        under ``other``."""
        items = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
        for key, v in items[:MAX_LABEL_VALUES]:
            self.add(name, v, help_, kind, **{label: key})
        rest = items[MAX_LABEL_VALUES:]
        if rest:
            self.add(name, sum(v for _k, v in rest), help_, kind, **{label: "other"})

    def histogram(self, name: str, hist: Histogram, help_: str, **labels: Any) -> None:
        """``name`` (seconds) as a Prometheus histogram: cumulative ``_bucket`` series,
        ``_sum`` and ``_count``."""
        if name not in self._seen:
            self._seen.add(name)
            self.lines.append(f"# HELP {name} {help_}")
            self.lines.append(f"# TYPE {name} histogram")
        lab = "".join(f',{k}="{escape_label(v)}"' for k, v in labels.items())
        total = 0
        for bound, n in zip(hist.buckets, hist.counts, strict=True):
            total += n
            self.lines.append(f'{name}_bucket{{le="{bound:g}"{lab}}} {total}')
        self.lines.append(f'{name}_bucket{{le="+Inf"{lab}}} {hist.count}')
        tail = "{" + lab[1:] + "}" if lab else ""
        self.lines.append(f"{name}_sum{tail} {hist.sum:.6f}")
        self.lines.append(f"{name}_count{tail} {hist.count}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


async def serve_http(
    address: str,
    metrics: Callable[[], str | Awaitable[str]],
    health: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
    healthy: Callable[[dict[str, Any]], bool],
    extra: Callable[[Any], None] | None = None,
) -> Any:
    """``/metrics`` and ``/health`` on ``address``; ``extra(server)`` may add routes.
    ``metrics`` and ``health`` may return awaitables (a process whose state lives on
    another thread reads it there).  The server (:class:`ecast.tools.http.HttpServer`):
    its ``cleanup`` stops it."""

    async def get_metrics(_req: Request) -> Response:
        got = metrics()
        return text_response(await got if inspect.isawaitable(got) else got)

    async def get_health(_req: Request) -> Response:
        got = health()
        h = await got if inspect.isawaitable(got) else got
        return json_response(h, status=200 if healthy(h) else 503)

    server = HttpServer()
    server.add_get("/metrics", get_metrics)
    server.add_get("/health", get_health)
    if extra is not None:
        extra(server)
    host, _, port = address.rpartition(":")
    try:
        await server.start(host, int(port))
    except OSError as e:
        await server.cleanup()
        raise UsageError(f"--metrics {address}: {e.strerror or e}") from None
    log.info("event=metrics_listening address=%s", address)
    return server
