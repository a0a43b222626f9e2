"""Paper 002, App. A.6: section 6's training captions, paraphrased, as prompts.

    section 6's captions (naive subset, counted training image) -> one request per (caption, occupation)
      -> paraphrase (an OpenAI-compatible endpoint, a local transformers model on GPU actors, or a
         user's file) -> the occupation check (one retry) -> SBERT cosine(caption, paraphrase)
      -> M images per ok paraphrase (recorded seeds) -> E[A] beside section 6's

Every answer is checkpointed in the run directory under a key of (caption, occupation word,
backend, model, revision, prompt, temperature), so a killed run asks only what it had not got an
answer for; transport failures (http_error, timeout) are asked again on resume, answers (ok,
no_occupation, empty, refused, too long) are kept. The run records the backend, model, revision or
the endpoint's model name, the prompt text and the temperature; the API key never (only the name of
its environment variable).
"""

from __future__ import annotations

import hashlib
import io as stdio
import json
import os
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, Stage, conform
from operators.support.chat_client import ChatClient
from operators.support.models import ModelLoadError, loading, resolved_dir, source_record, weights_record
from operators.support.seeds import image_seeds
from operators.text_caption_paraphraser import CaptionParaphraser, check_template, names_occupation, occupation_words
from operators.text_occupation_matcher import OccupationMatcher
from operators.text_paraphrase_similarity import ParaphraseSimilarity
from pipelines.engine.storage import io
from pipelines.engine.stream import runtime, stages
from pipelines.engine.storage.checkpoint import first_per_key
from pipelines.standins.chat import MODEL as STANDIN_MODEL, StandinChatServer
from pipelines.studies.amplification.jobs import occupation_spec
from pipelines.studies.amplification.paraphrase_results import image_similarity, summary, summary_rows
from pipelines.engine.stream.progress import ErrorBudget, Phase, drain
from schemas import images as I
from schemas import paraphrases as P
from schemas.captions import CAPTION, CAPTION_GENDER, CAPTION_ID, OCCUPATION, URL
from schemas.paraphrases import ParaphraseStatus as S
from schemas.subsets import PROMPT, SUBSET, Subset

CHECKPOINT = "paraphrases"
FILES = {"paraphrases": "paraphrases", "table": "paraphrase_table", "image_similarity": "paraphrase_image_similarity"}
STANDIN_ENDPOINT = "standin"   # --standin-models: the local stand-in server (pipelines/standins/chat.py)


@dataclass(frozen=True)
class ParaphraseSettings:
    """How paraphrases are obtained: ``backend`` (a ``make_backend`` spec) or ``file``."""

    not_in_run_id = (
        "file",                  # the file's path: its content is in the run id (file_sha256)
        "backend.endpoint",      # where the endpoint lives: the answers are its model's (as in ``identity``)
        "backend.api_key_env",   # the name of the API key's variable
        "backend.timeout",       # how long a request waits: a transport failure is asked again on resume
        "backend.max_retries",   # retries of a failed request: likewise
        "backend.concurrency",   # requests in flight: how the requests execute
        "backend.backoff",       # the wait between retries
    )

    backend: dict | None
    file: str | None = None
    prompt: str = P.PAPER_PROMPT
    temperature: float = P.PAPER_TEMPERATURE
    actors: int = 1
    batch_size: int = 64
    file_sha256: str | None = None

    @property
    def kind(self) -> str:
        return "file" if self.file else self.backend["kind"]

    def identity(self) -> dict:
        """What an answer depends on (its cache key and the run id): not where an endpoint lives."""
        if self.file:
            return {"backend": "file", "file_sha256": self.file_sha256}
        b = self.backend
        return {"backend": b["kind"], "model": b["model"], "revision": b.get("revision"),
                "prompt": self.prompt, "temperature": self.temperature}

    def record(self, backend_record: dict | None = None) -> dict:
        """What the run records (never the key: only the name of its variable)."""
        rec = self.identity() | {"prompt": self.prompt, "temperature": self.temperature}
        if self.file:
            return rec | {"file": self.file}
        b = {k: v for k, v in self.backend.items() if k != "kind"}
        return rec | b | (backend_record or {})


def settings_from(args, standin: bool) -> ParaphraseSettings:
    """The paraphrase settings of ``--paraphrase-*`` (one source: endpoint, local model or file);
    bad combinations fail here, before anything starts."""
    endpoint, local, path = args.paraphrase_endpoint, args.paraphrase_local, args.paraphrase_file
    if sum(bool(x) for x in (endpoint, local, path)) > 1:
        raise ValueError("give one source of paraphrases: --paraphrase-endpoint, --paraphrase-local or "
                         "--paraphrase-file")
    prompt = check_template(args.paraphrase_prompt or P.PAPER_PROMPT)
    temperature = P.PAPER_TEMPERATURE if args.paraphrase_temperature is None else float(args.paraphrase_temperature)
    common = {"prompt": prompt, "temperature": temperature, "actors": max(1, int(args.paraphrase_actors)),
              "batch_size": max(1, int(args.paraphrase_batch_size))}
    if path:
        return ParaphraseSettings(None, file=str(path), file_sha256=_sha256(path), **common)
    if local:
        return ParaphraseSettings({"kind": "transformers", "model": local, "revision": args.paraphrase_revision,
                                   "dtype": args.paraphrase_dtype, "max_new_tokens": args.paraphrase_max_tokens,
                                   "batch_size": common["batch_size"]}, **common)
    if standin and not endpoint:   # the rule-based stand-in server, started by the run; it answers at once
        endpoint, model, extra = STANDIN_ENDPOINT, STANDIN_MODEL, {"backoff": 0.05}
    else:
        endpoint, model, extra = endpoint or P.PAPER_ENDPOINT, args.paraphrase_model or P.PAPER_MODEL, {}
        if endpoint == P.PAPER_ENDPOINT and not os.environ.get(args.paraphrase_api_key_env):
            raise ValueError(f"paraphrasing with {P.PAPER_MODEL} at {P.PAPER_ENDPOINT} (the paper's) needs an API key "
                             f"in ${args.paraphrase_api_key_env}; or give --paraphrase-endpoint URL of another "
                             f"OpenAI-compatible server, --paraphrase-local MODEL, or --paraphrase-file CSV")
    return ParaphraseSettings({"kind": "endpoint", "endpoint": endpoint, "model": model,
                               "api_key_env": args.paraphrase_api_key_env, "timeout": args.paraphrase_timeout,
                               "max_retries": args.paraphrase_retries, "concurrency": args.paraphrase_concurrency,
                               "max_tokens": args.paraphrase_max_tokens, **extra}, **common)


def _sha256(path: str) -> str:
    return hashlib.sha256(io.read_text(path).encode()).hexdigest()


def add_arguments(g, run: bool) -> None:
    """The ``--paraphrase-*`` flags (``run`` adds ``--paraphrases``, which turns A.6 on)."""
    if run:
        g.add_argument("--paraphrases", action="store_true",
                       help="App. A.6: also prompt with LLM paraphrases of section 6's captions (the paper: "
                            "gpt-3.5-turbo, temperature 0, its prompt verbatim) and report E[A] beside section 6's")
    g.add_argument("--paraphrase-endpoint", metavar="URL",
                   help="an OpenAI-compatible chat-completions API (OpenAI, vLLM, a local server), e.g. "
                        "http://localhost:8000/v1 (default: the paper's, https://api.openai.com/v1)")
    g.add_argument("--paraphrase-model", metavar="NAME",
                   help=f"the endpoint's model name (default {P.PAPER_MODEL}, the paper's)")
    g.add_argument("--paraphrase-api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the endpoint's API key (default OPENAI_API_KEY; the key "
                        "is sent, never recorded)")
    g.add_argument("--paraphrase-local", metavar="MODEL",
                   help="a local transformers instruction-tuned model (hub id or directory) instead of an "
                        "endpoint: run on GPU actors in batches, greedy at temperature 0")
    g.add_argument("--paraphrase-revision", metavar="REV", help="hub revision (commit) of --paraphrase-local")
    g.add_argument("--paraphrase-dtype", default="auto",
                   help="dtype of --paraphrase-local (auto: bfloat16 on a GPU, float32 on a CPU)")
    g.add_argument("--paraphrase-file", metavar="CSV",
                   help="your own paraphrases: a CSV with caption_id or caption, paraphrase (and optionally "
                        "occupation), e.g. the paraphrases.csv a `paraphrase` run writes; captions it lacks "
                        "get not_in_file, its extra rows are counted")
    g.add_argument("--paraphrase-prompt", metavar="TEMPLATE",
                   help="prompt with [OCCUPATION] and [CAPTION] (default: App. A.6's, verbatim)")
    g.add_argument("--paraphrase-temperature", type=float, help="sampling temperature (default 0, the paper's)")
    g.add_argument("--paraphrase-concurrency", type=int, default=8, help="requests in flight per actor (default 8)")
    g.add_argument("--paraphrase-timeout", type=float, default=60.0, help="seconds per request (default 60)")
    g.add_argument("--paraphrase-retries", type=int, default=5,
                   help="retries of a request after 429 / 5xx / connection errors, with backoff (default 5)")
    g.add_argument("--paraphrase-max-tokens", type=int, default=256, help="answer length limit (default 256)")
    g.add_argument("--paraphrase-actors", type=int, default=1, help="paraphrasing actors (default 1)")
    g.add_argument("--paraphrase-batch-size", type=int, default=64, help="captions per actor call (default 64)")


# ------------------------------------------------------------------------------------- requests
def requests_from_training(train_rows: pa.Table, pst: ParaphraseSettings, occupations) -> pa.Table:
    """One request per (caption, occupation) of section 6's captions: the naive subset's captions
    whose training image counts (S_o, the prompts P_o of section 6)."""
    naive = train_rows.filter(pc.and_(pc.equal(train_rows.column(SUBSET), Subset.NAIVE),
                                      pc.fill_null(train_rows.column(I.COUNTED), False)))
    return requests_from(naive, pst, occupations)


def requests_from(rows: pa.Table, pst: ParaphraseSettings, occupations) -> pa.Table:
    """``rows`` (caption_id, occupation, caption, caption_gender, url) as distinct requests, keyed."""
    table = conform(rows.select([c for c in (CAPTION_ID, OCCUPATION, CAPTION, CAPTION_GENDER, URL)
                                 if c in rows.column_names]), P.REQUESTS)
    if table.num_rows:
        table = first_per_key(table, [CAPTION_ID, OCCUPATION])
    words = occupation_words(occupations)
    ident = json.dumps(pst.identity(), sort_keys=True)
    # one key per request: the caption id is part of it, so two ids with the same text keep answers of
    # their own (a paraphrase file answers per id; a resumed run counts every request it reuses)
    keys = [hashlib.sha256(json.dumps([i, c, words.get(o, o), ident]).encode()).hexdigest()
            for i, c, o in zip(table.column(CAPTION_ID).to_pylist(), table.column(CAPTION).to_pylist(),
                               table.column(OCCUPATION).to_pylist())]
    table = table.set_column(table.schema.get_field_index(P.PARAPHRASE_KEY), P.PARAPHRASE_KEY, pa.array(keys, pa.string()))
    return table.sort_by([(OCCUPATION, "ascending"), (CAPTION_ID, "ascending")])


# ------------------------------------------------------------------------------------ paraphrasing
def stages_of(pst: ParaphraseSettings, occupations, forms: str, sbert, device: str, gpus: float) -> list[Stage]:
    """The stream: the paraphraser (not for a file) and the SBERT cosine."""
    specs = [occupation_spec(o) for o in occupations]
    sim = Stage(ParaphraseSimilarity, {"model": sbert.model, "revision": sbert.revision, "device": "cpu"},
                Resources(num_cpus=1, batch_size=pst.batch_size, actors=1))   # the paraphraser's batches
    # stream on: a larger batch would hold every answer back until the end (no checkpoint midway)
    if pst.file:
        return [sim]
    on_gpu = pst.backend["kind"] == "transformers" and str(device).startswith("cuda")
    para = Stage(CaptionParaphraser, {"backend": pst.backend, "occupations": specs, "forms": forms,
                                      "prompt": pst.prompt, "temperature": pst.temperature,
                                      "device": device if pst.backend["kind"] == "transformers" else None},
                 Resources(num_cpus=1, num_gpus=gpus if on_gpu else 0.0, batch_size=pst.batch_size, actors=pst.actors))
    return [para, sim]


def budget(execution: dict) -> ErrorBudget:
    """Fail the run when the endpoint keeps failing (HTTP errors, timeouts after the retries)."""
    return ErrorBudget("paraphrase", {P.PARAPHRASE_STATUS: (S.HTTP_ERROR, S.TIMEOUT)},
                       float(execution["max_error_rate"]), int(execution["error_budget_min_rows"]))


def paraphrase(ray, rd, requests: pa.Table, pst: ParaphraseSettings, occupations, forms: str, sbert,
               device: str = "cpu", gpus: float = 0.0, budgets=(), echo=print) -> tuple[pa.Table, Phase]:
    """Every request's paraphrase (checkpointed answers reused): the PARAPHRASES table, in the
    requests' order, and the Phase."""
    keys = requests.column(P.PARAPHRASE_KEY)
    done = _answers(rd, keys)
    todo = requests.filter(pc.invert(pc.is_in(keys, done.column(P.PARAPHRASE_KEY))))
    phase = Phase("paraphrases", "captions", requests.num_rows, reused=done.num_rows)
    for b in budgets:
        b.add(done)
    if todo.num_rows:
        rows = from_file(todo, pst.file, occupations, forms) if pst.file else todo
        ds = runtime.from_table(ray, rows, pst.batch_size)
        ds = stages.run(ds, stages_of(pst, occupations, forms, sbert, device, gpus))
        drain(ds, lambda t: rd.write_part(CHECKPOINT, conform(t, P.PARAPHRASES)), phase, budgets=budgets,
              flush_rows=pst.batch_size, echo=echo)
    return with_answers(rd, requests), phase


def with_answers(rd, requests: pa.Table) -> pa.Table:
    """The requests, each with its checkpointed answer (``_answers``): one per request's key."""
    keys = requests.column(P.PARAPHRASE_KEY)
    answers = _answers(rd, keys, final_only=False)
    position = pc.index_in(keys, answers.column(P.PARAPHRASE_KEY))
    if position.null_count:
        raise RuntimeError(f"paraphrases: {requests.num_rows} requests, {position.null_count} without an answer")
    got = answers.take(position)
    out = requests
    for f in P.PARAPHRASES:
        if f.name not in out.column_names:
            out = out.append_column(f, got.column(f.name))
    return out


def _answers(rd, keys, final_only: bool = True) -> pa.Table:
    """The checkpointed answer per key: a final one where any attempt got one, else the latest."""
    parts = rd.read_parts(CHECKPOINT, P.PARAPHRASES)
    parts = parts.filter(pc.is_in(parts.column(P.PARAPHRASE_KEY), keys))
    if final_only:
        parts = parts.filter(pc.is_in(parts.column(P.PARAPHRASE_STATUS), pa.array(S.FINAL)))
    if not parts.num_rows:
        return parts
    final = pc.is_in(parts.column(P.PARAPHRASE_STATUS), pa.array(S.FINAL)).to_numpy(zero_copy_only=False)
    order = np.lexsort((-np.arange(parts.num_rows), ~final))   # final answers first, then the latest part
    return first_per_key(parts.take(pa.array(order, pa.int64())), P.PARAPHRASE_KEY)


def read_paraphrase_file(path: str) -> tuple[pd.DataFrame, list[str]]:
    """A paraphrase CSV and the columns its rows are matched on: caption_id (as an integer) or
    caption, and occupation where the file has it."""
    text = io.read_text(path)
    try:
        df = pd.read_csv(stdio.StringIO(text), dtype={"caption": "string", "paraphrase": "string",
                                                      "occupation": "string"}, keep_default_na=False, na_values=[])
    except (ValueError, pd.errors.ParserError) as exc:
        raise ValueError(f"--paraphrase-file {path}: cannot read it as CSV ({str(exc).splitlines()[0]})") from None
    if "paraphrase" not in df.columns or not ({"caption_id", "caption"} & set(df.columns)):
        raise ValueError(f"--paraphrase-file {path}: needs a paraphrase column and caption_id or caption "
                         f"(it has {list(df.columns)})")
    if "caption_id" in df.columns:
        df["caption_id"] = pd.to_numeric(df["caption_id"], errors="coerce").astype("Int64")
    by = ["caption_id" if "caption_id" in df.columns else "caption"] + (["occupation"] if "occupation" in df.columns else [])
    return df, by


def from_file(todo: pa.Table, path: str, occupations, forms: str) -> pa.Table:
    """The requests with the file's answers: matched by caption_id (else the caption text), and by
    occupation where the file has that column; a request the file lacks gets not_in_file, an empty
    paraphrase empty_answer, one that does not name the occupation no_occupation (no retry: a file
    gives one answer)."""
    df, by = read_paraphrase_file(path)
    req = todo.to_pandas()
    found = req[by].merge(df[by + ["paraphrase"]].drop_duplicates(by), on=by, how="left")["paraphrase"]
    text = [None if pd.isna(v) else str(v) for v in found]
    missing = np.array([v is None for v in text])
    empty = np.array([v is not None and not v.strip() for v in text])
    matcher = OccupationMatcher(occupations, forms)
    named = names_occupation(matcher, pa.array([None if (m or e) else v for v, m, e in zip(text, missing, empty)],
                                               pa.string()), todo.column(OCCUPATION))
    status = np.where(missing, S.NOT_IN_FILE, np.where(empty, S.EMPTY, np.where(named, S.OK, S.NO_OCCUPATION)))
    error = np.where(missing, f"no row in {path}", np.where(status == S.NO_OCCUPATION,
                                                              "the paraphrase does not name the occupation", None))
    out = todo
    for name, values, typ in ((P.PARAPHRASE, [None if m else v.strip() for v, m in zip(text, missing)], pa.string()),
                              (P.PARAPHRASE_STATUS, status.tolist(), pa.string()),
                              (P.PARAPHRASE_ERROR, error.tolist(), pa.string()),
                              (P.PARAPHRASE_ATTEMPTS, np.zeros(len(text), np.int32), pa.int32()),
                              (P.PARAPHRASE_RETRIED, np.zeros(len(text), bool), pa.bool_())):
        out = out.append_column(pa.field(name, typ), pa.array(values, typ))
    return out


def file_coverage(path: str, requests: pa.Table) -> dict:
    """How the file's rows met the requests: rows, matched, extra (for no request), duplicates."""
    df, by = read_paraphrase_file(path)
    req = requests.to_pandas()[by].drop_duplicates()
    hit = df[by].merge(req.assign(_hit=1), on=by, how="left")["_hit"].notna()
    return {"file": path, "rows": int(len(df)), "matched_rows": int(hit.sum()), "extra_rows": int((~hit).sum()),
            "duplicate_rows": int(df.duplicated(by).sum()), "matched_by": by}


# ------------------------------------------------------------------------------------- generation
def generation_requests(paraphrases: pa.Table, images_per_caption: int, seed: int, schema: pa.Schema) -> pa.Table:
    """M images per ok paraphrase (App. A.6 keeps section 6's M), each with its own recorded seed,
    keyed by the caption, its occupation and the paraphrase text."""
    ok = paraphrases.filter(pc.equal(paraphrases.column(P.PARAPHRASE_STATUS), S.OK))
    m = int(images_per_caption)
    take = pa.array(np.repeat(np.arange(ok.num_rows), m), pa.int64())
    rows = ok.take(take)
    index = np.tile(np.arange(m), ok.num_rows).astype(np.int32)
    keys = [f"paraphrase:{cid}\x1f{occ}\x1f{p}" for cid, occ, p in zip(
        rows.column(CAPTION_ID).to_pylist(), rows.column(OCCUPATION).to_pylist(), rows.column(P.PARAPHRASE).to_pylist())]
    seeds = image_seeds(seed, keys, index.tolist())
    table = pa.table({I.SOURCE: pa.array([I.Source.PARAPHRASE_PROMPT] * rows.num_rows, pa.string()),
                      OCCUPATION: rows.column(OCCUPATION),
                      SUBSET: pa.array([Subset.NAIVE] * rows.num_rows, pa.string()),
                      PROMPT: rows.column(P.PARAPHRASE), I.IMAGE_INDEX: pa.array(index, pa.int32()),
                      I.SEED: pa.array(seeds, pa.int64()), CAPTION_ID: rows.column(CAPTION_ID),
                      CAPTION: rows.column(CAPTION), CAPTION_GENDER: rows.column(CAPTION_GENDER),
                      URL: rows.column(URL)})
    return conform(table, schema)


# ------------------------------------------------------------------------------------ in a run
def check_backend(pst: ParaphraseSettings, standin: bool) -> list[dict]:
    """The paraphraser's provenance record, checked on the driver before the run opens: a local
    model's configuration, tokenizer and weight files (the weights load on the actors, where a
    7B model's memory is), an endpoint's address (no request is sent: the error budget catches an
    endpoint that fails), a file's readability and columns."""
    role = "paraphraser (App. A.6)"
    if pst.file:
        read_paraphrase_file(pst.file)
        return [{"role": role, "model": f"file {pst.file}", "standin": False, "detail": pst.record()}]
    b = pst.backend
    if b["kind"] == "endpoint":
        if b["endpoint"] != STANDIN_ENDPOINT:
            ChatClient(b["endpoint"], b["model"])   # a URL that is not http(s) fails here
        standin = b["endpoint"] == STANDIN_ENDPOINT
        return [{"role": role, "model": b["model"], "standin": standin, "detail": pst.record(),
                 **({"standin_kind": "rule-based"} if standin else {})}]
    return [{"role": role, "model": b["model"], "standin": False, "detail": pst.record(describe(b["model"], b.get("revision")))}]


@dataclass
class InStudy:
    """App. A.6 inside `amplification.py run`: the paraphrases, their phase and budget, and what
    the run adds to its tables once the images are generated."""

    settings: ParaphraseSettings
    table: pa.Table
    phase: Phase
    budget: ErrorBudget
    coverage: dict | None = None
    summary: dict | None = None
    standin: bool = False

    def record(self) -> dict:
        rec = self.settings.record()
        if self.standin:
            rec["standin"] = "rule-based stand-in server (pipelines/standins/chat.py), not a language model"
        return rec | ({"file_coverage": self.coverage} if self.coverage else {})

    def summary_rows(self) -> list[dict]:
        return summary_rows(self.table, self.phase)

    def finish(self, rd, results: dict, generated: pa.Table | None, headline: dict) -> None:
        """After generation: the image similarity, the A.6 table, their files; into ``results``."""
        # deferred: scipy (results -> pipelines.engine.stats.headline); the CLI parser imports this module
        from pipelines.studies.amplification.results import a6_table

        sim = image_similarity(generated)
        self.summary = summary(self.table, sim, self.record())
        results["paraphrases"] = self.summary
        results["a6_table"] = a6_table(results, headline, self.summary)
        io.write_table_and_csv(results["a6_table"], rd.fs, f"{rd.path}/{FILES['table']}")
        io.write_table_and_csv(sim, rd.fs, f"{rd.path}/{FILES['image_similarity']}")

    def metrics(self, results: dict) -> dict:
        table = results.get("a6_table")
        return (self.summary or {}) | {"table": [] if table is None else table.to_dict("records"),
                                       "e_a": {m: {k: v["average"] for k, v in r.items()}
                                               for m, r in (results.get("paraphrase_prompts") or {}).items()}}


def describe(model: str, revision: str | None) -> dict:
    """A local paraphraser's provenance without loading its weights: its configuration and
    tokenizer load (a missing model or a gated one fails here, in one line), the weight files'
    sha256 and the hub commit."""
    def error(exc):
        return ModelLoadError(f"cannot load the paraphraser {model!r}: {str(exc).splitlines()[0][:300]}. Pass a "
                              f"local directory saved with save_pretrained or a hub id reachable from every node "
                              f"(pin it with --paraphrase-revision)")

    with loading(error):
        from transformers import AutoConfig, AutoTokenizer  # deferred: transformers

        config = AutoConfig.from_pretrained(model, revision=revision)
        tok = AutoTokenizer.from_pretrained(model, revision=revision)
        resolved = resolved_dir(model, revision)
        rec = source_record(model, revision, resolved) | weights_record(model, resolved, config)
        if os.path.isdir(model) and not rec.get("weight_files"):
            raise ValueError(f"no weight files in {model}")
    return rec | {"architecture": (config.architectures or [type(config).__name__])[0],
                  "chat_template": bool(getattr(tok, "chat_template", None))}


def run_in_study(run, cs, train_rows: pa.Table | None = None, rows: pa.Table | None = None) -> InStudy:
    """Paraphrase section 6's captions of this run (``train_rows``: its training rows) or ``rows``
    (caption_id, occupation, caption, caption_gender, url), checkpointed in the run's directory;
    writes paraphrases.parquet/.csv. ``cs``: settings with paraphrase, occupations, occupation_forms,
    sbert and execution."""
    pst = cs.paraphrase
    standin = bool(pst.backend and pst.backend.get("endpoint") == STANDIN_ENDPOINT)
    if standin:
        server = run.stack.enter_context(StandinChatServer())
        pst = replace(pst, backend=pst.backend | {"endpoint": server.base_url})
        print(f"paraphrasing with a rule-based stand-in server at {server.base_url} (NOT a language model)")
    requests = requests_from_training(train_rows, pst, cs.occupations) if rows is None else \
        requests_from(rows, pst, cs.occupations)
    print(f"\nparaphrases (App. A.6): {requests.num_rows:,} captions -> "
          + (f"file {pst.file}" if pst.file else f"{pst.backend['model']} ({pst.backend['kind']})") + " ...")
    b = budget(cs.execution)
    gp = run.gpu
    table, phase = paraphrase(run.ray, run.rd, requests, pst, cs.occupations, cs.occupation_forms, cs.sbert,
                              device=gp.device if gp else "cpu", gpus=gp.per_actor if gp else 0.0, budgets=[b],
                              echo=run.echo)
    io.write_table_and_csv(table, run.rd.fs, f"{run.rd.path}/{FILES['paraphrases']}")
    coverage = file_coverage(pst.file, requests) if pst.file else None
    if phase.reused:
        print(f"  paraphrases: {phase.reused:,} of {phase.total:,} reused from the checkpoint")
    return InStudy(pst, table, phase, b, coverage, standin=standin)
