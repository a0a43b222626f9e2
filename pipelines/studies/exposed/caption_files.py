"""The caption files triplets are made from (paper 004, section 3): reading them in bounded
batches (a parquet file, folder or fsspec URI, a text file, a CSV / TSV file), recognising their
caption column, and identifying their data for the run folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from operators.text_triplet_filter import TripletFilter
from pipelines.engine.storage import io
from pipelines.engine.storage.datasets import ColumnError, choose_columns
from pipelines.engine.storage.inputs import choose_input_columns, resolve_parquet_inputs
from schemas.captions import LAION_TEXT
from schemas.exposed import SOURCE_ROW

BATCH_ROWS = TripletFilter.resources.batch_size


def _parquet_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet")
                       if not any(part.startswith((".", "_")) for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"caption input {path} is a directory with no parquet file")
        return files
    return [path]


def _remote_parquet(uri: str, column: str, batch_rows: int) -> Iterator[pa.Table]:
    """Parquet captions on an object store or any fsspec URI (``s3://bucket/laion/``, a file or
    a folder read recursively in sorted order), streamed in batches of ``column`` only."""
    fs, root = fsspec.core.url_to_fs(uri, **io.storage_options(uri))
    if not fs.exists(root):
        raise ValueError(f"caption input {uri} does not exist")
    if fs.isdir(root):
        files = sorted(f for f in fs.find(root) if f.endswith(".parquet")
                       and not any(part.startswith((".", "_")) for part in f[len(root):].strip("/").split("/")))
        if not files:
            raise ValueError(f"caption input {uri} is a folder with no parquet file")
    elif root.endswith(".parquet"):
        files = [root]
    else:
        raise ValueError(f"caption input {uri}: only parquet is read from a URI (copy text or CSV files locally)")
    for f in files:
        with fs.open(f, "rb") as fh:
            _check_column(column, pq.ParquetFile(fh).schema_arrow.names, f)

    def tables():
        for f in files:
            with fs.open(f, "rb") as fh:
                for batch in pq.ParquetFile(fh, page_checksum_verification=True).iter_batches(batch_size=batch_rows, columns=[column]):
                    yield pa.Table.from_batches([batch])

    return _numbered(tables(), column)


def _check_column(column: str, names: list[str], where: Path) -> None:
    if column not in names:
        raise ValueError(f"caption column {column!r} not found in {where}; its columns are {names}")


def _numbered(tables: Iterable[pa.Table], column: str) -> Iterator[pa.Table]:
    """``tables`` as (``column``, ``source_row``) tables, rows numbered from 0 across all of them."""
    row = 0
    for t in tables:
        if t.num_rows == 0:
            continue
        yield pa.table({column: t.column(column), SOURCE_ROW: pa.array(np.arange(row, row + t.num_rows), pa.int64())})
        row += t.num_rows


def _text_lines(path: Path, batch_rows: int) -> Iterator[pa.Table]:
    """One caption per line (split on "\\n" only, a trailing "\\r" dropped, UTF-8, a BOM ignored)."""
    lines: list[str] = []
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            try:
                lines.append(raw.decode("utf-8-sig" if i == 0 else "utf-8"))
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}, line {i + 1}: not UTF-8 ({e})") from None
            if len(lines) == batch_rows:
                yield pa.table({"text": pa.array(lines, pa.string())})
                lines = []
    if lines:
        yield pa.table({"text": pa.array(lines, pa.string())})


def _delimited(path: Path, column: str, delimiter: str, batch_rows: int) -> Iterator[pa.Table]:
    parse = pacsv.ParseOptions(delimiter=delimiter, quote_char=False if delimiter == "\t" else '"',
                               newlines_in_values=delimiter != "\t")
    with pacsv.open_csv(path, parse_options=parse) as reader:  # the header, to name the columns
        _check_column(column, reader.schema.names, path)
    convert = pacsv.ConvertOptions(include_columns=[column], column_types={column: pa.string()},
                                   strings_can_be_null=False)
    with pacsv.open_csv(path, parse_options=parse, convert_options=convert) as reader:
        for batch in reader:
            t = pa.Table.from_batches([batch])
            for i in range(0, t.num_rows, batch_rows):
                yield t.slice(i, batch_rows)


def read_captions(path: str | Path, column: str = LAION_TEXT, batch_rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
    """The captions of ``path`` in batches of at most ``batch_rows`` rows (memory stays bounded),
    each a table of ``column`` and ``source_row`` (0-based row of the input).

    ``path``: a parquet file; a directory of parquet files (read in sorted path order, rows
    numbered across files; names starting with "." or "_" skipped); a ``.txt`` file, one caption
    per line (the line number is the row; the column is named ``column``); a ``.csv`` / ``.tsv``
    file with a header row (``.tsv``: no quoting, so captions may contain quotes).
    """
    if "://" in str(path):
        return _remote_parquet(str(path), column, batch_rows)
    path = Path(path)
    if not path.exists():
        raise ValueError(f"caption input {path} does not exist")
    suffix = path.suffix.lower()
    if path.is_dir() or suffix == ".parquet":
        files = _parquet_files(path)
        for f in files:
            _check_column(column, pq.ParquetFile(f).schema_arrow.names, f)

        def tables():
            for f in files:
                for batch in pq.ParquetFile(f, page_checksum_verification=True).iter_batches(batch_size=batch_rows, columns=[column]):
                    yield pa.Table.from_batches([batch])

        return _numbered(tables(), column)
    if suffix == ".txt":
        return _numbered((t.rename_columns([column]) for t in _text_lines(path, batch_rows)), column)
    if suffix in (".csv", ".tsv"):
        return _numbered(_delimited(path, column, "\t" if suffix == ".tsv" else ",", batch_rows), column)
    raise ValueError(f"caption input {path}: expected a .parquet file, a directory of them, or a .txt / .csv / .tsv file")


def caption_column(path: str, flag: str | None = None, dataset_name: str | None = None,
                   identity: str = "footer"):
    """(column, ColumnChoice or None) of a caption input: a parquet file, folder or URI and a CSV
    are recognised from their columns (``pipelines.engine.storage.datasets``: LAION's TEXT, Re-LAION's
    caption, COYO's and DataComp's text; else the one caption-like column), ``flag`` winning; a
    text file's one column is named ``flag`` or TEXT."""
    path = str(path)
    suffix = Path(path).suffix.lower()
    if suffix == ".txt":
        return flag or LAION_TEXT, None
    if suffix in (".csv", ".tsv") and "://" not in path:
        if not Path(path).exists():
            raise ValueError(f"caption input {path} does not exist")
        parse = pacsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",",
                                   quote_char=False if suffix == ".tsv" else '"')
        with pacsv.open_csv(path, parse_options=parse) as reader:
            names = reader.schema.names
        try:
            choice = choose_columns([(path, names)], flag, None, dataset_name, url=False, paths=[path])
        except ColumnError as exc:
            raise ValueError(str(exc)) from None
        return choice.caption, choice
    if "://" not in path and not Path(path).exists():
        raise ValueError(f"caption input {path} does not exist")
    inp = resolve_parquet_inputs(path, identity)
    choice = choose_input_columns(inp, flag, None, dataset_name, url=False, paths=[path])
    return choice.caption, choice


def input_identity(path: str, identity: str = "footer") -> dict[str, str]:
    """{file: what identifies its data} of a caption input, each file as an absolute path or URI:
    parquet files (local or any fsspec URI) as the engine identifies them (size, modification time
    or ETag, footer hash), a text or CSV file by its size and modification time. A missing input
    fails here, before the run starts."""
    if "://" not in path and not Path(path).exists():
        raise ValueError(f"caption input {path} does not exist")
    if "://" in path or Path(path).is_dir() or path.lower().endswith(".parquet"):
        return resolve_parquet_inputs(path, identity).data_identity()
    st = Path(path).stat()
    return {str(Path(path).resolve()): f"size={st.st_size} modified={st.st_mtime_ns}"}
