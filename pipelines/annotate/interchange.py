"""Labels in and out: the long table, Label Studio's JSON, a crowd platform's CSV.

- The long table ``item_id, annotator, answer`` (CSV or parquet) is the one interchange format;
  every import becomes it, and ``t2i annotate agreement`` reads it directly.
- Label Studio: the tasks as an import file (one task per item, ``data`` holding the image, the
  question and the item id) with a labelling config (``<Choices name="answer">``); its JSON export
  (``annotations[].result[].value.choices``, ``completed_by``) read back. Cancelled annotations are
  left out.
- Crowd CSV: the batch input (one row per item: ``item_id, image_url, question, choices``) and the
  results as MTurk returns them, one row per (item, worker): ``Input.item_id``, ``WorkerId``,
  ``Answer.answer`` by default, other column names by option (Prolific and others); rejected
  assignments (``AssignmentStatus`` "Rejected") are left out.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from pipelines.annotate.tasks import AnnotateError, TaskSet, require_label_columns
from schemas import annotation as A

CROWD_COLUMNS = {"item": "Input.item_id", "worker": "WorkerId", "answer": "Answer.answer"}
LS_CHOICES = "answer"          # the <Choices> name in the config


def read_table(path) -> pd.DataFrame:
    """A long label table from CSV or parquet (one line naming the file when it cannot be read)."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except FileNotFoundError:
        raise AnnotateError(f"{path}: no such file") from None
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise AnnotateError(f"{path}: not a readable label table ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def plain_labels(raw: pd.DataFrame, source) -> tuple[pd.DataFrame, int]:
    """A long label table with no task set to check it against: its three columns as text (one line
    naming ``source`` when one is missing), rows with an empty cell left out, an annotator's last
    answer to an item kept (as the store keeps it); and how many earlier answers that replaced."""
    require_label_columns(raw, source)
    labels = raw[list(A.LABEL_COLUMNS)].dropna().astype(str)
    repeated = labels.duplicated([A.ITEM_ID, A.ANNOTATOR], keep="last")
    return labels[~repeated], int(repeated.sum())


def write_table(labels: pd.DataFrame, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        labels.to_parquet(path, index=False)
    else:
        labels.to_csv(path, index=False)


def _image_url(tasks: TaskSet, rel: str, base: str | None) -> str:
    return f"{base.rstrip('/')}/{rel}" if base else rel


def label_studio_config(tasks: TaskSet) -> str:
    """Label Studio's labelling config: the image, the item's question, one choice per answer."""
    choices = "".join(f'<Choice value="{html.escape(c, quote=True)}"/>' for c in tasks.choices)
    return (f'<View><Image name="image" value="$image"/><Header value="$question"/>'
            f'<Choices name="{LS_CHOICES}" toName="image" choice="single" required="true">{choices}</Choices></View>\n')


def export_label_studio(tasks: TaskSet, out_dir, image_base: str | None = None) -> list[Path]:
    """``label_studio_tasks.json`` (import it into a project) and ``label_studio_config.xml``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = [{"data": {"image": _image_url(tasks, r[A.IMAGE_FILE], image_base), "question": r[A.QUESTION],
                         A.ITEM_ID: r[A.ITEM_ID], A.IMAGE_SHA256: r[A.IMAGE_SHA256],
                         "run_id": tasks.meta["run"]["id"]}}
               for r in tasks.items.to_dict("records")]
    (out / "label_studio_tasks.json").write_text(json.dumps(records, indent=1))
    (out / "label_studio_config.xml").write_text(label_studio_config(tasks))
    return [out / "label_studio_tasks.json", out / "label_studio_config.xml"]


def _annotator(completed_by) -> str:
    if isinstance(completed_by, dict):
        return str(completed_by.get("email") or completed_by.get("id"))
    return str(completed_by)


def import_label_studio(path) -> pd.DataFrame:
    """Label Studio's JSON export as the long table (one row per non-cancelled annotation)."""
    path = Path(path)
    try:
        records = json.loads(path.read_text())
    except FileNotFoundError:
        raise AnnotateError(f"{path}: no such file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise AnnotateError(f"{path}: not JSON ({e})") from None
    if not isinstance(records, list):
        raise AnnotateError(f"{path}: a Label Studio export is a JSON list of tasks, not {type(records).__name__}")
    rows = []
    for i, task in enumerate(records):
        item = (task.get("data") or {}).get(A.ITEM_ID) if isinstance(task, dict) else None
        if item is None:
            raise AnnotateError(f"{path}: task {i} has no data.{A.ITEM_ID} (tasks exported by `t2i annotate export`?)")
        for ann in task.get("annotations") or []:
            if not isinstance(ann, dict):
                raise AnnotateError(f"{path}: task {i} (item {item}): an annotation that is not a JSON object")
            if ann.get("was_cancelled"):
                continue
            if ann.get("completed_by") in (None, "", {}):
                raise AnnotateError(f"{path}: task {i} (item {item}): an annotation without completed_by (who answered)")
            picked = [(r.get("value") or {}).get("choices") for r in ann.get("result") or []
                      if isinstance(r, dict) and r.get("from_name") == LS_CHOICES and r.get("type") == "choices"]
            if not picked or not isinstance(picked[0], list) or len(picked[0]) != 1:
                raise AnnotateError(f"{path}: task {i} (item {item}): an annotation without exactly one "
                                    f"'{LS_CHOICES}' choice")
            rows.append({A.ITEM_ID: str(item), A.ANNOTATOR: _annotator(ann.get("completed_by")),
                         A.ANSWER: picked[0][0], A.ANSWERED_AT: ann.get("updated_at") or ann.get("created_at"),
                         A.IMAGE_SHA256: task["data"].get(A.IMAGE_SHA256)})
    return pd.DataFrame(rows, columns=[*A.LABEL_COLUMNS, A.ANSWERED_AT, A.IMAGE_SHA256])


def export_crowd_csv(tasks: TaskSet, path, image_base: str | None = None) -> Path:
    """The batch input of a crowd platform: one row per item (each column a ``${name}`` in the HIT)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({A.ITEM_ID: tasks.items[A.ITEM_ID],
                  "image_url": [_image_url(tasks, f, image_base) for f in tasks.items[A.IMAGE_FILE]],
                  A.QUESTION: tasks.items[A.QUESTION], "choices": "|".join(tasks.choices)}).to_csv(path, index=False)
    return path


def import_crowd_csv(path, item: str = CROWD_COLUMNS["item"], worker: str = CROWD_COLUMNS["worker"],
                     answer: str = CROWD_COLUMNS["answer"]) -> tuple[pd.DataFrame, int]:
    """A crowd platform's results (one row per item and worker) as the long table; and how many
    rejected assignments were left out."""
    df = read_table(path)
    missing = [c for c in (item, worker, answer) if c not in df.columns]
    if missing:
        raise AnnotateError(f"{path}: no column {', '.join(missing)} (name them with --item-column, --worker-column, "
                            "--answer-column)")
    rejected = 0
    if "AssignmentStatus" in df.columns:
        keep = df["AssignmentStatus"].fillna("") != "Rejected"
        rejected = int((~keep).sum())
        df = df[keep]
    out = pd.DataFrame({A.ITEM_ID: df[item], A.ANNOTATOR: df[worker], A.ANSWER: df[answer]})
    if "SubmitTime" in df.columns:
        out[A.ANSWERED_AT] = df["SubmitTime"]
    return out.reset_index(drop=True), rejected
