"""Every study command the README and docs/studies/*.md show is one its study's parser accepts.

The commands are the lines of the fenced code blocks (backslash continuations joined) that invoke a
study: ``python pipelines/<study>.py ...`` (any python, ``.venv/bin/python`` included),
``t2i <study> ...``, ``t2i-<study> ...``, ``ray submit cluster.yaml pipelines/<study>.py -- ...`` and
``ray job submit ... -- python pipelines/<study>.py ...``. Each is split as a POSIX shell would
(``shlex``; ``&&``, ``||``, ``;`` and ``|`` separate commands, ``#`` starts a comment, leading
``NAME=value`` assignments are skipped) and its arguments go through ``parse_args`` of the parser the
study's entry script builds (``build_parser()``, found through the registry of ``pipelines/t2i.py``).
A documented flag that does not exist, a missing required option, a bad choice, or placeholder syntax
a shell would not pass on (``<run id>``, ``[--flag]``, ``...``) fails, naming the file and line.
Placeholders such as ``RUN_DIR`` are fine where the option takes a string. No Ray, no models.
"""

from helpers import REPO_ROOT
import contextlib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.t2i import STUDIES, TOOLS

ROOT = REPO_ROOT
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs" / "studies").glob("*.md")))
FENCE = re.compile(r"^\s*(```|~~~)")
SCRIPT = re.compile(r"^(?:.*/)?pipelines/(\w+)\.py$")
ENTRY = re.compile(r"^(?:.*/)?t2i(?:-(\w+))?$")          # t2i, t2i-<study>, .venv/bin/t2i-<study>
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class Command:
    where: str          # "README.md:12"
    text: str           # the command line as written, continuations joined
    study: str          # "amplification", ... or "" (t2i alone)
    argv: tuple         # the study's arguments


def code_lines(text: str):
    """(first line number, logical line) of every line in a fenced code block."""
    in_block, pending, start = False, None, 0
    for no, raw in enumerate(text.splitlines(), 1):
        if FENCE.match(raw):
            if in_block and pending is not None:
                yield start, pending
            in_block, pending = not in_block, None
            continue
        if not in_block:
            continue
        if pending is None:
            start, pending = no, ""
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield start, pending + raw
        pending = None


def split_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line, as token lists (ValueError on unbalanced quotes)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    return [c for c in commands if c]


def study_call(tokens: list[str]) -> tuple[str, list[str]] | None:
    """(study, its arguments) when ``tokens`` invoke a study, else None. The study is "" for ``t2i``
    without one (``t2i --help``), and the name as written when it is not a registered study."""
    while tokens and ASSIGNMENT.match(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    entry = ENTRY.match(tokens[0])
    if entry:
        if entry.group(1):                                   # t2i-<study> ...
            return entry.group(1), tokens[1:]
        rest = tokens[1:]                                    # t2i <study> ...
        if not rest or rest[0].startswith("-"):
            return "", rest
        return rest[0], rest[1:]
    for i, token in enumerate(tokens):
        module = tokens[i + 1] if token == "-m" and i + 1 < len(tokens) else None
        m = SCRIPT.match(token) or (re.match(r"^pipelines\.(\w+)$", module) if module else None)
        if not m:
            continue
        name, rest = m.group(1), tokens[i + (2 if module else 1):]
        if rest[:1] == ["--"]:                               # ray submit cluster.yaml pipelines/x.py -- ...
            rest = rest[1:]
        if name == "t2i":
            return study_call(["t2i", *rest])
        if name not in STUDIES:                              # pipelines/synthetic_laion.py: not a study
            return None
        return name, rest
    return None


def documented_commands(path: Path, text: str | None = None) -> tuple[list[Command], list[str]]:
    """The study commands of one markdown file, and the lines that could not be split."""
    text = path.read_text() if text is None else text
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found, broken = [], []
    for no, line in code_lines(text):
        where = f"{name}:{no}"
        try:
            commands = split_commands(line)
        except ValueError as exc:
            if re.search(r"pipelines/\w+\.py|\bt2i\b", line):
                broken.append(f"{where}: cannot be split as a shell command ({exc}): {line.strip()}")
            continue
        for tokens in commands:
            call = study_call(tokens)
            if call is not None:
                found.append(Command(where, line.strip(), call[0], tuple(call[1])))
    return found, broken


def parser_of(study: str):
    """The argparse parser of a registered study, built by its entry script's ``build_parser()``
    (of a command across studies, ``t2i compare``: its module's ``parser()``)."""
    if study in TOOLS:
        return sys.modules[TOOLS[study][0].__module__].parser()
    main = STUDIES[study][0]
    return sys.modules[main.__module__].build_parser()


def parse_error(command: Command) -> str | None:
    """None when the command's arguments parse, else what argparse (or the registry) says."""
    if command.study == "":
        return None if not command.argv or command.argv[0] in ("-h", "--help") else \
            f"t2i needs a study first, one of {', '.join(STUDIES)}"
    if command.study not in STUDIES and command.study not in TOOLS:
        return f"unknown study {command.study!r}; one of: {', '.join(STUDIES)}"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser_of(command.study).parse_args(list(command.argv))
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def check(paths) -> tuple[list[Command], list[str]]:
    """Every study command of ``paths`` and the failures, each naming the file and line."""
    commands, failures = [], []
    for path in paths:
        found, broken = documented_commands(path)
        commands += found
        failures += broken
    for c in commands:
        error = parse_error(c)
        if error:
            failures.append(f"{c.where}: {error}\n    {c.text}")
    return commands, failures


# ------------------------------------------------------------------------------------------ tests
def test_every_documented_study_command_parses():
    commands, failures = check(DOCS)
    assert not failures, "documented commands that do not parse:\n" + "\n".join(failures)
    # and the extraction found what the docs show: the README's main job, and each study's page
    assert any(c.where.startswith("README.md:") and c.study == "amplification" and c.argv[:1] == ("run",)
               for c in commands), commands
    for study in STUDIES:
        page = f"docs/studies/{study}.md:"
        assert any(c.where.startswith(page) and c.study == study for c in commands), f"no command of {study} in {page}"
    assert any(c.where.startswith("README.md:") and c.study == "compare" for c in commands), "no t2i compare"
    forms = {c.text.split()[0] for c in commands}
    assert "ray" in forms, "the ray submit commands were not found"


def test_readme_keeps_the_ci_command_verbatim():
    """CI (.ci/run) runs the README's test command; the README shows exactly that line."""
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("python3.11 -m venv")]
    assert ci, ".ci/run has no install-and-test line"
    readme_lines = (ROOT / "README.md").read_text().splitlines()
    for line in ci:
        assert line in readme_lines, f"README.md does not show CI's command verbatim: {line}"


def test_the_check_fails_on_a_flag_that_does_not_exist(tmp_path):
    """The checker itself, on a scratch page: a bogus flag, shell placeholders and an unknown study
    fail, each naming its file and line; real commands in every supported form pass."""
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "# scratch",                                                                          # 1
        "```bash",                                                                            # 2
        "python pipelines/gep.py summarize --frequencies tests/data/paper001_tables11_12.csv",  # 3
        ".venv/bin/python pipelines/gep.py summarize --frequencies x.csv --no-such-flag",     # 4
        "t2i gep evaluate --run RUN_DIR --annotations a.csv",                                 # 5
        "t2i dalleval summarize --counts runs/dalleval/<run id>/prompt_counts.csv",           # 6
        "T2I=1 t2i-exposed triplets --profession-set --output runs/p  # a comment",          # 7
        "ray submit cluster.yaml pipelines/gep.py -- run --output s3://b/gep",                 # 8
        "ray submit cluster.yaml pipelines/gep.py -- run --output s3://b/gep ...",             # 9
        "python pipelines/amplification.py summarize [--output DIR] --percentages p.csv",     # 10
        "python pipelines/amplification.py captions \\",                                      # 11
        "    --output runs/x --occupations nurse --bogus-option 3",                            # 12
        "t2i nosuchstudy run --output x",                                                     # 13
        "cd /tmp && python pipelines/synthetic_laion.py --rows 10 && t2i --help",             # 14
        "```",
        "python pipelines/gep.py run --not-in-a-code-block",
    ]) + "\n")
    commands, failures = check([page])
    assert len(commands) == 11, commands
    failed = {f.split(":")[1] for f in failures}
    assert failed == {"4", "6", "9", "10", "11", "13"}, failures
    text = "\n".join(failures)
    assert "--no-such-flag" in text and "--bogus-option" in text and "nosuchstudy" in text
    assert all(f.startswith(f"{page}:") for f in failures)

    # and on a scratch copy of the real README with one bogus flag added to its main command
    readme = (ROOT / "README.md").read_text()
    assert "--steps 5" in readme
    copy = tmp_path / "README.md"
    copy.write_text(readme.replace("--steps 5", "--steps 5 --bogus-flag", 1))
    _, failures = check([copy])
    assert len(failures) == 1 and "--bogus-flag" in failures[0] and failures[0].startswith(f"{copy}:"), failures
