"""Commit messages: a subject of at most 72 characters that says what, then a blank line
and a body that says why.

    uv run python scripts/commit_msg.py FILE      # a commit-msg hook: check one message
    uv run python scripts/commit_msg.py --range   # CI: every commit since this script

As a hook, `.git/hooks/commit-msg` holds one line:
`exec uv run --no-sync python scripts/commit_msg.py "$1"`.

Why: subjects had grown to a median of 240 characters with empty bodies (issue 44), so
`git log --oneline` read like a lab notebook and nothing said why. Commits before this
script are left as they are: CI checks the ones from the commit that added it on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUBJECT_MAX = 72
HERE = Path(__file__).resolve().parent.parent


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (comment lines, as git strips them, ignored)."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or not lines[0].strip():
        return ["the subject is empty"]
    found = []
    if len(lines[0]) > SUBJECT_MAX:
        found.append(f"the subject is {len(lines[0])} characters (at most {SUBJECT_MAX})")
    if len(lines) > 1 and lines[1].strip():
        found.append("a blank line must separate the subject from the body")
    return found


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=HERE, capture_output=True, text=True, check=True
    ).stdout


def _since_this_script() -> list[tuple[str, str]]:
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "scripts/commit_msg.py").split()
    if not added:
        return []  # not committed yet: nothing to hold to it
    first = added[-1]
    hashes = [first, *_git("rev-list", "--reverse", f"{first}..HEAD").split()]
    return [(h, _git("log", "-1", "--format=%B", h)) for h in hashes]


def main(argv: list[str]) -> int:
    if argv == ["--range"]:
        commits = _since_this_script()
    elif len(argv) == 1:
        commits = [("this commit", Path(argv[0]).read_text(errors="replace"))]
    else:
        print(__doc__, file=sys.stderr)
        return 64
    bad = 0
    for name, message in commits:
        for problem in problems(message):
            bad += 1
            subject = message.splitlines()[0] if message.strip() else ""
            print(f"{name[:12]}: {problem}: {subject[:80]}", file=sys.stderr)
    if argv == ["--range"]:
        print(f"{len(commits)} commit(s) checked, {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
