"""Triplet prompts of the Stable Diffusion Exposed study (paper 004, section 3 and App. A).

Two sources of neutral prompts:

- **Captions** (GCC, COCO, TextCaps, Flickr30k, or any caption file): ``caption_triplets`` runs
  ``operators.text_triplet_filter.TripletFilter`` over the file in bounded batches, keeps the
  captions with *person* / *people* and no Table S1 word, and swaps them into their feminine and
  masculine forms. ``TRIPLET_COUNTS`` says how many captions each rule rejected and, for the
  Table S1 rule, how many rejected captions name each word.
- **Professions** (Table S2). The paper's neutral sentences were written by ChatGPT 3.5 and are
  not published, so, as this project's choice, ``profession_triplets`` builds them from
  per-topic templates (``DEFAULT_TEMPLATES``, three per topic, modelled on the paper's example
  "An ecologist studies the ecosystem in a lush green forest"). The feminine / masculine prompts
  put *female* / *male* before the profession and fix the article ("An ecologist" -> "A female
  ecologist"). ``sentence_triplets`` does the same for a file of sentences written elsewhere
  (ChatGPT's, for instance): the profession named in each is found and prefixed.

``write_triplets`` writes the tables; ``pipelines/exposed.py triplets`` is the command.
"""

from __future__ import annotations

import json
import re
import string
import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from operators.base import conform
from operators.text_triplet_filter import (
    TextBytes,
    TripletFilter,
    blank_captions,
    caption_array,
    splice_bytes,
)
from pipelines.engine import io
from schemas.captions import LAION_TEXT
from schemas.exposed import (
    COUNT,
    FEMININE,
    HUMAN_WORD,
    MASCULINE,
    NEUTRAL,
    PROFESSION,
    PROFESSIONS,
    SOURCE_ROW,
    TOPIC,
    TRIPLET_COUNTS,
    TRIPLET_ID,
    TRIPLET_SOURCE,
    TRIPLET_STATUS,
    TRIPLETS,
    TripletOutcome,
)
from schemas.occupations import indefinite_article

PROFESSION_SOURCE = "profession"
BATCH_ROWS = TripletFilter.resources.batch_size
TRIPLETS_FILE = "triplets.parquet"
COUNTS_CSV = "triplet_counts.csv"
COUNTS_JSON = "triplet_counts.json"
# the outcomes of the profession sentences (every one is reported, zeros included)
PROFESSION_OUTCOMES = (TripletOutcome.KEPT, TripletOutcome.NULL_CAPTION, TripletOutcome.NO_PROFESSION)

_SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*")


# ---------------------------------------------------------------------------------------------
# reading captions


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
    import fsspec

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


# ---------------------------------------------------------------------------------------------
# caption triplets


def _check_source(source: str) -> str:
    if not isinstance(source, str) or _SOURCE_NAME.fullmatch(source) is None:
        raise ValueError(f"source {source!r}: expected a short name of letters, digits, '.', '_' and '-' (gcc, coco, ...)")
    return source


def _triplet_ids(source: str, rows: pa.Array) -> pa.Array:
    """f"{source}-{row:07d}", vectorised."""
    padded = pc.utf8_lpad(rows.cast(pa.string()), 7, "0")
    return pc.binary_join_element_wise(pa.repeat(pa.scalar(source, pa.string()), len(rows)), padded, "-")


def count_rows(source: str, outcomes: Mapping[str, int], words: Mapping[str, int] | None = None) -> pa.Table:
    """``TRIPLET_COUNTS`` rows: one per outcome (human word null), then one per human word under
    the human_word outcome (most frequent first)."""
    rows = [(o, None, int(n)) for o, n in outcomes.items()]
    rows += [(TripletOutcome.HUMAN_WORD, w, int(n)) for w, n in sorted((words or {}).items(), key=lambda kv: (-kv[1], kv[0]))]
    return conform(pa.table({
        TRIPLET_SOURCE: pa.array([source] * len(rows), pa.string()),
        TRIPLET_STATUS: pa.array([r[0] for r in rows], pa.string()),
        HUMAN_WORD: pa.array([r[1] for r in rows], pa.string()),
        COUNT: pa.array([r[2] for r in rows], pa.int64()),
    }), TRIPLET_COUNTS)


def caption_triplets(path: str | Path, source: str, column: str = LAION_TEXT,
                     limit: int | None = None) -> tuple[pa.Table, pa.Table]:
    """(triplets, counts) of the captions of ``path`` (see ``read_captions``), the first ``limit``
    rows when given. ``counts`` adds up to the rows read."""
    _check_source(source)
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
            TRIPLET_ID: _triplet_ids(source, kept.column(SOURCE_ROW).combine_chunks()),
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
# profession triplets

# Neutral sentences, three per Table S2 topic: "{A}" is the profession's indefinite article at
# the start of the sentence ("A" / "An"), "{a}" the same in lower case, "{profession}" the
# profession (lower case, acronyms kept). No template names anyone else (no Table S1 word).
DEFAULT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "Science": (
        "{A} {profession} studies samples in a bright laboratory",
        "{A} {profession} takes notes at a field station on a cloudy morning",
        "{A} {profession} examines data on a computer screen late at night",
    ),
    "Art": (
        "{A} {profession} works on a new piece in a sunlit studio",
        "{A} {profession} sketches ideas at a wooden desk by the window",
        "{A} {profession} prepares an exhibition in a quiet gallery",
    ),
    "Sports": (
        "{A} {profession} trains hard at a stadium in the early morning",
        "{A} {profession} prepares for a competition on a sunny afternoon",
        "{A} {profession} takes a break beside the field after practice",
    ),
    "Celebrations": (
        "{A} {profession} gets ready for a wedding reception in a decorated hall",
        "{A} {profession} works at a birthday party in a colorful garden",
        "{A} {profession} sets up for a festival under string lights at night",
    ),
    "Education": (
        "{A} {profession} prepares a lesson in a bright classroom",
        "{A} {profession} reads a book in a quiet school library",
        "{A} {profession} writes on a whiteboard at the front of a lecture hall",
    ),
    "Healthcare": (
        "{A} {profession} checks medical records in a busy hospital corridor",
        "{A} {profession} works in a clean examination room",
        "{A} {profession} reviews test results at a desk in a clinic",
    ),
    "Technology": (
        "{A} {profession} writes code on two monitors in a modern office",
        "{A} {profession} tests a prototype in a high-tech lab",
        "{A} {profession} works on a laptop in a shared workspace",
    ),
    "Business and Finance": (
        "{A} {profession} analyzes financial reports in a glass-walled office",
        "{A} {profession} prepares a presentation in a conference room",
        "{A} {profession} reviews spreadsheets at a desk in a downtown office",
    ),
    "Government and Public Service": (
        "{A} {profession} works at a desk in a city government building",
        "{A} {profession} reviews documents in a public office",
        "{A} {profession} walks through the town square on a weekday morning",
    ),
    "Agriculture and Farming": (
        "{A} {profession} inspects crops on a farm at sunrise",
        "{A} {profession} works in a green field under a blue sky",
        "{A} {profession} checks the harvest in a rustic barn",
    ),
    "Environmental": (
        "{A} {profession} collects samples by a river in a lush green forest",
        "{A} {profession} surveys a wetland on a misty morning",
        "{A} {profession} takes measurements in a nature reserve",
    ),
    "Travel and Hospitality": (
        "{A} {profession} works in an elegant hotel lobby",
        "{A} {profession} prepares for the day at a seaside resort",
        "{A} {profession} checks an itinerary at a busy airport",
    ),
    "Media and Journalism": (
        "{A} {profession} prepares a story in a busy newsroom",
        "{A} {profession} records a segment in a broadcast studio",
        "{A} {profession} takes notes at a press conference",
    ),
    "Law and Legal": (
        "{A} {profession} reviews case files in a wood-paneled office",
        "{A} {profession} prepares documents in a courthouse library",
        "{A} {profession} walks up the steps of a courthouse",
    ),
    "Manufacturing and Industry": (
        "{A} {profession} works on the floor of a large factory",
        "{A} {profession} inspects machinery in an industrial plant",
        "{A} {profession} checks a production line in a warehouse",
    ),
    "Culinary and Food Services": (
        "{A} {profession} prepares a dish in a busy restaurant kitchen",
        "{A} {profession} arranges food on a plate in a bright kitchen",
        "{A} {profession} works at a market stall full of fresh produce",
    ),
}
GENDER_WORDS = ("female", "male")  # what the feminine / masculine prompts put before the profession
_TEMPLATE_FIELDS = {"a", "A", "profession"}
# letters whose English name starts with a vowel sound: "an AI", "an IT", "an MRI" but "a UI", "a DJ"
_VOWEL_SOUND_LETTERS = set("AEFHILMNORSX")


def _is_acronym(token: str) -> bool:
    return len(token) >= 2 and token.isupper()


def profession_phrase(name: str) -> str:
    """A Table S2 name as it stands in a sentence: lower case, all-capital tokens kept ("IT
    support specialist", "event DJ", "import-export specialist")."""
    return " ".join(t if _is_acronym(t) else t.lower() for t in name.split())


def article(phrase: str) -> str:
    """ "a" or "an" before ``phrase``, acronyms read letter by letter ("an AI ethics researcher",
    "a UI designer", "a CNC machinist")."""
    first = phrase.split()[0] if phrase.split() else phrase
    if _is_acronym(first):
        return "an" if first[0] in _VOWEL_SOUND_LETTERS else "a"
    return indefinite_article(phrase)


def topic_slug(topic: str) -> str:
    """ "Business and Finance" -> "business-and-finance"."""
    return re.sub(r"[^a-z0-9]+", "-", topic.lower()).strip("-")


def _check_template(topic: str, template: str) -> None:
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    unknown = set(fields) - _TEMPLATE_FIELDS
    if unknown or fields.count("profession") != 1:
        raise ValueError(f"template {template!r} ({topic}): expected {{profession}} once and otherwise only {{a}} / {{A}}, "
                         f"found {fields}")


def _sentence(template: str, phrase: str) -> str:
    art = article(phrase)
    return template.format(a=art, A=art.capitalize(), profession=phrase)


def profession_triplets(templates: Mapping[str, Iterable[str]] | None = None,
                        professions: Mapping[str, Iterable[str]] | None = None,
                        per_topic: int | None = None) -> tuple[pa.Table, pa.Table]:
    """(triplets, counts) of the profession set: every profession of every topic in every
    template of its topic, template by template (so that ``per_topic``, the most triplets kept
    per topic, covers the professions before it repeats them); ids
    ``profession-<topic slug>-<k>``, k counting from 0 within the topic."""
    templates = DEFAULT_TEMPLATES if templates is None else templates
    professions = PROFESSIONS if professions is None else professions
    if per_topic is not None and per_topic < 1:
        raise ValueError(f"per_topic must be >= 1, not {per_topic}")
    cols: dict[str, list] = {k: [] for k in (TRIPLET_ID, NEUTRAL, FEMININE, MASCULINE, TOPIC, PROFESSION)}
    for topic, names in professions.items():
        if topic not in templates or not tuple(templates[topic]):
            raise ValueError(f"no template for topic {topic!r}; templates are given for {sorted(templates)}")
        for t in templates[topic]:
            _check_template(topic, t)
        pairs = [(t, name) for t in templates[topic] for name in names]
        for k, (t, name) in enumerate(pairs[:per_topic]):
            phrase = profession_phrase(name)
            cols[TRIPLET_ID].append(f"{PROFESSION_SOURCE}-{topic_slug(topic)}-{k:04d}")
            cols[NEUTRAL].append(_sentence(t, phrase))
            cols[FEMININE].append(_sentence(t, f"{GENDER_WORDS[0]} {phrase}"))
            cols[MASCULINE].append(_sentence(t, f"{GENDER_WORDS[1]} {phrase}"))
            cols[TOPIC].append(topic)
            cols[PROFESSION].append(name)
    n = len(cols[TRIPLET_ID])
    table = pa.table({k: pa.array(v, pa.string()) for k, v in cols.items()})
    table = table.append_column(TRIPLET_SOURCE, pa.repeat(pa.scalar(PROFESSION_SOURCE, pa.string()), n))
    counts = dict.fromkeys(PROFESSION_OUTCOMES, 0)
    counts[TripletOutcome.KEPT] = n
    return conform(table, TRIPLETS), count_rows(PROFESSION_SOURCE, counts)


def _name_key(name: str) -> str:
    """A profession name as the words of a sentence are compared with it: lower case, its words
    joined by one space ("Import-Export Specialist" -> "import export specialist")."""
    return " ".join(re.findall(r"\w+", name.lower()))


def _find_professions(text: TextBytes, keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each row of ``text``: the profession it names (index into ``keys``, -1: none), the
    byte where that name starts, and the byte where the word before it starts when that word is
    "an" (-1 otherwise). The longest name (in characters) wins, then the first in the sentence;
    whole words, case-insensitive, any separators between the words of a name."""
    n = len(text.offsets) - 1
    found, start, an_start = np.full(n, -1), np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    tokens, starts, rows = text.words()
    if not len(tokens):
        return found, start, an_start, np.zeros(n, bool)
    lower = pc.utf8_lower(tokens)
    value_set = pa.array(keys, pa.large_string())
    hits = []  # (row, token index, key index)
    for size in sorted({k.count(" ") + 1 for k in keys}):
        m = len(tokens) - size + 1
        if m <= 0:
            continue
        idx = np.flatnonzero(rows[:m] == rows[size - 1:])
        parts = [lower.take(pa.array(idx + j)) for j in range(size)]
        grams = pc.binary_join_element_wise(*parts, pa.scalar(" ", pa.large_string())) if size > 1 else parts[0]
        key = pc.index_in(grams, value_set=value_set)
        ok = pc.is_valid(key).to_numpy(zero_copy_only=False)
        hits.append((rows[idx[ok]], idx[ok], pc.fill_null(key, 0).to_numpy(zero_copy_only=False)[ok]))
    hit_rows, hit_tok, hit_key = (np.concatenate(x) for x in zip(*hits)) if hits else (np.empty(0, np.int64),) * 3
    if len(hit_rows):
        length = np.array([len(k) for k in keys])[hit_key]
        order = np.lexsort((hit_tok, -length, hit_rows))  # by row, longest first, then leftmost
        first = order[np.r_[True, hit_rows[order][1:] != hit_rows[order][:-1]]]
        r, tok, key = hit_rows[first], hit_tok[first], hit_key[first]
        found[r], start[r] = key, starts[tok]
        prev = tok - 1
        is_an = (prev >= 0) & (rows[np.maximum(prev, 0)] == r)
        is_an &= pc.equal(lower.take(pa.array(np.maximum(prev, 0))), "an").to_numpy(zero_copy_only=False)
        an_start[r[is_an]] = starts[prev[is_an]]
    at_row_start = start == text.offsets[:-1]
    return found, start, an_start, at_row_start


def _prefixed(text: TextBytes, rows: np.ndarray, start: np.ndarray, an_start: np.ndarray,
              at_row_start: np.ndarray, word: str) -> pa.Array:
    """``text`` (its ``rows``) with ``word`` put before each profession (capitalised at the start
    of a sentence) and "an" before it made "a" (its "n" removed, whatever its case)."""
    pieces = (b"", f"{word} ".encode(), f"{word.capitalize()} ".encode())
    an = an_start >= 0
    span_start = np.concatenate([an_start[an] + 1, start])
    span_len = np.concatenate([np.ones(an.sum(), np.int64), np.zeros(len(start), np.int64)])
    codes = np.concatenate([np.zeros(an.sum(), np.int64), np.where(at_row_start, 2, 1)])
    order = np.argsort(span_start, kind="stable")
    out = splice_bytes(text, span_start[order], span_len[order], codes[order], pieces)
    return out.take(pa.array(rows, pa.int64())).cast(pa.string())


def sentence_triplets(path: str | Path, column: str = LAION_TEXT,
                      professions: Mapping[str, Iterable[str]] | Iterable[str] | None = None) -> tuple[pa.Table, pa.Table]:
    """(triplets, counts) of a file of neutral sentences about professions (``read_captions``
    formats): the Table S2 profession named in each sentence (see ``_find_professions``) gets
    *female* / *male* before its first mention, and a preceding "an" becomes "a". Sentences that
    name none are counted as ``no_profession``, blank ones as ``null_caption``. ``professions``:
    topic -> names (Table S2 by default) or a plain list of names (no topic). A name listed
    under two topics (Sommelier, Nutritionist) takes the first."""
    professions = PROFESSIONS if professions is None else professions
    topic_of: dict[str, tuple[str | None, str]] = {}
    items = professions.items() if isinstance(professions, Mapping) else [(None, professions)]
    for topic, names in items:
        for name in names:
            topic_of.setdefault(_name_key(name), (topic, name))
    if not topic_of:
        raise ValueError("no profession names given")
    keys = list(topic_of)
    key_topics = pa.array([t for t, _ in topic_of.values()], pa.string())
    key_names = pa.array([name for _, name in topic_of.values()], pa.string())
    counts = dict.fromkeys(PROFESSION_OUTCOMES, 0)
    parts = []
    for batch in read_captions(path, column):
        captions = caption_array(batch, column)
        blank = blank_captions(captions)
        text = TextBytes.of(captions)
        found, start, an_start, at_row_start = _find_professions(text, keys)
        found[blank] = -1
        kept = np.flatnonzero(found >= 0)
        counts[TripletOutcome.KEPT] += len(kept)
        counts[TripletOutcome.NULL_CAPTION] += int(blank.sum())
        counts[TripletOutcome.NO_PROFESSION] += int((~blank & (found < 0)).sum())
        spans = (kept, start[kept], an_start[kept], at_row_start[kept])
        rows = batch.column(SOURCE_ROW).combine_chunks().take(pa.array(kept, pa.int64()))
        which = pa.array(found[kept], pa.int64())
        parts.append(conform(pa.table({
            TRIPLET_ID: _triplet_ids(PROFESSION_SOURCE, rows),
            TRIPLET_SOURCE: pa.repeat(pa.scalar(PROFESSION_SOURCE, pa.string()), len(kept)),
            SOURCE_ROW: rows,
            NEUTRAL: captions.take(pa.array(kept, pa.int64())).cast(pa.string()),
            FEMININE: _prefixed(text, *spans, GENDER_WORDS[0]),
            MASCULINE: _prefixed(text, *spans, GENDER_WORDS[1]),
            TOPIC: key_topics.take(which),
            PROFESSION: key_names.take(which),
        }), TRIPLETS))
    triplets = pa.concat_tables(parts).combine_chunks() if parts else TRIPLETS.empty_table()
    return triplets, count_rows(PROFESSION_SOURCE, counts)


# ---------------------------------------------------------------------------------------------
# writing


def write_triplets(triplets: pa.Table, counts: pa.Table, output_dir: str | Path) -> dict[str, str]:
    """``triplets.parquet``, ``triplet_counts.csv`` and ``triplet_counts.json`` (a list of rows)
    in ``output_dir``, each written atomically (a temporary name, then a rename); their paths."""
    triplets, counts = conform(triplets, TRIPLETS), conform(counts, TRIPLET_COUNTS)
    fs, root = io.output_fs(str(output_dir))
    paths = {"triplets": f"{root}/{TRIPLETS_FILE}", "counts_csv": f"{root}/{COUNTS_CSV}",
             "counts_json": f"{root}/{COUNTS_JSON}"}
    io.write_table(triplets, fs, paths["triplets"])
    io.write_text(counts.to_pandas().to_csv(index=False), fs, paths["counts_csv"])
    io.write_text(json.dumps(counts.to_pylist(), indent=1) + "\n", fs, paths["counts_json"])
    return paths


# ---------------------------------------------------------------------------------------------
# the command (pipelines/exposed.py triplets)

# The command writes, like every command of the project, into a run folder under --output:
# ``<output>/exposed-triplets-<8 hex digits of the configuration fingerprint>/`` (or --run-id),
# with run.json holding that configuration (pipelines/engine/rundir.py). The same command finds
# its folder again; another input, column, source or per-topic count gets a folder of its own.
RUN_LABEL = "exposed-triplets"
CONFIG_FILE = "triplets_config.json"


def default_source(path: str | Path) -> str:
    """A caption set's name from its file name: "coco_captions.parquet" -> "coco_captions"."""
    name = re.sub(r"[^A-Za-z0-9_.]+", "-", Path(str(path).rstrip("/")).stem).strip("-.")
    return name or "custom"


def caption_column(path: str, flag: str | None = None, dataset_name: str | None = None,
                   identity: str = "footer"):
    """(column, ColumnChoice or None) of a caption input: a parquet file, folder or URI and a CSV
    are recognised from their columns (``pipelines.engine.datasets``: LAION's TEXT, Re-LAION's
    caption, COYO's and DataComp's text; else the one caption-like column), ``flag`` winning; a
    text file's one column is named ``flag`` or TEXT."""
    path = str(path)
    suffix = Path(path).suffix.lower()
    if suffix == ".txt":
        return flag or LAION_TEXT, None
    if suffix in (".csv", ".tsv") and "://" not in path:
        from pipelines.engine.datasets import ColumnError, choose_columns

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
    inp = io.resolve_parquet_inputs(path, identity)
    choice = io.choose_input_columns(inp, flag, None, dataset_name, url=False, paths=[path])
    return choice.caption, choice


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
    source = _check_source(getattr(args, "source", None) or default_source(inp)) if mode == "captions" \
        else PROFESSION_SOURCE
    identity = getattr(args, "input_identity", None) or "footer"
    if inp:
        column, choice = caption_column(str(inp), column, getattr(args, "dataset_name", None), identity)
        if choice is not None:
            print(f"  {choice.line()}")
    return {"mode": mode, "input": str(inp) if inp else None, "column": column if inp else None,
            "source": source, "per_topic": per_topic, "dataset": choice.record() if choice else None,
            "identity": identity}


def input_identity(path: str, identity: str = "footer") -> dict[str, str]:
    """{file: what identifies its data} of a caption input, each file as an absolute path or URI:
    parquet files (local or any fsspec URI) as the engine identifies them (size, modification time
    or ETag, footer hash), a text or CSV file by its size and modification time. A missing input
    fails here, before the run starts."""
    if "://" not in path and not Path(path).exists():
        raise ValueError(f"caption input {path} does not exist")
    if "://" in path or Path(path).is_dir() or path.lower().endswith(".parquet"):
        return io.resolve_parquet_inputs(path, identity).data_identity()
    st = Path(path).stat()
    return {str(Path(path).resolve()): f"size={st.st_size} modified={st.st_mtime_ns}"}


def triplets_job(s: dict) -> dict:
    """Everything the triplets depend on (``command_settings``' result): its fingerprint names the
    run folder, and run.json records it."""
    from schemas.exposed import HUMAN_WORDS, PERSON_WORDS

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

    def job(self, args, s: dict) -> dict:
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
    from pipelines.engine import config as study_config

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
    from types import SimpleNamespace

    from pipelines.engine import lifecycle

    started = time.time()
    s = command_settings(args)
    plan_args = SimpleNamespace(output=str(args.output), run_id=getattr(args, "run_id", None))
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
