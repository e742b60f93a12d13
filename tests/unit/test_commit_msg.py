"""scripts/commit_msg.py: subjects at most 72 characters, a blank line before the body."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def _script() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "commit_msg.py"
    spec = importlib.util.spec_from_file_location("commit_msg", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("message", "wanted"),
    [
        ("Short subject\n\nWhy it matters.\n", []),
        ("Short subject\n", []),
        ("x" * 72 + "\n", []),
        ("x" * 73 + "\n", ["the subject is 73 characters (at most 72)"]),
        ("Subject\nbody glued on\n", ["a blank line must separate the subject from the body"]),
        ("\n\n", ["the subject is empty"]),
        ("# only a comment\n", ["the subject is empty"]),
        ("Subject\n\n# Please enter the commit message\n", []),
    ],
)
def test_a_message_is_held_to_the_rule(message: str, wanted: list[str]) -> None:
    assert _script().problems(message) == wanted
