"""The items a preset may draw from one finished run: only images the run really stored (a file
under ``images/``), with the question's subject and the run's own classifier answer.

Each function returns one row per item with ``unit`` (the sampling unit: the image), the image's
file, ``subject``, ``prediction`` (in the protocol's choices; null where the classifier gave none)
and the preset's strata columns. ``ITEM_BUILDERS`` are the same without image bytes (``estimate``
needs the items and answers only): paper 002's preset reads none; the others only check that the
files exist.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from operators.image_sink import file_stem
from pipelines.annotate.protocols import FEMALE, MALE, NO, YES
from pipelines.annotate.tasks import AnnotateError
from pipelines.engine.storage.checkpoint import model_dir
from schemas import annotation as A
from schemas import dalleval as D
from schemas import images as I
from schemas import exposed as X
from schemas import gep as G
from schemas import paintskills as P
from schemas.captions import OCCUPATION, URL
from schemas.images import GENERATION_STATUS, IMAGE_ID, MODEL, PROMPT, GenerationStatus

UNIT = "unit"
PROMPT_ATTRIBUTE = "prompt_attribute"   # GEP: the attribute an image was generated with ("none": neutral)
IMAGES_DIR = "images"


def run_info(run_dir: Path) -> dict:
    """The run's id, study and status, read from run.json and metrics.json (one line when it is not
    a finished run)."""
    for name in ("run.json", "metrics.json"):
        if not (run_dir / name).is_file():
            raise AnnotateError(f"{run_dir}: not a finished run (no {name})")
    run = json.loads((run_dir / "run.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    if run.get("status") != "finished":              # RunDir.finish's status
        raise AnnotateError(f"{run_dir}: the run is {run.get('status')!r}, not finished")
    return {"id": metrics.get("run_id") or run.get("run_id"), "study": metrics.get("study"),
            "path": str(run_dir.resolve())}


def _images(run_dir: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """The run's images table; integer columns stay exact where they have nulls (a seed is int64)."""
    path = run_dir / "images.parquet"
    if not path.is_file():
        raise AnnotateError(f"{run_dir}: no images.parquet")
    table = pq.read_table(path, columns=columns)
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get)


def with_files(run_dir: Path, df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose image the run saved (``images/<model dir>/<image id>.png``), with its path."""
    files = [run_dir / IMAGES_DIR / model_dir(m) / f"{file_stem(str(i))}.png" for m, i in zip(df[MODEL], df[IMAGE_ID])]
    out = df.assign(_file=[str(f) for f in files])
    out = out[[f.is_file() for f in files]]
    if out.empty:
        raise AnnotateError(f"{run_dir}: no saved image to label (was the run made with --no-save-images?)")
    return out


def _finish(df: pd.DataFrame, subject, prediction, strata: list[str]) -> pd.DataFrame:
    """The candidate items: ``_file`` (a path) or ``_bytes`` (an image the run keeps in parquet)."""
    unit = df[UNIT] if UNIT in df else df[MODEL].astype(str) + "/" + df[IMAGE_ID].astype(str)
    image = {c: df[c] for c in ("_file", "_bytes") if c in df}      # none when only the items are asked for
    out = pd.DataFrame({UNIT: unit, A.IMAGE_ID: df[IMAGE_ID], MODEL: df[MODEL], **image, A.SUBJECT: subject,
                        A.PREDICTION: prediction})
    for c in strata:
        if c not in out:
            out[c] = df[c].to_numpy()
    return out.reset_index(drop=True)


GEP_CLASSIFIER = G.SCORE_CLS           # the automatic estimator whose answers people's labels correct
GEP_YES_AT = 0.5                       # its score at and above which the answer is "yes" (a project choice)


def gep(run_dir: Path) -> pd.DataFrame:
    """(image, attribute) pairs of section 5: every attribute of a neutral image, the prompt's
    attribute of an explicit one; the run's annotation_tasks.csv holds them with the phrase. The
    classifier's answer is CLS's (the cross-modal classifiers' mean probability that the attribute
    is shown, Eq. 7), "yes" from 0.5 on, with the probability as its score."""
    path = run_dir / "annotation_tasks.csv"
    if not path.is_file():
        raise AnnotateError(f"{run_dir}: no annotation_tasks.csv (a GEP run writes it)")
    tasks = pd.read_csv(path, dtype=str)
    tasks = with_files(run_dir, tasks)
    phrase = tasks["question"].str.extract(r"^Do you see a person (.*)\?$")[0]
    # the image's own attribute (its prompt's; "none" for a neutral image): GEP_human needs every
    # (setting, gender, attribute) cell, so the preset draws within them
    tasks[PROMPT_ATTRIBUTE] = tasks[G.ATTRIBUTE].where(tasks[G.SETTING] == G.Setting.EXPLICIT, "none")
    score = _gep_scores(run_dir, tasks)
    pred = pd.Series(None, index=tasks.index, dtype=object).where(score.isna(), score.ge(GEP_YES_AT).map({True: YES,
                                                                                                       False: NO}))
    out = _finish(tasks, phrase, pred, [G.SETTING, G.GENDER, PROMPT_ATTRIBUTE])
    out["attribute"] = tasks[G.ATTRIBUTE].to_numpy()
    out[A.SCORE] = score.to_numpy()
    return out


def _gep_scores(run_dir: Path, tasks: pd.DataFrame) -> pd.Series:
    """CLS's score of each (model, image, attribute) of ``tasks`` from the run's ``scores`` table
    (null where it has none)."""
    path = run_dir / "scores.parquet"
    if not path.is_file():
        raise AnnotateError(f"{run_dir}: no scores.parquet (a GEP run writes it)")
    scores = pq.read_table(path, columns=[MODEL, IMAGE_ID, G.ATTRIBUTE, GEP_CLASSIFIER]).to_pandas()
    keys = [MODEL, IMAGE_ID, G.ATTRIBUTE]
    got = tasks[keys].astype(str).merge(scores.astype({k: str for k in keys}).drop_duplicates(keys), on=keys,
                                        how="left")
    return pd.Series(pd.to_numeric(got[GEP_CLASSIFIER]).to_numpy(), index=tasks.index)


def dalleval_skills(run_dir: Path) -> pd.DataFrame:
    df = _images(run_dir)
    df = with_files(run_dir, df[df[P.CORRECT].notna()])
    pred = df[P.CORRECT].map({True: YES, False: NO})
    return _finish(df, df[PROMPT], pred, [P.SKILL])


def dalleval_social(run_dir: Path) -> pd.DataFrame:
    df = _images(run_dir)
    df = with_files(run_dir, df[df[GENERATION_STATUS] == GenerationStatus.OK])
    pred = df[D.DETECTED_GENDER].where(df[D.DETECTED_GENDER].isin([FEMALE, MALE]))
    out = _finish(df, None, pred, [])
    out[D.PROFESSION] = df[D.PROFESSION].to_numpy()
    return out


def dalleval_skin_tone(run_dir: Path) -> pd.DataFrame:
    df = _images(run_dir)
    df = with_files(run_dir, df[df[D.SKIN_STATUS] == "ok"])
    pred = df[D.SKIN_TONE].map(lambda t: None if pd.isna(t) else str(int(t)))
    out = _finish(df, None, pred, [])
    out[D.PROFESSION] = df[D.PROFESSION].to_numpy()
    return out


def dalleval_attributes(run_dir: Path) -> pd.DataFrame:
    """(image, attribute) pairs: every attribute BLIP-2 was asked about an image, its answer the
    prediction (yes / no; null where BLIP-2 said neither), the attribute's text the subject."""
    df = _images(run_dir)
    df = with_files(run_dir, df[df[GENERATION_STATUS] == GenerationStatus.OK])
    texts = {a["name"]: a["text"] for a in json.loads((run_dir / "metrics.json").read_text())
             .get("config", {}).get("images", {}).get("attributes", [])}
    pairs = df.assign(_pair=[list(zip(n if n is not None else [], p if p is not None else []))
                             for n, p in zip(df[D.ATTRIBUTE_NAMES], df[D.ATTRIBUTE_PRESENT])]).explode("_pair")
    pairs = pairs[pairs["_pair"].notna()]
    names = pairs["_pair"].map(lambda t: t[0])
    pred = pairs["_pair"].map(lambda t: None if t[1] is None or pd.isna(t[1]) else (YES if t[1] else NO))
    out = _finish(pairs, names.map(lambda n: texts.get(n, n)), pred, [])
    out["attribute"] = names.to_numpy()
    out[D.PROFESSION] = pairs[D.PROFESSION].to_numpy()
    return out


def exposed_nouns(run_dir: Path) -> pd.DataFrame:
    """(image, prompt noun) pairs; the model found the noun when it is not among the hidden nouns
    (no detected object matches it)."""
    df = _images(run_dir)
    if X.PROMPT_NOUNS not in df or X.HIDDEN_NOUNS not in df:
        raise AnnotateError(f"{run_dir}: no prompt nouns or hidden nouns (a run made with --no-objects?)")
    df = with_files(run_dir, df[df[X.DETECTION_STATUS] == "ok"])
    rows = df.assign(**{A.SUBJECT: df[X.PROMPT_NOUNS].map(list)}).explode(A.SUBJECT)
    rows = rows[rows[A.SUBJECT].notna()]
    hidden = [noun in set(h if h is not None else []) for noun, h in zip(rows[A.SUBJECT], rows[X.HIDDEN_NOUNS])]
    pred = pd.Series([NO if h else YES for h in hidden], index=rows.index)
    return _finish(rows, rows[A.SUBJECT], pred, [])


def _parts(folder: Path, keys: list[str], with_bytes: bool = True) -> pd.DataFrame:
    """The images a paper 002 run saved as parquet parts (``--save-images``): keys and (with
    ``with_bytes``) the bytes; without them only the key columns are read."""
    files = sorted(folder.glob("part-*.parquet"))
    if not files:
        return pd.DataFrame(columns=[*keys, *(["_bytes"] if with_bytes else [])])
    t = pd.concat([pd.read_parquet(f, columns=[*keys, *(["image"] if with_bytes else [])]) for f in files],
                  ignore_index=True)
    if with_bytes:
        t = t.assign(_bytes=t["image"].map(lambda v: v["bytes"])).drop(columns=["image"])
    return t.drop_duplicates(keys)


def paper002_a4(run_dir: Path, images: bool = True) -> pd.DataFrame:
    """Training and generated images of a paper 002 run that passed the face filter (those whose
    CLIP answer enters % female), one item per image (a URL in several subsets is one image),
    with their bytes from the run's saved images (``images`` False: the items alone, for estimates)."""
    if not (run_dir / IMAGES_DIR).is_dir():
        raise AnnotateError(f"{run_dir}: no saved images (paper 002 saves them with --save-images: run it again "
                            "with that flag; the finished stages are reused)")
    df = _images(run_dir)
    df = df[df[I.FACE_STATUS] == I.FaceStatus.OK]
    training = df[df[I.SOURCE] == I.Source.TRAINING].drop_duplicates(URL)
    training = training.merge(_parts(run_dir / IMAGES_DIR / "training", [URL], images), on=URL)
    training = training.assign(**{UNIT: "training/" + training[URL], IMAGE_ID: training[URL], "source": "training"})
    generated = df[df[I.SOURCE] != I.Source.TRAINING].drop_duplicates([MODEL, PROMPT, I.SEED])
    generated = generated.merge(_parts(run_dir / IMAGES_DIR / "generated", [MODEL, PROMPT, I.SEED], images),
                                on=[MODEL, PROMPT, I.SEED])
    generated = generated.assign(**{UNIT: generated[MODEL] + "/" + generated[I.SEED].astype(str) + "/" + generated[PROMPT],
                                    IMAGE_ID: generated[PROMPT] + " #" + generated[I.SEED].astype(str),
                                    "source": "generated"})
    both = pd.concat([training, generated], ignore_index=True)
    if both.empty:
        raise AnnotateError(f"{run_dir}: no saved image passed the face filter")
    pred = both[I.GENDER].where(both[I.GENDER].isin([FEMALE, MALE]))
    out = _finish(both, None, pred, ["source"])
    out[OCCUPATION] = both[OCCUPATION].to_numpy()
    return out


BUILDERS = {"paper002-a4": paper002_a4, "gep": gep, "dalleval-skills": dalleval_skills, "dalleval-social": dalleval_social,
            "dalleval-skin-tone": dalleval_skin_tone, "dalleval-attributes": dalleval_attributes,
            "exposed-nouns": exposed_nouns}
ITEM_BUILDERS = {**BUILDERS, "paper002-a4": functools.partial(paper002_a4, images=False)}
