"""Exit codes of the study command lines, shared by every pipeline's ``main``.

0 done; 2 bad input or an unloadable model (a clear message, no traceback); 3 an error budget
was exceeded; 4 a Ray task or actor failed beyond its retries; 5 the disk (or quota) is full
(for 4 and 5 finished work is checkpointed: the same command resumes). Anything else is a bug and
keeps its traceback.

Every error is one line, ``error: ...``, on stderr. An exception raised inside a Ray task reaches
the driver wrapped (``RayTaskError``; Ray Data's ``UserCodeException``, which keeps the original
only as the text of its traceback): it is reported as what the task raised, its type and first
line, and sorted like the same exception raised on the driver (a full disk inside a sink task is
exit 5 naming the file, a ValueError exit 2); anything else a task raised is exit 4.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable

from operators.support.models import ModelLoadError
from pipelines.engine.storage import io
from pipelines.engine.storage.output_check import check_output
from pipelines.engine.stream.progress import ErrorBudgetExceeded

INPUT_ERRORS = (io.InputError, ModelLoadError, ValueError, FileNotFoundError)
RESUME = "finished work is checkpointed under --output: the same command resumes from it"


def exit_code(work: Callable[[], object], output: str | None = None) -> int:
    """Run a subcommand; ``output`` (its --output, if any) is checked first, before any model loads."""
    try:
        if output:
            check_output(output)
        work()
    except Exception as exc:
        reported = report(exc, output)
        if reported is None:
            raise
        code, line = reported
        print(f"error: {line}", file=sys.stderr)
        return code
    return 0


def report(exc: BaseException, output: str | None = None) -> tuple[int, str] | None:
    """(exit code, the line after ``error: ``) for what a subcommand raised; None for a bug (it
    keeps its traceback)."""
    ray_exceptions = sys.modules.get("ray.exceptions")  # a RayError exists only once Ray is imported
    if ray_exceptions is not None and isinstance(exc, ray_exceptions.RayError):
        return _report_ray(exc, output)
    if isinstance(exc, INPUT_ERRORS):
        return 2, io.plain(str(exc))
    if isinstance(exc, ErrorBudgetExceeded):
        return 3, io.plain(str(exc))
    code = io.disk_full_errno(exc)  # an OSError, or a library's own error (safetensors') saying so
    if code is not None:
        return 5, disk_full_line(code, getattr(exc, "filename", None) or output)
    return None


def disk_full_line(code: int, where: str | None) -> str:
    return (f"{os.strerror(code)} while writing {where or 'the output'}; free space there and run the same "
            f"command again: it resumes from the finished work")


@dataclass(frozen=True)
class TaskError:
    """What a Ray task raised, out of Ray's wrappers."""

    type_name: str                  # as its traceback names it, without the module: OSError, InputError
    message: str                    # its first line
    cls: type | None = None         # its class, where the driver knows it
    errno: int | None = None
    filename: str | None = None
    task: str | None = None         # the task it was raised in: MapBatches(write_part_task)

    def line(self) -> str:
        text = f"{self.type_name}: {self.message}" if self.message else self.type_name
        if self.filename and self.filename not in text:
            text += f" ({self.filename})"
        return text


def task_error(exc: BaseException) -> TaskError | None:
    """What the Ray task behind ``exc`` (a RayError) raised: the object where the driver got it (a
    plain task's ``RayTaskError(OSError)``: its ``cause``), else read from the traceback text Ray
    passes on (Ray Data's ``UserCodeException`` arrives without its ``__cause__``); None when no
    task raised anything (a crashed worker, a lost object, an out-of-memory kill)."""
    text = io.plain(str(exc))
    task = _task_name(text)
    e, seen = exc, []
    while e is not None and _wrapper(e) and not any(e is s for s in seen):
        seen.append(e)
        e = getattr(e, "cause", None) or e.__cause__
    if e is not None and not _wrapper(e):
        first = (io.plain(str(e)).strip().splitlines() or [""])[0]
        return TaskError(type(e).__name__, first, type(e), getattr(e, "errno", None), getattr(e, "filename", None),
                         task)
    return _from_traceback(text, task)


def _wrapper(exc: BaseException) -> bool:
    """Ray's own exceptions (RayTaskError, UserCodeException, Ray Data's SystemException) wrap
    what a task raised."""
    from ray.exceptions import RayError  # deferred: ray

    return isinstance(exc, RayError) or type(exc).__module__.split(".")[0] == "ray"


_CHAINED = re.compile(r"^[ \t]*(?:The above exception was the direct cause of the following exception:|"
                      r"During handling of the above exception, another exception occurred:)[ \t]*$", re.M)
_EXCEPTION_LINE = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?:: ?(?P<message>.*))?")
_TASK = re.compile(r"ray::(?P<task>.+?)(?:\(\))? \(pid=")
_OS_MESSAGE = re.compile(r"\[Errno (?P<errno>-?\d+)\] .*?(?:: '(?P<filename>.*)')?")


def _task_name(text: str) -> str | None:
    match = _TASK.search(text)
    return match.group("task") if match else None


def _from_traceback(text: str, task: str | None) -> TaskError | None:
    """The exception nearest to Ray's wrapper in a task's traceback text: the last of its chained
    sections whose exception is not one of Ray's."""
    for section in reversed(_CHAINED.split(text)):
        framed = False   # an exception line follows the frames of its traceback (Ray's own messages have none)
        for line in section.splitlines():
            if line.startswith('  File "'):
                framed = True
            if not framed or not line or line[0] in " \t" or line.startswith(("ray::", "Traceback (")):
                continue
            match = _EXCEPTION_LINE.fullmatch(line)
            if match is None:
                continue
            dotted, message = match.group("type"), (match.group("message") or "").strip()
            if dotted.startswith("ray."):
                break   # Ray's own wrapper (ray.exceptions.UserCodeException): the cause is before it
            os_message = _OS_MESSAGE.fullmatch(message)
            return TaskError(dotted.rpartition(".")[2], message, _exception_class(dotted),
                             int(os_message.group("errno")) if os_message else None,
                             os_message.group("filename") if os_message else None, task)
    return None


def _exception_class(dotted: str) -> type | None:
    """The class a traceback names (``ValueError``, ``pipelines.engine.storage.io.InputError``) when this
    process has imported it; None otherwise."""
    module, _, name = dotted.rpartition(".")
    found = getattr(sys.modules.get(module) if module else builtins, name, None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


_INPUT_ERROR_NAMES = {c.__name__ for c in INPUT_ERRORS}


def _report_ray(exc: BaseException, output: str | None) -> tuple[int, str]:
    te = task_error(exc)
    if te is None:   # no task raised: a worker or node died, an object was lost, ...
        first = (io.plain(str(exc)).strip().splitlines() or [""])[0]
        return 4, (f"a Ray worker failed and its retries are exhausted (--max-retries): "
                   f"{type(exc).__name__}: {first}; {RESUME}")
    code = te.errno if te.errno in io.DISK_FULL else io.disk_full_errno(f"{te.type_name}: {te.message}")
    if code is not None:
        return 5, disk_full_line(code, te.filename or output)
    where = f" (in the Ray task {te.task})" if te.task else ""
    if te.cls is not None and issubclass(te.cls, ErrorBudgetExceeded):
        return 3, te.message
    if issubclass(te.cls, INPUT_ERRORS) if te.cls is not None else te.type_name in _INPUT_ERROR_NAMES:
        return 2, f"{te.line()}{where}"
    return 4, f"a Ray task failed: {te.line()}{where}; {RESUME}"
