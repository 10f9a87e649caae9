"""Benchmarks that need no server."""
