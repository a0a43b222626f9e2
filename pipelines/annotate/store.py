"""The answers of a task set, in an embedded SQLite database (``answers.sqlite``).

Every answer is committed (WAL journal, ``synchronous=FULL``) before ``record`` returns, so a server
killed between two answers loses neither. One row per (item, annotator): answering an item again
replaces the earlier answer and ``record`` says so ("replaced"); every action is also appended to
``history``, which is what ``undo`` walks back. Several processes or threads may write at once
(SQLite serialises the writers; each call opens its own connection).
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from schemas import annotation as A

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS answers (
    {A.ITEM_ID} TEXT NOT NULL, {A.ANNOTATOR} TEXT NOT NULL, {A.ANSWER} TEXT NOT NULL,
    {A.ANSWERED_AT} TEXT, {A.ORIGIN} TEXT NOT NULL,
    PRIMARY KEY ({A.ITEM_ID}, {A.ANNOTATOR}));
CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, {A.ITEM_ID} TEXT NOT NULL, {A.ANNOTATOR} TEXT NOT NULL,
    {A.ANSWER} TEXT, previous TEXT, {A.ANSWERED_AT} TEXT, {A.ORIGIN} TEXT NOT NULL, action TEXT NOT NULL);
"""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class AnswerStore:
    def __init__(self, path):
        self.path = Path(path)
        db = self._connect()
        try:
            # WAL is a property of the file, set once; switching to it takes an exclusive lock, for
            # which SQLite does not wait: another connection opening the file at that moment retries
            for attempt in range(200):
                try:
                    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                        db.execute("PRAGMA journal_mode=WAL")
                    db.executescript(_SCHEMA)
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or attempt == 199:
                        raise
                    time.sleep(0.05)
        finally:
            db.close()

    @contextmanager
    def _transaction(self):
        """A write transaction, taken at once (``BEGIN IMMEDIATE``: writers wait for each other up to
        the timeout), committed when the block ends, rolled back on any exception."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA synchronous=FULL")
        return db

    def record(self, item_id: str, annotator: str, answer: str, origin: str = A.Origin.PAGE,
               answered_at: str | None = None) -> str:
        """Commit one answer; "new", "replaced" (the annotator had answered the item: the last answer
        is kept) or "same" (the same answer again: nothing changes)."""
        with self._transaction() as db:
            return _record(db, item_id, annotator, answer, origin, answered_at or now())

    def record_many(self, labels: pd.DataFrame, origin: str) -> dict:
        """Commit a checked label table (``item_id, annotator, answer``, optionally ``answered_at``)
        in one transaction (all of the file or none of it); the count of each outcome."""
        outcome = {"new": 0, "replaced": 0, "same": 0}
        at = labels[A.ANSWERED_AT] if A.ANSWERED_AT in labels else [None] * len(labels)
        stamp = now()
        with self._transaction() as db:
            for item, who, answer, when in zip(labels[A.ITEM_ID], labels[A.ANNOTATOR], labels[A.ANSWER], at):
                outcome[_record(db, item, who, answer, origin, stamp if pd.isna(when) else str(when))] += 1
        return outcome

    def undo(self, annotator: str) -> str | None:
        """Take back the annotator's last answer (the earlier one comes back where it replaced one);
        the item id, or None when there is nothing to undo."""
        with self._transaction() as db:
            last = db.execute(f"SELECT seq, {A.ITEM_ID}, previous FROM history WHERE {A.ANNOTATOR}=? AND action IN "
                              "('answer', 'replace') ORDER BY seq DESC LIMIT 1", (annotator,)).fetchone()
            if last is None:
                return None
            seq, item, previous = last
            if previous is None:
                db.execute(f"DELETE FROM answers WHERE {A.ITEM_ID}=? AND {A.ANNOTATOR}=?", (item, annotator))
            else:
                db.execute(f"UPDATE answers SET {A.ANSWER}=? WHERE {A.ITEM_ID}=? AND {A.ANNOTATOR}=?",
                           (previous, item, annotator))
            db.execute("UPDATE history SET action='undone' WHERE seq=?", (seq,))
            db.execute(f"INSERT INTO history ({A.ITEM_ID}, {A.ANNOTATOR}, {A.ANSWER}, previous, {A.ANSWERED_AT}, "
                       f"{A.ORIGIN}, action) VALUES (?, ?, NULL, ?, ?, ?, 'undo')",
                       (item, annotator, previous, now(), A.Origin.PAGE))
            return item

    def labels(self) -> pd.DataFrame:
        """Every current answer as the long table (``schemas.annotation.LABELS``' columns)."""
        db = self._connect()
        try:
            return pd.read_sql_query(f"SELECT {A.ITEM_ID}, {A.ANNOTATOR}, {A.ANSWER}, {A.ANSWERED_AT}, {A.ORIGIN} "
                                     f"FROM answers ORDER BY {A.ITEM_ID}, {A.ANNOTATOR}", db)
        finally:
            db.close()

    def answered(self, annotator: str) -> set[str]:
        db = self._connect()
        try:
            return {r[0] for r in db.execute(f"SELECT {A.ITEM_ID} FROM answers WHERE {A.ANNOTATOR}=?", (annotator,))}
        finally:
            db.close()


def _record(db: sqlite3.Connection, item_id: str, annotator: str, answer: str, origin: str, at: str) -> str:
    """One answer inside the caller's transaction (``AnswerStore.record``)."""
    row = db.execute(f"SELECT {A.ANSWER} FROM answers WHERE {A.ITEM_ID}=? AND {A.ANNOTATOR}=?",
                     (item_id, annotator)).fetchone()
    if row is not None and row[0] == answer:
        return "same"
    db.execute(f"INSERT INTO answers VALUES (?, ?, ?, ?, ?) ON CONFLICT({A.ITEM_ID}, {A.ANNOTATOR}) DO "
               f"UPDATE SET {A.ANSWER}=excluded.{A.ANSWER}, {A.ANSWERED_AT}=excluded.{A.ANSWERED_AT}, "
               f"{A.ORIGIN}=excluded.{A.ORIGIN}", (item_id, annotator, answer, at, origin))
    action = "replace" if row is not None else "answer"
    db.execute(f"INSERT INTO history ({A.ITEM_ID}, {A.ANNOTATOR}, {A.ANSWER}, previous, {A.ANSWERED_AT}, "
               f"{A.ORIGIN}, action) VALUES (?, ?, ?, ?, ?, ?, ?)",
               (item_id, annotator, answer, row[0] if row else None, at, origin, action))
    return "replaced" if row is not None else "new"
