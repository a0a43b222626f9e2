"""Exit codes of the study command lines, shared by every pipeline's ``main``.

0 done; 2 bad input or an unloadable model (a clear message, no traceback); 3 an error budget
was exceeded; 4 a Ray task or actor failed beyond its retries; 5 the disk (or quota) is full
(for 4 and 5 finished work is checkpointed: the same command resumes). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import sys
from typing import Callable

from operators.support.models import ModelLoadError
from pipelines.engine import io
from pipelines.engine.progress import ErrorBudgetExceeded


def exit_code(work: Callable[[], object], output: str | None = None) -> int:
    """Run a subcommand; ``output`` (its --output, if any) is checked first, before any model loads."""
    try:
        if output:
            io.check_output(output)
        work()
    except (io.InputError, ModelLoadError, ValueError, FileNotFoundError) as exc:
        print(f"error: {io.plain(str(exc))}", file=sys.stderr)
        return 2
    except ErrorBudgetExceeded as exc:
        print(f"error: {io.plain(str(exc))}", file=sys.stderr)
        return 3
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = exc.filename or output or "the output"
        print(f"error: {exc.strerror or 'no space left'} while writing {where}; free space there and run the "
              f"same command again: it resumes from the finished work", file=sys.stderr)
        return 5
    except Exception as exc:
        from ray.exceptions import RayError

        if not isinstance(exc, RayError):
            raise
        first = io.plain(str(exc)).strip().splitlines()  # Ray colours its task tracebacks
        print(f"error: a Ray worker failed and its retries are exhausted (--max-retries): "
              f"{type(exc).__name__}: {first[0] if first else ''}\n"
              f"Finished work is checkpointed under --output; the same command resumes from it.", file=sys.stderr)
        return 4
    return 0
