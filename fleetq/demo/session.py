"""One demo run, in order: database, repositories and configuration; runners; the job
stream with its faults (beside the console, or headless); settling; shutdown; report.

Where the demo runs: in a database of its own (`fleetq.demo.database`) on the server the
DSN names, or the embedded server's: `fleetq_demo` beside the embedded `fleetq`, never
the database the DSN names. One demo at a time runs in it; a second is refused (exit 75).

Where the demo keeps its files: with the embedded server (no --dsn, no FLEETQ_DSN),
in `$FLEETQ_HOME/demo/` (repositories, runner work directories, logs, the applied
configuration), kept between runs so `fleetq jobs` and the console can still be pointed
at what happened. With a named server, in a temporary directory removed after a
successful run (kept, and named, after a failed one): runner journals belong to one
database, and a second database must not inherit them (for the same reason a demo
database made afresh starts without the runner directories of an older one).

Ctrl-C is the demo's, not the runners' (they run in sessions of their own): the first
ends the job stream early and lets the queue settle, the second stops waiting for it.
Either way the runners are drained, stopped and checked gone before the report, and the
exit status is 130 (interrupted), whatever the report says.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from fleetq.core import config, migrate, migrationlock, report
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.driver import open_driver
from fleetq.core.embedded import default_home
from fleetq.demo import database, repo, scenario
from fleetq.demo import report as printed
from fleetq.demo.fleet import Fleet
from fleetq.demo.plan import Plan, RunLog


@dataclass(frozen=True)
class Options:
    """What `fleetq demo` was asked for."""

    dsn: str | None
    duration_s: float
    lease_s: int
    headless: bool
    reset: bool


class Interrupts:
    """SIGINT while the demo runs: the first ends the stream, the second the settling."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self.say = say
        self.interrupted = False  # the run ends with 130, as any interrupted command

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        self.interrupted = True
        if not self.stop.is_set():
            self.say("interrupted: ending the job stream (Ctrl-C again: stop waiting)")
            self.stop.set()
        elif not self.hurry.is_set():
            self.say("interrupted again: stopping the runners now")
            self.hurry.set()


INTERRUPTED = 130  # the CLI's exit status for Ctrl-C (fleetq.cli.exits)


def main(options: Options) -> int:
    """Run the demo in its own database; the exit status is the report's verdict (0 or
    1), or 130 when Ctrl-C ended it early. `RefusedNow` when another demo runs there."""
    began = time.monotonic()
    named = bool(options.dsn or os.environ.get("FLEETQ_DSN"))
    server = resolve_dsn(options.dsn)  # names the server; the demo's database is its own
    work = Path(tempfile.mkdtemp(prefix="fleetq-demo-")) if named else default_home() / "demo"
    status = 1
    try:
        with database.exclusive(server) as demo:
            if demo.created:  # a new database: runner journals of an older one are stale
                _clear_runners(work)
            status = _run(options, demo, work, began)
    finally:
        if named and status == 0:
            shutil.rmtree(work, ignore_errors=True)
        elif named:
            print(f"the demo's files (runner logs) are kept in {work}")
    return status


def _run(options: Options, demo: database.DemoDatabase, work: Path, began: float) -> int:
    dsn = demo.dsn
    interactive = sys.stdout.isatty() and not options.headless
    say = Sayer(work / "demo.log" if interactive else None)
    say(
        f"the demo runs in a database of its own, {demo.name}, beside {demo.given} (your "
        f"fleet's: left alone); look at it with `fleetq --dsn {_shown(dsn)} jobs`"
    )
    repos = prepare(dsn, work, options, say)
    plan = Plan(duration_s=options.duration_s, lease_s=options.lease_s)
    log = RunLog(tag=uuid.uuid4().hex[:6])
    fleet = Fleet(dsn, work)
    interrupts = Interrupts(say)
    previous = signal.signal(signal.SIGINT, interrupts)
    problems: list[str] = []
    try:
        asyncio.run(_start(fleet, dsn, say))
        _stream(dsn, plan, fleet, repos, log, interrupts, say, interactive=interactive)
        settle_from = time.monotonic()
        asyncio.run(_settle(dsn, plan, log, interrupts.hurry, say))
        settle_s = time.monotonic() - settle_from
    finally:
        problems = asyncio.run(_stop(fleet, dsn, say))
        signal.signal(signal.SIGINT, previous)
    assert log.started_at is not None
    figures = asyncio.run(_figures(dsn, log, plan))
    verdict = printed.judge(figures, log, problems)
    verdict.warnings += fleet.restarted  # killed from outside: not the fleet's failure
    text = printed.render(
        figures, log, plan, verdict, wall_s=time.monotonic() - began, settle_s=settle_s
    )
    print("\n" + text, end="", flush=True)
    if interrupts.interrupted:
        say("interrupted: exit status 130 (the report covers the jobs accepted until then)")
        return INTERRUPTED
    return 0 if verdict.ok else 1


def prepare(
    dsn: str, work: Path, options: Options, say: Callable[[str], None]
) -> dict[str, repo.DemoRepo]:
    """Reset if asked, migrate, build the repositories, apply the demo configuration.
    `dsn` is the demo's own database (`database.exclusive`), whose lock the caller holds:
    the reset drops its fleetq schema, never the user's."""
    if options.reset:
        migrationlock.reset(dsn)
        _clear_runners(work)
        say("reset: dropped the demo database's fleetq schema and the demo's runner directories")
    applied = migrate.migrate(dsn)
    say(f"database {_where(dsn)}: {len(applied)} migration(s) applied, schema current")
    work.mkdir(parents=True, exist_ok=True)
    repos = {name: repo.build(work / "repos" / name, name) for name in scenario.PROJECTS}
    path = scenario.write_config(work / "fleet.toml", repos, lease_s=options.lease_s)
    with connect(dsn) as conn:
        config.apply(conn, config.load(path), source=path)
    say(
        f"config {path} applied: lanes checks and control, projects "
        + ", ".join(f"{n} ({len(r.commits)} commits)" for n, r in repos.items())
        + f", lease {options.lease_s}s"
    )
    return repos


async def _start(fleet: Fleet, dsn: str, say: Callable[[str], None]) -> None:
    async with open_driver(dsn) as driver:
        await fleet.start(driver)
    for spec in fleet.specs:
        lanes = " ".join(f"{lane}={n}" for lane, n in spec.lanes.items())
        say(
            f"runner {spec.runner_id} (pid {fleet.procs[spec.runner_id].pid}): {lanes}, "
            f"{','.join(spec.capabilities)}, {spec.memory_mb} MB, {spec.cpus:g} CPUs; {spec.about}"
        )


def _stream(
    dsn: str,
    plan: Plan,
    fleet: Fleet,
    repos: dict[str, repo.DemoRepo],
    log: RunLog,
    interrupts: Interrupts,
    say: Sayer,
    *,
    interactive: bool,
) -> None:
    """The job stream and its faults in a thread of their own, while the main thread
    runs the console (interactive) or waits for it (headless)."""
    failure: list[BaseException] = []

    def work() -> None:
        try:
            asyncio.run(scenario.run(dsn, plan, fleet, repos, log, interrupts.stop, say))
        except BaseException as exc:  # reported in the main thread, after shutdown
            failure.append(exc)
            interrupts.stop.set()

    thread = threading.Thread(target=work, name="demo-stream", daemon=True)
    thread.start()
    if interactive:
        _console(dsn, say)
        interrupts.stop.set()  # the operator quit: the stream ends with the console
        say.path = None  # the screen is ours again
    while thread.is_alive():
        thread.join(0.2)  # short joins, so SIGINT is handled promptly
        if not interactive:
            fleet.check_alive(say)
    if failure:
        raise failure[0]


def _console(dsn: str, say: Sayer) -> None:
    """Open the console on the demo's database until the operator quits; meanwhile log
    lines go to the demo's log file, never over the screen."""
    from fleetq.console.main import run_console  # only here: headless never loads textual

    try:
        run_console(dsn, title="fleetq demo", log=say.path)
    except NotImplementedError:
        say("the console is not available in this build; waiting for the stream instead")


async def _settle(
    dsn: str, plan: Plan, log: RunLog, hurry: threading.Event, say: Callable[[str], None]
) -> None:
    """Wait (with a deadline) until every accepted job is terminal."""
    deadline = time.monotonic() + plan.settle_s
    next_line = time.monotonic()
    async with open_driver(dsn) as driver:
        while time.monotonic() < deadline and not hurry.is_set():
            live = await report.live(driver, sorted(log.jobs))
            if not live:
                say(f"settled: all {len(log.jobs)} accepted jobs are terminal")
                return
            if time.monotonic() >= next_line:
                say(f"settling: {len(live)} job(s) still live")
                next_line += plan.progress_every_s
            await asyncio.sleep(0.2)  # polling a database condition, with a deadline
    say("stopped waiting for the queue to settle")


async def _stop(fleet: Fleet, dsn: str, say: Callable[[str], None]) -> list[str]:
    say("stopping: draining the runners, then SIGTERM")
    try:
        async with open_driver(dsn) as driver:
            problems = await fleet.stop(driver)
    except Exception as exc:  # the database is gone: still stop the processes
        say(f"cannot drain through the database ({exc}); stopping the runners anyway")
        problems = await fleet.stop(None)
    say("runners stopped" + (": " + "; ".join(problems) if problems else ", no stray process"))
    return problems


async def _figures(dsn: str, log: RunLog, plan: Plan) -> report.RunFigures:
    assert log.started_at is not None
    async with open_driver(dsn) as driver:
        return await report.gather(
            driver, sorted(log.jobs), start=log.started_at, interval_s=plan.interval_s
        )


class Sayer:
    """Progress lines: to stdout, or to a log file while the console owns the screen."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path

    def __call__(self, line: str) -> None:
        if self.path is None:
            print(line, flush=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def _clear_runners(work: Path) -> None:
    """The runners' directories (their journals) and logs: they belong to one database."""
    shutil.rmtree(work / "runners", ignore_errors=True)
    shutil.rmtree(work / "logs", ignore_errors=True)


def _shown(dsn: str) -> str:
    """The DSN to type for a look at the demo's database: no password, quoted for a shell
    (fleetq adds `target_session_attrs` again itself)."""
    import shlex

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    hidden = ("password", "target_session_attrs")
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k not in hidden}
    return shlex.quote(make_conninfo("", **params))


def _where(dsn: str) -> str:
    """The DSN without a password, for a progress line."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    host = params.get("host", "local socket")
    return f"{params.get('dbname', '')} on {host}:{params.get('port', 5432)}"
