"""What the queue commands share: a driver for one command, the actor, time formats."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import math
import os
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TypeAlias, TypeVar

from fleetq.core import migrate
from fleetq.core.db import resolve_dsn
from fleetq.core.driver import Driver, open_driver

T = TypeVar("T")


def run(args: argparse.Namespace, work: Callable[[Driver], Awaitable[T]]) -> T:
    """Run `work` on a fresh connection to the selected database."""

    async def main() -> T:
        async with open_driver(resolve_dsn(args.dsn)) as driver:
            await migrate.require_current_async(driver)
            return await work(driver)

    return asyncio.run(main())


def actor(args: argparse.Namespace) -> str:
    """Who is acting: --as, else $FLEETQ_ACTOR, else the login name."""
    return str(getattr(args, "actor", None) or os.environ.get("FLEETQ_ACTOR") or getpass.getuser())


def add_actor(parser: argparse.ArgumentParser) -> None:
    """--as IDENTITY, recorded with the action."""
    parser.add_argument(
        "--as",
        dest="actor",
        metavar="IDENTITY",
        help="who is acting (default: $FLEETQ_ACTOR, else your login name)",
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    """--json on every listing."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def age(at: datetime | None, now: datetime) -> str:
    """ "3s", "4m", "2h", "5d" ago (or ahead, for a lease that has not expired)."""
    if at is None:
        return ""
    return duration(now - at)


def duration(delta: timedelta) -> str:
    """A short human duration; negative means in the future."""
    seconds = int(delta.total_seconds())
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{sign}{seconds // size}{unit}"
    return f"{sign}{seconds}s"


Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

BIGINT_MAX = 2**63 - 1


def job_id_arg(text: str) -> int:
    """An argparse type: a job id (1 .. 2^63-1), refused as a usage error otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a positive integer)") from None
    if not 1 <= value <= BIGINT_MAX:
        raise argparse.ArgumentTypeError(f"{text} is not a job id (1 to {BIGINT_MAX})")
    return value


def token_arg(text: str) -> int:
    """An argparse type: a fencing token (1 .. 2^63-1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token (a positive integer)") from None
    if not 1 <= value <= BIGINT_MAX:
        raise argparse.ArgumentTypeError(f"{text} is not a token (1 to {BIGINT_MAX})")
    return value


def seconds_arg(text: str) -> float:
    """An argparse type: a finite, non-negative number of seconds (a --timeout): `nan`,
    `inf` and `-1` are typing mistakes, never "wait for ever"."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds (0 or more)")
    return value


def positive_arg(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a --limit, say)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= BIGINT_MAX:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value
