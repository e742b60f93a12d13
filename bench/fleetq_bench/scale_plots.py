"""PNG plots of the scale report (`fleetq-bench scale`), with matplotlib, imported only
when plots are asked for."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from fleetq_bench.harness import BenchError
from fleetq_bench.peers import INSTALL_HINT


def require() -> ModuleType:
    """matplotlib's pyplot on a non-interactive backend, or a `BenchError` saying how to
    install it."""
    try:
        import matplotlib
    except ImportError:
        raise BenchError(f"--plot needs matplotlib: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pyplot: ModuleType = plt  # typed alike with matplotlib's stubs or without
    return pyplot


def write(report: dict[str, Any], directory: Path) -> list[Path]:
    """Write the plots the report has data for; returns their paths."""
    plt = require()
    directory.mkdir(parents=True, exist_ok=True)
    written = [_scale(plt, report["steps"], directory / "scale-claims.png")]
    if report.get("history"):
        written.append(_history(plt, report["history"], directory / "scale-history.png"))
    return written


def _scale(plt: Any, steps: list[dict[str, Any]], path: Path) -> Path:
    """Per fleet size and way in (direct, through gateways): jobs/s, claim round trip,
    server connections; a size a way could not run at is left out (the report says why)."""
    fig, (rate, latency, conns) = plt.subplots(1, 3, figsize=(15, 4.2))
    for via in dict.fromkeys(s.get("via", "direct") for s in steps):
        ran = [s for s in steps if s.get("via", "direct") == via and "stopped" not in s]
        runners = [s["runners"] for s in ran]
        rate.plot(runners, [s["jobs_per_s"] for s in ran], "o-", label=via)
        for p, style in (("p50", "o-"), ("p99", "s--")):
            values = [s["claim_ms"][p] for s in ran]
            latency.plot(runners, values, style, label=f"{via} {p}")
        conns.plot(runners, [s["server_connections"]["max"] for s in ran], "o-", label=via)
    rate.set(xlabel="simulated runners", ylabel="jobs/s", title="10,000-job burst: jobs/s")
    latency.set(xlabel="simulated runners", ylabel="ms", title="Claim round trip (took jobs)")
    latency.set_yscale("log")
    conns.set(xlabel="simulated runners", ylabel="connections", title="Server connections (max)")
    for axes in (rate, latency, conns):
        axes.set_xscale("log")
        axes.grid(alpha=0.3)
        axes.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _history(plt: Any, history: dict[str, Any], path: Path) -> Path:
    labels = ("p50", "p95", "p99")
    phases = [("before", history["before"]), ("after", history["after"])]
    if history.get("after_prune"):
        phases.append(("after prune", history["after_prune"]))
    fig, axes = plt.subplots(figsize=(6.5, 4.2))
    width = 0.8 / len(phases)
    for i, (name, probe) in enumerate(phases):
        xs = [x + (i - (len(phases) - 1) / 2) * width for x in range(len(labels))]
        values = [probe["claim_ms"][p] or 0 for p in labels]
        axes.bar(xs, values, width, label=f"{name}: {probe['finished_jobs']:,} finished jobs")
    axes.set_xticks(range(len(labels)), labels)
    axes.set(ylabel="ms", title="Claim round trip before and after the history, and its prune")
    axes.grid(axis="y", alpha=0.3)
    axes.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
