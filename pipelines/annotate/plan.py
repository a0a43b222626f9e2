"""``t2i annotate plan``: draw a preset's items from a finished run into a task set.

Sampling units (images) are drawn without replacement within each stratum, in the order of a
random permutation (numpy's PCG64 seeded with ``--seed``) of the units sorted by id: the same run,
preset, sizes and seed give the same items. ``--n N`` splits N equally over the strata (a stratum
with fewer units gives all it has, the rest go to the others); ``--n-per-stratum K`` takes K from
each. Every item of a drawn unit is kept (GEP: all of a neutral image's attributes; SD Exposed: all
of its prompt nouns), as the papers ask them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from operators.image_sink import extension
from pipelines.annotate import budget as B
from pipelines.annotate import candidates as C
from pipelines.annotate.interchange import read_table
from pipelines.annotate.protocols import PRESETS, Protocol
from pipelines.annotate.agreement import classifier_agreement, majority
from pipelines.annotate.store import AnswerStore
from pipelines.annotate.tasks import ANSWERS_DB, IMAGES_DIR, ITEMS_FILE, TASKS_FILE, AnnotateError, TaskSet
from schemas import annotation as A
from schemas.images import MODEL

KNOWN_STRATUM = "known answer"


def allocate(sizes: dict, n: int | None, n_per_stratum: int | None, rng: np.random.Generator | None = None) -> dict:
    """Units to draw per stratum: ``n_per_stratum`` each (capped by the stratum's size), or ``n``
    split equally with what a small stratum cannot give passed on to the others. A remainder that
    cannot be split equally goes to strata in a random order (``rng``; sorted order without one),
    so no stratum is favoured by its name."""
    if n_per_stratum is not None:
        return {s: min(k, n_per_stratum) for s, k in sizes.items()}
    names = sorted(sizes)
    if rng is not None:
        names = [names[i] for i in rng.permutation(len(names))]
    want = {s: 0 for s in sizes}
    left = min(n or 0, sum(sizes.values()))
    while left > 0:
        open_ = [s for s in names if want[s] < sizes[s]]
        share, extra = divmod(left, len(open_))
        for i, s in enumerate(open_):
            give = min(share + (i < extra), sizes[s] - want[s])
            want[s] += give
            left -= give
    return want


def stratum_labels(df: pd.DataFrame, strata: list[str]) -> pd.Series:
    """Each row's stratum as the task set names it: "model=sd | source=generated" ("all": no strata)."""
    if not strata:
        return pd.Series("all", index=df.index)
    return df[strata].astype(str).apply(lambda r: " | ".join(f"{c}={v}" for c, v in r.items()), axis=1)


def draw(cands: pd.DataFrame, strata: list[str], n: int | None, n_per_stratum: int | None,
         seed: int, planner=None) -> tuple[pd.DataFrame, dict]:
    """The items of the drawn units, and per stratum how many units it had and gave. ``planner``
    (stratum -> units it has) -> (stratum -> units to draw) replaces ``n`` / ``n_per_stratum``."""
    units = cands.drop_duplicates(C.UNIT).sort_values(C.UNIT)
    key = units[strata].astype(str).agg(" | ".join, axis=1) if strata else pd.Series("all", index=units.index)
    labels = stratum_labels(units, strata)
    sizes = key.value_counts().to_dict()
    rng = np.random.default_rng(seed)
    if planner is not None:
        label_of = dict(zip(key, labels))
        planned = planner({label_of[s]: int(k) for s, k in sizes.items()})
        want = {s: int(planned[label_of[s]]) for s in sizes}
    else:
        want = allocate(sizes, n, n_per_stratum, np.random.default_rng([seed, 1]))
    chosen, per = [], {}
    for s in sorted(sizes):
        mine = units[key == s]
        picked = mine.iloc[rng.permutation(len(mine))[:want[s]]]
        chosen.append(picked[[C.UNIT]].assign(**{A.STRATUM: labels[key == s].iloc[0]}))
        per[labels[key == s].iloc[0]] = {"units": int(sizes[s]), "drawn": int(want[s])}
    picked = pd.concat(chosen, ignore_index=True) if chosen else pd.DataFrame(columns=[C.UNIT, A.STRATUM])
    items = cands.merge(picked, on=C.UNIT)
    return items, per


def item_id(run_id: str, unit: str, subject) -> str:
    return hashlib.sha256(f"{run_id}|{unit}|{'' if pd.isna(subject) else subject}".encode()).hexdigest()[:16]


def custom_protocol(path: Path) -> tuple[Protocol, dict]:
    """A protocol from a YAML file: question, choices (and unsure, level, strata, n, annotators),
    and the item query: ``where`` (a pandas query on images.parquet), ``subject`` and ``prediction``
    columns."""
    try:
        spec = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise AnnotateError(f"{path}: no such file") from None
    except yaml.YAMLError as e:
        raise AnnotateError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(spec, dict) or not spec.get("question") or not spec.get("choices"):
        raise AnnotateError(f"{path}: a custom protocol needs at least 'question' and 'choices'")
    choices = tuple(str(c) for c in spec["choices"])
    unsure = spec.get("unsure")
    if unsure is not None and str(unsure) not in choices:
        raise AnnotateError(f"{path}: unsure {unsure!r} is not one of the choices")
    proto = Protocol(name="custom", study=str(spec.get("study", "")), paper=f"custom ({Path(path).name})",
                     question=str(spec["question"]), choices=choices, unsure=None if unsure is None else str(unsure),
                     level=str(spec.get("level", "nominal")), strata=tuple(spec.get("strata", [MODEL])),
                     n=spec.get("n", 50), n_per_stratum=spec.get("n_per_stratum"),
                     annotators=int(spec.get("annotators", 3)), notes=str(spec.get("notes", "")))
    query = {k: spec.get(k) for k in ("where", "subject", "prediction")}
    return proto, query


def custom_candidates(run_dir: Path, query: dict, proto: Protocol) -> pd.DataFrame:
    df = C._images(run_dir)
    if query.get("where"):
        try:
            df = df.query(query["where"])
        except Exception as e:  # noqa: BLE001 - any error of the user's expression is one line
            raise AnnotateError(f"where {query['where']!r}: {type(e).__name__}: {e}") from None
    for role in ("subject", "prediction"):
        if query.get(role) and query[role] not in df.columns:
            raise AnnotateError(f"{role} column {query[role]!r} is not in images.parquet")
    missing = [c for c in proto.strata if c not in df.columns]
    if missing:
        raise AnnotateError(f"strata {', '.join(missing)}: not columns of images.parquet")
    df = C.with_files(run_dir, df)

    def text(column):      # a column as text, missing values kept missing (never the string "None")
        return df[column].astype(object).map(lambda v: None if pd.isna(v) else str(v))

    subject = text(query["subject"]) if query.get("subject") else None
    prediction = text(query["prediction"]) if query.get("prediction") else None
    if prediction is not None:
        outside = sorted(set(prediction.dropna()) - set(proto.choices))
        if outside:
            raise AnnotateError(f"prediction column {query['prediction']!r} holds {', '.join(map(repr, outside[:5]))}, "
                                f"not among the choices {', '.join(proto.choices)}")
    return C._finish(df, subject, prediction, list(proto.strata))


def plan(run_dir, protocol: str, output, *, n: int | None = None, n_per_stratum: int | None = None,
         annotators: int | None = None, seed: int = 0, strata: list[str] | None = None,
         custom: str | None = None, known_answers: str | None = None, target_width: float | None = None,
         budget: int | None = None, pilot: str | None = None, assumed_disagreement: float = B.CONSERVATIVE,
         allocation: str = "neyman") -> Path:
    """Draw the items and write the task set to ``output``; returns its path. ``target_width`` or
    ``budget`` size the strata by the label budget planner (``budget.py``)."""
    run_dir, out = Path(run_dir), Path(output)
    if out.exists() and any(out.iterdir()):
        raise AnnotateError(f"{out}: exists and is not empty (a task set is written once)")
    info = C.run_info(run_dir)
    if protocol == "custom":
        if not custom:
            raise AnnotateError("--protocol custom needs --custom FILE.yaml")
        proto, query = custom_protocol(Path(custom))
        cands = custom_candidates(run_dir, query, proto)
    else:
        if protocol not in PRESETS:
            raise AnnotateError(f"unknown protocol {protocol!r}: one of {', '.join([*PRESETS, 'custom'])}")
        proto = PRESETS[protocol]
        if proto.study and info["study"] != proto.study:
            raise AnnotateError(f"{run_dir}: a {info['study']} run; the {protocol} protocol labels a {proto.study} run")
        if protocol not in C.BUILDERS:
            raise AnnotateError(f"{protocol}: drawing from a {proto.study} run is not available yet")
        cands = C.BUILDERS[protocol](run_dir)
    if n is not None or n_per_stratum is not None:
        proto = replace(proto, n=n, n_per_stratum=n_per_stratum)
    if annotators is not None:
        proto = replace(proto, annotators=annotators)
    if strata is not None:
        proto = replace(proto, strata=tuple(strata))
    missing = [c for c in proto.strata if c not in cands.columns]
    if missing:
        raise AnnotateError(f"strata {', '.join(missing)}: not columns of the {proto.name} items "
                            f"({', '.join(c for c in cands.columns if not c.startswith('_'))})")
    planned: dict = {}
    planner = None
    if target_width is not None or budget is not None:
        planner = _planner(planned, target_width, budget, pilot, assumed_disagreement, allocation)
    items, per = draw(cands, list(proto.strata), proto.n, proto.n_per_stratum, seed, planner)
    if items.empty:
        raise AnnotateError(f"{run_dir}: nothing to draw for {proto.name}")
    if known_answers:
        items = with_known_answers(items, cands, Path(known_answers), proto)
    return _write(out, run_dir, info, proto, items, per, seed, planned or None)


def _planner(record: dict, target_width, budget, pilot, assumed, allocation):
    """The label budget planner as ``draw`` calls it; what it decided goes into ``record``."""
    rates, pooled = {}, None
    if pilot:
        rates, pooled = pilot_rates(Path(pilot))

    def plan_sizes(sizes: dict) -> dict:
        sigma2 = B.sigmas(sorted(sizes), rates, pooled, assumed)
        want = (B.by_width(sizes, sigma2, target_width) if target_width is not None
                else B.by_budget(sizes, sigma2, budget, allocation))
        record.update({"target_width": target_width, "budget": budget,
                       "allocation": None if target_width is not None else allocation,
                       "pilot": str(Path(pilot).resolve()) if pilot else None,
                       "disagreement": "pilot (upper 95% Wilson bound)" if pilot else f"assumed {assumed}",
                       "per_stratum": B.summary(sizes, sigma2, want),
                       "pooled_expected_width": B.pooled_width(sizes, sigma2, want)})
        return want
    return plan_sizes


def pilot_rates(path: Path) -> tuple[dict, float | None]:
    """The classifier's disagreement with people per stratum in an earlier task set's answers."""
    tasks = TaskSet.load(path)
    labels = AnswerStore(path / ANSWERS_DB).labels() if (path / ANSWERS_DB).is_file() else pd.DataFrame()
    if labels.empty:
        raise AnnotateError(f"{path}: the pilot task set has no answers yet")
    items = tasks.items[tasks.items[A.KNOWN_ANSWER].isna()]
    rows = classifier_agreement(items, majority(labels, tasks.unsure), [A.STRATUM])
    if rows["scored"].sum() == 0:
        raise AnnotateError(f"{path}: no pilot item has both a classifier answer and a people's majority")
    return B.pilot_disagreement(rows)


def with_known_answers(items: pd.DataFrame, cands: pd.DataFrame, path: Path, proto: Protocol) -> pd.DataFrame:
    """Known-answer (attention check) items from a CSV ``image_id, answer`` (``subject`` where the
    protocol's items have one, ``model`` where several models share image ids): shown like any other item, left out of every estimate, and used to
    flag annotators who miss them (report.py). An item drawn at random that is also listed moves to
    the known-answer stratum."""
    known = read_table(path)
    need = [A.IMAGE_ID, "answer"] + ([A.SUBJECT] if cands[A.SUBJECT].notna().any() else [])
    missing = [c for c in need if c not in known.columns]
    if missing:
        raise AnnotateError(f"{path}: no column {', '.join(missing)} (known answers: {', '.join(need)})")
    bad = sorted(set(known["answer"]) - set(proto.choices))
    if bad:
        raise AnnotateError(f"{path}: answer(s) {', '.join(map(repr, bad))} not among the choices "
                            f"{', '.join(proto.choices)}")
    keys = [c for c in (MODEL, A.IMAGE_ID, A.SUBJECT) if c in need or (c == MODEL and c in known.columns)]
    found = cands.merge(known[keys + ["answer"]].astype(str), on=keys, how="inner")
    if len(found) > len(known):
        raise AnnotateError(f"{path}: a known-answer row matches images of several models: add a 'model' column")
    if len(found) < len(known):
        got = set(map(tuple, found[keys].astype(str).to_numpy()))
        lost = [k for k in map(tuple, known[keys].astype(str).to_numpy()) if k not in got]
        raise AnnotateError(f"{path}: {len(lost)} known-answer item(s) not among the run's stored items, e.g. {lost[0]}")
    found = found.rename(columns={"answer": A.KNOWN_ANSWER}).assign(**{A.STRATUM: KNOWN_STRATUM})
    rest = items[~items[C.UNIT].astype(str).add("|").add(items[A.SUBJECT].astype(str))
                 .isin(found[C.UNIT].astype(str).add("|").add(found[A.SUBJECT].astype(str)))]
    return pd.concat([rest, found], ignore_index=True)


def _write(out: Path, run_dir: Path, info: dict, proto: Protocol, items: pd.DataFrame, per: dict, seed: int,
           planned: dict | None = None) -> Path:
    (out / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    # each image once, named by its content's hash: from a file of the run, or bytes it keeps in parquet
    source = items["_file"] if "_file" in items else items["_bytes"]
    stored = {}
    for key in dict.fromkeys(source):
        data = Path(key).read_bytes() if isinstance(key, str) else key
        digest = hashlib.sha256(data).hexdigest()
        rel = f"{IMAGES_DIR}/{digest[:20]}.{extension(data)}"
        if not (out / rel).exists():
            (out / rel).write_bytes(data)
        stored[key] = (rel, digest)
    items = items.assign(**{A.ITEM_ID: [item_id(info["id"], u, s) for u, s in zip(items[C.UNIT], items[A.SUBJECT])],
                            A.IMAGE_FILE: source.map(lambda k: stored[k][0]),
                            A.IMAGE_SHA256: source.map(lambda k: stored[k][1]),
                            A.QUESTION: [proto.question.format(subject=s) if "{subject}" in proto.question
                                         else proto.question for s in items[A.SUBJECT]],
                            A.KNOWN_ANSWER: items[A.KNOWN_ANSWER] if A.KNOWN_ANSWER in items else None})
    first = [A.ITEM_ID, A.IMAGE_ID, MODEL, A.SUBJECT, A.QUESTION, A.PREDICTION, A.STRATUM, A.IMAGE_FILE,
             A.IMAGE_SHA256, A.KNOWN_ANSWER]
    rest = [c for c in items.columns if c not in first and not c.startswith("_") and c != C.UNIT]
    items = items[first + rest].sort_values([A.STRATUM, A.ITEM_ID]).reset_index(drop=True)
    items[A.SUBJECT] = items[A.SUBJECT].astype(object).where(items[A.SUBJECT].notna(), None)
    items.to_parquet(out / ITEMS_FILE, index=False)
    meta = {"protocol": proto.record(), "run": info,
            "drawing": {"seed": seed, "strata": list(proto.strata), "n": proto.n, "n_per_stratum": proto.n_per_stratum,
                        "unit": proto.unit, "per_stratum": per, "items": int(len(items)),
                        "method": "simple random sample of units without replacement within each stratum "
                                  "(numpy PCG64 permutation of the units sorted by id)",
                        "planner": planned},
            "annotators": proto.annotators,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "version": _version()}
    (out / TASKS_FILE).write_text(json.dumps(meta, indent=1, default=str))
    return out


def _version() -> str:
    try:
        return metadata.version("t2i-bias-audit")
    except metadata.PackageNotFoundError:
        return "unknown"
