"""Runner configuration: file, then flags, then machine defaults; errors say where."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetq.core.errors import ConfigError
from fleetq.runner.config import load
from fleetq.runner.main import build_parser, parse


def test_flags_win_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "runner.toml"
    path.write_text(
        'node = "n1"\nname = "a"\ncapabilities = ["browser"]\n[lanes]\nchecks = 2\ncontrol = 1\n'
    )
    config = load({"name": "b", "cpus": 1.5}, path)
    assert (config.runner_id, config.lanes, config.cpu_millis) == (
        "n1/b",
        {"checks": 2, "control": 1},
        1500,
    )
    assert config.capabilities == ["browser"] and config.memory_mb > 0


def test_errors_name_the_source_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runner options: lanes: "):
        load({"node": "n1"}, None)
    path = tmp_path / "runner.toml"
    path.write_text('node = "bad node"\n[lanes]\nchecks = 1\n')
    with pytest.raises(ConfigError, match=rf"{path}: node: String should match pattern"):
        load({}, path)


@pytest.mark.parametrize("lane", ["checks", "checks=0", "=2", "checks=-1"])
def test_lane_flag_wants_lane_equals_slots(capsys: pytest.CaptureFixture[str], lane: str) -> None:
    """`--lane checks=0` exited 2, argparse's status, where every fleetq usage error exits
    64, and did not say slots start at 1 (issue 42, finding 8)."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--node", "n", "--lane", lane])
    assert exit_.value.code == 64
    assert "--lane wants LANE=SLOTS with SLOTS at least 1" in capsys.readouterr().err


def test_a_lane_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """`--lane tests=1 --lane tests=2` silently took the last (issue 14)."""
    with pytest.raises(SystemExit) as exit_:
        parse(["--node", "n", "--lane", "tests=1", "--lane", "tests=2"])
    assert exit_.value.code == 64
    assert "--lane names tests more than once" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"api": "https://q.example", "dsn": "postgresql://db/q"}, "not both"),
        ({"api": "https://q.example"}, "api needs token_file"),
        ({"token_file": "r.token"}, "go with api"),
        ({"api": "q.example", "token_file": "r.token"}, "api: String should match"),
    ],
)
def test_one_way_to_the_queue(given: dict[str, object], said: str) -> None:
    """A DSN or the API's URL with a token file: a mix is refused at start, saying why."""
    with pytest.raises(ConfigError, match=said):
        load({"node": "n1", "lanes": {"checks": 1}, **given}, None)
    ok = load(
        {"node": "n1", "lanes": {"checks": 1}, "api": "http://q:8080", "token_file": "t"}, None
    )
    assert ok.api == "http://q:8080" and ok.dsn is None


def test_through_the_api_an_idle_runner_polls_and_reaps_less_unless_told() -> None:
    """Each call of an API runner is a request a gateway serves: its idle polls back off to
    30 s and it tries the reaper every 15 s (issue 46's idle fleet), while a direct runner
    keeps 10 s and 5 s, and either takes what it is given."""
    base: dict[str, object] = {"node": "n1", "lanes": {"checks": 1}}
    api = {**base, "api": "http://q:8080", "token_file": "t"}
    direct = load({**base, "dsn": "postgresql://db/q"}, None)
    assert (direct.poll_max_s, direct.reap_interval_s) == (10.0, 5.0)
    through = load(api, None)
    assert (through.poll_max_s, through.reap_interval_s) == (30.0, 15.0)
    told = load({**api, "poll_max_s": 4.0, "reap_interval_s": 2.0}, None)
    assert (told.poll_max_s, told.reap_interval_s) == (4.0, 2.0)
