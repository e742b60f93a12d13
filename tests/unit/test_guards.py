"""scripts/guards.py: which lines of the protocol SQL are guards, and which mutant covers
each (on small SQL of its own, not the protocol's)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("guards", ROOT / "scripts" / "guards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["guards"] = module
    spec.loader.exec_module(module)
    return module


guards = load()

SQL = """\
-- a comment: WHERE now() FOR UPDATE is no guard here
CREATE OR REPLACE FUNCTION fleetq.take(p_job bigint, p_runner text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    j fleetq.jobs%ROWTYPE;
BEGIN
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown job %', p_job;
    END IF;
    IF j.state = 'queued' THEN
        PERFORM 1;
    END IF;
    UPDATE fleetq.jobs
    SET state = CASE WHEN j.state = 'x' THEN 'y' ELSE 'z' END,
        node = (SELECT r.node FROM fleetq.runners r WHERE r.id = p_runner),
        updated_at = clock_timestamp()
    WHERE id = p_job
      AND lease_owner = p_runner;  -- 'WHERE' in a comment
    SELECT count(*) INTO j.n FROM fleetq.jobs WHERE state = 'queued';
    RETURN 'ok';
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.read(p_job bigint)
 RETURNS text
 LANGUAGE sql
AS $function$
    SELECT state FROM fleetq.jobs WHERE id = p_job AND updated_at < now()
$function$;

CREATE OR REPLACE FUNCTION fleetq.fits(p_need integer, p_free integer)
 RETURNS boolean
 LANGUAGE sql
AS $function$
    SELECT p_need <= p_free
$function$;

CREATE OR REPLACE FUNCTION fleetq.entry(p_job bigint)
 RETURNS boolean
 LANGUAGE sql
 SECURITY DEFINER
AS $function$
    SELECT fleetq.fits(1, 2) AND fleetq.take(p_job, 'me') = 'ok'
$function$;
"""


@pytest.fixture
def protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "protocol").mkdir()
    (tmp_path / "protocol" / "x.sql").write_text(SQL)
    monkeypatch.setattr(guards, "PROTOCOL", tmp_path / "protocol")
    monkeypatch.setattr(guards, "MUTANTS", tmp_path / "mutants.toml")
    monkeypatch.setattr(guards, "LISTS", tmp_path / "guards.toml")
    return tmp_path


def found(protocol: Path) -> set[tuple[str, str, int]]:
    return {(g.function, g.kind, g.lines[0]) for g in guards.all_guards()}


def test_refusals_writes_locks_clocks_and_predicates_are_guards(protocol: Path) -> None:
    assert found(protocol) == {
        ("take", "where", 9),  # a locking read's WHERE
        ("take", "lock", 9),
        ("take", "refusal", 10),  # IF NOT FOUND THEN RAISE
        ("take", "clock", 19),
        ("take", "where", 20),  # the UPDATE's WHERE, line by line
        ("take", "where", 21),
        ("fits", "predicate", 38),  # a predicate an entry point calls
    }
    # not guards: the comment, an IF that refuses nothing, a CASE in a SET, a lookup in a
    # SET, a plain read, and a function no writer or entry point reaches (read)


def test_a_mutant_covers_the_lines_it_changes_and_only_those(protocol: Path) -> None:
    (protocol / "mutants.toml").write_text(
        '[[mutant]]\nname = "owner"\nfile = "x.sql"\n'
        'find = """    WHERE id = p_job\\n      AND lease_owner = p_runner;"""\n'
        'replace = """    WHERE id = p_job;"""\nwhy = "."\n'
        '[[mutant]]\nname = "named"\nfile = "x.sql"\nfind = "PERFORM 1;"\n'
        'replace = "PERFORM 2;"\nwhy = "."\ncovers = ["take | IF NOT FOUND THEN"]\n'
    )
    rows = {(r.guard.kind, r.guard.lines[0]): r.mutants for r in guards.table()}
    assert rows[("where", 21)] == ("owner",)
    assert rows[("where", 20)] == ("owner",)  # its line changed too (the `;` moved)
    assert rows[("refusal", 10)] == ("named",)
    assert rows[("lock", 9)] == ()


def test_check_is_a_ratchet(protocol: Path) -> None:
    (protocol / "mutants.toml").write_text("mutant = []\n")
    uncovered = [r.guard.key for r in guards.table()]  # a line both lock and where: twice
    assert not guards.check().ok  # nothing covered, nothing listed
    baseline = "\n".join(f"    {guards.toml_string(k)}," for k in sorted(uncovered))
    (protocol / "guards.toml").write_text(f"[baseline]\nuncovered = [\n{baseline}\n]\n")
    assert guards.check().ok
    # a guard covered now must leave the baseline: the list only shrinks
    (protocol / "mutants.toml").write_text(
        '[[mutant]]\nname = "n"\nfile = "x.sql"\nfind = "clock_timestamp()"\n'
        'replace = "now()"\nwhy = "."\n'
    )
    report = guards.check()
    assert report.gone == ["take | updated_at = clock_timestamp()"]
    assert not report.ok
    # a waived guard needs neither a mutant nor a baseline entry, but a reason
    locked = "take | SELECT * INTO j FROM fleetq.jobs WHERE id = p_job FOR UPDATE;"
    rest = [k for k in uncovered if k not in (locked, "take | updated_at = clock_timestamp()")]
    listed = "\n".join(f"    {guards.toml_string(k)}," for k in rest)
    (protocol / "guards.toml").write_text(
        f"[baseline]\nuncovered = [\n{listed}\n]\n"
        f'[[waived]]\nguard = {guards.toml_string(locked)}\nreason = "a test"\n'
    )
    assert guards.check().ok
    # a waiver naming a line that is no longer a guard (changed or gone) must go too
    (protocol / "guards.toml").write_text(
        f"[baseline]\nuncovered = [\n{listed}\n]\n"
        f'[[waived]]\nguard = {guards.toml_string(locked)}\nreason = "a test"\n'
        '[[waived]]\nguard = "take | IF v_gone THEN"\nreason = "gone"\n'
    )
    report = guards.check()
    assert report.stale == ["take | IF v_gone THEN"] and not report.ok
