"""A finished caption scan taken over by another run (`run --captions-from RUN_DIR`).

The caption scan (occupations, gender words, person names, SBERT similarities, one row per
caption and occupation) is the part of paper 002 that reads every caption: over LAION, hours on a
cluster. It depends on the caption settings and the input only, not on the image side, so a team
can scan once and run the image side many times (other generators, training images from
img2dataset shards, --fetch-missing). A run given ``--captions-from`` copies the committed shards
of that run's scan (its annotated parts, tallies and done markers) into its own directory before
its scan starts; the scan then finds every shard done, as a resumed run does, and the selection,
the walk and everything after run as always. It copies only when the two agree:

- the caption digest (``caption_digest``, recorded in every caption run's run.json under
  ``plans``): the caption settings as the run id reads them (the effective configuration file
  without its image-side blocks) and the input's files, rows, data identity and columns;
- the caption models' records (spaCy's version and pipes, SBERT's hub commit and the sha256 of
  its weights) in that run's metrics.json and this run's loads;
- every shard of that run's scan done.

Anything else is refused in one line: the digest and the shards when the settings are built
(``check_source``: before the run directory opens, Ray starts or a model loads), the models once
they load (``adopt``). The copy is crash-safe as the scan is: a shard's parts and tallies first,
its done marker last.
"""

from __future__ import annotations

import dataclasses

from pipelines.engine.run import fingerprint as fingerprints
from pipelines.engine.run import rundir
from pipelines.engine.storage import io
from pipelines.studies.amplification.caption_scan import CAPTION_TALLIES
from pipelines.studies.amplification.caption_settings import FILES, CaptionSettings, input_job

# the effective configuration file's blocks the caption scan never reads (the image side)
IMAGE_SIDE = ("generation", "face_filter", "gender_classifier", "fetch")
PLAN = "caption_side"   # run.json "plans" key of the caption digest


def caption_digest(opts, st: CaptionSettings) -> str:
    """sha256 of what the caption scan's results depend on: the caption settings of ``st`` (a
    `captions` or `run` settings object) as the run id reads them, without the configuration's
    image-side blocks, and the input (files, rows, data identity, columns)."""
    part = CaptionSettings(**{f.name: getattr(st, f.name) for f in dataclasses.fields(CaptionSettings)})
    job = fingerprints.settings_job(part)
    job["config"] = {k: v for k, v in job.get("config", {}).items() if k not in IMAGE_SIDE}
    inp = {k: v for k, v in input_job(opts, st).items() if k != "command"}
    return rundir.fingerprint({"caption_settings": job, **inp})


def _source(uri: str) -> rundir.RunDir:
    root, _, run_id = uri.rstrip("/").rpartition("/")
    try:
        return rundir.RunDir(root or ".", run_id)
    except io.InputError as exc:
        raise io.InputError(f"--captions-from {uri}: not a run directory ({exc})") from None


def _copy(src: rundir.RunDir, src_path: str, dst: rundir.RunDir, dst_path: str) -> None:
    with src.fs.open_input_stream(src_path) as fh:
        rundir.write_atomic(dst.fs, dst_path, fh.read())


def check_source(opts, st: CaptionSettings):
    """``st``, once the run ``--captions-from`` names (if any) is found to have made the caption
    scan this run would make and finished every shard of it: checked before the run starts, no
    model loaded and no Ray (the caption models are checked when they are, by ``adopt``)."""
    uri = opts.flags.get("captions_from")
    if uri:
        _scanned(_source(uri), uri, caption_digest(opts, st))
    return st


def _scanned(src: rundir.RunDir, uri: str, digest: str) -> tuple[dict, list, list]:
    """``src``'s recorded plans, its caption shards and their done markers, once checked against
    ``digest`` (each refusal one line)."""
    shown = src.display()
    record = src.read_json(rundir.RUN_FILE)
    if record is None:
        raise io.InputError(f"--captions-from {shown}: no {rundir.RUN_FILE} there (not a run directory)")
    plans = record.get("plans") or {}
    if PLAN not in plans or "caption_shards" not in plans:
        raise io.InputError(f"--captions-from {shown}: that run records no caption scan to reuse (no caption "
                            f"side, or a version that did not record its caption settings)")
    if plans[PLAN] != digest:
        raise io.InputError(f"--captions-from {shown}: its caption scan was made with other caption settings or "
                            f"another input than this run's (occupations, prompts, gender words, names, SBERT, "
                            f"selection, or the input's files, rows, data or columns): run without --captions-from")
    shards = plans["caption_shards"]
    markers = [src.done(f"captions/shard-{i:05d}") for i in range(len(shards))]
    missing = [i + 1 for i, done in enumerate(markers) if done is None or "parts" not in done]
    if missing:
        raise io.InputError(f"--captions-from {shown}: its caption scan is not finished (shard {missing[0]} of "
                            f"{len(shards)} is not done): finish that run first")
    return plans, shards, markers


def adopt(run: rundir.RunDir, uri: str, digest: str, models: dict) -> int:
    """Copy the finished caption scan of the run at ``uri`` into ``run`` (the shards ``run`` has
    not done yet), after checking that it is the scan ``run`` would make (``digest``, ``models``:
    this run's caption model records). Returns the number of shards copied."""
    src = _source(uri)
    shown = src.display()
    _, shards, markers = _scanned(src, uri, digest)
    metrics = src.read_json("metrics.json") or {}
    theirs = {k: (metrics.get("models") or {}).get(k) for k in models}
    if theirs != models:
        differ = sorted(k for k in models if theirs.get(k) != models[k])
        raise io.InputError(f"--captions-from {shown}: its captions were annotated by other caption models than "
                            f"this run loads ({', '.join(differ)}: version, files or loader differ, or that run "
                            f"did not finish and recorded none)")
    if (run.record.get("plans") or {}).get("caption_shards", shards) != shards:
        raise io.InputError(f"--captions-from {shown}: this run started its caption scan in other shards: run "
                            f"without --captions-from to finish it")
    run.plan("caption_shards", shards)   # this run's scan reads its input in that run's shards
    copied = 0
    for i, done in enumerate(markers):
        name, key = f"captions/shard-{i:05d}", f"shard-{i:05d}"
        if run.done(name):
            continue
        data = f"{FILES['annotated']}/{key}"
        run.clear(run.file(data))
        for part in done["parts"]:
            _copy(src, src.file(f"{data}/{part['name']}"), run, run.file(f"{data}/{part['name']}"))
        _copy(src, src.part_path(CAPTION_TALLIES, key), run, run.part_path(CAPTION_TALLIES, key))
        run.mark_done(name, done)   # the commit point, as in the scan: a crash before it redoes the shard
        copied += 1
    return copied
