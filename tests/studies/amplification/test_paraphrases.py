"""Paper 002, App. A.6: the pieces of the paraphrase step without Ray (a user's file
with missing, extra, duplicate and bad rows; the cache keys; which checkpointed answer wins; the
generation requests and their seeds; the image similarity), the command line's refusals, and on
local Ray the `paraphrase` command with a tiny local transformers model through the production
loader, and killed mid-paraphrasing then resumed to identical results."""

import json
import threading
import time
from http.server import ThreadingHTTPServer

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import amplification
from pipelines.engine.run.rundir import RunDir
from pipelines.standins.chat import JsonHandler
from pipelines.studies.amplification import paraphrase_results as PR, paraphrases as PP
from pipelines.studies.amplification.images import REQUEST_SCHEMA
from schemas import images as I
from schemas import paraphrases as P
from schemas.paraphrases import ParaphraseStatus as S

OCCS = ["nurse", "engineer", {"name": "ceo", "prompt_name": "CEO"}]


def settings(**kw):
    base = {"kind": "endpoint", "endpoint": "http://127.0.0.1:1/v1", "model": "m"}
    return PP.ParaphraseSettings(base | kw.pop("backend", {}), **kw)


def rows(n=6):
    occ = ["nurse", "engineer", "ceo"]
    return pa.table({"caption_id": pa.array(range(n), pa.int64()), "occupation": [occ[i % 3] for i in range(n)],
                     "caption": [f"caption {i} of a {occ[i % 3]}" for i in range(n)],
                     "caption_gender": ["none"] * n, "url": [f"https://x/{i}.jpg" for i in range(n)]})


def test_cache_keys_follow_caption_backend_model_prompt_temperature_not_the_endpoint():
    key = lambda st: PP.requests_from(rows(), st, OCCS).column(P.PARAPHRASE_KEY).to_pylist()  # noqa: E731
    k = key(settings())
    assert len(set(k)) == 6
    assert key(settings(backend={"endpoint": "http://elsewhere/v1"})) == k        # a moved server: same answers
    for other in (settings(backend={"model": "m2"}), settings(temperature=0.7),
                  settings(prompt=P.PAPER_PROMPT + " Be brief."),
                  settings(backend={"kind": "transformers", "revision": "abc"})):
        assert not set(key(other)) & set(k)
    # a caption in two occupations is two requests (the prompt names the occupation)
    two = pa.concat_tables([rows(1), rows(1).set_column(1, "occupation", pa.array(["engineer"]))])
    assert PP.requests_from(two, settings(), OCCS).num_rows == 2


def test_the_answer_kept_per_key_is_a_final_one_else_the_latest(tmp_path):
    rd = RunDir(str(tmp_path), "r")
    req = PP.requests_from(rows(3), settings(), OCCS)
    keys = req.column(P.PARAPHRASE_KEY)

    def part(i, status, text):
        t = req.slice(i, 1)
        for f, v in ((P.PARAPHRASE, text), (P.PARAPHRASE_STATUS, status)):
            t = t.append_column(f, pa.array([v], pa.string()))
        rd.write_part(PP.CHECKPOINT, t)
        time.sleep(0.01)

    part(0, S.HTTP_ERROR, None)
    part(0, S.OK, "first ok")          # asked again on resume: the answer wins over the failure
    part(1, S.NO_OCCUPATION, "x")
    part(1, S.TIMEOUT, None)           # a later failure does not replace an answer
    part(2, S.TIMEOUT, None)
    final = PP._answers(rd, keys)
    assert sorted(final.column(P.PARAPHRASE_STATUS).to_pylist()) == [S.NO_OCCUPATION, S.OK]
    every = PP._answers(rd, keys, final_only=False).to_pandas().set_index(P.PARAPHRASE_KEY)
    got = every.loc[keys.to_pylist(), P.PARAPHRASE_STATUS].tolist()
    assert got == [S.OK, S.NO_OCCUPATION, S.TIMEOUT]


def test_a_users_file_with_missing_extra_duplicate_empty_and_wrong_rows(tmp_path):
    req = PP.requests_from(rows(6), settings(), OCCS)
    f = tmp_path / "p.csv"
    pd.DataFrame({"caption_id": [0, 1, 2, 2, 3, 4, 99, 98],
                  "paraphrase": ["Two nurses", "an ENGINEER at work", "The CEO", "duplicate, ignored", "  ",
                                 "a person", "extra", "extra too"]}).to_csv(f, index=False)
    out = PP.from_file(req, str(f), OCCS, "plural").to_pandas().set_index("caption_id")
    assert out.loc[[0, 1, 2], P.PARAPHRASE_STATUS].tolist() == [S.OK] * 3
    assert out.loc[2, P.PARAPHRASE] == "The CEO"                     # the first of duplicate rows
    assert out.loc[3, P.PARAPHRASE_STATUS] == S.EMPTY
    assert out.loc[4, P.PARAPHRASE_STATUS] == S.NO_OCCUPATION         # 'a person' names no engineer
    assert out.loc[5, P.PARAPHRASE_STATUS] == S.NOT_IN_FILE and pd.isna(out.loc[5, P.PARAPHRASE])
    assert (out[P.PARAPHRASE_ATTEMPTS] == 0).all() and not out[P.PARAPHRASE_RETRIED].any()
    cov = PP.file_coverage(str(f), req)
    assert cov | {"file": None} == {"file": None, "rows": 8, "matched_rows": 6, "extra_rows": 2, "duplicate_rows": 1,
                                    "matched_by": ["caption_id"]}
    # by caption text and occupation when the file has no caption_id
    g = tmp_path / "q.csv"
    pd.DataFrame({"caption": ["caption 0 of a nurse", "caption 0 of a nurse"], "occupation": ["nurse", "engineer"],
                  "paraphrase": ["a nurse", "an engineer"]}).to_csv(g, index=False)
    by_text = PP.from_file(req, str(g), OCCS, "plural").to_pandas().set_index("caption_id")[P.PARAPHRASE_STATUS]
    assert by_text.sort_index().tolist() == [S.OK] + [S.NOT_IN_FILE] * 5
    assert PP.file_coverage(str(g), req)["extra_rows"] == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("caption_id,text\n1,x\n")
    with pytest.raises(ValueError, match="needs a paraphrase column"):
        PP.from_file(req, str(bad), OCCS, "plural")


def test_generation_requests_m_per_ok_paraphrase_with_their_own_seeds():
    req = PP.requests_from(rows(3), settings(), OCCS)
    answered = req
    for f, v in ((P.PARAPHRASE, ["a nurse", "an engineer", None]), (P.PARAPHRASE_STATUS, [S.OK, S.OK, S.HTTP_ERROR])):
        answered = answered.append_column(f, pa.array(v, pa.string()))
    g = PP.generation_requests(answered, 3, 7, REQUEST_SCHEMA)
    assert g.schema == REQUEST_SCHEMA and g.num_rows == 6
    assert set(g.column(I.SOURCE).to_pylist()) == {I.Source.PARAPHRASE_PROMPT}
    assert g.column(I.IMAGE_INDEX).to_pylist() == [0, 1, 2, 0, 1, 2]
    seeds = g.column(I.SEED).to_pylist()
    assert len(set(seeds)) == 6 and PP.generation_requests(answered, 3, 7, REQUEST_SCHEMA).column(I.SEED).to_pylist() == seeds
    assert PP.generation_requests(answered, 3, 8, REQUEST_SCHEMA).column(I.SEED).to_pylist() != seeds
    # the original caption stays with its images; the prompt is the paraphrase
    assert g.column("caption").to_pylist()[::3] == req.column("caption").to_pylist()[:2]
    assert g.column("prompt").to_pylist()[::3] == ["a nurse", "an engineer"]


def test_image_similarity_on_known_embeddings():
    e = lambda *v: np.asarray(v, np.float32) / np.linalg.norm(v)  # noqa: E731
    a1, a2, b1 = e(1, 0, 0), e(0, 1, 0), e(1, 1, 0)
    t = pa.table({I.MODEL: ["m"] * 3, "occupation": ["nurse"] * 3, "caption_id": pa.array([5] * 3, pa.int64()),
                  I.SOURCE: [I.Source.CAPTION_PROMPT, I.Source.CAPTION_PROMPT, I.Source.PARAPHRASE_PROMPT],
                  I.CLIP_EMBEDDING: [a1.tolist(), a2.tolist(), b1.tolist()]})
    sim = PR.image_similarity(t)
    row = sim.iloc[0]
    assert (row.caption_images, row.paraphrase_images) == (2, 1)
    assert row.caption_vs_paraphrase == pytest.approx((a1 @ b1 + a2 @ b1) / 2)   # mean over pairs
    assert row.caption_vs_caption == pytest.approx(a1 @ a2)                    # two seeds of one caption
    assert PR.image_similarity(None).empty


@pytest.mark.parametrize("argv,message", [
    (["--paraphrase-file", "x.csv"], "need --paraphrases"),
    (["--paraphrases", "--paraphrase-file", "x.csv", "--paraphrase-local", "m"], "give one source"),
    (["--paraphrases", "--caption-images", "0"], "needs --caption-images > 0"),
    (["--paraphrases", "--paraphrase-prompt", "Paraphrase: [CAPTION]"], "lacks the [OCCUPATION] placeholder"),
    (["--paraphrases", "--paraphrase-file", "/nonexistent/p.csv"], "no such file"),
])
def test_bad_paraphrase_flags_fail_before_any_work(tmp_path, capsys, argv, message):
    res = amplification.main(["run", "--output", str(tmp_path / "out"), "--standin-models", *argv])
    err = capsys.readouterr().err
    assert res == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_the_papers_endpoint_without_a_key_fails_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    res = amplification.main(["run", "--output", str(tmp_path / "out"), "--paraphrases"])
    err = capsys.readouterr().err
    assert res == 2 and "$OPENAI_API_KEY" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------- on local Ray
class Endpoint:
    """An OpenAI-compatible endpoint on 127.0.0.1 counting its requests; its answers depend only on
    the prompt (caption ids divisible by 5 never name the occupation)."""

    def __init__(self):
        self.count, self.lock = 0, threading.Lock()
        fake = self

        class Handler(JsonHandler):
            def do_POST(self):
                body = self.read_json()
                with fake.lock:
                    fake.count += 1
                prompt = body["messages"][-1]["content"]
                word = prompt.split("include the word ", 1)[1].split(".", 1)[0]
                caption = prompt.rsplit("Phrase/Sentence: ", 1)[1]
                number = int(caption.split()[1])
                text = "Someone at work" if number % 5 == 0 else f"In other words, {caption} ({word})"
                self.send_json(200, {"choices": [{"finish_reason": "stop", "message": {"content": text}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        from helpers import serve_in_thread

        serve_in_thread(self.server)
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def caption_file(path, n=24, occupations=("nurse", "engineer")):
    pd.DataFrame({"caption_id": range(n), "occupation": [occupations[i % len(occupations)] for i in range(n)],
                  "caption": [f"caption {i} a {occupations[i % len(occupations)]} at work" for i in range(n)]}
                 ).to_csv(path, index=False)
    return path


def command(src, out, run_id, url):
    return ["paraphrase", "--from", str(src), "--output", str(out), "--run-id", run_id, "--paraphrase-endpoint", url,
            "--paraphrase-model", "fake-1", "--paraphrase-batch-size", "4", "--paraphrase-concurrency", "1",
            "--no-progress"]


def test_killed_mid_paraphrasing_resumes_to_identical_results(tmp_path, ray_local):
    """The `paraphrase` command's run directory as a driver killed after its first checkpointed
    answers leaves it (a copy taken then, during the uninterrupted run: helpers.SnapshotAtFirstPart;
    a driver killed for real, attached to a cluster: test_run.py's killed run), resumed: it asks
    only what it had no answer for and ends with the table of the uninterrupted run."""
    from helpers import SnapshotAtFirstPart

    src = caption_file(tmp_path / "captions.csv")
    out = tmp_path / "killed"
    with Endpoint() as endpoint:
        with SnapshotAtFirstPart(tmp_path / "at_first_part") as killed:
            assert amplification.main(command(src, out, "k", endpoint.url)) == 0
        assert endpoint.count == 24 + 24 // 5 + 1       # every caption once, those lacking the word twice
        whole = pq.read_table(out / "k" / "paraphrases.parquet")
        done = killed.rows[0]
        assert 0 < done < 24
        killed.swap(out / "k", tmp_path / "clean" / "k")
        assert not (out / "k" / "paraphrases.parquet").exists()
        asked_before = endpoint.count
        assert amplification.main(command(src, out, "k", endpoint.url)) == 0
        assert endpoint.count - asked_before < 24 + 24 // 5 + 1   # the checkpointed answers were not asked again
    resumed = pq.read_table(out / "k" / "paraphrases.parquet")
    assert resumed.equals(whole)
    m = json.loads((out / "k" / "metrics.json").read_text())
    row = next(r for r in m["run_summary"] if r["stage"] == P.STAGE_PARAPHRASE)
    assert row["rows_reused"] == done and row["rows_in"] == 24
    assert row["dropped_by_reason"] == {S.NO_OCCUPATION: 24 // 5 + 1} and row["kept"] == 24 - 24 // 5 - 1
    assert [a["resumed"] for a in json.loads((out / "k" / "run.json").read_text())["attempts"]] == [False, True]
    assert m["paraphrases"]["config"]["model"] == "fake-1" and "api_key_env" in m["paraphrases"]["config"]


def test_a_local_transformers_model_through_the_production_loader(tmp_path, ray_local):
    """A tiny scripted Llama (it answers "a doctor" to everything) paraphrases on a Ray actor:
    the doctor captions' answers name their occupation, the nurse captions' do not (and greedy
    decoding is deterministic, so they are not asked again); the model's provenance is recorded."""
    from chat_models import build_dirs

    model = build_dirs(tmp_path / "models")["chain"]
    src = caption_file(tmp_path / "captions.csv", n=6, occupations=("doctor", "nurse"))
    assert amplification.main(["paraphrase", "--from", str(src), "--output", str(tmp_path / "out"), "--run-id", "l",
                               "--paraphrase-local", str(model), "--paraphrase-max-tokens", "8", "--device", "cpu",
                               "--no-progress"]) == 0
    t = pq.read_table(tmp_path / "out" / "l" / "paraphrases.parquet").to_pandas()
    doctor, nurse = t[t.occupation == "doctor"], t[t.occupation == "nurse"]
    assert (doctor[P.PARAPHRASE] == "a doctor").all() and (doctor[P.PARAPHRASE_STATUS] == S.OK).all()
    assert (nurse[P.PARAPHRASE_STATUS] == S.NO_OCCUPATION).all() and not t[P.PARAPHRASE_RETRIED].any()
    assert doctor[P.PARAPHRASE_SBERT].notna().all() and nurse[P.PARAPHRASE_SBERT].isna().all()
    m = json.loads((tmp_path / "out" / "l" / "metrics.json").read_text())
    para = next(r for r in m["models"] if r["role"].startswith("paraphraser"))
    assert para["detail"]["backend"] == "transformers" and len(para["detail"]["weights_sha256"]) == 64
    assert para["detail"]["prompt"] == P.PAPER_PROMPT and para["detail"]["temperature"] == 0.0


def test_a_local_model_runs_on_gpu_actors_and_an_endpoint_on_cpu_actors():
    """What a real cluster gets: the transformers paraphraser asks each actor for the run's GPUs and
    is given the run's device; an endpoint's actors ask for none; the SBERT cosine stays on the CPU
    and streams in the paraphraser's batches (a larger batch would hold every answer back)."""
    from pipelines.engine.run.models import ModelSpec
    from schemas.occupations import parse_occupations

    occ, sbert = parse_occupations(OCCS), ModelSpec("sentence-transformers/all-MiniLM-L6-v2")
    local = PP.ParaphraseSettings({"kind": "transformers", "model": "org/llm", "revision": "abc"}, actors=3, batch_size=32)
    para, sim = PP.stages_of(local, occ, "plural", sbert, "cuda", 1.0)
    assert (para.resources.num_gpus, para.resources.actors, para.resources.batch_size) == (1.0, 3, 32)
    assert para.kwargs["device"] == "cuda" and para.kwargs["backend"]["revision"] == "abc"
    assert (sim.resources.num_gpus, sim.resources.batch_size, sim.kwargs["device"]) == (0.0, 32, "cpu")
    endpoint = PP.stages_of(settings(actors=2), occ, "plural", sbert, "cuda", 1.0)[0]
    assert endpoint.resources.num_gpus == 0.0 and endpoint.kwargs["device"] is None
    cpu_run = PP.stages_of(local, occ, "plural", sbert, "cpu", 0.0)[0]
    assert cpu_run.resources.num_gpus == 0.0
    file_only = PP.stages_of(PP.ParaphraseSettings(None, file="p.csv"), occ, "plural", sbert, "cuda", 1.0)
    assert [s.name for s in file_only] == [P.STAGE_PARAPHRASE_SIMILARITY]
