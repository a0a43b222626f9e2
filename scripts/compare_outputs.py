#!/usr/bin/env python3
"""Behaviour-unchanged check for t2i-bias-audit: run the stand-in pipelines of a checkout, hash
their outputs while ignoring run-to-run noise, and diff two hash files.

For a restructuring that must leave every table identical: run it on both checkouts and diff. Usage,
from a checkout with its venv (e.g. against a clone of another commit at /tmp/old):

    python scripts/compare_outputs.py run  --repo /tmp/old --out /tmp/out_old
    python scripts/compare_outputs.py run  --repo . --out /tmp/out_new

    python compare_outputs.py run  --repo DIR --out OUTDIR      # runs every command (minutes)
    python compare_outputs.py hash --out OUTDIR > hashes.json    # hashes OUTDIR
    python compare_outputs.py diff A.json B.json                 # exit 1 on any difference

`run` executes each command with cwd=--repo and PYTHONPATH=--repo (so that checkout's own
packages are imported, not the editable install); it verifies that in the driver and in a Ray
worker first (OUTDIR/logs/import_check.json). Standalone: only the standard library, pyarrow
and pandas (the hash step reads tables; run it with the project's venv python).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_PYTHON = sys.executable
DEFAULT_LOCK = "/tmp/heavy.lock"
EDITABLE_ROOT = str(Path(__file__).resolve().parents[1])  # this checkout: where an editable install points

# name -> (argv after the python executable, heavy?). OUT is replaced by --out.
COMMANDS = {
    "amp": (["pipelines/amplification.py", "run", "--output", "OUT/amp", "--standin-models",
             "--sample-size", "10", "--nn-k", "10", "--images-per-prompt", "2",
             "--caption-images", "1", "--steps", "5", "--no-progress"], True),
    "captions": (["pipelines/amplification.py", "captions", "--output", "OUT/captions", "--no-progress"], True),
    "gep": (["pipelines/gep.py", "run", "--output", "OUT/gep", "--standin-models",
             "--images-per-prompt", "1", "--steps", "2", "--max-contexts", "2", "--no-progress"], True),
    "dalleval": (["pipelines/dalleval.py", "run", "--output", "OUT/dalleval", "--standin-models",
                  "--images-per-prompt", "1", "--steps", "2", "--no-progress"], True),
    "skills": (["pipelines/dalleval.py", "skills", "--output", "OUT/skills", "--standin-models",
                "--prompts-per-skill", "8", "--steps", "2", "--no-progress"], True),
    "alignment": (["pipelines/dalleval.py", "alignment", "--output", "OUT/alignment", "--standin-models",
                   "--steps", "2", "--no-progress"], True),
    "exposed": (["pipelines/exposed.py", "run", "--output", "OUT/exposed", "--standin-models",
                 "--max-triplets", "2", "--steps", "2", "--no-progress"], True),
    "sum_amp": (["pipelines/amplification.py", "summarize", "--percentages", "tests/data/paper002_table6.csv",
                 "--output", "OUT/sum_amp"], False),
    "sum_gep": (["pipelines/gep.py", "summarize", "--frequencies", "tests/data/paper001_tables11_12.csv",
                 "--output", "OUT/sum_gep"], False),
    # tests/data/paper000_tables16_17.csv holds average genders, not counts: the counts CSV is
    # derived from it exactly as tests/pipelines/test_dalleval_summarize_cli.py does (see
    # _dalleval_counts) and written to OUT/inputs/
    "sum_dalleval": (["pipelines/dalleval.py", "summarize", "--counts", "OUT/inputs/dalleval_counts.csv",
                      "--output", "OUT/sum_dalleval"], False),
}
# directories whose children are <run id> directories (the others are written directly)
RUN_ROOTS = ("amp", "captions", "gep", "dalleval", "skills", "alignment", "exposed")

IMPORT_CHECK = r"""
import json, os, sys
mods = ["pipelines", "pipelines.engine", "operators", "schemas", "configs"]
forbidden = os.environ.get("CMP_FORBIDDEN") or None
def where():
    import importlib
    out = {}
    for m in mods:
        try:
            out[m] = importlib.import_module(m).__file__
        except ModuleNotFoundError:
            out[m] = "absent"   # a restructure may remove a package; only 'pipelines' is required
        except Exception as exc:
            out[m] = f"ERROR {type(exc).__name__}: {exc}"
    def bad(f):  # the checkout of the editable install, not its venv
        return f.startswith(forbidden + os.sep) and not f.startswith(os.path.join(forbidden, ".venv") + os.sep)
    leaked = sorted(n for n, mod in list(sys.modules.items())
                    if forbidden and bad(str(getattr(mod, "__file__", None) or "")))
    return {"modules": out, "from_forbidden_dir": leaked}
res = {"driver": where()}
import ray
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
res["ray_worker"] = ray.get(ray.remote(where).remote())
ray.shutdown()
print(json.dumps(res))
"""


def _dalleval_counts(repo: Path, dest: Path) -> None:
    """model,group,prompt,male,female from the paper's Tables 16-17 (9 images per prompt, each value
    is (female - male) / 9), as in tests/pipelines/test_dalleval_summarize_cli.py at 8359c57."""
    import csv
    models = ["minDALL-E", "Karlo", "Stable Diffusion"]
    rows = []
    with open(repo / "tests" / "data" / "paper000_tables16_17.csv") as fh:
        for r in csv.DictReader(fh):
            for model in models:
                female = round(9 * (1 + float(r[model])) / 2)
                rows.append({"model": model, "group": "person",
                             "prompt": f"a person who works as a/an {r['profession'].lower()}",
                             "male": 9 - female, "female": female})
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _env(repo: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo)
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray instance
    return env


def cmd_run(args) -> int:
    repo = Path(args.repo).resolve()
    out = Path(args.out).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = _env(repo)
    # the editable install points at this checkout: when checking another checkout, nothing may be
    # imported from there
    if str(repo) != EDITABLE_ROOT and not str(repo).startswith(EDITABLE_ROOT + os.sep):
        env["CMP_FORBIDDEN"] = EDITABLE_ROOT
    lock = [] if args.no_lock else ["flock", args.lock]
    record = {"repo": str(repo), "python": args.python, "commands": {}}
    try:
        record["repo_commit"] = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                               text=True).stdout.strip()
        record["repo_dirty"] = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"],
                                              capture_output=True, text=True).stdout.splitlines()
    except OSError:
        pass

    # 1. the checkout's packages are the ones imported, in the driver and in Ray workers
    p = subprocess.run(lock + [args.python, "-c", IMPORT_CHECK], cwd=repo, env=env, capture_output=True, text=True)
    (logs / "import_check.stderr").write_text(p.stderr)
    ok = p.returncode == 0
    try:
        check = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check, ok = {"stdout": p.stdout}, False
    bad = []
    for side, d in check.items():
        if not isinstance(d, dict) or "modules" not in d:
            continue
        for m, f in d["modules"].items():
            if not (str(f).startswith(str(repo) + os.sep) or (f == "absent" and m != "pipelines")):
                bad.append(f"{side}:{m}={f}")
        bad += [f"{side}:{m} loaded from {env.get('CMP_FORBIDDEN')}" for m in d.get("from_forbidden_dir", [])]
    check["ok"] = ok and not bad
    (logs / "import_check.json").write_text(json.dumps(check, indent=2))
    print(f"import check: {'OK' if check['ok'] else 'FAILED ' + str(bad or p.stderr[-2000:])}", flush=True)
    if not check["ok"]:
        return 2

    _dalleval_counts(repo, out / "inputs" / "dalleval_counts.csv")
    entries = dict(e.split("=", 1) for e in (args.entry or []))
    record["entry_overrides"] = entries
    failed = []
    only = set(args.only or COMMANDS)
    for name, (argv, heavy) in COMMANDS.items():
        if name not in only:
            continue
        argv = [entries.get(a, a).replace("OUT/", f"{out}/") for a in argv]
        full = (lock if heavy else []) + [args.python] + argv
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(full)}", flush=True)
        t0 = time.time()
        with open(logs / f"{name}.stdout", "w") as so, open(logs / f"{name}.stderr", "w") as se:
            rc = subprocess.run(full, cwd=repo, env=env, stdout=so, stderr=se).returncode
        dt = time.time() - t0
        record["commands"][name] = {"argv": full, "rc": rc, "seconds": round(dt, 1)}
        print(f"    rc={rc} in {dt:.0f}s", flush=True)
        if rc != 0:
            failed.append(name)
    prev = logs / "commands.json"
    if prev.exists():  # keep earlier entries when re-running a subset with --only
        old = json.loads(prev.read_text())
        old["commands"].update(record["commands"])
        record["commands"] = old["commands"]
    prev.write_text(json.dumps(record, indent=2))
    if failed:
        print(f"FAILED: {failed} (see {logs})", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------------------- hashing
# Everything below that is ignored is run-to-run noise; each rule says why. Decided by inspecting
# the outputs and by diffing two runs of the same commit (out_base vs out_base2).

# JSON keys dropped wherever they occur (recursively), with the reason.
VOLATILE_JSON_KEYS = {
    # wall-clock timings and rates
    "duration_s": "wall-clock time",
    "started_unix": "timestamp",
    "ended_unix": "timestamp",
    "seconds": "wall-clock time of a phase",
    "phase_seconds": "wall-clock time of a phase",
    "rate_per_s": "throughput (time-derived)",
    "rows_per_s": "throughput (time-derived)",
    # machine / installation, not behaviour (the git commit differs by design between checkouts)
    "environment": "python/platform/package versions/git commit of the checkout",
}
# dotted paths from the document root dropped (only there)
VOLATILE_JSON_PATHS = {
    ".fingerprint": "run.json: sha256 of the configuration, which includes the bundled sample's absolute "
                    "path and mtime; compared instead as run_ids.normalized_config_sha256 (same "
                    "configuration with those rewritten) - the configuration itself stays in the hash",
}
# keys ending in these are dropped too (package versions recorded next to each model)
VOLATILE_JSON_SUFFIXES = {"_version": "package version (torch_version, diffusers_version, ...)"}
# Regexes applied to every string (JSON values and keys, table cells, CSV cells), in order.
# They rewrite values that legitimately vary to placeholders; nothing else is touched.
#   <out>/<repo>/<venv> prefixes: the output and checkout directories differ between runs/checkouts
#   <run>: the run id directory (it contains a fingerprint of the input file's path and mtime,
#          which differ between checkouts; it is compared separately, see "run_ids")
#   127.0.0.1:<port>: the bundled sample's local image server listens on a random free port
#   part-<...>.parquet: checkpoint / Ray part files are named from time_ns and uuid4
STRING_RULES_DOC = [
    "absolute --out directory -> <out>",
    "python venv prefix (sys.prefix) -> <venv>",
    "absolute --repo directory -> <repo>",
    "run id directory names -> <run>",
    "127.0.0.1:<random port> -> 127.0.0.1:<port> (local image server of the bundled sample)",
    "sha256(stand-in model path)[:12] and [:6] in names (_work/generated/<12 hex>/, images/<model>-<6 hex>/) "
    "-> <sha12 run:model> / <sha6 run:model>: stand-in models are directories under --out",
    "part-<time_ns>-<uuid8>.parquet / part-<uuid32>.parquet -> part-<ts>-<uuid>.parquet / part-<uuid>.parquet",
    "input file identity 'modified=<float mtime>' -> 'modified=<mtime>' (file mtime of the checkout's bundled sample)",
]
# Table columns dropped before hashing: only timings (no table column holds timestamps, hostnames
# or pids; absolute paths in cells are rewritten by the string rules instead).
VOLATILE_COLUMNS: dict[str, str] = {
    "phase_seconds": "wall-clock time of the phase (run_summary.csv)",
    "rows_per_s": "throughput, time-derived (run_summary.csv)",
}
# JSON lists whose element order is run-to-run noise: compared as multisets (elements sorted by
# their canonical dump). Keyed by dotted path from the document root.
UNORDERED_JSON_LISTS = {
    ".results.frequencies": "gep metrics.json: the rows of frequencies.parquet, whose row order varies "
                            "between two runs of the same code (values identical)",
}
# Files that are listed (presence only) but not hashed.
SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".ckpt", ".html", ".txt")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")  # saved images: raw bytes hashed, by (normalized) name
HASHED_SUFFIXES = (".parquet", ".csv", ".json", ".done")
# Volatile part-file names: parts of one directory matching these are hashed as one logical table.
PART_RES = [(re.compile(r"part-\d{20}-[0-9a-f]{8}\.parquet$"), "part-<ts>-<uuid>.parquet"),
            (re.compile(r"part-[0-9a-f]{32}\.parquet$"), "part-<uuid>.parquet"),
            (re.compile(r"^[0-9a-f]{32}_\d{6}_\d{6}\.parquet$"), "<ray-part>.parquet")]


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class Normalizer:
    def __init__(self, out: Path, repo: str | None, venv: str | None, run_ids: list[str]):
        subs = [(str(out), "<out>")]
        if venv:
            subs.append((venv.rstrip("/"), "<venv>"))
        if repo:
            subs.append((repo.rstrip("/"), "<repo>"))
        subs += [(rid, "<run>") for rid in sorted(set(run_ids), key=len, reverse=True)]
        self.subs = subs
        # stand-in models are directories under the run directory; the code names checkpoint and
        # image directories after sha256(model path)[:12] / [:6] (image_side.py, gep_study.py,
        # dalleval_study.py), so those hex names change with --out: name them after the model
        self.hex_res = []
        for p in sorted(out.glob("*/*/standin_models/*")):
            h = _sha(str(p).encode())
            tag = f"{p.parent.parent.parent.name}:{p.name}"
            self.hex_res += [(re.compile(rf"(?<![0-9a-f]){h[:12]}(?![0-9a-f])"), f"<sha12 {tag}>"),
                             (re.compile(rf"(?<![0-9a-f]){h[:6]}(?![0-9a-f])"), f"<sha6 {tag}>")]
        self.res = [(re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
                    (re.compile(r"localhost:\d+"), "localhost:<port>"),
                    (re.compile(r"part-\d{20}-[0-9a-f]{8}"), "part-<ts>-<uuid>"),
                    (re.compile(r"part-[0-9a-f]{32}"), "part-<uuid>"),
                    (re.compile(r"modified=[0-9.eE+-]+"), "modified=<mtime>")]

    def s(self, x: str) -> str:
        for r, b in self.hex_res:  # before the path rewrites (hex of the raw path)
            x = r.sub(b, x)
        for a, b in self.subs:
            x = x.replace(a, b)
        for r, b in self.res:
            x = r.sub(b, x)
        return x

    def json(self, o, dropped: set, path=""):
        if isinstance(o, dict):
            out = {}
            for k, v in o.items():
                if (k in VOLATILE_JSON_KEYS or k.endswith(tuple(VOLATILE_JSON_SUFFIXES))
                        or f"{path}.{k}" in VOLATILE_JSON_PATHS):
                    dropped.add(k)
                    continue
                out[self.s(k)] = self.json(v, dropped, f"{path}.{k}")
            return out
        if isinstance(o, list):
            items = [self.json(v, dropped, path) for v in o]
            if path in UNORDERED_JSON_LISTS:
                dropped.add(f"order of {path}")
                items.sort(key=lambda v: json.dumps(v, sort_keys=True))
            return items
        if isinstance(o, str):
            return self.s(o)
        return o


def _cell(v, norm: Normalizer) -> str:
    if v is None:
        return "\\N"
    if isinstance(v, (bytes, bytearray)):
        return "sha256:" + _sha(bytes(v))
    if isinstance(v, str):
        return norm.s(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_cell(x, norm) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_cell(x, norm)}" for k, x in v.items()) + "}"
    return repr(v)


def _table_entry(columns: list[str], types: list[str], rows: list[list[str]], dropped: list[str]) -> dict:
    import csv
    def dump(rs):
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rs)
        return buf.getvalue().encode("utf-8")
    return {"kind": "table", "rows": len(rows), "columns": columns, "types": types,
            "dropped_columns": dropped, "sha256": _sha(dump(sorted(rows))),
            "row_order_sha256": _sha(dump(rows))}


def _hash_parquet(files: list[Path], norm: Normalizer) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    tables = [pq.read_table(f) for f in sorted(files)]
    schemas = {str(t.schema) for t in tables}
    t = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    dropped = [c for c in t.column_names if c in VOLATILE_COLUMNS]
    t = t.drop_columns(dropped)
    cols = t.column_names
    data = [t.column(c).to_pylist() for c in cols]
    rows = [[_cell(col[i], norm) for col in data] for i in range(t.num_rows)]
    e = _table_entry([norm.s(c) for c in cols], [str(t.schema.field(c).type) for c in cols], rows, dropped)
    e["format"] = "parquet"
    if len(files) > 1:
        e["parts"] = len(files)  # informational: how many part files were merged
        e["part_schemas_differ"] = len(schemas) > 1
    return e


def _hash_csv(f: Path, norm: Normalizer) -> dict:
    import csv
    with open(f, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    keep = [i for i, c in enumerate(header) if c not in VOLATILE_COLUMNS]
    dropped = [c for c in header if c in VOLATILE_COLUMNS]
    body = [[norm.s(r[i]) if i < len(r) else "\\MISSING" for i in keep] + [norm.s(x) for x in r[len(header):]]
            for r in body]
    e = _table_entry([norm.s(header[i]) for i in keep], [], body, dropped)
    e["format"] = "csv"
    return e


def _hash_json(f: Path, norm: Normalizer) -> dict:
    dropped: set = set()
    try:
        obj = json.loads(f.read_text(encoding="utf-8"))
    except ValueError as exc:
        return {"kind": "json", "error": f"unparseable: {exc}", "sha256": _sha(norm.s(f.read_text()).encode())}
    obj = norm.json(obj, dropped)
    canon = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    e = {"kind": "json", "sha256": _sha(canon.encode()), "dropped_keys": sorted(dropped)}
    if isinstance(obj, dict):  # per top-level key, so that diff can say where a document differs
        e["key_sha256"] = {k: _sha(json.dumps(v, sort_keys=True, separators=(",", ":")).encode())
                           for k, v in sorted(obj.items())}
    return e


def _fingerprint(config) -> str:
    # = pipelines.engine.run.rundir.fingerprint at 8359c57
    return _sha(json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode())


def _run_id_entry(run_dir: Path, norm: Normalizer) -> dict:
    e = {"run_id": run_dir.name}
    rj = run_dir / "run.json"
    if not rj.exists():
        e["error"] = "no run.json"
        return e
    rec = json.loads(rj.read_text())
    config = rec.get("config", {})
    fp = _fingerprint(config)
    e["fingerprint_recomputed_matches"] = fp == rec.get("fingerprint")
    e["status"] = rec.get("status")
    # the same fingerprint over the configuration with checkout/output paths and the input
    # file's mtime rewritten: identical iff the configuration is the same up to those
    norm_cfg = norm.json(config, set())
    nfp = _fingerprint(norm_cfg)
    label = run_dir.name.rsplit("-", 1)[0] if re.search(r"-[0-9a-f]{8}$", run_dir.name) else run_dir.name
    e["normalized_run_id"] = f"{label}-{nfp[:8]}"
    e["normalized_config_sha256"] = nfp
    return e


def _walk(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            yield Path(dirpath) / fn


def cmd_hash(args) -> int:
    out = Path(args.out).resolve()
    meta = {}
    cj = out / "logs" / "commands.json"
    if cj.exists():
        meta = json.loads(cj.read_text())
    repo = meta.get("repo")
    venv = str(Path(meta["python"]).parent.parent) if meta.get("python") else None  # no resolve(): the venv, not /usr
    run_dirs = {}
    for name in RUN_ROOTS:
        root = out / name
        run_dirs[name] = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    all_ids = [p.name for ps in run_dirs.values() for p in ps]
    norm = Normalizer(out, repo, venv, all_ids)
    result = {
        "tool": "compare_outputs.py",
        "out": str(out), "repo": repo, "repo_commit": meta.get("repo_commit"), "repo_dirty": meta.get("repo_dirty"),
        "command_rc": {k: v.get("rc") for k, v in meta.get("commands", {}).items()},
        "ignore_rules": {"json_keys_dropped": VOLATILE_JSON_KEYS,
                         "json_key_suffixes_dropped": VOLATILE_JSON_SUFFIXES,
                         "json_paths_dropped": VOLATILE_JSON_PATHS,
                         "json_lists_compared_unordered": UNORDERED_JSON_LISTS, "table_columns_dropped": VOLATILE_COLUMNS,
                         "string_rewrites": STRING_RULES_DOC,
                         "not_hashed_presence_only": list(SKIP_SUFFIXES),
                         "row_order": "rows are sorted before hashing (sha256); row_order_sha256 is informational"},
        "run_ids": {}, "files": {}, "present_only": [],
    }
    for name in list(COMMANDS) + ["inputs"]:
        base = out / name
        if not base.is_dir():
            result["files"][f"{name}/"] = {"kind": "missing-output-dir"}
            continue
        roots = [(d, f"{name}/<run>") for d in run_dirs.get(name, [])] if name in RUN_ROOTS else [(base, name)]
        if name in RUN_ROOTS:
            result["run_ids"][name] = [_run_id_entry(d, norm) for d in run_dirs[name]]
            loose = [p for p in base.iterdir() if p.is_file()]
            result["present_only"] += [f"{name}/{p.name}" for p in loose]
        for root, label in roots:
            groups: dict[str, list[Path]] = {}
            for f in _walk(root):
                rel = f.relative_to(root).as_posix()
                key = f"{label}/{rel}"
                if f.name.endswith(".parquet"):
                    for rx, repl in PART_RES:
                        if rx.search(f.name):
                            key = f"{label}/{posixpath_dir(rel)}{repl}"
                            break
                    groups.setdefault(key, []).append(f)
                elif f.name.endswith(HASHED_SUFFIXES[1:] + IMAGE_SUFFIXES) and "/standin_models/" not in f"/{rel}":
                    groups.setdefault(key, []).append(f)
                else:
                    result["present_only"].append(key)
            for key, files in sorted(groups.items()):
                try:
                    if files[0].name.endswith(".parquet"):
                        e = _hash_parquet(files, norm)
                    elif files[0].name.endswith(IMAGE_SUFFIXES):
                        e = {"kind": "image", "sha256": _sha(files[0].read_bytes()), "bytes": files[0].stat().st_size}
                    elif files[0].name.endswith(".csv"):
                        e = _hash_csv(files[0], norm)
                    else:
                        e = _hash_json(files[0], norm)
                except Exception as exc:  # a table that cannot be read is itself a finding
                    e = {"kind": "error", "error": f"{type(exc).__name__}: {exc}"}
                result["files"][norm.s(key)] = e
    # stdout of the summarize commands (the printed tables), normalized
    for name in COMMANDS:
        if name.startswith("sum_"):
            so = out / "logs" / f"{name}.stdout"
            if so.exists():
                txt = norm.s(so.read_text())
                result["files"][f"stdout/{name}.txt"] = {"kind": "text", "sha256": _sha(txt.encode()),
                                                         "lines": txt.count("\n")}
    result["present_only"] = sorted(set(norm.s(p) for p in result["present_only"]))
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


def posixpath_dir(rel: str) -> str:
    d = rel.rsplit("/", 1)[0] if "/" in rel else ""
    return d + "/" if d else ""


def cmd_diff(args) -> int:
    a = json.loads(Path(args.a).read_text())
    b = json.loads(Path(args.b).read_text())
    bad = 0
    # run ids
    for name in sorted(set(a.get("run_ids", {})) | set(b.get("run_ids", {}))):
        ra, rb = a["run_ids"].get(name, []), b["run_ids"].get(name, [])
        ida, idb = [r["run_id"] for r in ra], [r["run_id"] for r in rb]
        na, nb = [r.get("normalized_run_id") for r in ra], [r.get("normalized_run_id") for r in rb]
        if na != nb:
            bad += 1
            print(f"DIFFERENT run id    {name}: {ida} vs {idb} (normalized {na} vs {nb})")
        elif ida != idb:
            print(f"same      run id    {name}: normalized {na}; raw ids {ida} vs {idb} differ only by "
                  f"checkout/output paths or the input file's mtime (informational)")
        else:
            print(f"same      run id    {name}: {ida}")
        for r in ra + rb:
            if r.get("fingerprint_recomputed_matches") is False:
                print(f"  note: {name} {r['run_id']}: run.json fingerprint is not sha256 of its config "
                      f"(the fingerprint function changed?)")
            if r.get("status") != "finished":
                bad += 1
                print(f"  BAD: {name} {r['run_id']} status {r.get('status')}")
    for k in sorted(set(a.get("command_rc", {})) | set(b.get("command_rc", {}))):
        x, y = a.get("command_rc", {}).get(k), b.get("command_rc", {}).get(k)
        if x != 0 or y != 0:
            bad += 1
            print(f"FAILED    command   {k}: rc {x} vs {y}")
    fa, fb = a["files"], b["files"]
    for k in sorted(set(fa) | set(fb)):
        x, y = fa.get(k), fb.get(k)
        if (x or {}).get("kind") == "missing-output-dir" or (y or {}).get("kind") == "missing-output-dir":
            bad += 1
            print(f"MISSING   output directory {k} in {'A' if (x or {}).get('kind') == 'missing-output-dir' else 'B'}"
                  f"{' and B' if (x or {}).get('kind') == (y or {}).get('kind') else ''}")
            continue
        if x is None or y is None:
            bad += 1
            print(f"MISSING   {'in B' if y is None else 'in A'}: {k}")
            continue
        notes = []
        if x.get("kind") != y.get("kind"):
            notes.append(f"kind {x.get('kind')} vs {y.get('kind')}")
        if x.get("kind") == "table":
            if x["columns"] != y["columns"]:
                if set(x["columns"]) == set(y["columns"]):
                    notes.append("column order differs")
                else:
                    notes.append(f"columns only in A {sorted(set(x['columns']) - set(y['columns']))}, "
                                 f"only in B {sorted(set(y['columns']) - set(x['columns']))}")
            elif x.get("types") != y.get("types"):
                notes.append(f"column types differ: " + ", ".join(
                    f"{c} {s}->{t}" for c, s, t in zip(x["columns"], x["types"], y["types"]) if s != t))
            if x["rows"] != y["rows"]:
                notes.append(f"rows {x['rows']} vs {y['rows']}")
        if x.get("kind") == "json" and x.get("sha256") != y.get("sha256"):
            ka, kb = x.get("key_sha256") or {}, y.get("key_sha256") or {}
            keys = [k for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)]
            if keys:
                notes.append("top-level keys differing: " + ", ".join(keys))
        if x.get("sha256") != y.get("sha256") or notes:
            bad += 1
            extra = f" ({'; '.join(notes)})" if notes else " (content)"
            if x.get("kind") == "table":
                extra += f" [rows {x['rows']}]" if x["rows"] == y["rows"] else ""
            print(f"DIFFERENT {k}{extra}")
        else:
            info = f" [{x['rows']} rows]" if x.get("kind") == "table" else ""
            order = ""
            if x.get("kind") == "table" and x.get("row_order_sha256") != y.get("row_order_sha256"):
                order = "  (same rows, different row order: informational)"
            print(f"same      {k}{info}{order}")
    pa_, pb_ = set(a.get("present_only", [])), set(b.get("present_only", []))
    for p in sorted(pa_ ^ pb_):
        bad += 1
        print(f"MISSING   {'in B' if p in pa_ else 'in A'} (unhashed file): {p}")
    print(f"\n{'DIFFERENCES: ' + str(bad) if bad else 'ALL SAME'} "
          f"({len(set(fa) | set(fb))} hashed entries, {len(pa_ | pb_)} presence-only files)")
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run every stand-in command of a checkout into --out")
    r.add_argument("--repo", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--python", default=DEFAULT_PYTHON)
    r.add_argument("--lock", default=DEFAULT_LOCK, help="flock file serialising heavy commands")
    r.add_argument("--no-lock", action="store_true")
    r.add_argument("--entry", action="append", metavar="OLD=NEW",
                   help="replace the command-line token OLD by NEW in every command (e.g. "
                        "pipelines/gep.py=t2i/gep.py if the restructure moved an entry point or a test "
                        "data file); repeatable. Leave it out to test that the old paths still work")
    r.add_argument("--only", nargs="+", choices=list(COMMANDS), help="run only these commands")
    h = sub.add_parser("hash", help="hash the outputs under --out (JSON on stdout)")
    h.add_argument("--out", required=True)
    d = sub.add_parser("diff", help="compare two hash files; exit 1 on any difference")
    d.add_argument("a")
    d.add_argument("b")
    args = ap.parse_args(argv)
    return {"run": cmd_run, "hash": cmd_hash, "diff": cmd_diff}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
