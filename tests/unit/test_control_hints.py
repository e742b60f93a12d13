"""`job:N` notifications name a job only as ASCII digits that fit a bigint (issue 41):
any login may NOTIFY, and `job:²` or 5,000 digits raised in the runner's listener."""

from __future__ import annotations

import pytest

from fleetq.runner.control import job_named


@pytest.mark.parametrize(
    ("ident", "job"),
    [
        ("7", 7),
        ("9223372036854775807", 2**63 - 1),
        ("9223372036854775808", None),
        ("0", None),
        ("²", None),
        ("٣", None),  # an Arabic-Indic three: a digit to isdigit, not to a job id
        ("1" * 5000, None),
        ("", None),
        ("-1", None),
        (" 7", None),
    ],
)
def test_a_hint_names_a_job_only_in_ascii_digits(ident: str, job: int | None) -> None:
    assert job_named(ident) == job
