"""``check_all``: judge a history against the workload that produced it.

A runner stores, next to each history, the workload description it ran as JSON, so the
same call works on a live run and on a file found later::

    {"name": "list-append", "model": "sequential"}
    {"name": "list-append", "edges": ["ww", "wr", "rw", "process", "realtime"]}
    {"name": "bank", "accounts": [0, 1, 2, 3], "initial_balance": 10}
    {"name": "bank", "initial": {"a": 5, "b": 15}, "allow_negative": true}
    {"name": "multicast", "config": "ecast:KeyRingConfig", "config_args": {"replication": 3}}

The options objects of the checkers (``ListAppendOptions``, ``BankOptions``,
``MulticastOptions``) are accepted as well, and a name alone (``"list-append"``,
``"multicast"``) means its defaults.  A multicast history is E-Cast's own format
(:mod:`rubberband.checkers.multicast`), not operations.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rubberband.checkers import bank, list_append, multicast
from rubberband.checkers.bank import BankOptions
from rubberband.checkers.history import read_history
from rubberband.checkers.list_append import ListAppendOptions
from rubberband.checkers.multicast import MulticastOptions
from rubberband.checkers.result import DEFAULT_MAX_EXAMPLES, CheckResult

Workload = str | Mapping[str, Any] | ListAppendOptions | BankOptions | MulticastOptions
Options = ListAppendOptions | BankOptions | MulticastOptions


def workload_options(workload: Workload) -> Options:
    """The checker options a workload description asks for; unknown fields are errors."""
    if isinstance(workload, ListAppendOptions | BankOptions | MulticastOptions):
        return workload
    if isinstance(workload, str):
        workload = {"name": workload}
    spec = dict(workload)
    name = spec.pop("name", None)
    if name == "multicast":
        return MulticastOptions.from_spec(spec)
    max_examples = spec.pop("max_examples", DEFAULT_MAX_EXAMPLES)
    if name == "list-append":
        model = spec.pop("model", None)
        edges = spec.pop("edges", None)
        if model is not None and edges is not None:
            raise ValueError("give a list-append workload a model or edges, not both")
        options: dict[str, Any] = {"max_examples": max_examples}
        if model is not None:
            options["edges"] = list_append.MODELS.get(model)
            if options["edges"] is None:
                raise ValueError(f"unknown model {model!r}; known: {sorted(list_append.MODELS)}")
        if edges is not None:
            options["edges"] = frozenset(edges)
        for key in ("txn_fs", "final_read_fs"):
            if key in spec:
                options[key] = frozenset(spec.pop(key))
        _no_leftovers(name, spec)
        return ListAppendOptions(**options)
    if name == "bank":
        allow_negative = bool(spec.pop("allow_negative", False))
        if "initial" in spec:
            initial = spec.pop("initial")
            if "accounts" in spec or "initial_balance" in spec:
                raise ValueError("give a bank workload initial, or accounts and initial_balance")
        else:
            try:
                accounts = spec.pop("accounts")
                balance = spec.pop("initial_balance")
            except KeyError as missing:
                raise ValueError(f"a bank workload needs {missing}") from None
            initial = dict.fromkeys(accounts, balance)
        _no_leftovers(name, spec)
        return BankOptions(
            initial=initial, allow_negative=allow_negative, max_examples=max_examples
        )
    raise ValueError(f"unknown workload {name!r}; known: bank, list-append, multicast")


def _no_leftovers(name: str, spec: Mapping[str, Any]) -> None:
    if spec:
        raise ValueError(f"the {name} workload has no setting {sorted(spec)}")


def check_all(history: Any, workload: Workload) -> CheckResult:
    """Check a history (ops, or the path of a JSON-lines file; for the multicast workload
    an ``ecast.history.History`` or its file) against its workload."""
    options = workload_options(workload)
    if isinstance(options, MulticastOptions):
        return multicast.check(history, options)
    ops = read_history(history) if isinstance(history, str | os.PathLike) else history
    if isinstance(options, BankOptions):
        return bank.check(ops, options)
    return list_append.check(ops, options)
