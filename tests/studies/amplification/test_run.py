"""`amplification.py run` end to end on a local Ray instance: caption side, image fetch from a
local HTTP server, real BlazeFace, tiny random CLIP and Stable Diffusion stand-ins, metrics."""

from helpers import kill_when
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipelines import amplification, synthetic_laion
from pipelines.studies.amplification.images import TRAINING_URLS
from pipelines.studies.amplification.sample_server import LocalImageServer, synthetic_kind
from schemas import images as I
from schemas.captions import URL
from schemas.subsets import Subset

pytestmark = pytest.mark.ray

OCCS = ["nurse", "engineer", "teacher"]
IMAGES_PER_PROMPT, CAPTION_IMAGES = 2, 1
INTERVAL_RESAMPLES = 500       # --interval-resamples: passed down to metrics.json's headline
# what the local server's photo kinds must give through fetch and the real face filter
EXPECTED = {
    "astronaut": ("ok", "ok"), "camera": ("ok", "ok"), "coffee": ("ok", "no_face"), "chelsea": ("ok", "no_face"),
    "broken": ("not_image", None), "not_found": ("http_error", None), "montage": ("ok", "many_faces"),
}


def study_args(*extra):
    """The study of this module's run (the resume test runs the same study)."""
    return ["--occupations", ",".join(OCCS), "--sample-size", "12", "--nn-k", "6",
            "--images-per-prompt", str(IMAGES_PER_PROMPT), "--caption-images", str(CAPTION_IMAGES),
            "--steps", "2", "--standin-models", "--allow-local-urls", "--save-images",
            "--interval-resamples", str(INTERVAL_RESAMPLES),
            # App. A.6 with the rule-based stand-in endpoint (pipelines/standins/chat.py)
            "--paraphrases",
            # the walk's first round fetches 2 x k captions per occupation: about 70% of the sample's
            # images count, so k are reached in one round (the rounds themselves: test_resume.py)
            "--walk-first-round", "2",
            # the paper's threshold (0.9): the stand-in CLIP is calibrated so that the sample's two
            # face photos are counted, one "man" and one "woman" (pipelines/standins/clip.py)
            *extra]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, ray_local):
    root = tmp_path_factory.mktemp("amp_run")
    synthetic_laion.write(synthetic_laion.generate(3000, seed=1), root / "input.parquet")
    with LocalImageServer() as server:
        argv = ["run", "--captions", str(root / "input.parquet"), "--output", str(root / "out"), "--run-id", "r",
                *study_args("--url-rewrite", f"https://images.example.org/={server.base_url}/")]
        assert amplification.main(argv) == 0
    return root / "out" / "r"


def test_outputs_exist(run_dir):
    for name in ("images.parquet", "table3.csv", "table6_1.csv", "table6_2.csv", "training_percentages.csv",
                 "generated_percentages.csv", "image_stage_counts.csv", "amplification.json", "report.html",
                 "metrics.json", "training_subsets.parquet"):
        assert (run_dir / name).exists(), name


def test_clip_embeddings_are_checkpointed_and_the_image_similarity_is_reported(run_dir):
    """Section 5.2's image similarity: every training image CLIP classified has its unit embedding in
    the checkpoint (not in images.parquet), and the run writes the per-pair table and the summary."""
    import pandas as pd

    from pipelines.studies.amplification.images import TRAINING_CHECKPOINT

    parts = pq.read_table(run_dir / "_work" / TRAINING_CHECKPOINT)
    classified = parts.filter(pc.is_valid(parts.column(I.P_FEMALE)))
    assert classified.num_rows > 0 and classified.column(I.CLIP_EMBEDDING).null_count == 0
    assert parts.filter(pc.is_null(parts.column(I.P_FEMALE))).column(I.CLIP_EMBEDDING).null_count == \
        parts.num_rows - classified.num_rows
    norms = [np.linalg.norm(np.asarray(v, np.float32)) for v in classified.column(I.CLIP_EMBEDDING).to_pylist()]
    assert np.allclose(norms, 1.0, atol=2e-3)
    assert I.CLIP_EMBEDDING not in pq.read_schema(run_dir / "images.parquet").names
    table = pd.read_csv(run_dir / "image_similarity.csv")
    assert list(table.columns)[:5] == ["model", "occupation", "prompt_id", "naive", "nn"]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert "per_model" in m["results"]["image_similarity"]


def test_training_rows_one_per_subset_row_with_real_statuses(run_dir):
    images = pq.read_table(run_dir / "images.parquet")
    subsets = pq.read_table(run_dir / "training_subsets.parquet")
    train = images.filter(pc.equal(images.column(I.SOURCE), I.Source.TRAINING))
    assert train.num_rows == subsets.num_rows
    seen = set()
    for rec in train.select([URL, I.FETCH_STATUS, I.FACE_STATUS, I.GENDER, I.COUNTED]).to_pylist():
        index = int(rec[URL].rsplit("/", 1)[1].split(".")[0])
        kind = synthetic_kind(index)
        if kind in EXPECTED:
            fetch, face = EXPECTED[kind]
            assert (rec[I.FETCH_STATUS], rec[I.FACE_STATUS]) == (fetch, face), (kind, rec)
            seen.add(kind)
        if rec[I.COUNTED]:
            assert rec[I.FACE_STATUS] == "ok" and rec[I.GENDER] in I.Gender.DECIDED
        if rec[I.FACE_STATUS] == "ok":
            assert rec[I.GENDER] in I.Gender.ALL   # CLIP ran on every image that passed the face filter
    assert {"astronaut", "camera", "broken"} <= seen
    assert train.column(I.FETCH_STATUS).null_count == 0


def test_t_is_over_exactly_k_counted_images_walked_in_sample_key_order(run_dir):
    """Section 4: each occupation's naive subset is its pool's captions in sample_key order up to
    and including the 12th counted image (the paper's 500), and the walk is reported."""
    images = pq.read_table(run_dir / "images.parquet")
    pool = pq.read_table(run_dir / "training_pool.parquet").to_pandas()
    walk = pq.read_table(run_dir / "training_walk.parquet").to_pandas().set_index("occupation")
    naive = images.filter(pc.and_(pc.equal(images[I.SOURCE], I.Source.TRAINING),
                                  pc.equal(images["subset"], Subset.NAIVE))).to_pandas()   # caption ids: int64
    m = json.loads((run_dir / "metrics.json").read_text())["training_walk"]
    assert m["walked"] and m["training_sample"] == "counted_images" and m["groups"] == len(OCCS)
    walked_past = 0
    for occ in OCCS:
        mine = naive[naive.occupation == occ]
        ranked = pool[(pool.occupation == occ) & (pool.subset == "naive")].sort_values("rank")
        walked = ranked.caption_id.tolist()[:len(mine)]
        assert sorted(mine.caption_id) == sorted(walked)        # a prefix of the pool's order
        assert ranked.sample_key.is_monotonic_increasing
        counted = mine.set_index("caption_id").loc[walked, I.COUNTED].to_numpy()
        w = walk.loc[occ]
        assert (w.walked_captions, w.counted_images) == (len(mine), counted.sum())
        if w.shortfall == 0:
            assert counted.sum() == 12 and counted[-1]            # stops at the 12th counted image
        walked_past += len(mine) > 12
        assert w.shortfall == 12 - counted.sum()
    assert walked_past   # some of the first captions failed (404, no face, ...) and were walked past


def test_paraphrases_as_prompts_app_a6(run_dir):
    """App. A.6 on the stand-in endpoint: one request per (caption, occupation) of section 6's
    captions, every status counted in the run summary, M images per ok paraphrase with their own
    seeds and the original caption's indicator, E[A] beside section 6's with intervals in the A.6
    table, metrics.json and the report."""
    import pandas as pd

    from schemas import paraphrases as P

    table = pq.read_table(run_dir / "images.parquet")
    of = lambda source: table.filter(pc.equal(table.column(I.SOURCE), source)).to_pandas()  # noqa: E731
    para = pq.read_table(run_dir / "paraphrases.parquet").to_pandas()
    m = json.loads((run_dir / "metrics.json").read_text())
    train = of(I.Source.TRAINING)     # (filtered in Arrow: caption ids stay int64, exact)
    naive = train[(train["subset"] == Subset.NAIVE) & train[I.COUNTED]]
    assert sorted(zip(para.caption_id, para.occupation)) == sorted(set(zip(naive.caption_id, naive.occupation)))
    statuses = para[P.PARAPHRASE_STATUS].value_counts().to_dict()
    assert set(statuses) <= set(P.ParaphraseStatus.ALL) and statuses.get("ok", 0) > 0
    row = next(r for r in m["run_summary"] if r["stage"] == P.STAGE_PARAPHRASE)
    assert row["rows_in"] == len(para) and row["kept"] == statuses["ok"]
    assert row["dropped_by_reason"] == {k: v for k, v in statuses.items() if k != "ok"}
    ok = para[para[P.PARAPHRASE_STATUS] == "ok"]
    assert ok[P.PARAPHRASE_SBERT].between(-1.0001, 1.0001).all() and para.loc[
        para[P.PARAPHRASE_STATUS] != "ok", P.PARAPHRASE_SBERT].isna().all()
    models = m["image_config"]["generators"]
    gen = of(I.Source.PARAPHRASE_PROMPT)
    for model in models:
        mine = gen[gen[I.MODEL] == model]
        assert len(mine) == CAPTION_IMAGES * len(ok)
        assert sorted(mine.prompt) == sorted(ok[P.PARAPHRASE].repeat(CAPTION_IMAGES))
        # each image's caption indicator is its original caption's (the no-indicator subset of A.6)
        got = mine.set_index(["caption_id", "occupation"])["caption_gender"].sort_index()
        want = naive.drop_duplicates(["caption_id", "occupation"]).set_index(["caption_id", "occupation"])[
            "caption_gender"].reindex(got.index)
        assert (got == want).all()
    section6 = of(I.Source.CAPTION_PROMPT)
    assert not set(gen[I.SEED]) & set(section6[I.SEED]) and gen[I.SEED].notna().all()
    a6 = pd.read_csv(run_dir / "paraphrase_table.csv")
    assert len(a6) == 2 * len(models) and set(a6.prompts) == {"captions (section 6)", "paraphrases (App. A.6)"}
    res = m["results"]["paraphrases"]
    assert res["statuses"] == {s: statuses.get(s, 0) for s in P.ParaphraseStatus.ALL}
    assert res["config"]["prompt"] == P.PAPER_PROMPT and res["config"]["temperature"] == 0.0
    assert "standin" in res["config"] and "key" not in json.dumps(res["config"]).replace("api_key_env", "")
    for model in models:
        for name in ("all_captions", "no_indicator_captions"):
            got = a6[(a6.model == model) & (a6.prompts == "paraphrases (App. A.6)")][name].iloc[0]
            assert got == pytest.approx(res["e_a"][model][name]) or (np.isnan(got) and res["e_a"][model][name] is None)
    # A.6's E[A] is over the paraphrases' images, against section 6's T
    from pipelines.studies.amplification import results

    everything = table.to_pandas()
    for model in models:
        want = results.caption_prompt_results(everything[everything[I.SOURCE] == I.Source.TRAINING], everything[
            (everything[I.SOURCE] == I.Source.PARAPHRASE_PROMPT) & (everything[I.MODEL] == model)], OCCS)
        for name, r in want.items():
            assert res["e_a"][model][name] == (pytest.approx(r["average"]) if r["average"] is not None else None)
    keys = {x["key"] for s in m["headline"]["subjects"] for x in s["metrics"]}
    assert {"expected_amplification/paraphrases_as_prompts/all_captions",
            "expected_amplification/paraphrases_as_prompts/no_indicator_captions"} <= keys
    html = (run_dir / "report.html").read_text()
    assert "Paraphrased captions as prompts (App. A.6)" in html and "App. A.6: paraphrased captions as prompts" in html


def test_generated_rows_and_seeds(run_dir):
    images = pq.read_table(run_dir / "images.parquet")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    models = metrics["image_config"]["generators"]
    subsets = pq.read_table(run_dir / "training_subsets.parquet")
    del subsets
    train = images.filter(pc.equal(images.column(I.SOURCE), I.Source.TRAINING))
    # section 6: M images per naive caption whose training image counts (P_o = S_o)
    counted_naive = train.filter(pc.and_(pc.equal(train.column("subset"), Subset.NAIVE), train.column(I.COUNTED)))
    assert counted_naive.num_rows > 0
    gen = images.filter(pc.equal(images.column(I.SOURCE), I.Source.GENERATED))
    cap = images.filter(pc.equal(images.column(I.SOURCE), I.Source.CAPTION_PROMPT))
    assert gen.num_rows == len(models) * len(OCCS) * 4 * IMAGES_PER_PROMPT
    assert cap.num_rows == len(models) * counted_naive.num_rows * CAPTION_IMAGES
    assert set(cap.column("caption_id").to_pylist()) == set(counted_naive.column("caption_id").to_pylist())
    for t in (gen, cap):
        assert t.column(I.SEED).null_count == 0 and t.column(I.GENERATION_STATUS).null_count == 0
        assert set(t.column(I.MODEL).to_pylist()) == set(models)
    # one seed per (prompt, index), shared by the two models (paired noise), distinct otherwise
    for model in models:
        part = gen.filter(pc.equal(gen.column(I.MODEL), model))
        assert len(set(part.column(I.SEED).to_pylist())) == part.num_rows
        # caption prompts: one seed per (caption, index), even for captions with the same text
        part = cap.filter(pc.equal(cap.column(I.MODEL), model))
        keys = set(zip(part.column("caption_id").to_pylist(), part.column(I.IMAGE_INDEX).to_pylist(),
                       part.column("occupation").to_pylist()))
        assert len(set(zip(part.column(I.SEED).to_pylist(), part.column("occupation").to_pylist()))) == len(keys)
    # prompts are Table 1's with the right article
    prompts = set(gen.column("prompt").to_pylist())
    assert "A photo of the face of an engineer" in prompts and "A photo of a nurse at work" in prompts


def test_recorded_seed_regenerates_the_image(run_dir):
    """Regenerating one image alone from its recorded (model, prompt, seed) gives the same CLIP
    probabilities the run computed from the in-memory tensor."""
    from operators.image_generation import ImageGenerator

    images = pq.read_table(run_dir / "images.parquet")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    gen = images.filter(pc.and_(pc.equal(images.column(I.SOURCE), I.Source.GENERATED),
                                pc.equal(images.column(I.GENERATION_STATUS), "ok"))).slice(5, 1)
    from operators.base import Stage
    from operators.image_clip_gender import ClipGenderClassifier

    g = ImageGenerator(model=gen.column(I.MODEL)[0].as_py(), steps=2,
                       heads=[Stage(ClipGenderClassifier, metrics["image_config"]["clip"])],
                       device="cpu")
    out = g(gen.select(["prompt", I.SEED]))
    assert out.column(I.P_FEMALE)[0].as_py() == pytest.approx(gen.column(I.P_FEMALE)[0].as_py(), abs=1e-4)


def test_saved_images(run_dir):
    images = pq.read_table(run_dir / "images.parquet")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    saved_training = pq.read_table(run_dir / "images" / "training")
    saved_generated = pq.read_table(run_dir / "images" / "generated")
    fetched_ok = sum(r["count"] for r in metrics["image_counts"]
                     if r["branch"] == TRAINING_URLS and r["stage"] == "fetch" and r["outcome"] == "ok")
    assert saved_training.num_rows == fetched_ok
    gen = images.filter(pc.is_in(images.column(I.SOURCE), pa.array([I.Source.GENERATED, I.Source.CAPTION_PROMPT,
                                                                    I.Source.PARAPHRASE_PROMPT])))
    # every generated image is saved, except those left out (flagged by the NSFW check, or invalid): never stored
    left_out = pc.is_in(gen.column(I.GENERATION_STATUS), pa.array([I.GenerationStatus.NSFW_EXCLUDED,
                                                                   I.GenerationStatus.INVALID_IMAGE]))
    assert saved_generated.num_rows == gen.num_rows - pc.sum(left_out.cast(pa.int64())).as_py()
    # a saved generated image is found by its (model, seed) and decodes to an image
    import io

    from PIL import Image

    rec = saved_generated.slice(0, 1).to_pylist()[0]
    # saved as the datasets Image feature's struct (bytes, path)
    assert Image.open(io.BytesIO(rec[I.IMAGE]["bytes"])).size[0] > 0
    assert rec[I.SEED] in set(gen.column(I.SEED).to_pylist())


def test_people_label_the_runs_saved_images_as_app_a4_asks(run_dir, tmp_path, capsys):
    """`t2i annotate plan --protocol paper002-a4`: training and generated images that passed the face
    filter, half each, every item's image the bytes the run saved and its prediction the row's CLIP
    answer; seven simulated annotators; the run's report gets "Checked by people"."""
    import hashlib

    import pandas as pd

    from pipelines.annotate import cli
    from pipelines.annotate.tasks import TaskSet

    assert cli.main(["plan", str(run_dir), "--protocol", "paper002-a4", "--output", str(tmp_path / "t"),
                     "--n", "8"]) == 0
    t = TaskSet.load(tmp_path / "t")
    items = t.items
    assert items["source"].value_counts().to_dict() == {"training": 4, "generated": 4}
    rows = pq.read_table(run_dir / "images.parquet").to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    rows = rows[rows[I.FACE_STATUS] == I.FaceStatus.OK]
    saved = {**{("training", r[URL]): r[I.IMAGE]["bytes"] for r in pq.read_table(run_dir / "images" / "training")
                .to_pylist()},
             **{("generated", f"{r[I.PROMPT]} #{r[I.SEED]}"): r[I.IMAGE]["bytes"]
                for r in pq.read_table(run_dir / "images" / "generated").to_pylist()}}
    for r in items.to_dict("records"):
        data = saved[(r["source"], r["image_id"])]
        assert (tmp_path / "t" / r["image_file"]).read_bytes() == data
        assert r["image_sha256"] == hashlib.sha256(data).hexdigest()
        mine = rows[(rows[URL] == r["image_id"]) & (rows[I.SOURCE] == I.Source.TRAINING)] if r["source"] == "training" \
            else \
            rows[(rows[I.MODEL] == r["model"]) & (rows[I.PROMPT] + " #" + rows[I.SEED].astype(str) == r["image_id"])]
        assert len(mine) and (set(mine[I.GENDER]) == {r["prediction"]} if r["prediction"] else
                              set(mine[I.GENDER]) <= {I.Gender.AMBIGUOUS, I.Gender.DECODE_ERROR})
    assert cli.main(["simulate", str(tmp_path / "t"), "--annotators", "7"]) == 0
    assert cli.main(["report", str(tmp_path / "t"), "--interval-resamples", "200"]) == 0
    assert "by 7 annotators on 8 items (56 simulated)" in capsys.readouterr().out
    assert "Checked by people: paper002-a4" in (run_dir / "report.html").read_text()
    # % female corrected by their labels, per source: the population is every image with one face
    # (a URL once, a (model, prompt, seed) once), those with a CLIP answer
    assert cli.main(["estimate", str(tmp_path / "t"), "--method", "both"]) == 0
    est = pd.read_parquet(tmp_path / "t" / "estimate" / "estimates.parquet")
    assert len(est) == 4
    train = rows[rows[I.SOURCE] == I.Source.TRAINING].drop_duplicates(URL)
    gen = rows[rows[I.SOURCE] != I.Source.TRAINING].drop_duplicates([I.MODEL, I.PROMPT, I.SEED])
    for stratum, part in (("source=training", train), ("source=generated", gen)):
        answered = part[part[I.GENDER].isin([I.Gender.FEMALE, I.Gender.MALE])]
        for _, row in est[est["stratum"] == stratum].iterrows():
            assert row["items"] == len(answered) and row["no_prediction"] == len(part) - len(answered)
            # drawn items CLIP gave no answer are outside the population (as outside % female)
            assert row["labelled"] == ((items["source"] == stratum.split("=")[1]) & items["prediction"].notna()).sum()
            assert row["classifier"] == pytest.approx((answered[I.GENDER] == I.Gender.FEMALE).mean())
    # the demo's report fills: corrected shares per source and E[A] per approach, each with an interval
    ppi = est[est["correction"] == "ppi++"]
    assert len(ppi) == 2 and ppi["corrected"].notna().all() and ppi["corrected_low"].notna().all()
    assert (est["corrected"].notna() | (est["flag"] != "")).all()      # Rogan-Gladen says why where it gives none
    amp = pd.read_parquet(tmp_path / "t" / "estimate" / "amplification_corrected.parquet")
    valued = amp[amp["classifier"].notna()]
    assert len(valued) and valued["corrected"].notna().all() and valued["corrected_low"].notna().all()
    page = (run_dir / "report.html").read_text()
    assert "Corrected by people: paper002-a4" in page and "E[A] from corrected % female" in page


def test_e_a_from_percentages_corrected_by_people(run_dir, tmp_path, capsys):
    """App. A.4's labels on every image the run saved: people who agree with CLIP everywhere give
    back the run's own E[A] for every approach and section 6 (the corrected percentages are then the
    classifier's), and people who see the other gender in every generated image move it."""
    import pandas as pd

    from pipelines.annotate import cli
    from pipelines.annotate.store import AnswerStore
    from pipelines.annotate.tasks import ANSWERS_DB, TaskSet

    out = tmp_path / "all"
    assert cli.main(["plan", str(run_dir), "--protocol", "paper002-a4", "--output", str(out), "--n", "100000"]) == 0
    assert cli.main(["simulate", str(out), "--annotators", "1", "--error-rate", "0", "--unsure-rate", "0"]) == 0
    assert cli.main(["estimate", str(out), "--resamples", "8"]) == 0
    amp = json.loads((run_dir / "amplification.json").read_text())
    est = pd.read_parquet(out / "estimate" / "amplification_corrected.parquet")
    assert len(est) and (est["groups_corrected"] > 0).all()
    for r in est.to_dict("records"):
        if r["approach"].startswith("section 6: "):
            own = amp["caption_prompts"][r["model"]][r["approach"][len("section 6: "):]]["average"]
        else:
            own = amp["approaches"][r["model"]][r["approach"]]["average"]
        assert (r["classifier"], r["corrected"]) == (pytest.approx(own), pytest.approx(own)) if own is not None \
            else pd.isna(r["corrected"])
    # people who see the other gender than CLIP in every generated image: G becomes 100 - G
    items = TaskSet.load(out).items
    store = AnswerStore(out / ANSWERS_DB)
    labels = store.labels()
    generated = set(items.loc[items["source"] == "generated", "item_id"])
    swap = {"female": "male", "male": "female"}
    flipped = labels.assign(answer=[(swap.get(a, a) if i in generated else a)
                                    for i, a in zip(labels["item_id"], labels["answer"])])
    store.record_many(flipped[["item_id", "annotator", "answer"]], "table")
    capsys.readouterr()
    assert cli.main(["estimate", str(out), "--resamples", "8"]) == 0
    moved = pd.read_parquet(out / "estimate" / "amplification_corrected.parquet")
    assert not np.allclose(moved["corrected"].fillna(-99), est["corrected"].fillna(-99))
    assert (moved["corrected_low"].dropna() <= moved["corrected"][moved["corrected_low"].notna()] + 1e-9).all()


def test_counts_add_up(run_dir):
    import pandas as pd

    counts = pd.read_csv(run_dir / "image_stage_counts.csv")
    for (branch, stage), part in counts.groupby(["branch", "stage"]):
        assert part["count"].sum() == part["rows_in"].iloc[0], (branch, stage)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    fetch = counts[(counts.branch == TRAINING_URLS) & (counts.stage == "fetch")]
    assert fetch["rows_in"].iloc[0] == metrics["images"]["distinct_urls"]
    # the per-subset-row branches agree with the per-image table
    images = pq.read_table(run_dir / "images.parquet").to_pandas()
    train = images[images[I.SOURCE] == "training"]
    for subset, part in train.groupby("subset"):
        c = counts[counts.branch == f"training rows: {subset}"]
        assert c[c.stage == "fetch"]["rows_in"].iloc[0] == len(part)
        decided = c[(c.stage == "clip_gender") & c.outcome.isin(["male", "female"])]["count"].sum()
        assert decided == int(part[I.COUNTED].sum())
    # every stage's input is what the previous one passed
    for branch, part in counts.groupby("branch"):
        stages = list(dict.fromkeys(part["stage"]))
        for a, b in zip(stages, stages[1:]):
            passed = part[(part.stage == a) & (part.outcome == "ok")]["count"].sum()
            assert part[part.stage == b]["rows_in"].iloc[0] == passed, (branch, a, b)


def _strict(text):
    def bad(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=bad)


def test_metrics_and_report_say_standins(run_dir):
    metrics = _strict((run_dir / "metrics.json").read_text())
    _strict((run_dir / "amplification.json").read_text())
    roles = {m["role"]: m["standin"] for m in metrics["image_models"]}
    assert roles["gender classifier (CLIP)"] is True and roles["generator"] is True
    assert roles["face detector"] is False
    assert metrics["image_config"]["standin_models"] is True
    assert [g["guidance_scale"] for g in metrics["image_config"]["generation"]["generators"]] == [7.5, 7.5]
    assert metrics["environment"]["packages"]["mediapipe"] == "0.10.14"
    html = (run_dir / "report.html").read_text()
    assert "Stand-in models" in html and html.count("<img") >= 4 and "figure7_approaches_prompt1" in html
    assert "nsfw" not in html or "nsfw_blocked" in html
    table3 = (run_dir / "table3.csv").read_text().splitlines()
    assert len(table3) == 1 + 2 * 4  # two models x four approaches


def test_amplification_matches_percentages(run_dir):
    """E[A] in amplification.json recomputed from the per-image table by hand."""

    images = pq.read_table(run_dir / "images.parquet").to_pandas()
    amp = json.loads((run_dir / "amplification.json").read_text())
    model = sorted(set(images[I.MODEL].dropna()))[0]
    tr = images[(images[I.SOURCE] == "training") & (images["subset"] == "naive") & images[I.COUNTED]]
    ge = images[(images[I.SOURCE] == "generated") & (images[I.MODEL] == model) & images[I.COUNTED]]
    rows = amp["approaches"][model]["naive"]["rows"]
    for r in rows:
        t = tr[tr.occupation == r["occupation"]]
        g = ge[(ge.occupation == r["occupation"]) & (ge.prompt_id == r["prompt_id"])]
        if len(t):
            assert r["training"] == pytest.approx(100 * (t[I.GENDER] == "female").mean())
        else:
            assert r["training"] is None
        if len(g):
            assert r["generated"] == pytest.approx(100 * (g[I.GENDER] == "female").mean())
        if r["training"] is not None and r["generated"] is not None and r["excluded"] is None:
            assert r["amplification"] == pytest.approx(abs(r["generated"] - 50) - abs(r["training"] - 50))
    # the counted-image path is exercised on both sides (the calibrated stand-in CLIP counts the
    # sample's two face photos, one per gender), and on generated images that show a face; a cell
    # without counted images must show as an exclusion reason, not as a silent gap
    counted = images[images[I.COUNTED]]
    assert set(counted[counted[I.SOURCE] == "training"][I.GENDER]) == {"female", "male"}
    assert len(counted[counted[I.SOURCE] != "training"]) > 0
    # section 6's E[A] (captions as prompts) has a number for a model, and the correlation its points
    assert any(r["all_captions"]["average"] is not None for r in amp["caption_prompts"].values())
    assert amp["indicator_correlation"]["n"] == len(OCCS)
    assert any(r["training"] is not None for r in rows)
    for r in rows:
        if r["generated"] is None:
            assert r["excluded"] in ("no_generated_images", "no_training_images")
    included = [r["amplification"] for r in rows if r["excluded"] is None and r["prompt_id"] == 1]
    per = {p["group"]: p for p in amp["approaches"][model]["naive"]["per_prompt"]}
    if included:
        assert per["1"]["expected_amplification"] == pytest.approx(np.mean(included))
    else:
        assert per["1"]["expected_amplification"] is None


def test_headline_numbers_have_intervals_and_units(run_dir):
    """metrics.json's headline: per generator, every E[A] of Table 3 and section 6 with its interval
    over occupations; headline_units.parquet's per-unit values average to each reported number,
    which is the one in amplification.json; table3.csv has the bounds beside each E[A]; the report
    opens with the interval table."""
    import pandas as pd

    from pipelines.studies.amplification import results

    m = _strict((run_dir / "metrics.json").read_text())
    head, amp = m["headline"], json.loads((run_dir / "amplification.json").read_text())
    assert head["study"] == "paper002-amplification" and head["standin"] is True
    assert head["interval"]["resamples"] == INTERVAL_RESAMPLES and head["interval"]["level"] == 0.95
    assert "prompts" in head["protocol"] and "gender_classifier" in head["protocol"]
    assert "nn_mean_cosine" in m["caption_headline"]            # the caption side's means, moved aside
    models = m["image_config"]["generators"]
    assert [s["name"] for s in head["subjects"]] == models and len({s["key"] for s in head["subjects"]}) == 2
    units = pq.read_table(run_dir / "headline_units.parquet").to_pandas()
    t3 = pd.read_csv(run_dir / "table3.csv")
    cols = list(t3.columns)
    assert cols[cols.index("#1"):cols.index("#1") + 3] == ["#1", "#1_low", "#1_high"]
    assert cols[cols.index("average"):cols.index("average") + 3] == ["average", "average_low", "average_high"]
    valued = 0
    for subject in head["subjects"]:
        model = subject["name"]
        keys = [x["key"] for x in subject["metrics"]]
        # Table 3's approaches (average and 4 prompts), section 6's two, App. A.6's two (--paraphrases)
        assert len(keys) == 4 * 5 + 2 + 2 and results.captions_key("all_captions") in keys
        assert results.paraphrases_key("no_indicator_captions") in keys
        assert subject["images"] == int(pd.read_parquet(run_dir / "images.parquet").query(
            "model == @model and counted").shape[0])
        for metric in subject["metrics"]:
            assert metric["unit"] == "occupation" and metric["better"] == "lower"
            if metric["low"] is not None:
                assert metric["low"] <= metric["value"] <= metric["high"]
            mine = units[(units.subject == subject["key"]) & (units.metric == metric["key"])]
            assert set(mine.unit) == set(OCCS)
            # intervals over occupations and the images behind each percentage (two-level)
            assert metric["method"] == "two-level bootstrap-percentile" and mine.replicates.map(len).eq(200).all()
            mine = mine[mine.value.notna()]
            if metric["value"] is None:
                assert mine.empty
                continue
            valued += 1
            assert np.average(mine.value, weights=mine.weight) == pytest.approx(metric["value"])
        by_key = {x["key"]: x for x in subject["metrics"]}
        for subset, res in amp["approaches"][model].items():
            assert by_key[results.approach_key(subset)]["value"] == pytest.approx(res["average"])
            for p in res["per_prompt"]:
                assert by_key[results.approach_key(subset, p["group"])]["value"] == \
                    pytest.approx(p["expected_amplification"])
            row = t3[(t3.model == model) & (t3.approach == results.APPROACH_TITLES[subset])].iloc[0]
            ends = (by_key[results.approach_key(subset)]["low"], by_key[results.approach_key(subset)]["high"])
            assert [None if pd.isna(v) else v for v in (row.average_low, row.average_high)] == \
                [pytest.approx(e) if e is not None else None for e in ends]
        for name, res in amp["caption_prompts"][model].items():
            assert by_key[results.captions_key(name)]["value"] == pytest.approx(res["average"])
    assert valued       # the stand-ins give some E[A] (section 6's at least): the units are checked
    html = (run_dir / "report.html").read_text()
    box = html[html.index("class=headline>"):html.index("</section>")]
    assert "class=headline-metrics" in box and "95% interval" in box and "occupations" in box
    assert "E[A], Naive Approach, average over prompts" in box and "prompt #1" not in box


def test_unloadable_model_fails_before_any_work(tmp_path, ray_local, capsys):
    """Offline, the default CLIP (ViT-L/14, OpenAI) cannot load: the run stops at once, naming it,
    before reading data or writing anything. (``--device cpu``: with no GPU here the GPU check
    would refuse the real models even earlier, tests/engine/test_gpus.py.) In this process, on the
    tests' shared local instance (HF_HUB_OFFLINE=1 is set for the whole session in conftest.py);
    the script's own entry point runs in subprocesses in test_summarize_cli.py and, on a cluster,
    in tests/test_job_submit.py."""
    import os

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    res = amplification.main(["run", "--output", str(tmp_path / "out"), "--device", "cpu", "--ray-address", "local",
                              "--num-cpus", "2"])
    err = capsys.readouterr().err
    assert res == 2
    assert "cannot load CLIP model 'ViT-L-14'" in err and "--standin-models" in err
    assert "Traceback" not in err
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_missing_input_fails_before_any_work(tmp_path):
    res = amplification.main(["run", "--output", str(tmp_path / "out"), "--standin-models",
                              "--captions", str(tmp_path / "missing.parquet")])
    assert res == 2
    assert not (tmp_path / "out").exists()  # no stand-ins built, nothing written


def test_shard_key_without_training_images_fails_before_any_work(tmp_path, capsys):
    res = amplification.main(["run", "--output", str(tmp_path / "out"), "--standin-models", "--shard-key", "uid"])
    err = capsys.readouterr().err
    assert res == 2 and "--shard-key needs --training-images" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


_DRIVER = """
import sys
from pipelines import amplification
from pipelines.studies.amplification.sample_server import LocalImageServer
with LocalImageServer() as server:
    sys.exit(amplification.main(sys.argv[1:] + ["--url-rewrite", f"https://images.example.org/={server.base_url}/"]))
"""


@pytest.mark.timeout(1500)
def test_killed_run_resumes_to_identical_results(run_dir, tmp_path, ray_local):
    """Kill a run's driver (SIGKILL to its whole process group) while it generates images, as a
    cluster loses a `ray submit` driver: the driver is attached to the tests' Ray instance (an
    address, so CPU actors are asked for), which ends the killed job's actors. The same command
    then skips the finished caption shards, the fetched URLs and the generated images, and ends
    with the results of the uninterrupted run (``run_dir``, which read the same captions from one
    file instead of two shards of one file each)."""
    import glob
    import sys

    import pandas as pd

    synthetic_laion.write(synthetic_laion.generate(3000, seed=1), tmp_path / "laion", files=2)
    out = tmp_path / "out"
    argv = ["run", "--captions", str(tmp_path / "laion"), "--output", str(out), "--run-id", "k",
            "--files-per-shard", "1", "--gen-batch-size", "2", "--gpus-per-actor", "0", "--device", "cpu",
            *study_args()]
    parts = str(out / "k" / "_work" / "generated" / "*" / "part-*.parquet")
    address = ray_local.get_runtime_context().gcs_address
    kill_when([sys.executable, "-c", _DRIVER, *argv, "--ray-address", address, "--no-progress"],
              parts, tmp_path / "killed.log")
    assert glob.glob(parts), (tmp_path / "killed.log").read_text()[-3000:]
    run = out / "k"
    assert not (run / "images.parquet").exists() and not (run / "report.html").exists()  # killed midway
    assert json.loads((run / "run.json").read_text())["status"] == "running"
    assert len(glob.glob(str(run / "_work" / "captions" / "shard-*.done"))) == 2

    with LocalImageServer() as server:
        assert amplification.main(argv + ["--url-rewrite", f"https://images.example.org/={server.base_url}/",
                                          "--no-progress"]) == 0
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "finished" and [a["resumed"] for a in record["attempts"]] == [False, True]
    m = json.loads((run / "metrics.json").read_text())
    assert m["caption_phase"]["reused"] == 3000 and m["caption_phase"]["processed"] == 0
    # the error budgets count every attempt's rows (the caption scan's all came from the first)
    resumed_scan = next(b for b in m["error_budgets"] if b["stage"] == "read_captions")
    scan = next(b for b in json.loads((run_dir / "metrics.json").read_text())["error_budgets"]
                if b["stage"] == "read_captions")
    assert resumed_scan["rows"] == scan["rows"] == 3000 and resumed_scan["failed"] == scan["failed"]
    summary = {(r["branch"], r["stage"]): r for r in m["run_summary"]}
    fetch = summary[(TRAINING_URLS, "fetch")]
    assert fetch["rows_reused"] == fetch["rows_in"] > 0  # every URL came from the checkpoint
    gen = [r for (b, s), r in summary.items() if b.startswith(I.Source.GENERATED + ":") and s == "generate"]
    assert gen and gen[0]["rows_reused"] > 0  # the first model's finished images were not generated again

    # identical results (the stand-in generators live in each run's directory: compare their names)
    def same_models(df):
        for col in ("model", "branch"):
            if col in df:
                df[col] = df[col].map(lambda v: v if not isinstance(v, str) else
                                      v.replace(str(run), "<run>").replace(str(run_dir), "<run>"))
        return df

    for name in ("training_percentages.csv", "generated_percentages.csv", "table3.csv", "table6_1.csv",
                 "table6_2.csv", "image_stage_counts.csv", "similarity_summary.csv", "paraphrase_table.csv"):
        pd.testing.assert_frame_equal(same_models(pd.read_csv(run / name)), same_models(pd.read_csv(run_dir / name)),
                                      check_exact=False, rtol=1e-4, obj=name)
    key = [I.SOURCE, I.MODEL, "occupation", "subset", "prompt_id", "prompt", "caption_id", I.IMAGE_INDEX, URL]
    a = same_models(pq.read_table(run / "images.parquet").to_pandas())
    b = same_models(pq.read_table(run_dir / "images.parquet").to_pandas())
    a = a.sort_values(key, na_position="first").reset_index(drop=True)
    b = b.sort_values(key, na_position="first").reset_index(drop=True)
    exact = key + [I.SEED, I.FETCH_STATUS, I.FACE_STATUS, I.GENDER, I.GENERATION_STATUS, I.COUNTED]
    pd.testing.assert_frame_equal(a[exact], b[exact])
    np.testing.assert_allclose(a[I.P_FEMALE].fillna(-1).to_numpy(), b[I.P_FEMALE].fillna(-1).to_numpy(), atol=1e-4)
