"""Materialized views maintained from the total order, readable exactly as of a position
(``docs/views.md``): definitions (:mod:`.define`), rows from base changes
(:mod:`.compute`), the sans-I/O maintainer (:mod:`.maintain`) and protocols
(:mod:`.steps`), and the client calls that drive them (:mod:`.client`)."""

from rubberband.views.client import View, create_view, drop_view, list_views, maintain
from rubberband.views.define import ViewDef, view_def
from rubberband.views.steps import LEVELS

__all__ = [
    "LEVELS",
    "View",
    "ViewDef",
    "create_view",
    "drop_view",
    "list_views",
    "maintain",
    "view_def",
]
