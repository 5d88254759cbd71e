"""One exception hierarchy for every Rubberband call, exported from ``rubberband``."""

from __future__ import annotations

import pytest

import ecast
import rubberband
from rubberband import engine, keys
from rubberband.client import ClientCore
from storage_adapters.memory import KVOps


def test_every_error_is_a_rubberband_error_exported_from_the_package() -> None:
    for name in ("Unavailable", "Indeterminate", "BadOperation", "BadKey", "Rejected", "Refused"):
        assert issubclass(getattr(rubberband, name), rubberband.RubberbandError), name
        assert name in rubberband.__all__
    # One class each, wherever a module names it (engines import them from the engine
    # protocol, key code from the key algebra).
    assert rubberband.BadOperation is engine.BadOperation
    assert rubberband.BadKey is keys.BadKey is engine.BadKey


def test_what_each_error_also_is() -> None:
    """Handlers written for the standard exceptions, or for E-Cast's, catch them too."""
    assert issubclass(rubberband.Unavailable, ecast.Unavailable)
    assert issubclass(rubberband.Indeterminate, TimeoutError)
    assert issubclass(rubberband.Rejected, rubberband.BadOperation)
    assert issubclass(rubberband.BadKey, rubberband.BadOperation)
    assert issubclass(rubberband.BadOperation, ValueError)
    assert str(rubberband.Unavailable("no holder is left")) == "no holder is left"


@pytest.mark.parametrize(
    "op",
    [
        ("get", ()),  # names no key
        ("get", ([1],)),  # a list is no key
        ("frobnicate", (1,)),  # no such operation
    ],
)
def test_a_bad_operation_raises_at_the_call_as_a_rubberband_error(op: tuple) -> None:
    core = ClientCore(KVOps())
    with pytest.raises(rubberband.BadOperation) as caught:
        core.read(op, "sequential", 0.0)
    assert isinstance(caught.value, rubberband.RubberbandError)
