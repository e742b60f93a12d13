"""`fleetq-runner`: serve lanes of the fleet queue on this node."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from fleetq.core.db import as_uri, resolve_dsn
from fleetq.core.errors import FleetqError
from fleetq.runner import config as runner_config
from fleetq.runner import metrics, orphans, tracing
from fleetq.runner.service import RunnerService
from fleetq.runner.signals import install_signals


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 64 (EX_USAGE), as every fleetq command's do, not argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(64, f"{self.prog}: error: {message}\n")


def _lane(value: str) -> tuple[str, int]:
    lane, sep, slots = value.partition("=")
    if not sep or not lane or not slots.isdigit() or int(slots) < 1:
        raise argparse.ArgumentTypeError(
            f"--lane wants LANE=SLOTS with SLOTS at least 1 (e.g. checks=4), got {value!r}"
        )
    return lane, int(slots)


def build_parser() -> argparse.ArgumentParser:
    """The runner's command line."""
    p = _Parser(
        prog="fleetq-runner",
        description="Claim and run fleetq jobs on this node: only jobs whose lane it serves, "
        "whose capabilities it has, and that fit its free slots, memory and CPUs. With no "
        "--dsn and no FLEETQ_DSN it uses this machine's embedded PostgreSQL.",
        epilog="Signals: SIGTERM or SIGINT stops claiming and lets running jobs finish for "
        "--grace seconds (a second one stops them at once); SIGUSR1 logs where each of the "
        "runner's tasks waits, SIGUSR2 its threads' stacks (for a runner that seems stuck).",
    )
    p.add_argument("--node", help="this node's name (required, here or in --config)")
    p.add_argument("--name", help="this runner's name on the node (default: runner)")
    p.add_argument(
        "--lane",
        action="append",
        type=_lane,
        default=[],
        metavar="LANE=SLOTS",
        help="serve LANE with SLOTS parallel jobs (repeatable)",
    )
    p.add_argument(
        "--capability",
        action="append",
        default=[],
        metavar="CAP",
        help="advertise a capability, e.g. browser (repeatable)",
    )
    p.add_argument("--memory-mb", type=int, help="memory to offer (default: total minus 512)")
    p.add_argument("--cpus", type=float, help="CPUs to offer (default: the CPU count)")
    p.add_argument("--dsn", help="PostgreSQL connection URI (default: $FLEETQ_DSN, else embedded)")
    p.add_argument(
        "--api",
        metavar="URL",
        help="reach the queue through `fleetq api` at URL (https://… in production) instead "
        "of a DSN: this node then holds no database credentials, only --token-file",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="with --api: this runner's token (`fleetq tokens add runner NODE/NAME`), a "
        "file only its owner may read",
    )
    p.add_argument(
        "--api-ca",
        type=Path,
        metavar="PEM",
        help="with --api https://…: trust this CA for the API's certificate (default: the "
        "system's)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="runner.toml",
        help="read these settings from a TOML file (flags win)",
    )
    p.add_argument(
        "--work-dir", type=Path, help="staging, mirrors and logs (default: $FLEETQ_HOME/runners)"
    )
    p.add_argument("--keep-failed", action="store_true", help="keep staged trees of failed jobs")
    p.add_argument(
        "--grace",
        type=float,
        dest="grace_s",
        metavar="SECONDS",
        help="on SIGTERM, let running jobs finish this long (default 30)",
    )
    p.add_argument("--batch", type=int, help="claim at most this many jobs at once (default 32)")
    p.add_argument(
        "--poll",
        type=float,
        dest="poll_interval_s",
        metavar="SECONDS",
        help="poll this often when no notification arrives (default 1); polls that find "
        "nothing back off, each twice as long, up to --poll-max",
    )
    p.add_argument(
        "--poll-max",
        type=float,
        dest="poll_max_s",
        metavar="SECONDS",
        help="the longest wait between polls while idle (default 10, through --api 30); a "
        "notification resets it",
    )
    p.add_argument(
        "--exit-when-drained", action="store_true", help="exit once drained (after `fleetq drain`)"
    )
    p.add_argument(
        "--orphans",
        choices=["kill", "adopt"],
        help="kill (default): job processes die with the runner; adopt: they outlive it and "
        "a restarted runner adopts them",
    )
    users = p.add_mutually_exclusive_group()
    users.add_argument(
        "--job-uid-range",
        metavar="FIRST-LAST",
        help="run each command job as a uid of its own from FIRST-LAST (e.g. 61000-61031), "
        "leased to that job alone and returned when it ends, after whatever still runs "
        "under it is killed: jobs can read neither the runner's credentials nor each "
        "other's trees, logs and mirrors. The runner must be root; the range needs a uid "
        "per slot of all lanes together, may not hold 0 or the runner's uid, and must be "
        "this runner's alone (uids need no user: one without gets a group of its number)",
    )
    users.add_argument(
        "--job-user",
        metavar="USER",
        help="a --job-uid-range of one: run command jobs as USER (its uid and groups), for "
        "a runner with one slot in all. Without either, command jobs run as the runner's "
        "own uid and can read what it reads, its credentials included (a passfile named on "
        "its command line): on a node that runs others' code, run it as root with "
        "--job-uid-range",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every claim")
    return p


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked beyond what argparse does itself."""
    parser = build_parser()
    args = parser.parse_args(argv)
    lanes = [lane for lane, _ in args.lane]
    if repeated := sorted({lane for lane in lanes if lanes.count(lane) > 1}):
        parser.error(f"--lane names {', '.join(repeated)} more than once (give each lane once)")
    return args


# The young generation is collected after this many allocations (Python's default: 700).
YOUNG_COLLECTION_EVERY = 10_000


def settle_heap() -> None:
    """Keep the cyclic garbage collector off what lives as long as the runner.

    A full collection walks every tracked object, and most of a runner's are its start-up
    heap (its imports: pydantic, asyncpg, ...), which is never garbage; each job allocates
    a handful of short-lived containers (its task, coroutine, context, futures), which
    reach the young generation's threshold every few dozen jobs, and under a backlog the
    full collections were a tenth of a runner's CPU. With the start-up heap frozen (moved
    out of every generation) and the young generation collected every 10,000 allocations
    they are a small part (docs/performance.md).
    """
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, 20, 20)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the runner until SIGTERM/SIGINT (twice: stop running jobs at once)."""
    # first, before anything secret is read: a job of this uid cannot read our /proc files
    orphans.make_undumpable()
    args = parse(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    overrides: dict[str, object] = {
        "node": args.node,
        "name": args.name,
        "memory_mb": args.memory_mb,
        "cpus": args.cpus,
        "dsn": args.dsn,
        "api": args.api,
        "token_file": args.token_file,
        "api_ca": args.api_ca,
        "work_dir": args.work_dir,
        "grace_s": args.grace_s,
        "batch": args.batch,
        "poll_interval_s": args.poll_interval_s,
        "poll_max_s": args.poll_max_s,
        "keep_failed": args.keep_failed or None,
        "exit_when_drained": args.exit_when_drained or None,
        "orphans": args.orphans,
        "job_user": args.job_user,
        "job_uid_range": args.job_uid_range,
        "lanes": dict(args.lane) or None,
        "capabilities": args.capability or None,
    }
    try:
        config = runner_config.load(overrides, args.config)
        if args.metrics_port:
            metrics.serve(args.metrics_port)
        if tracing.configure():
            logging.getLogger(__name__).info("OpenTelemetry spans on")
        service = RunnerService(config)

        async def serve() -> int:
            install_signals(service, asyncio.get_running_loop().add_signal_handler)
            dsn = None if config.api else as_uri(resolve_dsn(config.dsn))
            return await service.run(dsn)

        settle_heap()
        try:
            return asyncio.run(serve())
        finally:
            tracing.shutdown()
    except FleetqError as exc:
        print(f"fleetq-runner: error: {exc}", file=sys.stderr)
        return 1
