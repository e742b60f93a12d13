"""The demo's source repositories: real git history with real, small checks.

Each repository gets five commits of a tiny shopping-cart module and a `checks/` package
that the demo's operations run (`python -m checks.unit` and so on): a quick unit test, a
slow integration suite, a "browser" smoke test, a lint that always fails and a staging
test that hangs until its timeout. Commit 3 introduces a rounding bug that commit 4
fixes, so the unit check fails at exactly one revision, as real verdicts do.

Author, committer, dates and git configuration are pinned, so the same project name
always yields the same commit SHAs: a rerun of the demo rebuilds its repositories and
jobs of earlier runs still name commits that exist.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetq.core.errors import FleetqError

CHECKS: dict[str, str] = {
    "checks/__init__.py": '"""The project\'s checks, run by fleetq runners."""\n',
    "checks/integration.py": '''\
"""Integration suite: slow on purpose (eight scenarios, about a second each)."""
import time

STEPS = 8
for step in range(1, STEPS + 1):
    time.sleep(1)
    print(f"scenario {step}/{STEPS} passed", flush=True)
''',
    "checks/browser.py": '''\
"""Browser smoke test: needs a runner with the `browser` capability."""
import time

print("launching headless browser", flush=True)
time.sleep(1.5)
print("GET /cart rendered in 0.4 s; checkout button visible")
''',
    "checks/lint.py": '''\
"""Lint: no TODO may reach the main branch (the cart still has one, so this fails)."""
import pathlib
import sys

found = [
    f"{path}:{n}: TODO left in the code"
    for path in sorted(pathlib.Path("app").glob("*.py"))
    for n, line in enumerate(path.read_text().splitlines(), 1)
    if "TODO" in line
]
print("\\n".join(found) or "clean")
sys.exit(1 if found else 0)
''',
    "checks/staging.py": '''\
"""End-to-end test against the staging API, which never answers: it runs until the
operation's timeout stops it."""
import time

print("connecting to https://staging.example.invalid ...", flush=True)
time.sleep(600)
''',
}

CART_V1 = '''\
"""Shopping cart arithmetic, in cents."""
# TODO: currency support


def total(items: list[tuple[int, int]]) -> int:
    return sum(price * quantity for price, quantity in items)
'''

CART_V2 = (
    CART_V1
    + """

def discount(amount: int, percent: int) -> int:
    return amount - amount * percent // 100
"""
)

# Commit 3 rounds VAT down (the bug the unit test catches); commit 4 rounds half-up.
CART_V3 = CART_V2 + "\n\ndef with_vat(amount: int) -> int:\n    return amount * 120 // 100 - 1\n"
CART_V4 = CART_V2 + "\n\ndef with_vat(amount: int) -> int:\n    return (amount * 120 + 50) // 100\n"

UNIT_V1 = '''\
"""Unit tests of the cart: quick, no network."""
import unittest

from app import cart


class CartTest(unittest.TestCase):
    def test_total(self) -> None:
        self.assertEqual(cart.total([(250, 2), (100, 1)]), 600)
'''
UNIT_V2 = (
    UNIT_V1
    + """
    def test_discount(self) -> None:
        self.assertEqual(cart.discount(1000, 15), 850)
"""
)
UNIT_V3 = (
    UNIT_V2
    + """
    def test_vat(self) -> None:
        self.assertEqual(cart.with_vat(1000), 1200)
"""
)
MAIN = '\n\nif __name__ == "__main__":\n    unittest.main()\n'

README = """# {name}

A demo project for fleetq. Its checks run as `python -m checks.<name>` in a checkout of
the exact commit a job names: unit, integration, browser, lint, staging.
"""

# (message, files written by the commit), oldest first.
HISTORY: list[tuple[str, dict[str, str]]] = [
    (
        "Cart totals, with checks",
        {**CHECKS, "app/__init__.py": "", "app/cart.py": CART_V1, "checks/unit.py": UNIT_V1 + MAIN},
    ),
    ("Percentage discounts", {"app/cart.py": CART_V2, "checks/unit.py": UNIT_V2 + MAIN}),
    ("Add VAT to totals", {"app/cart.py": CART_V3, "checks/unit.py": UNIT_V3 + MAIN}),
    ("Round VAT half-up (fixes the failing unit test)", {"app/cart.py": CART_V4}),
    ("README: how the checks run", {"README.md": README}),
]


@dataclass(frozen=True)
class DemoRepo:
    """A built repository: where it is and its commits, oldest first."""

    name: str
    path: Path
    commits: tuple[str, ...]


def build(path: Path, name: str) -> DemoRepo:
    """(Re)create the repository at `path`; the same `name` gives the same SHAs."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    _git(path, "init", "-q", "--initial-branch=main")
    commits: list[str] = []
    for day, (message, files) in enumerate(HISTORY, start=1):
        for relative, text in files.items():
            target = path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text.format(name=name) if relative == "README.md" else text)
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", f"{name}: {message}", date=f"2026-01-{day:02d}T10:00:00Z")
        commits.append(_git(path, "rev-parse", "HEAD"))
    return DemoRepo(name=name, path=path, commits=tuple(commits))


def _git(repo: Path, *args: str, date: str = "2026-01-01T10:00:00Z") -> str:
    """Run git with identity, dates and configuration pinned (no user or system config:
    a global `commit.gpgsign` must not make the demo prompt for a key)."""
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "fleetq demo",
        "GIT_AUTHOR_EMAIL": "demo@fleetq.invalid",
        "GIT_COMMITTER_NAME": "fleetq demo",
        "GIT_COMMITTER_EMAIL": "demo@fleetq.invalid",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
        )
    except FileNotFoundError as exc:
        raise FleetqError("the demo needs git on PATH to build its repositories") from exc
    except subprocess.CalledProcessError as exc:
        raise FleetqError(f"git {' '.join(args)} failed: {exc.stderr.strip()}") from exc
    return done.stdout.strip()
