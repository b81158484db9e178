"""``ditgate bench`` (placeholder parsers are added by the bench module when it lands)."""

from __future__ import annotations


def add_bench_parsers(sub) -> None:
    return None
