"""Paper 002, App. A.6's numbers besides its E[A]: the paraphrases' statuses, the run summary's row,
the CLIP similarity of the images generated from a caption and from its paraphrase, metrics.json's
``results.paraphrases``, and the paper's E[A] that the A.6 table sets beside the run's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engine.stats.summary import stage_row
from pipelines.engine.stream.progress import Phase
from schemas import images as I
from schemas import paraphrases as P
from schemas.captions import CAPTION_ID, OCCUPATION
from schemas.paraphrases import ParaphraseStatus as S

BRANCH = "paraphrases (App. A.6)"
PAPER_VALUES = {"all_captions": 0.69, "no_indicator_captions": 2.49}          # App. A.6
SECTION6_PAPER_VALUES = {"all_captions": 0.68, "no_indicator_captions": 2.05}  # section 6


def status_counts(paraphrases: pa.Table) -> dict[str, int]:
    values = paraphrases.column(P.PARAPHRASE_STATUS).to_pylist()
    return {s: int(sum(v == s for v in values)) for s in S.ALL}


def summary_rows(paraphrases: pa.Table, phase: Phase) -> list[dict]:
    """The run summary's rows: requests in, ok kept, every other status a reason."""
    counts = status_counts(paraphrases)
    dropped = {k: v for k, v in counts.items() if k != S.OK}
    return [stage_row(phase, BRANCH, P.STAGE_PARAPHRASE, paraphrases.num_rows, counts[S.OK], dropped,
                      phase.processed)]


def image_similarity(generated: pa.Table | None) -> pd.DataFrame:
    """Per (model, occupation, caption): the mean CLIP cosine between the images generated from the
    caption (section 6) and those from its paraphrase (A.6), and, as the scale to read it against,
    the mean cosine between two images of the same caption with different seeds (M >= 2)."""
    cols = [I.MODEL, OCCUPATION, CAPTION_ID, "caption_images", "paraphrase_images", "caption_vs_paraphrase",
            "caption_vs_caption"]
    if generated is None or not generated.num_rows or I.CLIP_EMBEDDING not in generated.column_names:
        return pd.DataFrame(columns=cols)
    sel = generated.filter(pc.and_(pc.is_in(generated.column(I.SOURCE),
                                            pa.array([I.Source.CAPTION_PROMPT, I.Source.PARAPHRASE_PROMPT])),
                                   pc.is_valid(generated.column(I.CLIP_EMBEDDING))))
    if not sel.num_rows:
        return pd.DataFrame(columns=cols)
    emb = np.asarray(sel.column(I.CLIP_EMBEDDING).to_pylist(), np.float32)
    emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    df = sel.select([I.MODEL, OCCUPATION, CAPTION_ID, I.SOURCE]).to_pandas()
    out = []
    for (model, occ, cid), g in df.groupby([I.MODEL, OCCUPATION, CAPTION_ID], sort=True):
        a = emb[g.index[g[I.SOURCE] == I.Source.CAPTION_PROMPT]]
        b = emb[g.index[g[I.SOURCE] == I.Source.PARAPHRASE_PROMPT]]
        if not len(a) or not len(b):
            continue
        sa = a.sum(0)
        within = float((sa @ sa - len(a)) / (len(a) * (len(a) - 1))) if len(a) > 1 else np.nan
        out.append([model, occ, int(cid), len(a), len(b), float(a.mean(0) @ b.mean(0)), within])
    return pd.DataFrame(out, columns=cols)


def summary(paraphrases: pa.Table, image_sim: pd.DataFrame, record: dict) -> dict:
    """metrics.json's ``results.paraphrases`` (besides the E[A], which live with section 6's)."""
    ok = paraphrases.filter(pc.equal(paraphrases.column(P.PARAPHRASE_STATUS), S.OK))
    cos = np.asarray(ok.column(P.PARAPHRASE_SBERT).to_pylist(), float) if ok.num_rows else np.array([])
    per_model = {}
    for model, g in image_sim.groupby(I.MODEL, sort=True):
        per_model[model] = {"captions": int(len(g)), "caption_vs_paraphrase": float(g["caption_vs_paraphrase"].mean()),
                            "caption_vs_caption": (float(g["caption_vs_caption"].mean())
                                                   if g["caption_vs_caption"].notna().any() else None)}
    return {"config": record, "requests": paraphrases.num_rows, "statuses": status_counts(paraphrases),
            "retried_without_occupation": int(pc.sum(paraphrases.column(P.PARAPHRASE_RETRIED)).as_py() or 0),
            "sbert_cosine": {"mean": float(np.nanmean(cos)) if len(cos) else None,
                             "median": float(np.nanmedian(cos)) if len(cos) else None, "n": int(len(cos))},
            "image_similarity": per_model,
            "paper": {"a6": PAPER_VALUES, "section6": SECTION6_PAPER_VALUES}}
