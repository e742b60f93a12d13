"""The guards of the protocol SQL, and the SQL mutant (scripts/mutants.toml) that breaks each.

    uv run python scripts/guards.py [--check] [--uncovered] [--write-baseline]

A guard is a line of migrations/protocol/*.sql that refuses, restricts, dates or locks,
in a function that matters: one that writes (INSERT, UPDATE, DELETE, a lock), one that is
a SECURITY DEFINER entry point, or one that such a function calls (transitively). In such
a function the guards are:

- refusal: every IF/ELSIF whose branch RAISEs an exception or RETURNs early (`RETURN
  QUERY` does not return); the guard is the condition, from IF to THEN;
- where: every line of every WHERE clause of a statement that writes (UPDATE, DELETE,
  INSERT ... SELECT, a data-modifying WITH) or locks (SELECT/PERFORM ... FOR UPDATE), and
  every line of a JOIN's ON in such a statement when it holds more than the join key (an
  AND): one guard per line, so a mutant names the predicate it drops;
- clock: every line that reads a clock (now(), clock_timestamp(), statement_timestamp(),
  transaction_timestamp(), current_timestamp, localtimestamp);
- predicate: every line that compares, of what a boolean function that writes nothing
  returns and of a text function such a predicate calls (a reason, NULL when none): the
  eligibility rule, whether a runner is stale, whether a token was granted...;
- lock: every line with a lock clause (FOR [NO KEY] UPDATE, FOR [KEY] SHARE, SKIP LOCKED,
  NOWAIT), a LOCK TABLE, or a pg_advisory* call.

A mutant covers a guard when a line it changes (its `find` against its `replace`, line by
line, at every place `find` occurs in the file) is one of the guard's lines, or when it
names the guard in `covers = ["function | guard text"]`. Lines the rule picks that guard
nothing are waived in scripts/guards.toml, each with its reason. Guards nobody has
covered yet are listed there too, as the baseline: `--check` fails on an uncovered guard
that is not in it, and on a baseline entry that is covered now (the list only shrinks).
Both lists name a guard by function and normalized text, never by line number.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "migrations" / "protocol"
MUTANTS = ROOT / "scripts" / "mutants.toml"
LISTS = ROOT / "scripts" / "guards.toml"

_FUNCTION = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+([\w.]+)\s*\(", re.IGNORECASE
)
_DOLLAR = re.compile(r"\$(\w*)\$")
_TOKEN = re.compile(r"[A-Za-z_][\w$]*|\d+|::|[();,.]|\S")
_CLOCK = re.compile(
    r"\b(?:now|clock_timestamp|statement_timestamp|transaction_timestamp)\s*\(|"
    r"\bcurrent_timestamp\b|\blocaltimestamp\b",
    re.IGNORECASE,
)
_LOCK = re.compile(
    r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b|\bSKIP\s+LOCKED\b|\bNOWAIT\b|"
    r"\bLOCK\s+TABLE\b|\bpg_(?:try_)?advisory\w*",
    re.IGNORECASE,
)
# what makes a line of a predicate decide something
_DECIDES = re.compile(r"[<>=~]|@>|<@|\b(?:IS|NOT|AND|OR|IN|EXISTS|WHEN)\b", re.IGNORECASE)
# what ends a WHERE clause at its own depth
_CLAUSE_END = {
    "order",
    "group",
    "returning",
    "for",
    "limit",
    "having",
    "on",
    "window",
    "union",
    "except",
    "intersect",
    "offset",
}
_NOT_RAISING = {"notice", "warning", "info", "log", "debug"}
_STARTS_STATEMENT = {"then", "else", "loop", "begin", "declare", "exception"}


@dataclass(frozen=True)
class Token:
    word: str  # lower-cased
    line: int  # 1-based, in the file
    depth: int  # parentheses open before it


@dataclass(frozen=True)
class Guard:
    file: str
    function: str
    kind: str  # refusal, where, clock, lock
    lines: tuple[int, ...]
    text: str  # the guard's first line, as written

    @property
    def key(self) -> str:
        """How the lists name it: function and normalized text."""
        return f"{self.function} | {normalize(self.text)}"


@dataclass
class Function:
    file: str
    name: str
    start: int  # line of CREATE
    body_tokens: list[Token]
    definer: bool
    predicate: bool  # RETURNS boolean
    returns: str
    calls: set[str] = field(default_factory=set)
    writes: bool = False


def normalize(text: str) -> str:
    """A guard's text without its comment, case or spacing differences."""
    text = re.sub(r"--.*", "", text)
    return " ".join(text.split())


def mask(text: str) -> str:
    """`text` with every comment and string literal blanked (newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("--", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text[i] == "'":
            j = i + 1
            while j < n:
                if text[j] == "'" and text.startswith("''", j):
                    j += 2
                elif text[j] == "'":
                    break
                else:
                    j += 1
            for k in range(i + 1, min(j, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def tokens(masked: str, first_line: int) -> list[Token]:
    found: list[Token] = []
    depth = 0
    line = first_line
    last = 0
    for m in _TOKEN.finditer(masked):
        line += masked.count("\n", last, m.start())
        last = m.start()
        word = m.group().lower()
        if word == ")":
            depth -= 1
        found.append(Token(word, line, depth))
        if word == "(":
            depth += 1
    return found


def _returns(header: str) -> str:
    m = re.search(r"\bRETURNS\s+(\w+)", header, re.IGNORECASE)
    return m.group(1).lower() if m else ""


def functions(path: Path) -> list[Function]:
    """The functions of one protocol file, with their bodies' tokens."""
    text = path.read_text()
    masked = mask(text)
    found: list[Function] = []
    for m in _FUNCTION.finditer(masked):
        opening = _DOLLAR.search(masked, m.end())
        if opening is None:
            continue
        closing = masked.find(opening.group(), opening.end())
        header = masked[m.end() : opening.start()]
        body_line = masked.count("\n", 0, opening.end()) + 1
        body = masked[opening.end() : closing]
        found.append(
            Function(
                file=path.name,
                name=m.group(1).split(".")[-1].lower(),
                start=masked.count("\n", 0, m.start()) + 1,
                body_tokens=tokens(body, body_line),
                definer=re.search(r"\bSECURITY\s+DEFINER\b", header, re.I) is not None,
                predicate=re.search(r"\bRETURNS\s+boolean\b", header, re.I) is not None,
                returns=_returns(header),
            )
        )
    return found


def _segments(toks: list[Token]) -> list[tuple[str, int, int]]:
    """Split a body into ('cond', i, j) conditions (IF/ELSIF ... THEN) and ('stmt', i, j)
    statements, j exclusive. A CASE expression's THEN/ELSE is no boundary."""
    segments: list[tuple[str, int, int]] = []
    start, kind = 0, "stmt"
    cases = 0
    for i, t in enumerate(toks):
        prev = toks[i - 1].word if i else ""
        if t.word == "case" and prev != "end":
            cases += 1
            continue
        nxt = toks[i + 1].word if i + 1 < len(toks) else ""
        if t.word == "end" and cases and nxt not in ("if", "loop"):
            cases -= 1  # END of a CASE expression, or END CASE
            continue
        if t.depth != 0 or cases:
            continue
        if t.word in ("if", "elsif") and prev != "end":
            if i > start:
                segments.append((kind, start, i))
            start, kind = i, "cond"
        elif t.word == ";" or t.word in _STARTS_STATEMENT:
            if i > start:
                segments.append((kind, start, i + (t.word == "then")))
            start, kind = i + 1, "stmt"
    if start < len(toks):
        segments.append((kind, start, len(toks)))
    return segments


def _branch_refuses(toks: list[Token], then: int) -> bool:
    """Whether the branch after the THEN at `then` raises or returns early."""
    nested = 0
    i = then + 1
    while i < len(toks):
        t = toks[i]
        prev = toks[i - 1].word
        nxt = toks[i + 1].word if i + 1 < len(toks) else ""
        if t.depth == 0:
            if t.word == "if" and prev != "end":
                nested += 1
            elif t.word == "end" and nxt == "if":
                if nested == 0:
                    return False
                nested -= 1
            elif t.word in ("elsif", "else") and nested == 0 and _plpgsql_else(toks, i):
                return False
            elif (t.word == "raise" and nxt not in _NOT_RAISING) or (
                t.word == "return" and nxt not in ("query", "next")
            ):
                return True
        i += 1
    return False


def _plpgsql_else(toks: list[Token], i: int) -> bool:
    """An ELSE at depth 0 that is not a CASE expression's (no open CASE before it in its
    statement)."""
    cases = 0
    j = i - 1
    while j >= 0 and toks[j].word != ";" and toks[j].word != "then":
        if toks[j].word == "case" and (j == 0 or toks[j - 1].word != "end"):
            cases += 1
        elif toks[j].word == "end":
            cases -= 1
        j -= 1
    return cases <= 0


def _is_write(seg: list[Token]) -> bool:
    for i, t in enumerate(seg):
        prev = seg[i - 1].word if i else ""
        nxt = seg[i + 1].word if i + 1 < len(seg) else ""
        if t.word == "insert" and nxt == "into":
            return True
        if t.word == "delete" and nxt == "from":
            return True
        if t.word == "update" and prev not in ("for", "key", "do"):
            return True
    return False


def _has_lock(seg: list[Token]) -> bool:
    for i, t in enumerate(seg):
        nxt = seg[i + 1].word if i + 1 < len(seg) else ""
        if t.word == "for" and nxt in ("update", "share", "no", "key"):
            return True
        if t.word == "lock" and nxt == "table":
            return True
    return False


_JOIN_WORDS = {"where", "left", "right", "join", "cross", "inner", "full", "group", "order"}


_LOOKUP = {"set", "select", "values", "returning", "then", "else", "when"}
_CONTEXT = _LOOKUP | {
    "where",
    "from",
    "join",
    "on",
    "as",
    "with",
    "and",
    "or",
    "in",
    "exists",
    "using",
    "into",
    "by",
    "having",
}


def _is_lookup(seg: list[Token], at: int) -> bool:
    """Whether seg[at] sits in a subquery that only looks a value up: one opened in a SET,
    a select list, VALUES, RETURNING or a CASE (any enclosing level)."""
    depth = seg[at].depth
    i = at
    while depth > 0:
        while i > 0 and not (seg[i - 1].word == "(" and seg[i - 1].depth == depth - 1):
            i -= 1
        i -= 1  # the "("
        depth -= 1
        j = i - 1
        while j >= 0 and not (seg[j].depth == depth and seg[j].word in _CONTEXT):
            j -= 1
        if j >= 0 and seg[j].word in _LOOKUP:
            return True
    return False


def _arbiter(seg: list[Token], at: int) -> bool:
    """Whether the WHERE at seg[at] is an ON CONFLICT's index predicate (no guard)."""
    j = at - 1
    if j < 0 or seg[j].word != ")":
        return False
    depth = seg[at].depth
    while j >= 0 and not (seg[j].word == "(" and seg[j].depth == depth):
        j -= 1
    return j >= 1 and seg[j - 1].word == "conflict"


def _restricts(seg: list[Token], at: int) -> bool:
    """Whether the ON at seg[at] holds more than a join key (`a.x = b.y AND ...`)."""
    if at + 1 < len(seg) and seg[at + 1].word == "conflict":
        return False
    depth = seg[at].depth
    words: list[str] = []
    for t in seg[at + 1 :]:
        if t.depth < depth or (
            t.depth == depth and (t.word in _CLAUSE_END | _JOIN_WORDS or t.word == ";")
        ):
            break
        words.append(t.word)
    key = re.compile(r"^(\w+\.)?\w+=(\w+\.)?\w+$")
    return not all(key.match(part) for part in "".join(words).split("and"))


def _clause_lines(seg: list[Token], at: int, ends: set[str]) -> list[int]:
    """The lines of the clause whose keyword is seg[at]."""
    depth = seg[at].depth
    last = seg[at].line
    for t in seg[at + 1 :]:
        if t.depth < depth or (t.depth == depth and (t.word in ends or t.word == ";")):
            break
        if t.depth == depth and t.word in ("join", "where", "from"):
            break
        last = t.line
    return list(range(seg[at].line, last + 1))


def guards_of(fn: Function, lines: list[str]) -> list[Guard]:
    toks = fn.body_tokens
    found: list[Guard] = []

    def add(kind: str, span: list[int]) -> None:
        span = [
            n for n in span if lines[n - 1].strip() and not lines[n - 1].strip().startswith("--")
        ]
        if span:
            found.append(Guard(fn.file, fn.name, kind, tuple(span), lines[span[0] - 1].strip()))

    for kind, i, j in _segments(toks):
        seg = toks[i:j]
        if kind == "cond":
            if seg[-1].word == "then" and _branch_refuses(toks, j - 1):
                add("refusal", list(range(seg[0].line, seg[-1].line + 1)))
            continue
        if not (_is_write(seg) or _has_lock(seg)):
            continue
        for k, t in enumerate(seg):
            if t.word == "where" and not _is_lookup(seg, k) and not _arbiter(seg, k):
                for n in _clause_lines(seg, k, _CLAUSE_END):
                    add("where", [n])
            elif t.word == "on" and not _is_lookup(seg, k) and _restricts(seg, k):
                for n in _clause_lines(seg, k, _CLAUSE_END | _JOIN_WORDS):
                    add("where", [n])
    if fn.predicate and not fn.writes:
        # a predicate's answer is its guard: every line of what it returns
        ret = next((k for k, t in enumerate(toks) if t.word == "return"), None)
        if ret is None:  # LANGUAGE sql: the body
            span = sorted({t.line for t in toks})
        else:
            end = next((k for k in range(ret, len(toks)) if toks[k].word == ";"), len(toks) - 1)
            span = list(range(toks[ret].line, toks[end].line + 1))
        for n in span:
            if _DECIDES.search(mask(lines[n - 1])):
                add("predicate", [n])
    body_lines = sorted({t.line for t in toks})
    for n in body_lines:
        code = mask(lines[n - 1])
        if _CLOCK.search(code):
            add("clock", [n])
        if _LOCK.search(code):
            add("lock", [n])
    # one guard per (kind, line): a WHERE line inside a refusal's condition, say, is both
    seen: set[tuple[str, tuple[int, ...]]] = set()
    unique = []
    for g in sorted(found, key=lambda g: (g.lines, g.kind)):
        if (g.kind, g.lines) not in seen:
            seen.add((g.kind, g.lines))
            unique.append(g)
    return unique


def _writes(fn: Function) -> bool:
    toks = fn.body_tokens
    for _kind, i, j in _segments(toks):
        seg = toks[i:j]
        if _is_write(seg) or _has_lock(seg):
            return True
    return any(t.word.startswith("pg_advisory") for t in toks)


def _calls(fn: Function) -> set[str]:
    toks = fn.body_tokens
    return {
        toks[i + 2].word
        for i in range(len(toks) - 3)
        if toks[i].word == "fleetq" and toks[i + 1].word == "." and toks[i + 3].word == "("
    }


def all_functions() -> list[Function]:
    fns = [fn for path in sorted(PROTOCOL.glob("*.sql")) for fn in functions(path)]
    for fn in fns:
        fn.writes = _writes(fn)
        fn.calls = _calls(fn)
    changed = True
    while changed:  # a function that calls a writer writes; one a predicate calls decides
        changed = False
        writers = {fn.name for fn in fns if fn.writes}
        deciders = {c for fn in fns if fn.predicate and not fn.writes for c in fn.calls}
        for fn in fns:
            if not fn.writes and fn.calls & writers:
                fn.writes = changed = True
            if not fn.predicate and not fn.writes and fn.name in deciders and fn.returns == "text":
                fn.predicate = changed = True
    return fns


def in_scope(fns: list[Function]) -> set[str]:
    """Names of the functions that write, are SECURITY DEFINER, or are called by one."""
    scope = {fn.name for fn in fns if fn.writes or fn.definer}
    # what an entry point calls is part of its guard
    reach = set(scope)
    todo = list(scope)
    by_name: dict[str, list[Function]] = {}
    for fn in fns:
        by_name.setdefault(fn.name, []).append(fn)
    while todo:
        for fn in by_name.get(todo.pop(), []):
            for callee in fn.calls:
                if callee in by_name and callee not in reach:
                    reach.add(callee)
                    todo.append(callee)
    return reach


def all_guards() -> list[Guard]:
    fns = all_functions()
    scope = in_scope(fns)
    found: list[Guard] = []
    texts = {path.name: path.read_text().splitlines() for path in PROTOCOL.glob("*.sql")}
    for fn in fns:
        if fn.name in scope:
            found.extend(guards_of(fn, texts[fn.file]))
    return found


@dataclass(frozen=True)
class MutantSpan:
    name: str
    file: str
    lines: frozenset[int]  # the lines of the file it changes
    covers: tuple[str, ...]


def changed_lines(text: str, find: str, replace: str) -> set[int]:
    """The lines of `text` that replacing every `find` with `replace` changes."""
    a, b = find.split("\n"), replace.split("\n")
    offsets: set[int] = set()
    for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            offsets.update(range(i1, i2))
        elif tag == "insert":
            offsets.add(min(i1, len(a) - 1))
    found: set[int] = set()
    start = text.find(find)
    while start >= 0 and find:
        first = text.count("\n", 0, start) + 1
        found.update(first + k for k in offsets)
        start = text.find(find, start + len(find))
    return found


def mutant_spans() -> list[MutantSpan]:
    with MUTANTS.open("rb") as f:
        listed = tomllib.load(f)["mutant"]
    spans = []
    for m in listed:
        text = (PROTOCOL / m["file"]).read_text()
        spans.append(
            MutantSpan(
                name=m["name"],
                file=m["file"],
                lines=frozenset(changed_lines(text, m["find"], m["replace"])),
                covers=tuple(normalize_key(c) for c in m.get("covers", [])),
            )
        )
    return spans


def normalize_key(key: str) -> str:
    function, _, text = key.partition("|")
    return f"{function.strip().lower()} | {normalize(text)}"


def load_lists() -> tuple[dict[str, str], Counter[str]]:
    """The waived guards (key: reason) and the baseline (keys, with repeats)."""
    if not LISTS.exists():
        return {}, Counter()
    with LISTS.open("rb") as f:
        data = tomllib.load(f)
    waived = {normalize_key(w["guard"]): w["reason"] for w in data.get("waived", [])}
    baseline = Counter(normalize_key(k) for k in data.get("baseline", {}).get("uncovered", []))
    return waived, baseline


@dataclass(frozen=True)
class Row:
    guard: Guard
    mutants: tuple[str, ...]
    waived: str | None


def table() -> list[Row]:
    spans = mutant_spans()
    waived, _ = load_lists()
    rows = []
    for g in all_guards():
        by = tuple(
            s.name
            for s in spans
            if (s.file == g.file and s.lines & set(g.lines)) or g.key in s.covers
        )
        rows.append(Row(g, by, None if by else waived.get(g.key)))
    return rows


@dataclass(frozen=True)
class Report:
    rows: list[Row]
    new: list[Row]  # uncovered, not waived, not in the baseline
    gone: list[str]  # baseline entries covered (or no longer guards) now
    stale: list[str]  # waivers that name no guard any more (its line changed or went)

    @property
    def ok(self) -> bool:
        return not self.new and not self.gone and not self.stale


def check() -> Report:
    rows = table()
    waived, baseline = load_lists()
    stale = sorted(set(waived) - {r.guard.key for r in rows})
    uncovered = [r for r in rows if not r.mutants and r.waived is None]
    left = Counter(baseline)
    new = []
    for r in uncovered:
        if left[r.guard.key] > 0:
            left[r.guard.key] -= 1
        else:
            new.append(r)
    gone = sorted((+left).elements())
    return Report(rows, new, gone, stale)


def summary(report: Report) -> str:
    rows = report.rows
    covered = sum(1 for r in rows if r.mutants)
    waived = sum(1 for r in rows if not r.mutants and r.waived is not None)
    uncovered = len(rows) - covered - waived
    kinds = Counter(r.guard.kind for r in rows)
    text = (
        f"{len(rows)} guards ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}): "
        f"{covered} covered by a mutant, {waived} waived, {uncovered} uncovered "
        f"({uncovered - len(report.new)} in the baseline)"
    )
    for r in report.new:
        g = r.guard
        text += f"\n  UNCOVERED {g.file}:{g.lines[0]} {g.function}: {g.text}"
    for key in report.gone:
        text += f"\n  COVERED NOW, remove from the baseline in {LISTS.name}: {key}"
    for key in report.stale:
        text += f"\n  NO SUCH GUARD, remove its waiver from {LISTS.name}: {key}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on a new uncovered guard")
    parser.add_argument("--uncovered", action="store_true", help="list uncovered guards only")
    parser.add_argument(
        "--write-baseline", action="store_true", help="print the baseline for the uncovered"
    )
    args = parser.parse_args()
    report = check()
    if args.write_baseline:
        print("[baseline]\nuncovered = [")
        for r in report.rows:
            if not r.mutants and r.waived is None:
                print(f"    {toml_string(r.guard.key)},")
        print("]")
        return 0
    if not args.check:
        for r in report.rows:
            if args.uncovered and (r.mutants or r.waived is not None):
                continue
            g = r.guard
            by = ", ".join(r.mutants) or (f"waived: {r.waived}" if r.waived else "NONE")
            print(f"{g.file}:{g.lines[0]:<4} {g.function:28} {g.kind:8} {g.text[:70]:70}  {by}")
    print(summary(report))
    return 0 if report.ok or not args.check else 1


def toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


if __name__ == "__main__":
    sys.exit(main())
