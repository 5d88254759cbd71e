"""The m-seq a router learned, with the configs it induces (3.5.3, 3.5.5, Figure 3.4).

Timestamps are absolute: ``t`` is a message's index in the one m-seq every router agrees
on, and it is never re-based when the stable prefix is collected.  ``configs`` is the
chain of ``Config`` values: ``configs[i]`` routes every message with
``starts[i] <= t < starts[i + 1]`` (the config of the prefix before it).  A new config is
stored only where ``apply`` changes it.  Collecting the stable prefix drops its messages
and every config that no remaining message needs.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from ecast.core.config import Config, config_path, restore_config
from ecast.core.message import Message


class MSeq:
    __slots__ = ("configs", "entries", "floor", "next_t", "stable", "starts")

    def __init__(self, config: Config) -> None:
        self.next_t = 0
        self.floor = 0
        """Every message with ``t < floor`` is stable and collected."""
        self.entries: dict[int, Message] = {}
        self.stable: set[int] = set()
        """Stable timestamps at or above ``floor`` (waiting for the ones below them)."""
        self.starts: list[int] = [0]
        self.configs: list[Config] = [config]

    # ------------------------------------------------------------------ growth
    def append(self, msg: Message, apply_config: bool = True) -> int:
        t = self.next_t
        self.entries[t] = msg
        self.next_t = t + 1
        if apply_config:
            current = self.configs[-1]
            nxt = current.apply(msg)
            if nxt is not current:
                self.starts.append(t + 1)
                self.configs.append(nxt)
        return t

    def config_for(self, t: int) -> Config:
        """The config of the prefix before ``t`` (``t == next_t``: the latest one)."""
        return self.configs[bisect_right(self.starts, t) - 1]

    @property
    def latest(self) -> Config:
        return self.configs[-1]

    # ------------------------------------------------------------------ stability and GC
    def mark_stable(self, t: int) -> bool:
        if t < self.floor or t >= self.next_t or t in self.stable:
            return False
        self.stable.add(t)
        return True

    def is_stable(self, t: int) -> bool:
        return t < self.floor or t in self.stable

    def collect(self) -> int:
        """Drop the stable prefix and the configs only it needed; return how many went."""
        floor = self.floor
        stable = self.stable
        entries = self.entries
        start = floor
        while floor in stable:
            stable.discard(floor)
            entries.pop(floor, None)
            floor += 1
        self.floor = floor
        starts = self.starts
        while len(starts) > 1 and starts[1] <= floor:
            del starts[0]
            del self.configs[0]
        return floor - start

    def unstable(self) -> int:
        return self.next_t - self.floor - len(self.stable)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> dict[str, Any]:
        """A plain, self-contained copy (configs serialized), for a joining router."""
        return {
            "next_t": self.next_t,
            "floor": self.floor,
            "entries": [(t, m) for t, m in self.entries.items()],
            "stable": sorted(self.stable),
            "configs": [
                (s, config_path(c), c.to_state())
                for s, c in zip(self.starts, self.configs, strict=True)
            ],
        }

    @classmethod
    def restore(cls, state: dict[str, Any]) -> MSeq:
        chain = state["configs"]
        m = cls(restore_config(chain[0][1], chain[0][2]))
        m.starts = [s for s, _p, _c in chain]
        m.configs = [restore_config(p, c) for _s, p, c in chain]
        m.next_t = state["next_t"]
        m.floor = state["floor"]
        # Messages arrive as plain arrays when the snapshot crossed the wire.
        m.entries = {
            t: msg if type(msg) is Message else Message(*msg) for t, msg in state["entries"]
        }
        m.stable = set(state["stable"])
        return m
