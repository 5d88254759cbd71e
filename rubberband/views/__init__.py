"""Materialized views maintained from the total order, readable exactly as of a position
(``docs/views.md``): definitions (:mod:`.define`), rows from base changes
(:mod:`.compute`), the sans-I/O maintainer (:mod:`.maintain`), and the client calls
(:mod:`.client`)."""

from rubberband.views.client import LEVELS, View, create_view, drop_view, list_views, maintain
from rubberband.views.define import ViewDef, view_def

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
