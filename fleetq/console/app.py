"""The console application (being built for issue #6)."""

from __future__ import annotations


def run_console(dsn: str, *, readonly: bool = False, title: str | None = None) -> None:
    """Run the console on `dsn` until the operator quits (blocks)."""
    raise NotImplementedError("the console arrives with issue #6")
