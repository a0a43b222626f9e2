"""Triplet prompts of the Stable Diffusion Exposed study (paper 004, section 3 and App. A), and the
``exposed.py triplets`` command.

Two sources of neutral prompts:

- **Captions** (GCC, COCO, TextCaps, Flickr30k, or any caption file, read by
  ``caption_files.read_captions``): ``caption_triplets`` runs
  ``operators.text_triplet_filter.TripletFilter`` over the file in bounded batches, keeps the
  captions with *person* / *people* and no Table S1 word, and swaps them into their feminine and
  masculine forms. ``TRIPLET_COUNTS`` says how many captions each rule rejected and, for the
  Table S1 rule, how many rejected captions name each word.
- **Professions** (Table S2): ``profession_set.profession_triplets`` (built-in templates) and
  ``profession_set.sentence_triplets`` (a file of sentences).

``triplet_tables.write_triplets`` writes the tables; ``run_command`` is ``pipelines/exposed.py
triplets``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from operators.base import conform
from operators.text_triplet_filter import TripletFilter, caption_array
from pipelines.engine.cli import config as study_config
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.run import lifecycle
from pipelines.engine.storage import io
from pipelines.studies.exposed.caption_files import caption_column, input_identity, read_captions
from pipelines.studies.exposed.profession_set import (
    DEFAULT_TEMPLATES,
    GENDER_WORDS,
    PROFESSION_SOURCE,
    profession_triplets,
    sentence_triplets,
)
from pipelines.studies.exposed.triplet_tables import (
    COUNTS_CSV,
    COUNTS_JSON,
    TRIPLETS_FILE,
    check_source,
    count_rows,
    triplet_ids,
    write_triplets,
)
from schemas.captions import LAION_TEXT
from schemas.exposed import (
    COUNT,
    FEMININE,
    HUMAN_WORD,
    HUMAN_WORDS,
    MASCULINE,
    NEUTRAL,
    PERSON_WORDS,
    PROFESSIONS,
    SOURCE_ROW,
    TRIPLET_ID,
    TRIPLET_SOURCE,
    TRIPLET_STATUS,
    TRIPLETS,
    TripletOutcome,
)


def caption_triplets(path: str | Path, source: str, column: str = LAION_TEXT,
                     limit: int | None = None) -> tuple[pa.Table, pa.Table]:
    """(triplets, counts) of the captions of ``path`` (see ``read_captions``), the first ``limit``
    rows when given. ``counts`` adds up to the rows read."""
    check_source(source)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    op = TripletFilter(text_column=column, source=source)
    outcomes = dict.fromkeys(op.outcomes, 0)
    words: Counter[str] = Counter()
    parts = []
    read = 0
    for batch in read_captions(path, column):
        if limit is not None:
            if read >= limit:
                break
            batch = batch.slice(0, limit - read)
        read += batch.num_rows
        out = op(batch)
        status = out.column(TRIPLET_STATUS)
        vc = pc.value_counts(status.combine_chunks().dictionary_decode() if pa.types.is_dictionary(status.type) else status)
        for value, n in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()):
            outcomes[value] += n
        human = out.filter(pc.equal(status, TripletOutcome.HUMAN_WORD))
        words.update(op.human_word_counts(caption_array(human, column)))
        kept = out.filter(pc.equal(status, TripletOutcome.KEPT))
        parts.append(conform(pa.table({
            TRIPLET_ID: triplet_ids(source, kept.column(SOURCE_ROW).combine_chunks()),
            TRIPLET_SOURCE: kept.column(TRIPLET_SOURCE),
            SOURCE_ROW: kept.column(SOURCE_ROW),
            NEUTRAL: kept.column(NEUTRAL),
            FEMININE: kept.column(FEMININE),
            MASCULINE: kept.column(MASCULINE),
        }), TRIPLETS))
    if sum(outcomes.values()) != read:  # every caption read has exactly one outcome
        raise AssertionError(f"triplet counts add up to {sum(outcomes.values())}, not to the {read} captions read")
    triplets = pa.concat_tables(parts) if parts else TRIPLETS.empty_table()
    return triplets.combine_chunks(), count_rows(source, outcomes, words)


# ---------------------------------------------------------------------------------------------
# the command (pipelines/exposed.py triplets)

# The command writes, like every command of the project, into a run folder under --output:
# ``<output>/exposed-triplets-<8 hex digits of the configuration fingerprint>/`` (or --run-id),
# with run.json holding that configuration (pipelines/engine/run/rundir.py). The same command finds
# its folder again; another input, column, source or per-topic count gets a folder of its own.
RUN_LABEL = "exposed-triplets"
CONFIG_FILE = "triplets_config.json"


def default_source(path: str | Path) -> str:
    """A caption set's name from its file name: "coco_captions.parquet" -> "coco_captions"."""
    name = re.sub(r"[^A-Za-z0-9_.]+", "-", Path(str(path).rstrip("/")).stem).strip("-.")
    return name or "custom"


def command_settings(args) -> dict:
    """What ``exposed.py triplets`` builds its triplets from: mode, input, column, source and
    per-topic count, checked (bad flags fail before anything is written)."""
    inp = getattr(args, "captions", None)
    column, choice = getattr(args, "caption_column", None), None
    per_topic = getattr(args, "per_topic", None)
    if getattr(args, "profession_set", False):
        if inp and per_topic is not None:
            raise ValueError("--per-topic applies to the built-in templates, not to sentences given with --captions")
        mode = "profession_sentences" if inp else "profession_templates"
    elif inp:
        if per_topic is not None:
            raise ValueError("--per-topic applies to the Profession set (--profession-set)")
        mode = "captions"
    else:
        raise ValueError("give --captions (a caption file) or --profession-set (the Profession set of Table S2)")
    if per_topic is not None and per_topic < 1:
        raise ValueError(f"--per-topic must be >= 1, not {per_topic}")
    source = check_source(getattr(args, "source", None) or default_source(inp)) if mode == "captions" \
        else PROFESSION_SOURCE
    identity = getattr(args, "input_identity", None) or "footer"
    if inp:
        column, choice = caption_column(str(inp), column, getattr(args, "dataset_name", None), identity)
        if choice is not None:
            print(f"  {choice.line()}")
    return {"mode": mode, "input": str(inp) if inp else None, "column": column if inp else None,
            "source": source, "per_topic": per_topic, "dataset": choice.record() if choice else None,
            "identity": identity}


def triplets_job(s: dict) -> dict:
    """Everything the triplets depend on (``command_settings``' result): its fingerprint names the
    run folder, and run.json records it."""
    job = {"study": "paper004-exposed", "command": "triplets", "mode": s["mode"], "source": s["source"]}
    if s["input"]:
        # what identifies the input's data, not only its name: a file rewritten in place gets a
        # run folder of its own (or, under the same --run-id, a refusal), never the old triplets
        data = input_identity(s["input"], s.get("identity") or "footer")
        job["input"] = {"files": list(data), "data": data}
        job["column"] = s["column"]
        if s.get("dataset"):
            job["dataset"] = s["dataset"]
    if s["mode"] == "captions":
        job["filter"] = {"human_words": {k: list(v) for k, v in HUMAN_WORDS.items()},
                         "person_words": {k: list(v) for k, v in PERSON_WORDS.items()}}
    else:
        job["professions"] = {k: list(v) for k, v in PROFESSIONS.items()}
        job["gender_words"] = list(GENDER_WORDS)
    if s["mode"] == "profession_templates":
        job["templates"] = {k: list(v) for k, v in DEFAULT_TEMPLATES.items()}
        job["per_topic"] = s["per_topic"]
    return job


class TripletsCommand:
    """``exposed.py triplets`` as the engine's run planner sees it (``lifecycle.plan_run``): its
    label and its job."""

    name = "paper004-exposed"

    def label(self, s: dict) -> str:
        return RUN_LABEL

    def job(self, opts, s: dict) -> dict:
        return triplets_job(s)


def check_input(s: dict) -> None:
    """Read the first batch of the input: a wrong caption column or an unreadable file fails
    before the run folder is written."""
    if s["input"]:
        next(read_captions(s["input"], s["column"]), None)


def build(s: dict) -> tuple[pa.Table, pa.Table]:
    """(triplets, counts) of ``command_settings``' result."""
    if s["mode"] == "captions":
        return caption_triplets(s["input"], s["source"], column=s["column"])
    if s["mode"] == "profession_sentences":
        return sentence_triplets(s["input"], column=s["column"])
    return profession_triplets(per_topic=s["per_topic"])


def write_config(rd, s: dict, triplets: pa.Table, counts: pa.Table) -> str:
    """``triplets_config.json`` beside the tables: the run's configuration (as run.json records
    it), the input's size, the triplets and counts made, package versions."""
    inp = s["input"]
    record = {"command": "exposed.py triplets", "run_id": rd.run_id, "output": rd.display(), "input_path": inp,
              **rd.job,
              "input_bytes": Path(inp).stat().st_size if inp and Path(inp).is_file() else None,
              "triplets": triplets.num_rows, "counts": counts.to_pylist(),
              "environment": study_config.environment()}
    io.write_text(json.dumps(io.clean_json(record), indent=1, default=str) + "\n", rd.fs, rd.file(CONFIG_FILE))
    return rd.file(CONFIG_FILE)


def output_paths(rd) -> dict[str, str]:
    """The files a triplets run writes in its folder (as ``write_triplets`` and ``write_config`` name them)."""
    return {"triplets": rd.file(TRIPLETS_FILE), "counts_csv": rd.file(COUNTS_CSV),
            "counts_json": rd.file(COUNTS_JSON), "config": rd.file(CONFIG_FILE)}


def _finished_before(rd) -> bool:
    """Whether the run just opened was finished by an earlier attempt and still holds every file."""
    attempts = rd.record.get("attempts", [])[:-1]
    return (rd.resumed and bool(attempts) and attempts[-1].get("status") == "finished"
            and all(io.exists(rd.fs, p) for p in output_paths(rd).values()))


def _print_counts(n: int, rows: list[dict]) -> None:
    source = rows[0][TRIPLET_SOURCE] if rows else None
    print(f"{n:,} triplets from {source}")
    for r in rows:
        label = r[TRIPLET_STATUS] + (f" ({r[HUMAN_WORD]})" if r[HUMAN_WORD] is not None else "")
        print(f"  {label:<32} {r[COUNT]:>12,}")


def run_command(args) -> dict:
    """``exposed.py triplets``: captions (``--captions``, ``--caption-column``, ``--source``) or the
    Profession set (``--profession-set``: the built-in templates, ``--per-topic``; or sentences from
    ``--captions``) -> ``write_triplets`` into the run folder ``<--output>/<run id>/`` with run.json
    (``--run-id``, ``--overwrite`` as for every command). The same command again finds the folder
    and, when that run finished, reuses its files. Prints the run id first, the counts, and the
    results path last; returns the run id, the paths and the counts."""
    started = time.time()
    s = command_settings(args)
    plan_args = RunOptions(output=str(args.output), run_id=getattr(args, "run_id", None), command=" ".join(sys.argv))
    rd = lifecycle.plan_run(plan_args, TripletsCommand(), s)   # the input is identified here: a missing one fails
    check_input(s)
    if getattr(args, "overwrite", False):
        io.clear_dir(rd.fs, rd.path)
    lifecycle.open_run(plan_args, rd)   # a folder of another configuration is refused, naming what differs
    try:
        paths = output_paths(rd)
        reuse = _finished_before(rd)
        if reuse:
            with rd.fs.open_input_stream(paths["counts_json"]) as fh:
                rows = json.loads(fh.read().decode("utf-8"))
            with rd.fs.open_input_file(paths["triplets"]) as fh:
                n = pq.read_metadata(fh).num_rows
            print(f"run {rd.run_id} finished earlier: its triplets are reused (--overwrite makes them again)")
        else:
            triplets, counts = build(s)
            paths = write_triplets(triplets, counts, rd.uri) | {"config": write_config(rd, s, triplets, counts)}
            rows, n = counts.to_pylist(), triplets.num_rows
    except BaseException as exc:
        rd.finish("failed", error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        raise
    rd.finish("finished", duration_s=round(time.time() - started, 3), reused=reuse)
    _print_counts(n, rows)
    print(f"\nresults: {rd.display()}/")
    return {"run_id": rd.run_id, "output": rd.display(), "reused": reuse, "paths": paths, "triplets": n,
            "counts": rows}
