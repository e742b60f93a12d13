"""The jobs filter as the operator types it: `lane:checks state:queued lost>0 webapp`."""

from __future__ import annotations

from fleetq.core.jobpages import JobFilter
from fleetq.core.models import JobState

KEYS = ("lane", "state", "project", "runner")


FLAGS = ("reassigned>0", "lost>0")


def parse_filter(text: str) -> JobFilter:
    """`lane:checks state:queued project:webapp runner:node-a/r1 reassigned>0 lost>0`
    (any subset), and at most one bare word: a job id, commit prefix, operation, project
    or submitter."""
    fields: dict[str, object] = {}
    for word in text.split():
        if word in FLAGS:
            fields[word.removesuffix(">0")] = True
            continue
        key, sep, value = word.partition(":")
        if not sep:
            if "word" in fields:
                raise ValueError(f"{word!r}: one free word at most (an id, a commit, a name)")
            fields["word"] = word
            continue
        if key not in KEYS or not value:
            keys = ", ".join([*(k + ":VALUE" for k in KEYS), *FLAGS])
            raise ValueError(f"{word!r}: use {keys}, or one free word")
        fields[key] = value
    if "state" in fields and fields["state"] not in {s.value for s in JobState}:
        raise ValueError(f"state must be one of {', '.join(s.value for s in JobState)}")
    return JobFilter.model_validate(fields)


def describe_filter(where: JobFilter) -> str:
    """The filter as the operator would type it."""
    parts = [f"{k}:{getattr(where, k)}" for k in KEYS if getattr(where, k) is not None]
    parts += [flag for flag in FLAGS if getattr(where, flag.removesuffix(">0"))]
    if where.word:
        parts.append(where.word)
    return " ".join(p.replace("JobState.", "") for p in parts)
