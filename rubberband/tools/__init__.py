"""Rubberband's command-line tools (``rubberband ...``)."""
