"""The engine protocol under its first name: engines written against
``storage_adapters.base`` keep working.  The protocol is Rubberband's, and lives in
:mod:`rubberband.engine`; new engines import it from there."""

from __future__ import annotations

from rubberband.engine import *  # noqa: F403
from rubberband.engine import __all__ as __all__
