"""Small builders shared by the tests."""
from pathlib import Path

import pyarrow as pa


def captions_table(captions, **extra) -> pa.Table:
    cols = {"caption": pa.array(captions, pa.string())}
    cols.update(extra)
    return pa.table(cols)


REPO_ROOT = Path(__file__).resolve().parents[1]  # the repository (tests/ sits at its top level)
TESTS_DATA = REPO_ROOT / "tests" / "data"  # the papers' tables as CSV


# The first lines of a driver script a test runs in a subprocess that starts a Ray instance of its
# own: its workers fork from the test process's template too (tests/forked_workers.py).
FORKED_WORKERS = (f"import sys\nsys.path.insert(0, {str(REPO_ROOT / 'tests')!r})\n"
                  "import forked_workers\nforked_workers.install()\n")


# How often a test server's loop looks for a shutdown request. socketserver's default is 0.5 s,
# which every test that stops a server in its teardown waited out.
SHUTDOWN_POLL_S = 0.02


def serve_in_thread(server) -> "threading.Thread":
    """Start ``server.serve_forever`` (a socketserver or werkzeug server) on a daemon thread that
    notices ``server.shutdown()`` within ``SHUTDOWN_POLL_S``; the thread, started."""
    import threading

    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True)
    thread.start()
    return thread


def run_main(main, argv) -> "subprocess.CompletedProcess":
    """A study's ``main(argv)`` in this process, as a subprocess would run its script: exit code
    (argparse's SystemExit included), stdout and stderr, in a CompletedProcess. What it saves is
    the start of Python and the imports (1-2 s a call); each script's own entry point is run as a
    real subprocess by at least one test of its study (``run_script`` in each test_summarize_cli.py)."""
    import contextlib
    import io
    import subprocess

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=err)
    return subprocess.CompletedProcess(list(argv), code or 0, out.getvalue(), err.getvalue())


def run_study_script(study: str, command: str, *args) -> "subprocess.CompletedProcess":
    """``pipelines/<study>.py <command> ...`` as a user runs it: the script as ``__main__``, in a
    process of its own: forked from the test run's template where one is running (its libraries
    imported: ``forked_workers.python_command``; 1-2 CPU-s less a call), else a fresh interpreter."""
    import subprocess
    import sys

    from forked_workers import python_command

    cmd, env = python_command([sys.executable, str(REPO_ROOT / "pipelines" / f"{study}.py"), command, *args])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def run_study_main(study: str, command: str, *args) -> "subprocess.CompletedProcess":
    """The same command in this process (``run_main``): for the checks of its output and errors."""
    import importlib

    return run_main(importlib.import_module(f"pipelines.{study}").main, [command, *args])


def run_stages_here(table: pa.Table, stages) -> pa.Table:
    """Image stages (``operators.base.Stage`` lists, no tally rows) applied in this process, one
    operator after the other, to ``table`` as one batch: the uninterrupted reference of a resume
    test, computed by the same operators without starting an actor per stage (several CPU-seconds
    each: their imports)."""
    for s in stages:
        table = s.build()(table)
    return table


def kill_when(cmd: list, pattern: str, log_path, timeout: float = 480) -> list[str]:
    """Start ``cmd`` (in the repository, a session of its own, output to ``log_path``), wait until a
    file matching the glob ``pattern`` appears (or it exits, or ``timeout`` seconds pass), then
    SIGKILL its whole process group (a local Ray it started included). Returns the matching files;
    empty means it never got there (the log's tail is in the assertion a caller makes)."""
    import glob
    import os
    import signal
    import subprocess
    import time

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=os.environ | {"PYTHONPATH": str(REPO_ROOT)}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        try:
            while not glob.glob(pattern) and proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    return glob.glob(pattern)


class SnapshotAtFirstPart:
    """A run left as a driver killed right after its first checkpoint part leaves it, without a
    run of its own to kill: while the uninterrupted run runs (``with``), ``RunDir.write_part``
    records each part's rows and, once the first part of any checkpoint is written, copies the run
    directory aside (what a SIGKILL there leaves: no handler runs, run.json still says "running").
    ``swap(run_dir, clean)`` then moves the finished run to ``clean`` and the copy to ``run_dir``,
    the path it was taken at (the stand-ins' paths in its records are that path's), for the resume.
    The copy is what a kill leaves only while the driver is the one writer: not with images saved
    (the actors' image sinks write into the run directory meanwhile)."""

    def __init__(self, copy: Path):
        self.copy, self.rows = Path(copy), []

    def __enter__(self):
        import shutil

        from pipelines.engine.run.rundir import RunDir

        self._real = real = RunDir.write_part
        rows, copy = self.rows, self.copy

        def write_part(rd, name, table, *args, **kwargs):
            written = real(rd, name, table, *args, **kwargs)
            rows.append(table.num_rows)
            if len(rows) == 1:
                shutil.copytree(rd.path, copy)
            return written

        RunDir.write_part = write_part
        return self

    def __exit__(self, *exc):
        from pipelines.engine.run.rundir import RunDir

        RunDir.write_part = self._real

    def swap(self, run_dir: Path, clean: Path) -> None:
        import shutil

        clean.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), str(clean))
        shutil.move(str(self.copy), str(run_dir))


def resumed_counts(printed: str) -> tuple[int, int, int]:
    """(reused, total, processed now) from a resumed generation's line "N of M images reused from
    the checkpoint, K processed now"."""
    import re

    found = re.search(r"(\d+) of (\d+) images reused from the checkpoint, (\d+) processed now", printed)
    assert found, f"no resumed generation in:\n{printed[-2000:]}"
    return tuple(int(g) for g in found.groups())
