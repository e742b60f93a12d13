"""The comparison's pictures (matplotlib).

Bars are medians over runs; whiskers span min to max, so a reader sees at once whether
two systems' difference is larger than a system's own run-to-run spread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetq.core.errors import FleetqError
from fleetq_bench.peers import INSTALL_HINT

# (file, title, y label, [(legend, dotted path)])
FIGURES: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "throughput.png",
        "Throughput, no-op jobs",
        "jobs/s",
        (
            ("first start → last outcome", "throughput.jobs_per_s"),
            ("enqueue → drained", "throughput.drain_jobs_per_s"),
        ),
    ),
    (
        "latency.png",
        "Enqueue → start latency, steady stream (producer's clock)",
        "ms",
        (
            ("p50", "latency.enqueue_to_start_ms.p50"),
            ("p99", "latency.enqueue_to_start_ms.p99"),
        ),
    ),
    (
        "write_xacts.png",
        "Write transactions per job",
        "write transactions / job",
        (
            ("throughput phase", "throughput.costs.write_xacts_per_job"),
            ("steady stream", "latency.costs.write_xacts_per_job"),
        ),
    ),
)


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    """Write every figure of `report` into `out`; the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise FleetqError(f"--plot needs matplotlib: {INSTALL_HINT}") from exc
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, ylabel, series in FIGURES:
        # wide enough that every row's two-line label stays apart from its neighbours'
        fig, ax = plt.subplots(
            figsize=(max(10.0, 1.3 * len(report["systems"])), 4.8), layout="constrained"
        )
        _bars(ax, report["systems"], series)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)
    return written


def _bars(ax: Any, rows: Sequence[dict[str, Any]], series: Sequence[tuple[str, str]]) -> None:
    width = 0.8 / len(series)
    for k, (label, path) in enumerate(series):
        med, low, high = whiskers(rows, path)
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, med, width, label=label, yerr=[low, high], capsize=3)
    ax.set_xticks(range(len(rows)), [_label(r) for r in rows], rotation=20, ha="right")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)


def whiskers(
    rows: Sequence[dict[str, Any]], path: str
) -> tuple[list[float], list[float], list[float]]:
    """Per row: the median of `path`, and how far min and max lie below and above it
    (matplotlib's yerr); a figure not measured draws as 0."""
    med, low, high = [], [], []
    for row in rows:
        fig = row["summary"].get(path) or {}
        m = fig.get("median")
        lo = m if fig.get("min") is None else fig["min"]
        hi = m if fig.get("max") is None else fig["max"]
        med.append(m or 0.0)
        low.append(0.0 if m is None else m - lo)
        high.append(0.0 if m is None else hi - m)
    return med, low, high


def _label(row: dict[str, Any]) -> str:
    cap = row["in_flight_per_worker"]
    return f"{row['system']}\n(cap {cap if cap else 'unset'}, batch {row['batch']})"
