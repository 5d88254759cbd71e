"""Jepsen-style testing of E-Cast and Rubberband: nemeses, workloads, checkers and the runner."""
