"""Neutral captions and their gender swaps (paper 004, section 3 and App. A "Prompts").

A caption becomes a triplet when (1) it contains the word *person* or *people* and (2) none of
the words of Table S1 nor their plurals. Its feminine / masculine prompts swap every *person* for
*woman* / *man* and every *people* for *women* / *men*; nothing else changes.

Choices the paper leaves open, made here:

- **Words.** A word is a maximal run of word characters: Unicode letters and digits and the
  underscore, exactly Python's ``\\w`` (``str.isalnum()`` or ``_``). Everything else separates
  words, the hyphen and the apostrophe included: "Spider-Man" contains the word "man", "person's"
  and "person’s" contain "person", "people-watching" contains "people", while "personal",
  "peoples", "persons", "salesperson", "manner", "womanly" and "person_id" contain none of the
  words. Non-ASCII letters are letters ("Iñigo" does not contain the word "i"); combining marks
  are not (captions are expected in NFC, where "é" is one letter).
- **Case.** Matching is case-insensitive: a word matches when its lower case (Arrow
  ``utf8_lower``; ``str.lower`` in the reference, the same but for a few characters such as the
  Turkish "İ") is a listed word. The swap mirrors the caption's case for the three usual forms,
  lower ("people" -> "women"), Title ("People" -> "Women") and UPPER ("PEOPLE" -> "WOMEN"); a
  caption with any other casing of the word ("pEople") cannot be mirrored and is rejected as
  ``unswappable_case``.
- **Plurals.** Table S1 words are matched in the singular and in the plural: the irregular ones of
  ``schemas.exposed.IRREGULAR_PLURALS``, none for ``NO_PLURAL`` (pronouns, adjectives), otherwise
  the regular English plural (``schemas.occupations.plural``: kids, ladies, actresses).
- **Outcomes**, first that applies: ``null_caption`` (null, empty, only white space, or not
  text), ``human_word`` (``human_word`` then names the first Table S1 word of the caption, lower
  case, as written: "ladies", not "lady"), ``no_person_word``, ``unswappable_case``, else ``kept``.

Vectorised, no Python loop over rows. One numpy pass over the bytes finds the word characters
(ASCII through a lookup table, the few non-ASCII characters decoded and looked up in a table of
every code point) and gives a copy of the lower-cased captions with every separator byte made a
space. RE2 then runs on that copy with patterns that need no Unicode classes (RE2 recompiles a
pattern on every kernel call, and ``\\pL`` costs milliseconds to compile): one
``match_substring_regex`` for Table S1 and one for person / people over every caption. The rows
with a Table S1 word are split into words (``ascii_split_whitespace``) and the first one found
in a hash set (``index_in``; RE2's ``extract_regex`` is slower); the few rows with person / people
are split into words with their byte positions, their person / people words looked up by casing,
and the swaps spliced into the bytes with numpy. ``python_loop_filter`` is the same rule one
caption at a time with Python's ``re``: the benchmark's baseline and the tests' reference.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
from typing import Iterable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, status_array, with_column
from operators.support.tokens import regex_escape, word_runs
from schemas.captions import LAION_TEXT
from schemas.exposed import (
    FEMININE,
    HUMAN_WORD,
    HUMAN_WORDS,
    IRREGULAR_PLURALS,
    MASCULINE,
    NEUTRAL,
    NO_PLURAL,
    PERSON_WORDS,
    TRIPLET_SOURCE,
    TRIPLET_STATUS,
    TripletOutcome,
)
from schemas.occupations import plural

STAGE_TRIPLETS = "triplets"

OUTCOMES = (TripletOutcome.KEPT, TripletOutcome.NULL_CAPTION, TripletOutcome.NO_PERSON_WORD,
            TripletOutcome.HUMAN_WORD, TripletOutcome.UNSWAPPABLE)
_KEPT, _NULL, _NO_PERSON, _HUMAN, _UNSWAPPABLE = range(len(OUTCOMES))

_WORD_RE = re.compile(r"\w+")  # a word, in Python's terms (the reference implementation)


# ---------------------------------------------------------------------------------------------
# the word lists


def default_human_words() -> tuple[str, ...]:
    """Table S1 (every type, and the added spelling "bridesmaid"): lower case, each word once."""
    return tuple(dict.fromkeys(w.lower() for words in HUMAN_WORDS.values() for w in words))


def human_word_forms(words: Iterable[str]) -> tuple[str, ...]:
    """Every form searched for ``words``: each word (lower case) and its plural, each once."""
    out: dict[str, None] = {}
    for w in words:
        w = str(w).strip().lower()
        if _WORD_RE.fullmatch(w) is None:
            raise ValueError(f"human word {w!r} is not a single word (letters, digits, underscore)")
        if w in PERSON_WORDS:
            raise ValueError(f"{w!r} is the neutral word the triplets swap; it cannot be a human word too")
        out[w] = None
        if w in IRREGULAR_PLURALS:
            out[IRREGULAR_PLURALS[w]] = None
        elif w not in NO_PLURAL:
            out[plural(w)] = None
    if not out:
        raise ValueError("the human word list is empty")
    return tuple(out)


def _case_forms(word: str) -> tuple[str, str, str]:
    """The three casings the swap mirrors: lower, Title, UPPER."""
    return word.lower(), word[:1].upper() + word[1:].lower(), word.upper()


def _mirror(word: str, like: str) -> str | None:
    """``word`` in the casing of ``like`` (lower / Title / UPPER), None for any other casing."""
    for form, target in zip(_case_forms(like), _case_forms(word)):
        if like == form:
            return target
    return None


# ---------------------------------------------------------------------------------------------
# the rule, one caption at a time (reference and documentation)


class Verdict(NamedTuple):
    status: str
    human_word: str | None = None
    neutral: str | None = None
    feminine: str | None = None
    masculine: str | None = None


def _is_blank(caption) -> bool:
    return not isinstance(caption, str) or not caption or caption.isspace()


def swap(caption: str) -> tuple[str, str] | None:
    """(feminine, masculine) of ``caption``: every word person / people swapped for woman / man
    and women / men in the same case; None when the caption has no such word or has one in a
    casing that cannot be mirrored ("pErson"). Table S1 words are not checked here."""
    found = [w for w in _WORD_RE.findall(caption) if w.lower() in PERSON_WORDS]
    if not found or any(_mirror("x", w) is None for w in found):
        return None

    def swapped(i: int) -> str:
        def sub(m: re.Match) -> str:
            w = m.group(0)
            return _mirror(PERSON_WORDS[w.lower()][i], w) if w.lower() in PERSON_WORDS else w

        return _WORD_RE.sub(sub, caption)

    return swapped(0), swapped(1)


def python_loop_filter(captions: Iterable, human_words: Iterable[str] | None = None) -> list[Verdict]:
    """The triplet rule with Python's ``re``, one caption at a time: the baseline the vectorised
    ``TripletFilter`` is measured against and must agree with."""
    forms = set(human_word_forms(default_human_words() if human_words is None else human_words))
    out = []
    for c in captions:
        if _is_blank(c):
            out.append(Verdict(TripletOutcome.NULL_CAPTION))
            continue
        first = next((w for w in _WORD_RE.findall(c.lower()) if w in forms), None)
        if first is not None:
            out.append(Verdict(TripletOutcome.HUMAN_WORD, first))
            continue
        if not any(w.lower() in PERSON_WORDS for w in _WORD_RE.findall(c)):
            out.append(Verdict(TripletOutcome.NO_PERSON_WORD))
            continue
        swapped = swap(c)
        if swapped is None:
            out.append(Verdict(TripletOutcome.UNSWAPPABLE))
            continue
        out.append(Verdict(TripletOutcome.KEPT, None, c, *swapped))
    return out


# ---------------------------------------------------------------------------------------------
# vectorised building blocks: word characters, words, splices


@functools.lru_cache(maxsize=1)
def _word_code_points() -> np.ndarray:
    """Whether each code point is a word character: Python's ``\\w`` (built once per process, ~0.1 s)."""
    table = np.fromiter((chr(c).isalnum() for c in range(sys.maxunicode + 1)), bool, count=sys.maxunicode + 1)
    table[ord("_")] = True
    return table


@functools.lru_cache(maxsize=1)
def _separator_bytes() -> np.ndarray:
    """Byte -> byte: ASCII separators to a space, ASCII word characters and every byte >= 0x80
    (decided per character afterwards) unchanged."""
    lut = np.arange(256, dtype=np.uint8)
    lut[:128][~_word_code_points()[:128]] = 0x20
    return lut


def _separate(data: np.ndarray) -> np.ndarray:
    """UTF-8 ``data`` with every byte of every separator character replaced by a space, so that
    word characters are exactly the bytes that are not spaces (a space is never one)."""
    out = _separator_bytes()[data]
    hi = np.flatnonzero(data >= 0x80)
    if len(hi):
        n = len(data)
        b0 = data[hi].astype(np.uint32)

        def cont(k):  # the k-th continuation byte's 6 bits (clipped at the end of the data)
            return data[np.minimum(hi + k, n - 1)].astype(np.uint32) & 0x3F

        cp = np.where(b0 >= 0xF0, ((b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3),
                      np.where(b0 >= 0xE0, ((b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2),
                               ((b0 & 0x1F) << 6) | cont(1)))
        lead = (b0 & 0xC0) != 0x80
        lead_word = lead & _word_code_points()[np.minimum(cp, sys.maxunicode)]
        # a continuation byte follows its lead byte in ``hi``: it takes the lead's answer
        idx = np.where(lead, np.arange(len(hi)), 0)
        np.maximum.accumulate(idx, out=idx)
        out[hi[~lead_word[idx]]] = 0x20
    return out


class TextBytes(NamedTuple):
    """A string array's bytes, its row offsets (relative to the first byte) and the same bytes
    with every separator character's bytes made spaces (``_separate``): words, their byte
    positions, and splices (``splice_bytes``) without a regex."""

    data: np.ndarray
    offsets: np.ndarray
    spaced: np.ndarray

    @classmethod
    def of(cls, text: pa.Array) -> "TextBytes":
        text = pc.fill_null(text, "").cast(pa.large_string())
        n = len(text)
        bufs = text.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64)[text.offset : text.offset + n + 1]
        data = (np.frombuffer(bufs[2], dtype=np.uint8)[offsets[0] : offsets[-1]] if bufs[2] is not None and n
                else np.empty(0, np.uint8))
        return cls(data, offsets - offsets[0], _separate(data))

    def separated(self) -> pa.Array:
        """The text with separators as spaces (same lengths, same offsets): word boundaries that
        RE2 sees with an ASCII pattern."""
        return pa.LargeStringArray.from_buffers(len(self.offsets) - 1, pa.py_buffer(self.offsets),
                                                pa.py_buffer(self.spaced))

    def words(self) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """Every word: (the words as strings, their start byte, their row), in text order."""
        w = self.spaced != 0x20
        if not len(w):
            return pa.array([], pa.large_string()), np.empty(0, np.int64), np.empty(0, np.int64)
        return word_runs(self.data, w, self.offsets)


def _split_words(spaced: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The words of separated text (``TextBytes.separated``), flattened, and the row of each (Arrow's
    ASCII white-space split: the separators are spaces by then)."""
    lists = pc.ascii_split_whitespace(spaced)
    return pc.list_flatten(lists), pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)


def splice_bytes(text: TextBytes, starts: np.ndarray, lengths: np.ndarray, codes: np.ndarray,
            replacements: tuple[bytes, ...]) -> pa.Array:
    """``text`` with the byte spans (``starts``, ``lengths``; sorted, not overlapping) replaced by
    ``replacements[codes]``: a few numpy passes, whatever the number of spans."""
    data, offsets = text.data, text.offsets
    table = np.frombuffer(b"".join(replacements), np.uint8)
    table_start = np.cumsum([0] + [len(r) for r in replacements])[:-1]
    rep_len = np.array([len(r) for r in replacements], np.int64)[codes]
    keep = np.ones(len(data), bool)
    span_first = np.cumsum(lengths) - lengths
    keep[np.repeat(starts - span_first, lengths) + np.arange(lengths.sum())] = False
    ins_first = np.cumsum(rep_len) - rep_len
    inserted = table[np.repeat(table_start[codes] - ins_first, rep_len) + np.arange(rep_len.sum())]
    out = np.insert(data[keep], np.repeat(starts - span_first, rep_len), inserted)
    # a row boundary moves by what was removed and inserted before it
    before = np.searchsorted(starts, offsets, side="left")
    new_offsets = offsets - np.r_[0, np.cumsum(lengths)][before] + np.r_[0, np.cumsum(rep_len)][before]
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(new_offsets.astype(np.int64)),
                                            pa.py_buffer(out.astype(np.uint8)))


def _whole_words(alternatives: Iterable[str]) -> str:
    """RE2 pattern for the separated text: one of ``alternatives`` as a whole word."""
    alt = "|".join(regex_escape(a) for a in sorted(alternatives, key=lambda s: (-len(s), s)))
    return f"(?:^| )(?:{alt})(?: |$)"


def _scatter(values: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """A string column of ``n`` rows holding ``values`` at ``rows`` and nulls elsewhere."""
    idx = np.full(n, -1, np.int64)
    idx[rows] = np.arange(len(rows))
    return values.cast(pa.string()).take(pa.array(idx, mask=idx < 0))


def _true(mask) -> np.ndarray:
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def blank_captions(captions: pa.Array) -> np.ndarray:
    """True where a caption is null, empty or only white space (``str.isspace``)."""
    return (pc.is_null(captions).to_numpy(zero_copy_only=False)
            | _true(pc.equal(pc.utf8_length(captions), 0)) | _true(pc.utf8_is_space(captions)))


def caption_array(batch: pa.Table, column: str) -> pa.Array:
    """The text column of ``batch`` as one string array; a clear error when it is missing or not text."""
    if column not in batch.column_names:
        raise ValueError(f"caption column {column!r} not found; the columns are {batch.column_names}")
    col = batch.column(column)
    typ = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if pa.types.is_null(typ):  # a column with no value at all (e.g. an all-null parquet column)
        return pa.nulls(len(col), pa.string())
    is_view = getattr(pa.types, "is_string_view", lambda t: False)
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ) or is_view(typ)):
        raise ValueError(f"caption column {column!r} has type {col.type}; the triplet filter needs a string column")
    col = col.cast(pa.large_string() if pa.types.is_large_string(typ) else pa.string())
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


# ---------------------------------------------------------------------------------------------
# the operator


class TripletFilter:
    """Adds ``triplet_status`` (one of ``OUTCOMES``), ``human_word`` (on human_word rows),
    ``neutral``, ``feminine``, ``masculine`` (on kept rows) and ``triplet_source`` (``source``,
    every row)."""

    stage_name = STAGE_TRIPLETS
    resources = Resources(num_cpus=1, batch_size=16384)
    status_column = TRIPLET_STATUS
    outcomes = OUTCOMES

    def __init__(self, text_column: str = LAION_TEXT, human_words: Iterable[str] | None = None, source: str = "custom"):
        self.text_column = text_column
        self.source = source
        self.human_words = default_human_words() if human_words is None else tuple(human_words)
        self.forms = human_word_forms(self.human_words)
        self._forms = pa.array(self.forms, pa.large_string())
        self._human = _whole_words(self.forms)
        self._person = _whole_words(PERSON_WORDS)
        # every casing of person / people: the three the swap mirrors first, then the others
        good = [f for w in PERSON_WORDS for f in _case_forms(w)]
        odd = ["".join(cs) for w in PERSON_WORDS for cs in itertools.product(*((c.lower(), c.upper()) for c in w))]
        self._casings = pa.array(good + [c for c in odd if c not in good], pa.large_string())
        self._n_good = len(good)
        self._good_lengths = np.array([len(f.encode()) for f in good], np.int64)
        # replacement bytes of each mirrored casing: feminine, masculine
        self._targets = tuple(
            tuple(_mirror(PERSON_WORDS[f.lower()][i], f).encode() for f in good) for i in (0, 1)
        )
        _word_code_points()  # build the code point table now, not in the first batch

    def classify(self, captions: pa.Array) -> dict[str, pa.Array]:
        """The five output columns for ``captions`` (a string array)."""
        n = len(captions)
        null = blank_captions(captions)
        codes = np.full(n, _KEPT, np.int8)
        codes[null] = _NULL
        lower = TextBytes.of(pc.utf8_lower(captions)).separated()
        # Table S1: one pass over every caption, the first word extracted where there is one
        human = np.flatnonzero(_true(pc.match_substring_regex(lower, self._human)) & ~null)
        codes[human] = _HUMAN
        first = self._first_human_word(lower.take(pa.array(human, pa.int64())))
        if len(first) != len(human):  # the regex and the word split disagree: a bug, never data
            raise AssertionError("triplet filter: a caption matched Table S1 but none of its words did")
        rest = codes == _KEPT
        person = _true(pc.match_substring_regex(lower, self._person)) & rest
        codes[rest & ~person] = _NO_PERSON
        # the few captions left: their person / people words, by casing
        cand = np.flatnonzero(person)
        text = TextBytes.of(captions.take(pa.array(cand, pa.int64())))
        tokens, starts, rows = text.words()
        casing = pc.index_in(tokens, value_set=self._casings)
        hit = _true(pc.is_valid(casing))
        casing = pc.fill_null(casing, 0).to_numpy(zero_copy_only=False)[hit]
        starts, rows = starts[hit], rows[hit]
        odd = np.zeros(len(cand), bool)
        odd[rows[casing >= self._n_good]] = True
        codes[cand[odd]] = _UNSWAPPABLE
        keep = ~odd[rows]  # person / people words of kept captions (all mirrored casings)
        lengths = self._good_lengths[casing[keep]]
        kept_rows = cand[~odd]
        # splice on the candidates' bytes, then keep the kept rows (odd rows have no span)
        swaps = [splice_bytes(text, starts[keep], lengths, casing[keep], t).take(pa.array(np.flatnonzero(~odd), pa.int64()))
                 for t in self._targets]
        neutral = captions.take(pa.array(kept_rows, pa.int64()))
        return {
            TRIPLET_STATUS: status_array(codes, OUTCOMES),
            HUMAN_WORD: _scatter(first, human, n),
            NEUTRAL: _scatter(neutral, kept_rows, n),
            FEMININE: _scatter(swaps[0], kept_rows, n),
            MASCULINE: _scatter(swaps[1], kept_rows, n),
        }

    def _first_human_word(self, spaced: pa.Array) -> pa.Array:
        """The first human word form of each of ``spaced`` (lower case, separators as spaces; each
        has one): its words looked up in one hash set, the first hit of each row kept (cheaper
        than RE2's ``extract_regex``, which runs a slower engine for the capture group)."""
        tokens, rows = _split_words(spaced)
        idx = pc.index_in(tokens, value_set=self._forms)
        hit = np.flatnonzero(_true(pc.is_valid(idx)))
        _, first = np.unique(rows[hit], return_index=True)  # rows ascend: one first hit per row
        return tokens.take(pa.array(hit[first], pa.int64()))

    def human_word_counts(self, captions: pa.Array) -> dict[str, int]:
        """For each human word form: how many of ``captions`` contain it (a caption naming two
        words counts under each; a word repeated in one caption counts once). Vectorised: the
        captions are split into words once and every word is looked up in one hash set."""
        tokens, rows = _split_words(TextBytes.of(pc.utf8_lower(captions)).separated())
        idx = pc.index_in(tokens, value_set=self._forms)
        hit = _true(pc.is_valid(idx))
        if not hit.any():
            return {}
        w = pc.fill_null(idx, 0).to_numpy(zero_copy_only=False)[hit].astype(np.int64)
        pairs = np.unique(rows[hit] * len(self.forms) + w)  # distinct (caption, word) pairs
        counts = np.bincount(pairs % len(self.forms), minlength=len(self.forms))
        return {self.forms[i]: int(counts[i]) for i in np.flatnonzero(counts)}

    def __call__(self, batch: pa.Table) -> pa.Table:
        for name, values in self.classify(caption_array(batch, self.text_column)).items():
            batch = with_column(batch, name, values)
        return with_column(batch, TRIPLET_SOURCE, pa.repeat(pa.scalar(self.source, pa.string()), batch.num_rows))
