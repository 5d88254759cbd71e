"""The bank checker: transfers between accounts must never create or destroy money.

Operations: ``transfer`` with value ``{"from": a, "to": b, "amount": n}`` (integers), and
``read``, whose ``ok`` value maps accounts to balances (all accounts or some; JSON object
keys are strings, so ``"1"`` names account ``1``).  A read's ``level`` is Rubberband's
isolation level (4.5.2), sequential when absent.  Transfers that are ``ok`` happened,
``fail`` ones did not, and ``info`` ones may have happened.

What is checked, by level:

* every read, every level: each balance is a state the account could have passed
  through, i.e. its initial balance plus the effect of some subset of the transfers that
  may have happened (``impossible-balance``), and it is not negative when the workload
  forbids that (``negative-balance``); an account the workload lacks is ``garbage-read``;
* snapshot and sequential reads of all accounts: the total equals the initial total,
  since they see a consistent cut of the data (``wrong-total``);
* sequential reads, additionally: read-your-writes and writes-follow-reads per process
  (``read-your-writes``).  The read must include the reading process's earlier ``ok``
  transfers and exclude its later ones; because others' transfers may be ordered anywhere
  (sequential consistency does not follow real time), this is checked against the bounds
  that every subset of others' transfers leaves, so it only catches what those bounds
  cannot absorb (a quiet account, an early read, a large own transfer);
* basic reads of all accounts: a wrong total is allowed (a multi-key basic read may see
  part of a concurrent transfer) and is reported as the observation ``torn-basic-read``.

What cannot be checked from balances: monotonic reads (two reads with equal balances
may come from different states, and sums do not say which transfers a read saw), and
the order of other processes' transfers.  The list-append checker proves those.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rubberband.checkers.history import Call, HistoryError, Op, gc_paused, pair_calls
from rubberband.checkers.result import DEFAULT_MAX_EXAMPLES, CheckResult, Findings


@dataclass(frozen=True, slots=True)
class BankOptions:
    """The accounts, their initial balances, and what the workload forbids."""

    initial: Mapping[Hashable, int]
    allow_negative: bool = False
    transfer_f: str = "transfer"
    read_f: str = "read"
    view_f: str = "view-read"
    """Reads of an aggregate view of the accounts (``docs/views.md``): ``ok`` value
    ``{"total": sum, "accounts": count, "position": p}``."""
    max_examples: int = DEFAULT_MAX_EXAMPLES
    accounts: tuple[Hashable, ...] = field(init=False)

    def __post_init__(self) -> None:
        for account, balance in self.initial.items():
            if not isinstance(balance, int) or isinstance(balance, bool):
                raise ValueError(f"initial balance of {account!r} is not an integer")
        object.__setattr__(self, "accounts", tuple(self.initial))

    @classmethod
    def uniform(cls, accounts: Iterable[Hashable], balance: int, **kwargs: Any) -> BankOptions:
        return cls(initial=dict.fromkeys(accounts, balance), **kwargs)

    @property
    def total(self) -> int:
        return sum(self.initial.values())


class _Reachable:
    """The balances one account can show: initial plus any subset of possible transfers.

    Each transfer either applied or did not, a choice between adding 0 or ``|delta|`` to
    the lowest possible balance.  The sums of all subsets are a bounded knapsack, kept as
    bits of an integer and built by binary splitting, so a thousand transfers of the same
    amount cost ten shifts.
    """

    __slots__ = ("base", "table", "width")

    def __init__(self, initial: int, deltas: Iterable[int]) -> None:
        counts: dict[int, int] = {}
        base = initial
        for delta in deltas:
            if delta < 0:
                base += delta
            counts[abs(delta)] = counts.get(abs(delta), 0) + 1
        bits = 1
        for amount, count in counts.items():
            step = 1
            while count > 0:
                take = min(step, count)
                bits |= bits << (amount * take)
                count -= take
                step *= 2
        self.base = base
        self.width = bits.bit_length()
        self.table = bits.to_bytes((self.width + 7) // 8, "little")

    def __contains__(self, balance: int) -> bool:
        i = balance - self.base
        return 0 <= i < self.width and bool(self.table[i >> 3] >> (i & 7) & 1)


@dataclass(slots=True)
class _Transfer:
    call: Call
    deltas: dict[Hashable, int]


def _parse_transfer(call: Call, accounts: set[Hashable]) -> _Transfer:
    value = call.invoke.value
    if not isinstance(value, Mapping) or not {"from", "to", "amount"} <= value.keys():
        raise HistoryError(f"{call.describe()}: a transfer needs from, to and amount: {value!r}")
    source, target, amount = value["from"], value["to"], value["amount"]
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise HistoryError(f"{call.describe()}: amount {amount!r} is not an integer")
    for account in (source, target):
        if account not in accounts:
            raise HistoryError(f"{call.describe()}: the workload has no account {account!r}")
    deltas: dict[Hashable, int] = {}
    if source != target and amount:
        deltas = {source: -amount, target: amount}
    return _Transfer(call, deltas)


def _parse_read(
    call: Call, by_name: Mapping[str, Hashable]
) -> tuple[dict[Hashable, int], list[Any], list[Hashable]]:
    """A read's balances by account, the names of accounts the workload lacks, and the
    accounts the read found no balance for."""
    value = call.completion.value if call.completion is not None else None
    if not isinstance(value, Mapping):
        raise HistoryError(f"{call.describe()}: a read returns an object of balances: {value!r}")
    balances: dict[Hashable, int] = {}
    unknown: list[Any] = []
    missing: list[Hashable] = []
    for name, balance in value.items():
        account = by_name.get(str(name))
        if account is None:
            unknown.append(name)
            continue
        if balance is None:
            missing.append(account)  # the read found no such key: an anomaly, not bad input
            continue
        if not isinstance(balance, int) or isinstance(balance, bool):
            raise HistoryError(f"{call.describe()}: balance {balance!r} is not an integer")
        balances[account] = balance
    return balances, unknown, missing


def _fmt_balances(balances: Mapping[Hashable, int]) -> str:
    return "{" + ", ".join(f"{a}: {b}" for a, b in balances.items()) + "}"


def check_calls(calls: Sequence[Call], options: BankOptions) -> CheckResult:
    """Check paired calls of a bank workload; see the module docstring for what is proved."""
    return _BankCheck(calls, options).run()


class _BankCheck:
    """One check of a bank history: the transfers that may have happened and the bounds
    they put on every account, then each read judged against them."""

    def __init__(self, calls: Sequence[Call], options: BankOptions) -> None:
        self.started = time.perf_counter()
        self.calls = calls
        self.options = options
        self.findings = Findings(options.max_examples)
        self.accounts = set(options.accounts)
        self.by_name = {str(account): account for account in options.accounts}
        self.transfers: dict[int, _Transfer] = {}
        """Position in calls -> a transfer that may have happened (ok or info)."""
        self.outcomes = {"ok": 0, "info": 0, "fail": 0}
        for position, call in enumerate(calls):
            if call.f == options.transfer_f:
                transfer = _parse_transfer(call, self.accounts)
                self.outcomes[call.outcome] += 1
                if call.outcome != "fail":
                    self.transfers[position] = transfer
        self._bounds()

    def _bounds(self) -> None:
        """Every account's reachable balances, and how far all transfers (and each
        process's own) can move it down or up."""
        self.deltas: dict[Hashable, list[int]] = {account: [] for account in self.accounts}
        self.low_all = dict.fromkeys(self.accounts, 0)
        self.high_all = dict.fromkeys(self.accounts, 0)
        self.low_own: dict[str, dict[Hashable, int]] = {}
        self.high_own: dict[str, dict[Hashable, int]] = {}
        for transfer in self.transfers.values():
            process = transfer.call.process
            for account, delta in transfer.deltas.items():
                self.deltas[account].append(delta)
                if delta < 0:
                    bounds_all, bounds_own = self.low_all, self.low_own
                else:
                    bounds_all, bounds_own = self.high_all, self.high_own
                bounds_all[account] += delta
                own = bounds_own.setdefault(process, {})
                own[account] = own.get(account, 0) + delta
        self.reachable = {
            account: _Reachable(self.options.initial[account], deltas)
            for account, deltas in self.deltas.items()
        }

    def run(self) -> CheckResult:
        # Per process, as its calls are met in order: the sum of its ok transfers so far,
        # and the bounds its earlier info transfers (which may or may not have applied) add.
        self.mandatory: dict[str, dict[Hashable, int]] = {}
        self.earlier_info: dict[str, tuple[dict[Hashable, int], dict[Hashable, int]]] = {}
        self.earlier_ok: dict[str, list[_Transfer]] = {}
        reads = {"sequential": 0, "snapshot": 0, "basic": 0}
        views: dict[str, int] = {}
        self.view_positions: dict[str, int] = {}
        for position, call in enumerate(self.calls):
            transfer = self.transfers.get(position)
            if transfer is not None:
                self._transfer_met(call, transfer)
            elif call.f == self.options.read_f and call.outcome == "ok":
                reads[call.level] += 1
                self._read(call)
            elif call.f == self.options.view_f and call.outcome == "ok":
                views[call.level] = views.get(call.level, 0) + 1
                self._view_read(call)
        options, outcomes = self.options, self.outcomes
        stats: dict[str, Any] = {
            "accounts": len(self.accounts),
            "total": options.total,
            "transfers_ok": outcomes["ok"],
            "transfers_info": outcomes["info"],
            "transfers_fail": outcomes["fail"],
            "reads_sequential": reads["sequential"],
            "reads_snapshot": reads["snapshot"],
            "reads_basic": reads["basic"],
            **{f"view_reads_{level}": n for level, n in sorted(views.items())},
            "seconds": round(time.perf_counter() - self.started, 3),
        }
        return self.findings.result("bank", stats, checked_anything=sum(reads.values()) > 0)

    def _transfer_met(self, call: Call, transfer: _Transfer) -> None:
        process = call.process
        if call.outcome == "ok":
            own = self.mandatory.setdefault(process, {})
            for account, delta in transfer.deltas.items():
                own[account] = own.get(account, 0) + delta
            self.earlier_ok.setdefault(process, []).append(transfer)
        else:
            low, high = self.earlier_info.setdefault(process, ({}, {}))
            for account, delta in transfer.deltas.items():
                side = low if delta < 0 else high
                side[account] = side.get(account, 0) + delta

    def _view_read(self, call: Call) -> None:
        """An ok read of the accounts' aggregate view, at any level: a view is exact at
        the position it reports, so it shows the initial total and every account
        (``view-wrong-total``); a process's reads at sequential and read-your-writes
        level never report an earlier position than its earlier ones
        (``view-position-back``)."""
        value = call.value if isinstance(call.value, Mapping) else {}
        total, count, at = value.get("total"), value.get("accounts"), value.get("position")
        who = f"{call.describe()} ({call.level})"
        if total != self.options.total or count != len(self.accounts):
            self.findings.anomaly(
                "view-wrong-total",
                f"{who} read the view's total {total} over {count} accounts at position "
                f"{at}; every position has {self.options.total} over {len(self.accounts)}.",
            )
        if call.level in ("sequential", "read-your-writes") and isinstance(at, int):
            last = self.view_positions.get(call.process, -1)
            if at < last:
                self.findings.anomaly(
                    "view-position-back",
                    f"{who} reported position {at} after this process had read the view at {last}.",
                )
            self.view_positions[call.process] = max(last, at)

    def _read(self, call: Call) -> None:
        """One ok read: every balance reachable, the total kept (but by a basic read),
        and a sequential read's own earlier transfers seen."""
        options, findings = self.options, self.findings
        level = call.level
        balances, unknown, missing = _parse_read(call, self.by_name)
        who = f"{call.describe()} ({level})"
        for name in unknown:
            findings.anomaly("garbage-read", f"{who} returned account {name!r}, which is unknown.")
        for account in missing:
            findings.anomaly(
                "missing-account",
                f"{who} found no balance for account {account}, which exists from the start "
                "(at any isolation level a read sees some value the account had).",
            )
        impossible: set[Hashable] = set()
        for account, balance in balances.items():
            if balance < 0 and not options.allow_negative:
                findings.anomaly(
                    "negative-balance",
                    f"{who} saw account {account} at {balance}; the workload forbids negative "
                    "balances.",
                )
            if balance not in self.reachable[account]:
                impossible.add(account)
                findings.anomaly(
                    "impossible-balance",
                    f"{who} saw account {account} at {balance}, which no subset of the "
                    f"{len(self.deltas[account])} transfers that may have happened "
                    f"(ok or info) gives from its initial {options.initial[account]}.",
                )
        if len(balances) == len(self.accounts) and not unknown:
            total = sum(balances.values())
            if total != options.total:
                text = (
                    f"{who} saw {_fmt_balances(balances)}, totalling {total}; transfers keep "
                    f"the total at {options.total}"
                )
                if level == "basic":
                    findings.observation(
                        "torn-basic-read",
                        text + ". A basic read may see part of a concurrent transfer.",
                    )
                else:
                    findings.anomaly("wrong-total", text + ", so this is not a consistent cut.")
        if level == "sequential":
            self._own_transfers_seen(call, who, balances, impossible)

    def _own_transfers_seen(
        self, call: Call, who: str, balances: dict[Hashable, int], impossible: set[Hashable]
    ) -> None:
        """Read your writes: a sequential read lies between the balances its process's
        own ok transfers (applied) and its later ones (not applied) allow."""
        process = call.process
        own = self.mandatory.get(process, {})
        info_low, info_high = self.earlier_info.get(process, ({}, {}))
        own_low, own_high = self.low_own.get(process, {}), self.high_own.get(process, {})
        for account, balance in balances.items():
            if account in impossible:
                continue
            base = self.options.initial[account] + own.get(account, 0)
            low = base + self.low_all[account] - own_low.get(account, 0) + info_low.get(account, 0)
            high = (
                base + self.high_all[account] - own_high.get(account, 0) + info_high.get(account, 0)
            )
            if low <= balance <= high:
                continue
            mine = [t for t in self.earlier_ok.get(process, []) if account in t.deltas]
            self.findings.anomaly(
                "read-your-writes",
                f"{who} saw account {account} at {balance}; with the process's own earlier "
                f"ok transfers on it applied ({len(mine)}, net {own.get(account, 0):+d}"
                f"{f', the last invoked at index {mine[-1].call.invoke_index}' if mine else ''})"
                f" and its later ones not, the balance lies between {low} and {high}, "
                "whatever other processes' transfers applied.",
            )


def check(history: Iterable[Op], options: BankOptions) -> CheckResult:
    """Check a bank history; invalid if any anomaly, unknown if no read completed."""
    with gc_paused():
        return check_calls(pair_calls(history), options)
