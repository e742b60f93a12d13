"""`fleetq-bench`: throughput, latency and per-job costs of no-op jobs; with
`--compare`, the same workload through fleetq and its peers (pgqueuer, procrastinate),
and through the floor: the least a durable PostgreSQL queue does for a job (one statement
per step, no guarantee beyond running what committed), to read every figure against.

Each measurement runs in a scratch database of its own on the selected server (created,
schema installed, dropped), starts real worker processes before any clock runs, and
reads throughput back from the queue's own timestamps. Phases (`fleetq_bench.phases`):

1. warm-up (uncounted);
2. idle: the waiting workers' transactions, statements and write transactions per
   second;
3. throughput: N jobs enqueued in one bulk call while the workers wait, then drained;
   jobs/s from the first start to the last outcome (database time), and from the
   enqueue's commit to the harness seeing the queue empty;
4. latency: jobs submitted one by one at a steady rate; enqueue -> start percentiles on
   the producer's clock (from just before the submit call to the handler's first line:
   the submit's commit, the wake-up, the claim and the handler's start included), and
   for fleetq also from its rows' timestamps (created_at to claimed_at).

Phases 3 and 4 each report their costs per job: write transactions (transaction ids
assigned), statements (pg_stat_statements), transactions (cumulative statistics), WAL
bytes, and the CPU time of the workers and of the PostgreSQL server. docs/performance.md
says how each is counted.

Without --compare it measures fleetq alone with --slots and --batch. With --compare it
measures each of --systems (`all`, or names from the list below) --runs times,
interleaved, and reports each figure's median and range.

The other benchmarks have commands of their own: `fleetq-bench scale` (a simulated fleet
of 1 to 100 runners) and `fleetq-bench checks` (a check job's overheads); each takes
--help. Run from a checkout of fleetq as `uv run --project bench fleetq-bench ...`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fleetq.cli import exits
from fleetq.cli.common import positive_arg
from fleetq.cli.main import UsageExit
from fleetq.core.db import resolve_dsn
from fleetq.core.errors import FleetqError
from fleetq.core.text import escape
from fleetq_bench import peers
from fleetq_bench.peers import System
from fleetq_bench.phases import Plan, measure

PROG = "fleetq-bench"
# The benchmarks with options of their own: name -> (module of fleetq_bench, what it measures)
BENCHMARKS = {
    "scale": ("scale", "a simulated fleet of 1 to 100 runners on the real protocol"),
    "checks": ("checkjobs", "a check job's claim -> process start overhead and staging"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one benchmark: `fleetq-bench [options]` (fleetq alone, or `--compare`), or
    `fleetq-bench scale|checks [options]`. A fleetq error is one line on stderr and the
    exit status `fleetq` gives it; the report is JSON (or Markdown) on stdout."""
    words = sys.argv[1:] if argv is None else list(argv)
    name, rest = split_benchmark(words)
    args = (parser() if name is None else benchmark_parser(name)).parse_args(rest)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except FleetqError as exc:
        print(f"{PROG}: error: {escape(exc, one_line=True)}", file=sys.stderr)
        return exits.for_error(exc)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return exits.Exit.INTERRUPTED


def split_benchmark(words: Sequence[str]) -> tuple[str | None, list[str]]:
    """The benchmark a command line names (None: the queue benchmark) and the words
    left for its parser; `--dsn X` and `-v` may stand before the name."""
    rest = list(words)
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        i += 2 if rest[i] == "--dsn" else 1
    if i < len(rest) and rest[i] in BENCHMARKS:
        return rest.pop(i), rest
    return None, rest


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        help="PostgreSQL server for the scratch databases (default: $FLEETQ_DSN, else the "
        "embedded server)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")


def parser() -> argparse.ArgumentParser:
    """The queue benchmark's command line (`fleetq-bench`, `fleetq-bench --compare`)."""
    p = UsageExit(
        prog=PROG,
        description=__doc__ + "\nsystems: " + ", ".join(peers.SYSTEMS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument("--jobs", type=positive_arg, default=5000, help="jobs in the throughput phase")
    p.add_argument("--runners", type=positive_arg, default=4, help="worker processes")
    p.add_argument("--slots", type=positive_arg, default=512, help="bench-lane slots per runner")
    p.add_argument("--batch", type=positive_arg, default=256, help="claim batch per runner")
    p.add_argument("--warmup", type=positive_arg, default=1000, help="uncounted jobs run first")
    p.add_argument("--rate", type=float, default=200.0, help="jobs/s in the latency phase")
    p.add_argument(
        "--latency-seconds", type=float, help="latency phase length (default 5; --compare 10)"
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=5.0,
        help="how long to watch the idle workers' load on the database (0: skip)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=11.0,
        help="seconds the statistics get to flush before transactions are read (below "
        "11, an idle backend's last 10 s may be missed)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="give up a wait after this long")
    g = p.add_argument_group("comparison")
    g.add_argument("--compare", action="store_true", help="measure every system of --systems")
    g.add_argument("--systems", default="all", help="comma-separated names, or all")
    g.add_argument("--runs", type=positive_arg, default=3, help="runs, interleaved")
    g.add_argument("--json-out", type=Path, help="write the JSON report here too")
    g.add_argument("--plot", type=Path, metavar="DIR", help="write PNG charts into DIR")
    g.add_argument("--markdown", action="store_true", help="print the docs' tables instead of JSON")
    p.set_defaults(func=_bench)
    return p


def benchmark_parser(name: str) -> argparse.ArgumentParser:
    """`fleetq-bench NAME`: a benchmark of fleetq_bench with options of its own (its
    module's `add_arguments` and `run`)."""
    module_name, _what = BENCHMARKS[name]
    module = importlib.import_module(f"fleetq_bench.{module_name}")
    p = UsageExit(
        prog=f"{PROG} {name}",
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    module.add_arguments(p)
    run: Callable[[str, argparse.Namespace], dict[str, Any]] = module.run

    def report(args: argparse.Namespace) -> int:
        sys.stdout.write(json.dumps(run(resolve_dsn(args.dsn), args), indent=2) + "\n")
        return 0

    p.set_defaults(func=report)
    return p


def _bench(args: argparse.Namespace) -> int:
    server = resolve_dsn(args.dsn)
    if args.compare:
        report = _compare(args, server)
    else:
        settings = f"lane slots {args.slots}, --batch {args.batch}"
        system = System("fleetq", "fleetq", args.slots, args.batch, settings)
        report = _single(measure(system, server, _plan(args, stream_seconds=5.0)), args)
    text = json.dumps(report, indent=2) + "\n"
    if args.json_out:
        args.json_out.write_text(text)
    if args.compare and args.markdown:
        from fleetq_bench.compare import markdown

        sys.stdout.write(markdown(report))
    else:
        sys.stdout.write(text)
    return 0


def _compare(args: argparse.Namespace, server: str) -> dict[str, Any]:
    from fleetq_bench.compare import compare

    systems = peers.select(args.systems)
    report = compare(server, systems, _plan(args, stream_seconds=10.0), args.runs, _progress)
    if args.plot:
        from fleetq_bench.plots import plot

        for path in plot(report, args.plot):
            _progress(f"wrote {path}")
    return report


def _plan(args: argparse.Namespace, *, stream_seconds: float) -> Plan:
    return Plan(
        jobs=args.jobs,
        workers=args.runners,
        warmup=args.warmup,
        rate=args.rate,
        stream_seconds=args.latency_seconds or stream_seconds,
        settle=args.settle,
        idle=args.idle_seconds,
        timeout=args.timeout,
    )


def _single(report: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """fleetq alone, under the names the single run has always printed."""
    idle = report["idle"]
    if idle is not None:
        idle["transactions_per_runner_s"] = idle["xacts_per_worker_s"]
    return {
        "runners": args.runners,
        "warmup_jobs": args.warmup,
        "slots": args.slots,
        "batch": args.batch,
        "cpus": os.cpu_count(),
    } | report


def _progress(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)
