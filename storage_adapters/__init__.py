"""Storage engines for Rubberband: each implements the small protocol of
:mod:`storage_adapters.base` and imports nothing else of the project."""
