"""Rubberband: elastic, sequentially consistent, successor-replicated storage on E-Cast
(dissertation chapter 4).

The client API: :func:`connect` and what its calls raise, all
:class:`RubberbandError` (:mod:`rubberband.errors` says which are safe to retry):
:class:`Unavailable`, :class:`Indeterminate`, :class:`BadOperation` (with
:class:`BadKey` and :class:`Rejected`) and, for reconfigurations, :class:`Refused`.  Names resolve
lazily, so importing ``rubberband`` starts nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "connect": "rubberband.sdk",
    "RubberbandClient": "rubberband.sdk",
    "RubberbandError": "rubberband.errors",
    "Unavailable": "rubberband.errors",
    "Indeterminate": "rubberband.errors",
    "BadOperation": "rubberband.errors",
    "BadKey": "rubberband.errors",
    "Rejected": "rubberband.errors",
    "Refused": "rubberband.errors",
    "RubberbandConfig": "rubberband.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rubberband' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
