"""The benchmarks' report arithmetic, apart from any database."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any, LiteralString

import pytest

from fleetq_bench import checkjobs, figures, harness, history, scale


def test_percentile_interpolates_like_percentile_cont() -> None:
    # PostgreSQL: percentile_cont(0.5) of 1,2,3,4 is 2.5; of 0.99 is 3.97
    values = [4.0, 1.0, 3.0, 2.0]
    assert figures.percentile(values, 50) == 2.5
    assert figures.percentile(values, 99) == pytest.approx(3.97)
    assert figures.percentile(values, 0) == 1.0
    assert figures.percentile(values, 100) == 4.0
    assert figures.percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_none_and_bad_points_are_refused() -> None:
    assert figures.percentile([], 50) is None
    with pytest.raises(ValueError, match="between 0 and 100"):
        figures.percentile([1.0], 101)


def test_summary_scales_rounds_and_counts() -> None:
    found = figures.summary([0.001, 0.002, 0.003], scale=1000)
    assert found == {"n": 3, "p50": 2.0, "p95": 2.9, "p99": 2.98}
    assert figures.summary([]) == {"n": 0, "p50": None, "p95": None, "p99": None}


def test_per_second_needs_time_to_pass() -> None:
    assert figures.per_second(100, 4) == 25.0
    assert figures.per_second(1, 3) == 0.3
    assert figures.per_second(5, 0) is None


def test_counter_delta_subtracts_own_reads_and_never_goes_negative() -> None:
    assert figures.counter_delta(100, 130, own=2) == 28
    assert figures.counter_delta(100, 50) == 0  # a reset counter


def test_idle_cadence_adds_up_the_runner_loops() -> None:
    cadence = {"beat_s": 10, "ping_s": 10, "poll_max_s": 10, "collect_s": 30, "schedules_s": 60}
    rate = figures.idle_cadence(reap_s=5, **cadence)
    assert rate == pytest.approx(0.2 + 0.2 + 0.1 + 0.1 + 2 / 30 + 1 / 60)
    with pytest.raises(ValueError, match="reap"):
        figures.idle_cadence(reap_s=0, **cadence)


def test_explain_buffers_reads_the_top_node() -> None:
    plan = {"Plan": {"Shared Hit Blocks": 12, "Shared Read Blocks": 3, "Plans": []}}
    assert figures.explain_buffers(plan) == {"shared_hit": 12, "shared_read": 3}
    assert figures.explain_buffers({"Node Type": "Result"}) == {"shared_hit": 0, "shared_read": 0}
    with pytest.raises(ValueError, match="not an EXPLAIN plan"):
        figures.explain_buffers({"Plan": [1]})


def test_step_report() -> None:
    claims = [(0.002, 4), (0.004, 2), (0.001, 0)]
    drain = {"jobs": 6, "succeeded": 6, "drain_s": 0.5}
    found = scale.step_report(
        runners=2,
        slots=4,
        drain=drain,
        claims=claims,
        harness_cpu_s=0.25,
        harness_wall_s=0.5,
        stale=0,
    )
    assert found["slots"] == 8
    assert found["jobs_per_s"] == 12.0
    assert found["claim_calls"] == 3
    assert found["claim_calls_per_s"] == 6.0
    assert found["jobs_per_claim"] == 3.0
    assert found["claim_ms"]["n"] == 2 and found["claim_ms"]["p50"] == 3.0
    assert found["empty_claim_ms"]["n"] == 1
    assert found["harness_cpu_percent"] == 50.0


def test_step_report_with_nothing_drained() -> None:
    found = scale.step_report(
        runners=1,
        slots=4,
        drain={"jobs": 0, "succeeded": 0, "drain_s": None},
        claims=[],
        harness_cpu_s=0,
        harness_wall_s=0,
        stale=0,
    )
    assert found["jobs_per_s"] is None and found["jobs_per_claim"] is None
    assert found["harness_cpu_percent"] is None


def test_idle_report_per_runner() -> None:
    found = scale.idle_report(
        runners=10, seconds=20, transactions=140, xids=40, expected_per_runner_s=0.6667
    )
    assert found["transactions_per_s"] == 7.0
    assert found["transactions_per_runner_s"] == 0.7
    assert found["xids_per_s"] == 2.0
    assert found["expected_per_runner_s"] == 0.67


def test_runner_counts_parse() -> None:
    assert scale._sizes("1, 10,100") == [1, 10, 100]
    for bad in ("", "1,x", "0,4"):
        with pytest.raises(argparse.ArgumentTypeError):
            scale._sizes(bad)


def test_defaults_are_the_issues() -> None:
    parser = argparse.ArgumentParser()
    scale.add_arguments(parser)
    args = parser.parse_args([])
    assert args.runners == [1, 10, 25, 50, 100]
    assert (args.slots, args.jobs, args.history) == (4, 10_000, 1_000_000)


def _row(claimed: float, printed: str, prepare_ms: int | None = 40) -> dict[str, Any]:
    return {
        "id": 7,
        "state": "succeeded",
        "created": claimed - 0.003,
        "claimed": claimed,
        "start_reported": claimed + 0.060,
        "prepare_ms": prepare_ms,
        "log_tail": printed,
    }


def test_job_timings_take_staging_out() -> None:
    found = checkjobs.job_timings(_row(1000.0, "1000.052000000\n"))
    assert found["claim_to_process_ms"] == pytest.approx(52)
    assert found["staging_ms"] == 40
    assert found["overhead_ms"] == pytest.approx(12)
    assert found["submit_to_claim_ms"] == pytest.approx(3)
    assert found["process_to_start_report_ms"] == pytest.approx(8)


def test_job_timings_of_a_job_without_output() -> None:
    found = checkjobs.job_timings(_row(1000.0, "date: not found\n"))
    assert found == {"job_id": 7, "state": "succeeded"}
    assert "overhead_ms" not in checkjobs.job_timings(_row(1000.0, "1000.1", prepare_ms=None))


def test_checks_report_against_the_target() -> None:
    fast = [checkjobs.job_timings(_row(1000.0, f"1000.{40 + i:03d}")) for i in range(3)]
    report = checkjobs.checks_report({"cold": fast[:1], "warm_same_commit": fast[1:]})
    assert report["jobs"] == report["succeeded"] == 3
    assert report["overhead_ms"]["p50"] == 1.0
    assert report["target_met"] is True
    assert report["staging_ms"]["cold"]["n"] == 1
    slow = [checkjobs.job_timings(_row(1000.0, "1000.090"))]
    assert checkjobs.checks_report({"cold": slow})["target_met"] is False
    assert checkjobs.checks_report({"cold": []})["target_met"] is None


def test_auto_explain_notices_parse() -> None:
    plan_json = '{"Query Text": "x", "Plan": {"Index Name": "a", "Plans": [{"Index Name": "b"}]}}'
    message = f"duration: 0.812 ms  plan:\n{plan_json}"
    (plan,) = history._plans(message)
    assert history._index_names(plan) == {"a", "b"}
    assert history._plans("duration: 1 ms  statement: SELECT 1") == []
    assert history._plans("plan:\n{not json") == []


class _Rows:
    """A driver that answers every statement with the same rows."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    async def fetch(
        self, query: LiteralString, *args: object, timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        return self.rows

    async def close(self) -> None:
        return None


def _server(in_use: int) -> _Rows:
    return _Rows(
        [
            {
                "server_version": "15.20",
                "max_connections": 100,
                "reserved": 3,
                "in_use": in_use,
                "superuser": True,
            }
        ]
    )


async def test_connection_budget_passes_when_there_is_room() -> None:
    found = await harness.require_connections(_server(5), 92, what="the fleet")
    assert found["free"] == 92


async def test_connection_budget_fails_clearly() -> None:
    with pytest.raises(
        harness.BenchError, match=r"102 more connections.*92 free.*max_connections=100"
    ):
        await harness.require_connections(_server(5), 102, what="100 runners")


async def test_wait_until_gives_up_at_its_deadline() -> None:
    async def never() -> bool:
        return False

    with pytest.raises(harness.BenchError, match="timed out after 0s waiting for nothing"):
        await harness.wait_until(never, timeout=0.1, what="nothing")


async def test_wait_until_raises_what_alive_raises() -> None:
    async def never() -> bool:
        return False

    def dead() -> None:
        raise harness.BenchError("runner exited")

    with pytest.raises(harness.BenchError, match="runner exited"):
        await harness.wait_until(never, timeout=10, what="x", alive=dead)


def test_plots_say_how_to_get_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from fleetq_bench import scale_plots as plots

    real = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(harness.BenchError, match="uv run --project bench"):
        plots.require()


def test_plots_are_written_from_a_report(tmp_path: Path) -> None:
    from fleetq_bench import scale_plots as plots

    claim = {"n": 3, "p50": 1.0, "p95": 2.0, "p99": 3.0}
    steps: list[dict[str, Any]] = [
        {
            "runners": n,
            "via": via,
            "claim_calls_per_s": 10.0 * n,
            "jobs_per_s": 20.0 * n,
            "claim_ms": claim,
            "server_connections": {"max": n, "mean": n},
        }
        for via in ("direct", "gateways")
        for n in (1, 10)
    ]
    steps.append({"runners": 1000, "via": "direct", "stopped": "needs 1000 connections"})
    probe = {"finished_jobs": 0, "claim_ms": claim}
    report = {"steps": steps, "history": {"before": probe, "after": probe}}
    written = plots.write(report, tmp_path / "plots")
    assert [p.name for p in written] == ["scale-claims.png", "scale-history.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


def test_wait_report_averages_per_sample() -> None:
    waits = Counter({"samples": 4, "Lock:object": 8, "CPU": 2, "IO:WALSync": 1})
    found = scale.wait_report(waits, top=2)
    assert found == {
        "samples": 4,
        "active_sessions": 2.75,
        "waits": {"Lock:object": 2.0, "CPU": 0.5},
    }
    assert scale.wait_report(Counter())["active_sessions"] is None
