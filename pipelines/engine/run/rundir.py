"""One directory per run under an output root, and the checkpoints that let a killed run resume.

Layout (``ROOT`` is ``--output``, a local path or any fsspec URI)::

    ROOT/<run id>/run.json            run id, configuration fingerprint, the configuration itself,
                                      status (running / finished / failed) and every attempt
    ROOT/<run id>/<results>           metrics.json, report.html, tables, ...
    ROOT/<run id>/_work/...           checkpoints: finished caption shards, fetched URLs,
                                      generated images (status rows, keyed)

The run id is ``--run-id`` or ``<label>-<8 hex digits of the configuration fingerprint>``, so
the same command lands in the same directory (and resumes there), while a job with other
occupations, prompts, thresholds or models gets a directory of its own: jobs sharing a root
never overwrite each other. A run id that already holds a run of a different configuration is
refused rather than mixed. The configuration includes what identifies each input file's data
(``input.data``): an input rewritten in place gets a run of its own, never the old results.

Checkpoint parts are written to a temporary name and moved into place, so a kill in the middle
of a write leaves no half-written part behind (temporary names are ignored when reading).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.fs as pafs

from pipelines.engine.storage import io

RUN_FILE = "run.json"
INPUT_DATA = "input.data"  # {file: identity} in a job's configuration (inputs.ParquetInput.data_identity)
WORK = "_work"
TMP_SUFFIX = io.TMP_SUFFIX


def _plain(obj):
    """A value JSON cannot write, as a fingerprint sees it: a spec by its record, else its str."""
    record = io.spec_record(obj)
    return str(obj) if record is None else record


def plain(config):
    """``config`` as JSON reads it back (specs as their records, tuples as lists): what a run
    records and compares on resume."""
    return json.loads(json.dumps(config, default=_plain))


def fingerprint(config) -> str:
    """sha256 of the canonical JSON of ``config`` (what the results depend on)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=_plain)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def slug(text: str, limit: int = 40) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return s[:limit].rstrip("-") or "run"


def default_run_id(label: str, fp: str) -> str:
    return f"{slug(label)}-{fp[:8]}"


def valid_run_id(run_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", run_id or ""):
        raise io.InputError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 100 characters)")
    return run_id


class RunDir:
    """The directory of one run, its run.json, and its checkpoints."""

    def __init__(self, root: str, run_id: str):
        self.root_uri = root.rstrip("/")
        self.run_id = valid_run_id(run_id)
        self.uri = f"{self.root_uri}/{run_id}"
        self.fs, self.path = io.output_fs(self.uri)
        self.record: dict = {}
        self.resumed = False

    # ------------------------------------------------------------------------------ lifecycle
    def open(self, fp: str, config: dict, overwrite: bool = False, command: str = "") -> "RunDir":
        """Start or resume the run: refuse a directory that holds another configuration."""
        previous = self.read_json(RUN_FILE)
        if previous is not None and overwrite:
            io.clear_dir(self.fs, self.path)
            previous = None
        if previous is not None and previous.get("fingerprint") != fp:
            diff = _differences(previous.get("config", {}), config)
            changed = [d[len(INPUT_DATA) + 1:] for d in diff if d.startswith(f"{INPUT_DATA}.")]
            if changed or INPUT_DATA in diff:
                raise io.InputError(
                    f"{self.uri} holds run {self.run_id!r} of a different configuration: its input data changed "
                    f"since that run started ({', '.join(changed[:3]) or 'the input files'}"
                    f"{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}: added, removed or rewritten; "
                    f"size, modification time, ETag or parquet footer differ), so its results would be stale. "
                    f"Leave --run-id out to get a run of its own for the new data, choose another --run-id, "
                    f"or pass --overwrite to discard the old results")
            raise io.InputError(
                f"{self.uri} holds run {self.run_id!r} of a different configuration (differs in: "
                f"{', '.join(diff) or 'details'}); choose another --run-id, leave --run-id out to get a "
                f"directory per configuration, or pass --overwrite to discard it")
        now = time.time()
        self.resumed = previous is not None
        self.record = previous or {"run_id": self.run_id, "fingerprint": fp, "config": config, "attempts": []}
        self.record["status"] = "running"
        self.record["attempts"].append({"command": command, "started_unix": now, "resumed": self.resumed})
        self._write_record()
        return self

    def finish(self, status: str = "finished", **info) -> None:
        self.record["status"] = status
        info = {k: io.plain(v) if isinstance(v, str) else v for k, v in info.items()}  # no terminal colours
        self.record["attempts"][-1].update({"ended_unix": time.time(), "status": status, **info})
        in_flight = sys.exception()  # called from an ``except`` recording that error
        try:
            self._write_record()
        except Exception as exc:
            if in_flight is None:
                raise
            # the error being recorded stays the one raised (its exit code, its message); this
            # failure is not swallowed but noted on it
            in_flight.add_note(f"recording it in {self.display(RUN_FILE)} failed too: {type(exc).__name__}: {exc}")

    def read_json(self, name: str) -> dict | None:
        """The JSON file ``name`` of this run directory (run.json, metrics.json), None if absent."""
        return self._json_at(self.file(name))

    def _json_at(self, path: str) -> dict | None:
        if not io.exists(self.fs, path):
            return None
        with self.fs.open_input_stream(path) as fh:
            return json.loads(fh.read().decode("utf-8"))

    def _write_record(self) -> None:
        write_atomic(self.fs, f"{self.path}/{RUN_FILE}",
                     json.dumps(self.record, indent=2, sort_keys=True, default=_plain).encode("utf-8"))

    def plan(self, key: str, value):
        """``value`` recorded under ``key`` on the first attempt; the recorded one afterwards (a
        resumed run keeps its shard layout even when defaults change)."""
        plans = self.record.setdefault("plans", {})
        if key not in plans:
            plans[key] = value
            self._write_record()
        return plans[key]

    # ------------------------------------------------------------------------------ paths
    def file(self, name: str) -> str:
        return f"{self.path}/{name}"

    def display(self, name: str = "") -> str:
        return f"{self.uri}/{name}" if name else self.uri

    def work(self, *parts: str) -> str:
        return posixpath.join(self.path, WORK, *parts)

    # ------------------------------------------------------------------------------ markers
    def done(self, name: str) -> dict | None:
        return self._json_at(self.work(f"{name}.done"))

    def mark_done(self, name: str, info: dict) -> None:
        write_atomic(self.fs, self.work(f"{name}.done"), json.dumps(info, default=str).encode("utf-8"))

    # ------------------------------------------------------------------------------ parts
    def write_part(self, name: str, table: pa.Table, key: str | None = None) -> str:
        """Write ``table`` as a new part of checkpoint ``name`` (atomic: temp name, then move).
        With ``key`` the part is ``part-<key>.parquet``, and writing the same key again replaces it:
        a step redone after a crash leaves one part, not two."""
        path = self.part_path(name, key or f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}")
        write_atomic(self.fs, path, io.parquet_bytes(table))
        return path

    def part_path(self, name: str, key: str) -> str:
        """Where the part of checkpoint ``name`` written with ``key`` is."""
        return self.work(name, f"part-{key}.parquet")

    def read_part(self, name: str, key: str, schema: pa.Schema) -> pa.Table | None:
        """The part of checkpoint ``name`` written with ``key`` (None when there is none)."""
        path = self.part_path(name, key)
        return self._read_part_file(path, schema) if io.exists(self.fs, path) else None

    def read_parts(self, name: str, schema: pa.Schema) -> pa.Table:
        """All finished parts of checkpoint ``name`` (empty when there are none)."""
        base = self.work(name)
        if not io.exists(self.fs, base):
            return schema.empty_table()
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=False))
        files = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))
        parts = [self._read_part_file(f, schema) for f in files]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _read_part_file(self, path: str, schema: pa.Schema) -> pa.Table:
        """One part file in ``schema`` (a column added to the schema since it was written reads as nulls)."""
        with self.fs.open_input_file(path) as fh:
            part = io.read_parquet(fh)
        for c in schema.names:
            if c not in part.column_names:
                part = part.append_column(c, pa.nulls(part.num_rows, schema.field(c).type))
        return part.select(schema.names).cast(schema)

    def clear(self, path: str) -> None:
        io.clear_dir(self.fs, path)


def write_atomic(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the whole file or none of it."""
    io.write_bytes(fs, path, data)


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _differences(va, vb, f"{prefix}{k}.")
        elif json.dumps(va, sort_keys=True, default=_plain) != json.dumps(vb, sort_keys=True, default=_plain):
            out.append(f"{prefix}{k}")
    return out
