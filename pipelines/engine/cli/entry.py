"""What the study commands share: running the subcommand a command line names, under the exit
codes of ``pipelines.engine.cli.cli`` (the ``main`` of every entry script, ``pipelines/<study>.py``),
and, for the ``summarize`` subcommands, the error of an input table that does not fit and the
summary files they write."""

from __future__ import annotations

import argparse
import importlib
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

from pipelines.engine.cli import cli
from pipelines.engine.storage import io


def main(parser: argparse.ArgumentParser, commands: Mapping[str, str], argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments) with ``parser`` and run the subcommand it
    names (``args.command``): ``commands`` maps each subcommand to ``"module:function"``, called with
    the parsed arguments. Returns ``cli.exit_code``'s code (its --output, where it has one, is
    checked first)."""
    args = parser.parse_args(argv)
    module, _, function = commands[args.command].partition(":")

    def work():
        # deferred: a study's modules pull in matplotlib and scipy (DALL-Eval's also cv2 and skimage),
        # which parsing a command line and --help do not need
        return getattr(importlib.import_module(module), function)(args)

    return cli.exit_code(work, output=getattr(args, "output", None))


@contextmanager
def input_errors(path: str) -> Iterator[None]:
    """A ValueError raised inside (a table that does not fit what a command reads from it) becomes
    the InputError ``<path>: <message>`` (exit 2, without a traceback)."""
    try:
        yield
    except ValueError as exc:
        raise io.InputError(f"{path}: {exc}") from None


def write_summary(output: str, stem: str, record, table, html: str | Callable) -> None:
    """A ``summarize`` subcommand's files under ``output`` (``<stem>.json`` of ``record``, ``.csv`` of
    ``table``, ``.html`` of ``html`` and its figures: ``summary_files.write_summary_files``), then the
    line naming them."""
    # deferred: matplotlib (summary_files draws the figures), which parsing a command line does not need
    from pipelines.engine.report.summary_files import write_summary_files, wrote_line

    out_fs, out = io.output_fs(output)
    names = write_summary_files(out_fs, out, stem, record, table, html)
    print(wrote_line(output, names))
