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


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """Every object made before the block left out of the collections inside it (as a
    process tuned to keep data leaves them, ``ecast.step_kept``), so that a collection
    there walks what the block made alone: a test that collects after each of hundreds
    of examples walked the whole heap of a test worker that had run a thousand other
    tests each time (189 s in one CI run, 7.8 s alone).  Whatever the block makes is
    still walked, so cyclic garbage among those objects is still found.  (Older
    garbage is frozen with the rest, uncollected, and freed after the block.)"""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
