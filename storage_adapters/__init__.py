"""Storage engines for Rubberband: each implements the small protocol of
:mod:`rubberband.engine` and imports nothing else of the project."""
