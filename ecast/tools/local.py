"""Local daemons for people, tests and tools: started, watched and stopped as an operator
would, through their command lines, signals and ``/health``.

:class:`StateDir` runs any daemon (a router, a Rubberband storage process, ...) with a
state directory that holds the cluster's certificate authority and a credential per
process (``ca.json``, ``credentials/NAME.cred``, mode 600), or in the development mode the
cluster secret (``secret``, mode 600), one log per process, and ``processes.json`` (pid,
command line, ports, log of each), so a later command (``status``, ``down``) finds them.
A *launcher prefix* runs a process inside something, such as
``["ip", "netns", "exec", "ns1"]`` for a network namespace.  A *placement*
(``dir/placement.json``: process name to ``{"host": ADDRESS, "launcher": [...]}``) says
where each process runs and on which address it listens, so that every tool working on
the directory (``rubberband cluster add`` as much as the tool that made it) starts a
process in the same place; names it does not list run on 127.0.0.1.
:class:`LocalCluster` is a router group on top of it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecast.core import mutations
from ecast.core.roles import APPLICATION, ROUTER
from ecast.security.credentials import CertificateAuthority

MUTATIONS_ENV = mutations.ENV
"""Set to 1 to let daemons accept ``--mutation`` (planted bugs, for tests only)."""


@dataclass(frozen=True)
class Place:
    """Where a daemon runs: the address it listens on (and its ``/health`` is polled
    at) and the launcher prefix its command line runs under."""

    host: str = "127.0.0.1"
    launcher: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "launcher": list(self.launcher)}


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie or a vanished process does not): for
    processes this one did not start, whose exit status it cannot wait for.

    A process's main thread can be a zombie while its other threads still exit (one
    killed inside an ``fdatasync`` finishes it first), and its files, with the locks on
    them, go only with its last thread: a log engine's directory read right after its
    storage process "ran" no more was still locked.  So a zombie with a live thread
    still runs."""
    if _state(f"/proc/{pid}/stat") not in _GONE:
        return True
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return any(_state(f"/proc/{pid}/task/{t}/stat") not in _GONE for t in threads)


_GONE = ("Z", "X", None)
"""Thread states of a process that no longer runs (None: the entry is gone)."""


def _state(path: str) -> str | None:
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing is bound to, drawn from below the kernel's ephemeral range.

    The caller hands the number to a daemon that binds it later.  A port from the
    ephemeral range (what binding port 0 returns) can be given in between to any socket
    that binds port 0 or dials out: a storage process's own listener once took the
    metrics port chosen for it that way.  Below the range only another caller of this
    function can pick the same port, and every pick is claimed for a while (a file per
    port, created exclusively) so that other processes skip it: a cluster picks all its
    ports before its daemons bind them, over seconds, and two clusters started side by
    side drew the same metrics port.
    """
    high = _ephemeral_low()
    low = max(1024, high - 22768)
    for _ in range(200):
        port = low + secrets.randbelow(high - low)
        if not _claim(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range is taken: the old way
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_CLAIMS = Path(tempfile.gettempdir()) / "ecast-port-claims"
CLAIM_S = 120.0
"""How long a port handed out by :func:`free_port` is not handed out again, to any
process: long enough for the daemon it was meant for to bind it."""


def _claim(port: int) -> bool:
    path = _CLAIMS / str(port)
    try:
        _CLAIMS.mkdir(exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < CLAIM_S:
                return False
            os.utime(path)  # an old claim: the port is for whoever needs it now
            return True
        except OSError:
            return False
    except OSError:
        return True  # no shared claims here (read-only /tmp): the bind check still holds


KILL_WAIT = 60.0
"""Seconds a SIGKILLed process gets to be reaped before it is an error."""


def kernel_state(pid: int) -> str:
    """A process's state and what it waits on, from ``/proc`` (best effort)."""
    out = [f"stat={_state(f'/proc/{pid}/stat') or '(gone)'!r}"]  # the state letter
    for name in ("wchan", "stack"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text().strip()
        except OSError as e:
            text = f"({type(e).__name__})"
        out.append(f"{name}={text[:300]!r}")
    return " ".join(out)


def http_json(url: str, timeout: float = 1.0) -> dict[str, Any] | None:
    """GET a JSON document; None if nothing answered (a 503 still answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as e:
        try:
            return dict(json.loads(e.read()))
        except Exception:
            return None
    except Exception:
        return None


@dataclass
class Daemon:
    """One process started by a :class:`StateDir`."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int] = field(default_factory=dict)
    health_port: int | None = None
    restart: Callable[[], Daemon] | None = None
    """How to start it again on fresh ports (after losing a port race)."""
    host: str = "127.0.0.1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def health(self) -> dict[str, Any] | None:
        if self.health_port is None:
            return None
        return http_json(f"http://{self.host}:{self.health_port}/health")

    def metrics_text(self) -> str:
        url = f"http://{self.host}:{self.health_port}/metrics"
        with urllib.request.urlopen(url, timeout=1) as r:
            return str(r.read().decode())

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, then wait for the exit.  Twice on a loaded CI machine a killed router
        was not reaped within 10 s (cause unknown): past 10 s what the process waits on
        in the kernel goes to stderr, and the wait goes on to ``KILL_WAIT``."""
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            print(f"local: pid {self.pid} not gone 10 s after SIGKILL: {kernel_state(self.pid)}",
                  file=sys.stderr, flush=True)  # fmt: skip
            self.proc.wait(KILL_WAIT - 10)

    def terminate(self, timeout: float = 10.0) -> int:
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class StateDir:
    """Processes of one local cluster, recorded in ``dir/processes.json``."""

    def __init__(
        self,
        path: Path | str,
        secret: str | None = None,
        launcher: Sequence[str] = (),
        env: dict[str, str] | None = None,
        credentials: bool | None = None,
        placement: dict[str, Place] | None = None,
    ) -> None:
        """Credentials by default; the development mode's one secret when ``secret`` is
        given (or ``credentials=False``: a fresh random secret).  ``placement`` is
        recorded in the directory (merged into what it already says)."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.placement_file = self.path / "placement.json"
        if placement:
            self.set_places(placement)
        self.credentials = secret is None if credentials is None else credentials
        self.secret_file = self.path / "secret"
        self.secret: str | None = None
        self.ca_file = self.path / "ca.json"
        self._ca: CertificateAuthority | None = None
        if self.credentials:
            if secret is not None:
                raise ValueError("a secret is for the development mode, not with credentials")
            if self.ca_file.exists():
                self._ca = CertificateAuthority.load(self.ca_file)
            else:
                self._ca = CertificateAuthority.create()
                self._ca.save(self.ca_file)
            (self.path / "credentials").mkdir(mode=0o700, exist_ok=True)
        else:
            if secret is None:
                secret = (
                    self.secret_file.read_text().strip()
                    if self.secret_file.exists()
                    else os.urandom(24).hex()
                )
            self.secret = secret
            self.secret_file.write_text(secret + "\n")
            self.secret_file.chmod(0o600)
        self.launcher = list(launcher)
        self.env = dict(env or {})
        self.daemons: dict[str, Daemon] = {}

    def _placement(self) -> dict[str, Place]:
        if not self.placement_file.exists():
            return {}
        return {
            n: Place(p["host"], tuple(p.get("launcher", ())))
            for n, p in json.loads(self.placement_file.read_text()).items()
        }

    def set_places(self, places: dict[str, Place]) -> None:
        """Record where processes run (merged into what the directory says)."""
        known = self._placement()
        known.update(places)
        self.placement_file.write_text(
            json.dumps({n: p.to_json() for n, p in known.items()}, indent=1)
        )

    def place(self, name: str) -> Place:
        """Where the process ``name`` runs: the directory's placement, else 127.0.0.1
        under this directory's launcher prefix."""
        return self._placement().get(name) or Place("127.0.0.1", tuple(self.launcher))

    def issue(self, role: str, names: Sequence[str], file: str | None = None) -> Path:
        """A credential for ``role`` under ``names``, issued by this directory's CA, in
        ``credentials/FILE.cred`` (FILE: the first name, made safe for a file name)."""
        if self._ca is None:
            raise ValueError("this state directory runs the development mode (one secret)")
        stem = file or "".join(c if c.isalnum() or c in "-_." else "_" for c in names[0])
        out = self.path / "credentials" / f"{stem}.cred"
        self._ca.issue(role, list(names)).save(out)
        return out

    def auth_args(self, role: str, name: str) -> list[str]:
        """The flags that give a daemon ``name`` its proof: a fresh credential (covering
        ``name`` and, for routers, the ids ``--rejoin`` takes) or the secret file."""
        if not self.credentials:
            return ["--secret-file", str(self.secret_file)]
        names = [name, f"{name}.*"] if role == ROUTER else [name]
        return ["--credentials", str(self.issue(role, names))]

    def client_auth(self, pattern: str) -> dict[str, Any]:
        """Keyword arguments for ``ecast.connect`` of a process named by ``pattern``."""
        if not self.credentials:
            return {"secret": self.secret}
        return {"credentials": str(self.issue(APPLICATION, [pattern]))}

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ports: dict[str, int] | None = None,
        health_port: int | None = None,
        env: dict[str, str] | None = None,
        launcher: Sequence[str] | None = None,
    ) -> Daemon:
        """Start ``argv`` (its output to ``dir/NAME.log``), recorded under ``name``, in
        its place (:meth:`place`; ``launcher`` overrides the place's prefix)."""
        log = self.path / f"{name}.log"
        place = self.place(name)
        full = [*(place.launcher if launcher is None else launcher), *argv]
        environ = {**os.environ, **self.env, **(env or {})}
        # Daemons read their proof from this directory, never from the environment.
        environ.pop("ECAST_SECRET", None)
        environ.pop("ECAST_CREDENTIALS", None)
        with log.open("ab") as out:
            proc = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, env=environ)
        d = Daemon(name, list(full), proc, log, dict(ports or {}), health_port, host=place.host)
        self.daemons[name] = d
        self.save()
        return d

    def python(self, module: str, *args: str) -> list[str]:
        """A command line that runs ``python -m module args`` with this interpreter."""
        return [sys.executable, "-m", module, *args]

    def save(self) -> None:
        # What others recorded in this directory stays: a second StateDir over a
        # cluster's directory (a tool, a test adding a process) must not make ``down``
        # forget the cluster's own processes.
        data = self.recorded(self.path)
        data |= {
            name: {
                "pid": d.pid,
                "argv": d.argv,
                "ports": d.ports,
                "health_port": d.health_port,
                "host": d.host,
                "log": str(d.log),
                "alive": d.alive(),
            }
            for name, d in self.daemons.items()
        }
        (self.path / "processes.json").write_text(json.dumps(data, indent=1))

    @staticmethod
    def recorded(path: Path | str) -> dict[str, Any]:
        """What ``processes.json`` of a state directory says (for ``status``, ``down``)."""
        f = Path(path) / "processes.json"
        return dict(json.loads(f.read_text())) if f.exists() else {}

    def wait_healthy(
        self,
        name: str,
        ok: Callable[[dict[str, Any]], bool] = lambda h: h.get("status") == "ok",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Poll ``/health`` until ``ok`` holds; start again on fresh ports if the process
        lost the race for a probed port before it did anything."""
        deadline = time.monotonic() + timeout
        h = None
        while time.monotonic() < deadline:
            d = self.daemons[name]
            h = d.health()
            if h is not None and ok(h):
                return h
            if not d.alive():
                if d.restart is None or not _lost_port_race(d):
                    break
                # ``free_port`` closes its probe before the daemon binds, and another
                # process may take the port in between: it did nothing yet, so start it
                # again on fresh ports.
                self.daemons[name] = d.restart()
            time.sleep(0.05)
        d = self.daemons[name]
        raise RuntimeError(f"{name} not healthy in time: {h}\n{d.log_text()[-3000:]}")

    def stop_all(self, timeout: float = 5.0) -> None:
        """SIGTERM everyone, then SIGKILL whoever is left."""
        for d in self.daemons.values():
            d.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for d in self.daemons.values():
            try:
                d.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                d.kill()
        self.save()


def _lost_port_race(d: Daemon) -> bool:
    text = d.log_text()
    return ("address already in use" in text.lower() or "in use" in text) and (
        "event=bootstrap" not in text and "event=joining" not in text
    )


@dataclass
class LocalRouter:
    """A router daemon of a :class:`LocalCluster`."""

    id: str
    port: int
    metrics: int
    daemon: Daemon

    @property
    def address(self) -> str:
        return f"{self.daemon.host}:{self.port}"

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.daemon.proc

    @property
    def log(self) -> Path:
        return self.daemon.log

    def health(self) -> dict[str, Any] | None:
        return self.daemon.health()

    def metrics_text(self) -> str:
        return self.daemon.metrics_text()

    def alive(self) -> bool:
        return self.daemon.alive()


class LocalCluster:
    """Routers ``r1``, ``r2``, ... as daemons; ``args`` go to every one of them."""

    def __init__(
        self,
        workdir: Path | str,
        secret: str | None = None,
        args: Sequence[str] = (),
        launcher: Sequence[str] = (),
        env: dict[str, str] | None = None,
        credentials: bool | None = None,
        placement: dict[str, Place] | None = None,
    ) -> None:
        self.state = StateDir(workdir, secret, launcher, env, credentials, placement)
        self.workdir = self.state.path
        self.secret = self.state.secret
        self.args = list(args)
        self.routers: dict[str, LocalRouter] = {}

    def start(self, rid: str, join: str | None = None, *extra: str) -> LocalRouter:
        port, metrics = free_port(), free_port()
        host = self.state.place(rid).host
        argv = self.state.python(
            "ecast",
            "router",
            "--id",
            rid,
            "--listen",
            f"{host}:{port}",
            "--metrics",
            f"{host}:{metrics}",
            *self.state.auth_args(ROUTER, rid),
            *self.args,
            *extra,
        )
        if join:
            argv += ["--join", join]
        d = self.state.start(
            rid, argv, ports={"listen": port, "metrics": metrics}, health_port=metrics
        )
        r = LocalRouter(rid, port, metrics, d)

        def again() -> Daemon:
            return self.start(rid, join, *extra).daemon

        d.restart = again
        self.routers[rid] = r
        return r

    def client_auth(self, pattern: str) -> dict[str, Any]:
        """Keyword arguments for ``ecast.connect``: a credential covering ``pattern`` (or
        the development secret)."""
        return self.state.client_auth(pattern)

    def wait_healthy(
        self, rid: str, members: int | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        h = self.state.wait_healthy(
            rid,
            lambda h: h.get("status") == "ok" and (members is None or len(h["members"]) == members),
            timeout,
        )
        d = self.state.daemons[rid]
        if self.routers[rid].daemon is not d:  # started again on fresh ports
            self.routers[rid] = LocalRouter(rid, d.ports["listen"], d.ports["metrics"], d)
        return h

    def start_group(self, n: int) -> list[LocalRouter]:
        first = self.start("r1")
        self.wait_healthy("r1")
        first = self.routers["r1"]
        for i in range(2, n + 1):
            self.start(f"r{i}", first.address)
        # Each joiner first on its own: one that lost the race for a probed port is
        # started again only while it is the one waited for, and waiting on a full view
        # at r1 would wait out the timeout for it.
        for i in range(2, n + 1):
            self.wait_healthy(f"r{i}")
        for i in range(1, n + 1):
            self.wait_healthy(f"r{i}", members=n)
        return [self.routers[f"r{i}"] for i in range(1, n + 1)]

    def leader(self) -> str | None:
        """The first member of the view, as the live routers report it."""
        for r in self.routers.values():
            h = r.health() if r.alive() else None
            if h and h.get("status") == "ok":
                return str(h["leader"])
        return None

    def kill(self, rid: str) -> None:
        self.routers[rid].daemon.kill()

    def terminate(self, rid: str, timeout: float = 10.0) -> int:
        return self.routers[rid].daemon.terminate(timeout)

    def addresses(self) -> list[str]:
        return [r.address for r in self.routers.values() if r.alive()]

    def stop_all(self) -> None:
        for r in self.routers.values():
            if r.alive():
                r.daemon.kill()
        self.state.save()
