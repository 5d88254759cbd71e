"""What a router sends to application processes in one step, batched per destination.

Every step of a router may produce, for one application process, message copies to
deliver, unsafe copies, stable acknowledgements, rejections and single control messages.
They leave as few messages as order allows: consecutive copies become one ``Deliver``,
consecutive unsafe copies one ``DeliverUnsafe``, and all acknowledgements one ``Stable``.
Items are kept in typed runs, never told apart by their length.
"""

from __future__ import annotations

from typing import Any

from ecast.core.effects import NodeId
from ecast.core.message import Message, MsgId
from ecast.core.proto import Deliver, DeliverUnsafe, Forbidden, RejectedClosed, Stable

Ack = tuple[MsgId, int | None, bool]


class AppOutbox:
    __slots__ = ("acks", "boxes", "closed", "forbidden", "runs", "unsafe_runs")

    def __init__(self) -> None:
        self.boxes: dict[NodeId, list[Any]] = {}
        """Per process, in order: ``list`` runs of deliveries, ``tuple``-holding unsafe
        runs (``_UnsafeRun``) and whole messages."""
        self.runs: dict[NodeId, list[tuple[int, Message]]] = {}
        """The open delivery run of each process (the last entry of its box)."""
        self.unsafe_runs: dict[NodeId, _UnsafeRun] = {}
        self.acks: dict[NodeId, list[Ack]] = {}
        self.closed: dict[NodeId, list[MsgId]] = {}
        self.forbidden: dict[NodeId, list[MsgId]] = {}

    def deliver(self, p: NodeId, t: int, msg: Message) -> None:
        run = self.runs.get(p)
        if run is None:
            run = self.runs[p] = []
            box = self.boxes.get(p)
            if box is None:
                self.boxes[p] = [run]
            else:
                box.append(run)
                self.unsafe_runs.pop(p, None)
        run.append((t, msg))

    def replace_delivery(self, p: NodeId, t: int, msg: Message) -> None:
        """Send ``p`` its own copy of the message at ``t`` just queued for it."""
        run = self.runs.get(p)
        if run and run[-1][0] == t:
            run[-1] = (t, msg)

    def deliver_unsafe(self, p: NodeId, tag: int | None, frontier: int, msg: Message) -> None:
        run = self.unsafe_runs.get(p)
        if run is None:
            run = self.unsafe_runs[p] = _UnsafeRun()
            self.boxes.setdefault(p, []).append(run)
            self.runs.pop(p, None)
        run.items.append((tag, frontier, msg))

    def send(self, p: NodeId, msg: Any) -> None:
        """A whole message, after everything queued for ``p`` so far."""
        self.boxes.setdefault(p, []).append(msg)
        self.runs.pop(p, None)
        self.unsafe_runs.pop(p, None)

    def ack(self, p: NodeId, ack: Ack) -> None:
        box = self.acks.get(p)
        if box is None:
            self.acks[p] = [ack]
        else:
            box.append(ack)

    def reject_closed(self, p: NodeId, sid: MsgId) -> None:
        self.closed.setdefault(p, []).append(sid)

    def reject_forbidden(self, p: NodeId, sid: MsgId) -> None:
        self.forbidden.setdefault(p, []).append(sid)

    def flush(self, send: Any) -> int:
        """Hand every message to ``send(p, msg)``; return how many closed rejections."""
        for p, acks in self.acks.items():
            self.send(p, Stable(tuple(acks)))
        rejected = 0
        for p, ids in self.closed.items():
            rejected += len(ids)
            self.send(p, RejectedClosed(tuple(ids)))
        for p, ids in self.forbidden.items():
            self.send(p, Forbidden(tuple(ids)))
        for p, box in self.boxes.items():
            for item in box:
                t = type(item)
                if t is list:
                    send(p, Deliver(tuple(item)))
                elif t is _UnsafeRun:
                    send(p, DeliverUnsafe(tuple(item.items)))
                else:
                    send(p, item)
        self.boxes = {}
        self.runs = {}
        self.unsafe_runs = {}
        self.acks = {}
        self.closed = {}
        self.forbidden = {}
        return rejected


class _UnsafeRun:
    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[tuple[int | None, int, Message]] = []
