"""Run-summary rows of generation: per generator, requested -> generated, then what each head measured."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Stage
from pipelines.engine.generation.routing import of_model
from pipelines.engine.stats.summary import stage_row
from pipelines.engine.stream.progress import outcome_counts
from schemas.images import GENERATION_STATUS, GenerationStatus


def generation_rows(images: pa.Table, requested: int, phases: dict, head_rows=None, heads: Sequence[Stage] = ()
                    ) -> list[dict]:
    """Run-summary rows per generator: generation (requested -> ok, dropped per status), then the
    rows ``head_rows(phase, branch, generated_ok_table, ok, share)`` adds for the heads; without
    ``head_rows``, one row per head of ``heads``: the generated images it measured (its first
    output column not null), the others dropped as its ``unmeasured`` reason ("not_measured")."""
    rows = []
    for model, phase in phases.items():
        mine = images.filter(of_model(images, model))
        branch = f"generated: {Path(model.rstrip('/')).name}"
        status = outcome_counts(mine, GENERATION_STATUS)
        ok = status.get(GenerationStatus.OK, 0)
        share = phase.processed / phase.total if phase.total else 0.0
        rows.append(stage_row(phase, branch, "generate", requested, ok,
                              {k: v for k, v in status.items() if k != GenerationStatus.OK}, round(requested * share)))
        gen_ok = mine.filter(pc.fill_null(pc.equal(mine.column(GENERATION_STATUS), GenerationStatus.OK), False))
        if head_rows is not None:
            rows += head_rows(phase, branch, gen_ok, ok, share)
            continue
        for head in heads:
            column = head.op.output_fields[0].name
            measured = int(pc.sum(pc.is_valid(gen_ok.column(column))).as_py() or 0) if gen_ok.num_rows else 0
            rows.append(stage_row(phase, branch, head.name, ok, measured,
                                  {getattr(head.op, "unmeasured", "not_measured"): ok - measured}, round(ok * share)))
    return rows


