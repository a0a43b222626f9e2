"""A task set on disk (``TASKS_DIR``): what people are asked, about which images, drawn how.

- ``tasks.json``: the protocol (question, choices, "unsure", level of measurement), the run it was
  drawn from (id, study, path), how the items were drawn (seed, strata, sizes), the package version;
- ``items.parquet``: one row per item (``schemas.annotation``), with the run's classifier answer;
- ``images/``: each shown image once, named by its content hash (the page and the exports name
  items by id, never by a path of the run);
- ``answers.sqlite``: every answer committed (``store.AnswerStore``), from the page or an import.

Labels are checked against the task set before they count: known item ids, answers among the
choices (``check_labels``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from schemas import annotation as A

TASKS_FILE = "tasks.json"
ITEMS_FILE = "items.parquet"
IMAGES_DIR = "images"
ANSWERS_DB = "answers.sqlite"


class AnnotateError(Exception):
    """A one-line error for the user: a bad task set, label file or setting."""


@dataclass
class TaskSet:
    path: Path
    meta: dict
    items: pd.DataFrame

    @classmethod
    def load(cls, path) -> "TaskSet":
        path = Path(path)
        for name in (TASKS_FILE, ITEMS_FILE):
            if not (path / name).is_file():
                raise AnnotateError(f"{path}: not a task set (no {name}; make one with `t2i annotate plan`)")
        try:
            meta = json.loads((path / TASKS_FILE).read_text())
            items = pd.read_parquet(path / ITEMS_FILE)
        except (ValueError, OSError) as e:
            raise AnnotateError(f"{path}: unreadable task set ({type(e).__name__}: {e})") from None
        return cls(path, meta, items)

    @property
    def protocol(self) -> dict:
        return self.meta["protocol"]

    @property
    def choices(self) -> list[str]:
        return list(self.protocol["choices"])

    @property
    def unsure(self) -> str | None:
        return self.protocol.get("unsure")

    @property
    def level(self) -> str:
        return self.protocol.get("level", "nominal")

    @property
    def scale(self) -> list[str]:
        """The choices α is computed on: every choice but "unsure"."""
        return [c for c in self.choices if c != self.unsure]

    @property
    def strata(self) -> list[str]:
        return list(self.meta.get("drawing", {}).get("strata", []))



def require_label_columns(labels: pd.DataFrame, source) -> None:
    """One line naming ``source`` when a label table lacks item_id, annotator or answer."""
    missing = [c for c in A.LABEL_COLUMNS if c not in labels.columns]
    if missing:
        raise AnnotateError(f"{source}: no column {', '.join(missing)} (a label table has {', '.join(A.LABEL_COLUMNS)})")


def check_labels(tasks: TaskSet, labels: pd.DataFrame, source: str) -> pd.DataFrame:
    """``labels`` (``item_id, annotator, answer``) checked against the task set: one line naming
    ``source`` and the cause for missing columns, empty tables, unknown item ids (another run's
    labels) and answers outside the choices. Returns the three columns as strings."""
    require_label_columns(labels, source)
    if labels.empty:
        raise AnnotateError(f"{source}: no labels in the file")
    out = labels[list(A.LABEL_COLUMNS)].copy()
    if out.isna().any().any():
        bad = out[out.isna().any(axis=1)].index[0]
        raise AnnotateError(f"{source}: row {bad} has an empty item id, annotator or answer")
    out = out.astype(str)
    unknown = sorted(set(out[A.ITEM_ID]) - set(tasks.items[A.ITEM_ID]))
    if unknown:
        run = tasks.meta["run"]["id"]
        raise AnnotateError(f"{source}: {len(unknown)} item id(s) not in this task set (run {run}), e.g. "
                            f"{unknown[0]!r}: labels of another task set or run?")
    if A.IMAGE_SHA256 in labels:        # the image the labeller saw (Label Studio's tasks carry its hash)
        shown = labels[A.IMAGE_SHA256].fillna("").astype(str)
        ours = out[A.ITEM_ID].map(tasks.items.set_index(A.ITEM_ID)[A.IMAGE_SHA256])
        changed = (shown != "") & (shown != ours)
        if changed.any():
            raise AnnotateError(f"{source}: item {out[A.ITEM_ID][changed].iloc[0]!r} was labelled on another image "
                                f"than this task set's (content hash differs)")
    outside = sorted(set(out[A.ANSWER]) - set(tasks.choices))
    if outside:
        raise AnnotateError(f"{source}: answer(s) {', '.join(map(repr, outside[:5]))} not among the choices "
                            f"{', '.join(tasks.choices)}")
    return out
