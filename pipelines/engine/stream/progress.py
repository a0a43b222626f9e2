"""Driving a Ray Data stream from the driver: checkpoint what comes back as it arrives, report
progress, enforce the error budget, and time each phase for the run summary.

A phase (the caption scan of one shard, the training images, the images of one generator) is a
stream whose results are small (statuses and scores, no pixels). ``drain`` pulls its blocks as
they finish, hands them to a sink (a checkpoint writer) in parts of bounded size, prints a
progress line at most every ``interval`` seconds, and checks the failure rate against the error
budget as it goes, so a run whose URLs all time out stops after the first few hundred rows, not
after hours.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class ErrorBudgetExceeded(RuntimeError):
    """More rows of a stage failed than the configured error budget allows."""


class CheckpointError(RuntimeError):
    """Checkpointing the rows that had arrived failed while the phase was stopping on another error.
    Both are in the message; the flush failure is the cause and the stopping error its context."""


@runtime_checkable
class Budget(Protocol):
    """What ``drain`` and ``generation.generate`` ask of an error budget: ``add`` the rows of a
    block (or a checkpoint's reused rows), ``check`` whether the failures exceed it (``final`` at
    the end of a phase). ``ErrorBudget`` is the engine's; a study may feed one from tally rows."""

    def add(self, batch: pa.Table) -> None: ...

    def check(self, final: bool = False) -> None: ...


@dataclass
class ErrorBudget:
    """Fail the job when the failure share of a stage exceeds ``max_rate``.

    ``failures`` maps a status column to the values that count as failures (a measurement such as
    "no face" or "ambiguous" is not a failure; a timeout, a 404 or undecodable bytes are). The
    share is checked as rows arrive and at the end, once at least ``min_rows`` rows have arrived
    (on fewer rows a share says little; the counts are reported in the metrics either way).
    """

    stage: str
    failures: dict[str, tuple[str, ...]]
    max_rate: float
    min_rows: int = 200
    flag: str = "--max-error-rate"
    seen: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    def add(self, batch: pa.Table) -> None:
        """Count the rows of a result batch and its failures (per status column)."""
        failed = {}
        for col, values in self.failures.items():
            if col not in batch.column_names:
                continue
            vc = pc.value_counts(batch.column(col).filter(pc.is_in(batch.column(col), pa.array(values, pa.string()))))
            for item in vc.to_pylist():
                failed[item["values"]] = failed.get(item["values"], 0) + item["counts"]
        self.count(batch.num_rows, failed)

    def count(self, rows: int, failed: dict[str, int]) -> None:
        """Count ``rows`` more rows, ``failed`` of them failing per reason."""
        self.seen += rows
        for reason, n in failed.items():
            self.failed[reason] = self.failed.get(reason, 0) + n

    def check(self, final: bool = False) -> None:
        n_failed = sum(self.failed.values())
        if self.seen < max(1, self.min_rows) or self.max_rate >= 1.0:
            return  # too few rows for a share to mean anything (a tiny job is judged by its counts)
        rate = n_failed / self.seen
        if rate > self.max_rate:
            reasons = ", ".join(f"{k}={v:,}" for k, v in sorted(self.failed.items(), key=lambda kv: -kv[1]) if v)
            raise ErrorBudgetExceeded(
                f"error budget exceeded at stage {self.stage}: {n_failed:,} of {self.seen:,} rows failed "
                f"({100 * rate:.1f}%: {reasons}); the budget is {100 * self.max_rate:g}% ({self.flag}). "
                f"Check the input, the network or the model; work finished so far is checkpointed, and the "
                f"same command resumes once the cause is fixed (or raise {self.flag}).")

    def as_dict(self) -> dict:
        return {"stage": self.stage, "max_rate": self.max_rate, "rows": self.seen, "failed": dict(self.failed)}


@dataclass
class Phase:
    """What one phase did, for the run summary."""

    name: str
    unit: str
    total: int
    reused: int = 0
    processed: int = 0
    seconds: float = 0.0
    ray_stats: str = ""

    @property
    def rate(self) -> float | None:
        return self.processed / self.seconds if self.seconds > 0 and self.processed else None


def drain(ds, sink, phase: Phase, budgets: list[Budget] = (), flush_rows: int = 512,
          flush_seconds: float = 30.0, interval: float = 10.0, echo=print, count=None) -> Phase:
    """Pull every block of ``ds``; give them to ``sink(table)`` in parts of about ``flush_rows``
    rows (or every ``flush_seconds``); report progress; check ``budgets``. Returns ``phase``.

    ``count(block)`` is how many of the phase's units a block stands for (default: its rows).
    A phase drained in several streams (the caption scan, one per shard) adds up their time."""
    start = last_flush = last_print = time.time()
    earlier = phase.seconds
    buffer: list[pa.Table] = []
    buffered = 0
    sink_failed = False

    def flush():
        nonlocal buffer, buffered, last_flush, sink_failed
        if buffer:
            try:
                sink(pa.concat_tables(buffer, promote_options="default"))
            except BaseException:
                sink_failed = True
                raise
        buffer, buffered, last_flush = [], 0, time.time()

    try:
        for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            if not block.num_rows:
                continue
            buffer.append(block)
            buffered += block.num_rows
            phase.processed += block.num_rows if count is None else count(block)
            for b in budgets:
                b.add(block)
                b.check()
            now = time.time()
            if buffered >= flush_rows or now - last_flush >= flush_seconds:
                flush()
            if now - last_print >= interval:
                last_print = now
                echo(progress_line(phase, earlier + now - start))
        flush()
    except BaseException as exc:
        if sink_failed:  # the checkpoint write itself failed: that is the error
            raise
        try:  # what arrived is valid: checkpoint it before the error propagates
            flush()
        except Exception as flush_exc:
            # never swallowed: a checkpoint that cannot be written (disk full, no permission) must
            # show, and so must the error that stopped the stream (chained as the context)
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: keep their meaning
                exc.add_note(f"checkpointing the rows that had arrived also failed: "
                             f"{type(flush_exc).__name__}: {flush_exc}")
                raise exc
            raise CheckpointError(
                f"checkpointing the rows that had arrived failed ({type(flush_exc).__name__}: {flush_exc}) "
                f"while the phase was stopping on {type(exc).__name__}: {exc}") from flush_exc
        raise
    finally:
        phase.seconds = earlier + time.time() - start
    for b in budgets:
        b.check(final=True)
    try:
        phase.ray_stats = ds.stats()
    except Exception:  # stats are informative only
        phase.ray_stats = ""
    return phase


def progress_line(phase: Phase, elapsed: float) -> str:
    done = phase.reused + phase.processed
    pct = f" ({100 * done / phase.total:.0f}%)" if phase.total else ""
    rate = phase.processed / elapsed if elapsed > 0 else 0.0
    eta = ""
    if rate > 0 and phase.total > done:
        eta = f", about {_duration((phase.total - done) / rate)} left"
    return f"  [{phase.name}] {done:,}/{phase.total:,} {phase.unit}{pct}, {rate:,.1f} {phase.unit}/s{eta}"


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def outcome_counts(table: pa.Table, column: str) -> dict[str, int]:
    """Counts of each value of ``column`` (nulls as "null")."""
    if table.num_rows == 0:
        return {}
    vals = np.array(table.column(column).to_pylist(), dtype=object)
    keys, counts = np.unique(np.where(vals == None, "null", vals).astype(str), return_counts=True)  # noqa: E711
    return {str(k): int(c) for k, c in zip(keys, counts)}
