"""What a block of code leaves to the cyclic collector."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def garbage_kept() -> Iterator[list[Any]]:
    """Automatic collections off, and what a collection finds unreachable kept in the
    yielded list: the cyclic garbage made inside the block (a collection runs first, so
    nothing older is in it)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
