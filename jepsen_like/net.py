"""Network faults on real connections: every process in a network namespace of its own.

Each process of a run (router, storage process, super, load-generating worker) runs in
its own network namespace (``ip netns``) with one interface, a veth pair joined to a
bridge in the runner's namespace, and an address of its own in ``10.231.T.0/24`` (``T``
a tag that the run holds a lock on, so that runs side by side never share one).  It
listens on that address, so routers gossip it and everyone else reaches it across the
bridge, as across a real switch.  Light clients that live in the runner's process get an
address of their own on the bridge instead (``source``): they connect from it and serve
on it, so one client can be cut off alone.

Faults are rules inside the namespaces, never in the runner's (the runner keeps
watching ``/health`` through every fault, and nothing on the machine outside the run is
touched):

* **cut** (partitions): nftables drops every packet between two sets of addresses, in
  both directions, in each namespace concerned (an input rule on the source address and
  an output rule on the destination).  Connections stay open and stall, as with a
  switch that stops forwarding; nothing is refused politely.
* **loss**: nftables drops a share of the packets a namespace receives and sends
  (``numgen random``).
* **stall**: nftables drops every packet a namespace sends, for less than a second,
  while it goes on receiving (a grey failure: a full send queue, a stuck NIC).  The
  process hears everyone and goes on working; nobody hears from it, and TCP resends
  what was lost once the stall is over.
* **slow**: a token bucket (``tc tbf``) on both ends of a namespace's veth pair limits its
  rate; queued packets wait, so latency grows as well.

``tc netem`` would give delay and loss in one place, but kernels without the
``sch_netem`` module (this machine's) cannot load it; nftables and ``tbf`` are in every
stock kernel.  Creating namespaces needs root; :func:`problem` says why a run cannot.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from ecast import local

_NFT_TABLE = """
table inet jl {
  set cut { type ipv4_addr; }
  chain cut_in { type filter hook input priority 0; policy accept; ip saddr @cut drop; }
  chain cut_out { type filter hook output priority 0; policy accept; ip daddr @cut drop; }
  chain loss_in { type filter hook input priority 1; policy accept; }
  chain loss_out { type filter hook output priority 1; policy accept; }
  chain stall_out { type filter hook output priority 2; policy accept; }
}
"""


def problem() -> str | None:
    """Why this machine cannot run network faults, or None."""
    if os.geteuid() != 0:
        return "network faults need root (network namespaces and nftables)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"network faults need {tool!r} (apt-get install {package})"
    # A name of this process's own: the test suite's workers probe at the same time, and
    # with one shared name the second's "File exists" skipped its network-fault tests.
    probe = f"jlprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    try:
        r = subprocess.run(
            ["ip", "netns", "exec", probe, "nft", "-f", "-"],
            input=_NFT_TABLE,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            return f"nftables does not work in a network namespace: {r.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


_LOCKS = "/run/lock" if os.path.isdir("/run/lock") else "/tmp"


def _claim(tag: int | None) -> tuple[int, int]:
    """A tag (1-250) and the descriptor of the lock that holds it for this run.

    Runs side by side (the test suite runs two at once) must not share a tag: a run
    starts by removing whatever a run of its tag left behind, processes included.  The
    lock is ``flock`` on a file per tag, so it is released when its holder dies, however
    it dies; what a dead holder left behind is then cleaned by the next holder."""
    first = tag if tag is not None else os.getpid() % 250 + 1
    for i in range(1 if tag is not None else 250):
        t = (first - 1 + i) % 250 + 1
        fd = os.open(f"{_LOCKS}/jepsen_like-net-{t}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return t, fd
    raise RuntimeError(
        f"network tag {first} is held by another run"
        if tag is not None
        else "every network tag (1-250) is held by a run: too many runs at once"
    )


@dataclass(frozen=True)
class Host:
    name: str
    ns: str
    ip: str
    veth: str


class Net:
    """The namespaces, addresses and fault rules of one run."""

    def __init__(self, tag: int | None = None) -> None:
        self.tag, self._lock = _claim(tag)
        self.prefix = f"10.231.{self.tag}"
        self.gateway = f"{self.prefix}.1"
        """The runner's own address on the bridge: never cut, lossy or slow."""
        self.bridge = f"jlb{self.tag}"
        self.hosts: dict[str, Host] = {}
        self.sources: dict[str, str] = {}
        """Addresses of light clients in the runner's namespace, by name."""
        self._next = 2
        self._cut: set[str] = set()
        self._shaped: dict[str, str] = {}
        """What is in effect on each namespace besides cuts: ``loss``, ``stall`` or ``slow``."""
        self._clean(self.tag)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    @staticmethod
    def _clean(tag: int) -> None:
        """Remove what a run with the same tag left behind (it was killed)."""
        for line in _run("ip", "netns", "list", check=False).splitlines():
            ns = line.split()[0] if line.strip() else ""
            if ns.startswith(f"jl{tag}-"):
                for pid in _run("ip", "netns", "pids", ns, check=False).split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
                _run("ip", "netns", "del", ns, check=False)
        # A namespace can outlive its name for a while; its veth pair goes now.
        for line in _run("ip", "-o", "link", "show", check=False).splitlines():
            parts = line.split(":")
            link = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
            if link.startswith(f"jl{tag}v"):
                _run("ip", "link", "del", link, check=False)
        _run("ip", "link", "del", f"jlb{tag}", check=False)

    def _address(self) -> str:
        if self._next > 254:
            raise RuntimeError("no address left in the run's /24")
        ip = f"{self.prefix}.{self._next}"
        self._next += 1
        return ip

    def add(self, name: str) -> local.Place:
        """A namespace for the process ``name``; where it runs and listens."""
        if name in self.hosts:
            h = self.hosts[name]
            return local.Place(h.ip, ("ip", "netns", "exec", h.ns))
        ip = self._address()
        h = Host(name, f"jl{self.tag}-{name}", ip, f"jl{self.tag}v{ip.rsplit('.', 1)[1]}")
        _run("ip", "netns", "add", h.ns)
        _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
        _run("ip", "link", "set", h.veth, "master", self.bridge, "up")
        _run("ip", "-n", h.ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _run("ip", "-n", h.ns, "link", "set", "eth0", "up")
        _run("ip", "-n", h.ns, "link", "set", "lo", "up")
        self._nft(h, _NFT_TABLE)
        self.hosts[name] = h
        return local.Place(ip, ("ip", "netns", "exec", h.ns))

    def source(self, name: str) -> str:
        """An address of the runner's namespace for a light client ``name`` to connect
        from and serve on."""
        if name not in self.sources:
            ip = self._address()
            _run("ip", "addr", "add", f"{ip}/32", "dev", self.bridge)
            self.sources[name] = ip
        return self.sources[name]

    def ip(self, name: str) -> str:
        return self.hosts[name].ip if name in self.hosts else self.sources[name]

    def _nft(self, h: Host, script: str) -> None:
        _run("ip", "netns", "exec", h.ns, "nft", "-f", "-", stdin=script)

    # ------------------------------------------------------------------ faults
    def cut(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        """No packet between any process of ``side_a`` and any of ``side_b``."""
        a, b = list(side_a), list(side_b)
        for mine, theirs in ((a, b), (b, a)):
            for name in mine:
                h = self.hosts.get(name)
                others = sorted({self.ip(o) for o in theirs if o != name})
                if h is None or not others:
                    continue  # a light client: the other side's rules cover it
                self._nft(h, f"add element inet jl cut {{ {', '.join(others)} }}\n")
                self._cut.add(name)

    def loss(self, name: str, percent: int) -> None:
        """Drop ``percent`` % of the packets ``name`` sends and receives."""
        h = self.hosts[name]
        rules = "".join(
            f"add rule inet jl loss_{d} ip {a} {self.prefix}.0/24 ip {a} != {self.gateway} "
            f"numgen random mod 100 < {int(percent)} drop\n"
            for d, a in (("in", "saddr"), ("out", "daddr"))
        )
        self._nft(h, rules)
        self._shaped[name] = "loss"

    def stall(self, name: str) -> None:
        """Drop every packet ``name`` sends to the run's processes; it still receives."""
        rule = (f"add rule inet jl stall_out ip daddr {self.prefix}.0/24 "
                f"ip daddr != {self.gateway} drop\n")  # fmt: skip
        self._nft(self.hosts[name], rule)
        self._shaped[name] = "stall"

    def slow(self, name: str, kbit: int) -> None:
        """Limit ``name``'s link to ``kbit`` kbit/s each way (packets queue up to 1 s)."""
        h = self.hosts[name]
        spec = ["tbf", "rate", f"{int(kbit)}kbit", "burst", "16kb", "latency", "1s"]
        _run("ip", "netns", "exec", h.ns, "tc", "qdisc", "replace", "dev", "eth0", "root", *spec)
        _run("tc", "qdisc", "replace", "dev", h.veth, "root", *spec)
        self._shaped[name] = "slow"

    def heal(self) -> None:
        """Undo every cut, loss, stall and slow link."""
        for name in sorted(self._cut):
            h = self.hosts.get(name)
            if h is not None:
                self._nft(h, "flush set inet jl cut\n")
        self._cut.clear()
        for name, what in sorted(self._shaped.items()):
            h = self.hosts[name]
            if what == "loss":
                self._nft(h, "flush chain inet jl loss_in\nflush chain inet jl loss_out\n")
            elif what == "stall":
                self._nft(h, "flush chain inet jl stall_out\n")
            else:
                _run("ip", "netns", "exec", h.ns, "tc", "qdisc", "del", "dev", "eth0", "root",
                     check=False)  # fmt: skip
                _run("tc", "qdisc", "del", "dev", h.veth, "root", check=False)
        self._shaped.clear()

    def destroy(self) -> None:
        """Kill whatever still runs in the namespaces, then remove them and the bridge."""
        self._clean(self.tag)
        self.hosts.clear()
        self.sources.clear()
        if self._lock >= 0:
            os.close(self._lock)  # the tag is free for the next run
            self._lock = -1
