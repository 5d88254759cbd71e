"""``ecast cost``: CPU time per stable message of each role, without sockets or scheduling.

On a shared machine a whole-cluster run (``ecast bench``) varies by 15 % or more from run
to run, and the CPU a process spends per message varies with it (smaller batches cost more
per message), so neither tells whether a code change made a role cheaper.  This drives
the same protocol cores in one process, in a fixed round-robin over virtual time: routers,
a closed-loop client and the receivers, every message encoded with the real codec into one
packet per destination process and decoded again, exactly as the runtime does.  The CPU
time of each call into a core, of the encoding of its output and of the decoding of its
input is charged to its role; divided by the stable acknowledgements it gives
microseconds per message per role.  Each packet also gets its integrity tag on the way out
and has it checked on the way in (``ecast.runtime.transport.PacketMac``), as on a
connection; ``--no-integrity`` leaves that out, to see its cost.  What it leaves out: the
link layer, system calls and the event loop.  The workload is deterministic; the timing is
the machine's.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import Counter, defaultdict
from typing import Any

from ecast.core.config import KeyRingConfig
from ecast.core.effects import Effects, NodeId, carry_out
from ecast.core.endpoint import Acked, Endpoint, EndpointParams
from ecast.core.link import Frame
from ecast.core.router import Router, RouterParams
from ecast.core.ufabcast.params import UfabParams
from ecast.runtime.transport import TAG, PacketMac
from ecast.wire.codec import Encoder
from ecast.wire.packet import array_header, decode_packet, frame_item

TICK = 0.002
"""Virtual seconds per round: every node gets one step per round."""


class _ByDestination:
    """A core's sends grouped per destination, as a link layer's flush groups them."""

    def __init__(self) -> None:
        self.boxes: defaultdict[NodeId, list[Any]] = defaultdict(list)

    def send(self, peer: NodeId, msg: Any) -> None:
        self.boxes[peer].append(msg)

    def forget(self, peer: NodeId) -> None:
        pass

    def drop(self, peer: NodeId) -> None:
        pass


class Pipeline:
    """The cores of a cluster wired together through the codec, stepped in a fixed order."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.routers = [f"r{i + 1}" for i in range(args.routers)]
        cfg = KeyRingConfig.initial(replication=args.replication)
        ufab = UfabParams(
            clump_trigger=3 if args.clumping else 1,
            clump_delay=0.010 if args.clumping else 0.0,
        )
        rparams = RouterParams(ufab=ufab, delayed_acks=args.delayed_acks)
        self.nodes: dict[NodeId, Any] = {
            r: Router(r, cfg, rparams, routers=self.routers) for r in self.routers
        }
        self.receivers = [f"d{i}" for i in range(args.receivers)]
        for d in self.receivers:
            self.nodes[d] = Endpoint(d, self.routers)
        self.client = Endpoint("c", self.routers, EndpointParams(max_window=args.window))
        self.nodes["c"] = self.client
        # Receivers share one OS process, as in ``ecast bench``: one packet for all of them.
        self.process = {n: "receivers" if n in self.receivers else n for n in self.nodes}
        self.role = {"c": "client", "receivers": "receivers", self.routers[0]: "leader"}
        for r in self.routers[1:]:
            self.role[r] = "followers"
        self.payload = bytes(args.payload)
        self.window = args.window
        self.cpu: Counter[tuple[str, str]] = Counter()
        """CPU seconds by (role, part): ``core`` (calls into the cores), ``encode``, ``decode``."""
        self.acked = 0
        self.now = 0.0
        self.key = 0
        self._inbox: defaultdict[NodeId, list[tuple[NodeId, tuple[Any, ...]]]] = defaultdict(list)
        self._wake: dict[NodeId, float] = {}
        self._seq = 0
        self._enc = Encoder()
        self.integrity = args.integrity
        self._macs: dict[tuple[str, str], tuple[PacketMac, PacketMac]] = {}
        """Per pair of processes: the sender's and the receiver's side of one direction."""
        for d in self.receivers:
            self._emit(d, self.nodes[d].join(self.now, role="receiver")[1])
        self._emit("c", self.client.join(self.now, role="client")[1])

    def _emit(self, src: NodeId, fx: Effects) -> None:
        if fx.wake_at is not None:
            self._wake[src] = fx.wake_at
        if src == "c":
            self.acked += sum(type(d) is Acked for d in fx.deliver)
        if not fx.send:
            return
        by_dst = _ByDestination()
        carry_out(fx, by_dst)
        packets: defaultdict[str, list[Any]] = defaultdict(list)
        for dst, msgs in by_dst.boxes.items():
            self._seq += 1
            packets[self.process[dst]].append(
                frame_item(src, dst, Frame(1, 1, self._seq, 0, tuple(msgs)))
            )
        clock = time.perf_counter
        t0 = clock()
        encoded = {}
        tags = {}
        here = self.process[src]
        for p, items in packets.items():
            parts = self._enc.pack_packet(items)  # as the runtime does, less the writev
            encoded[p] = array_header(len(parts)) + b"".join(parts)
            if self.integrity:  # over the joined body, as the runtime tags a packet it joins
                tags[p] = self._mac(here, p)[0].tag_body(encoded[p])
        self._enc.reset()
        self.cpu[self.role[here], "encode"] += clock() - t0
        for p, tag in tags.items():
            encoded[p] += tag  # the tag follows the body on the wire; not the sender's work
        for p, data in encoded.items():
            t0 = clock()
            if self.integrity:
                if not self._mac(here, p)[1].verify(data):
                    raise AssertionError("a packet failed its integrity check")
                data = memoryview(data)[:-TAG]
            items = decode_packet(data)
            self.cpu[self.role[p], "decode"] += clock() - t0
            for s, d, frame in items:
                self._inbox[d].append((s, frame.msgs))

    def _mac(self, src: str, dst: str) -> tuple[PacketMac, PacketMac]:
        pair = self._macs.get((src, dst))
        if pair is None:
            key = f"{src}->{dst}".encode().ljust(32, b"k")
            pair = self._macs[src, dst] = (PacketMac(key), PacketMac(key))
        return pair

    def _step(self, n: NodeId) -> None:
        node = self.nodes[n]
        role = self.role[self.process[n]]
        clock = time.perf_counter
        batch = self._inbox.pop(n, None)
        if batch:
            t0 = clock()
            if isinstance(node, Router):
                fx = node.on_batch(batch, self.now)
            else:
                fx = Effects()
                for s, msgs in batch:
                    f = node.on_messages(s, msgs, self.now)
                    fx.send += f.send
                    fx.deliver += f.deliver
                    fx.wake(f.wake_at)
            self.cpu[role, "core"] += clock() - t0
            self._emit(n, fx)
        if self._wake.get(n, 0.0) <= self.now:
            t0 = clock()
            fx = node.on_tick(self.now)
            self.cpu[role, "core"] += clock() - t0
            self._emit(n, fx)

    def run(self, rounds: int) -> None:
        order = [*self.routers, "c", *self.receivers]
        clock = time.perf_counter
        for _ in range(rounds):
            self.now += TICK
            if len(self.client.queued) < self.window:  # closed loop: keep it full
                t0 = clock()
                items = [(self.payload, {"key": self.key + i}) for i in range(self.window)]
                self.key += self.window
                fx = self.client.submit_many(items, self.now)[1]
                self.cpu["client", "core"] += clock() - t0
                self._emit("c", fx)
            for n in order:
                self._step(n)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    pipe = Pipeline(args)
    # The daemons run with the collector tuned the same way (ecast.runtime); restored
    # after, for callers that go on (tests).
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)
    try:
        pipe.run(args.warmup_rounds)
        pipe.cpu.clear()
        pipe.acked = 0
        wall0 = time.perf_counter()
        pipe.run(args.rounds)
        wall = time.perf_counter() - wall0
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    if not pipe.acked:
        raise SystemExit("ecast cost: no message became stable; nothing to divide by")
    per: dict[str, dict[str, float]] = {}
    for (role, part), secs in sorted(pipe.cpu.items()):
        per.setdefault(role, {})[part] = secs / pipe.acked * 1e6
    for parts in per.values():
        parts["total"] = sum(parts.values())
        for part, us in parts.items():
            parts[part] = round(us, 2)
    return {
        "stable_messages": pipe.acked,
        "us_per_message": per,
        "total_us_per_message": round(sum(pipe.cpu.values()) / pipe.acked * 1e6, 2),
        "wall_us_per_message": round(wall / pipe.acked * 1e6, 2),
        "routers": args.routers,
        "receivers": args.receivers,
        "replication": args.replication,
        "payload_bytes": args.payload,
        "window": args.window,
        "clumping": args.clumping,
        "delayed_acks": args.delayed_acks,
        "integrity": args.integrity,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ecast cost", description=__doc__.split("\n")[0])
    ap.add_argument("--routers", type=int, default=3)
    ap.add_argument("--receivers", type=int, default=16)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument("--payload", type=int, default=256, help="bytes")
    ap.add_argument("--window", type=int, default=1024, help="the client's messages in flight")
    ap.add_argument("--rounds", type=int, default=1000, help="measured rounds (2 ms virtual)")
    ap.add_argument("--warmup-rounds", type=int, default=300)
    ap.add_argument("--clumping", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--delayed-acks", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument(
        "--integrity",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tag and check every packet as connections do",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.routers < 1 or args.receivers < args.replication or args.window < 1:
        ap.error("need routers >= 1, receivers >= replication and window >= 1")
    result = measure(args)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'µs per stable message':<22} {'core':>8} {'encode':>8} {'decode':>8} {'total':>8}")
        for role, parts in result["us_per_message"].items():
            cols = " ".join(f"{parts.get(p, 0.0):8.2f}" for p in ("core", "encode", "decode"))
            print(f"{role:<22} {cols} {parts['total']:8.2f}")
        print(f"{'all roles':<22} {'':26} {result['total_us_per_message']:8.2f}")
        print(f"{result['stable_messages']} stable messages; wall "
              f"{result['wall_us_per_message']} µs each")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
