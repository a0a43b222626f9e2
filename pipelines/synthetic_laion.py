"""Synthetic LAION-like metadata parquet with ground truth -- NOT real LAION data.

Captions are assembled from templates so that the occupations, explicit gender indicators and
person names in each caption are known. Ground-truth columns (prefixed ``gt_``) let tests and
the embedded default run check the caption side end to end:

* ``gt_occupations``   occupations the caption names (list, in configuration order)
* ``gt_caption_gender`` male / female / both / none: the explicit indicators put in the caption
* ``gt_indicator_kinds`` which kinds of evidence were put in (word, pronoun, name)

A few captions carry a NUL or a zero-width space where a space belongs, as scraped captions do.

Usage: python pipelines/synthetic_laion.py --rows 30000 --output data/synthetic/laion_synthetic_sample.parquet
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.engine.storage.io import WRITE_OPTIONS  # noqa: E402 (page checksums, as every parquet file the project writes)
from schemas.occupations import indefinite_article, plural  # noqa: E402

DEFAULT_OCCUPATIONS = [
    "accountant", "architect", "assistant", "athlete", "attorney", "author", "baker", "bartender", "ceo",
    "chef", "comedian", "cook", "dancer", "dentist", "dietitian", "doctor", "engineer", "entrepreneur",
    "fashion designer", "filmmaker", "firefighter", "graphic designer", "hairdresser", "housekeeper",
    "intern", "janitor", "journalist", "lawyer", "librarian", "manager", "mechanic", "musician", "nurse",
    "nutritionist", "painter", "pharmacist", "photographer", "physician", "pilot", "poet", "politician",
    "president", "prime minister", "professor", "programmer", "psychologist", "receptionist", "reporter",
    "researcher", "salesperson", "scientist", "senator", "singer", "student", "supervisor", "surgeon",
    "teacher", "technician", "therapist", "tutor", "veterinarian", "writer",
]
MALE_NAMES = ["John", "Michael", "David", "James", "Robert", "William", "Thomas", "Daniel", "Richard", "Peter"]
FEMALE_NAMES = ["Mary", "Jennifer", "Linda", "Sarah", "Emily", "Jessica", "Karen", "Laura", "Susan", "Anna"]
SURNAMES = ["Smith", "Johnson", "Williams", "Brown", "Miller", "Davis", "Wilson", "Anderson", "Taylor", "Moore"]
MALE_WORDS = ["man", "male", "gentleman", "boy"]
FEMALE_WORDS = ["woman", "female", "lady", "girl"]
ADJECTIVES = ["young", "smiling", "confident", "happy", "serious", "senior", "friendly", "busy"]
CONTEXTS = [
    "in a modern office", "at the construction site", "with a laptop", "during a meeting",
    "in the city park", "on a sunny day", "isolated on white background", "stock photo",
    "in a bright studio", "at the annual conference", "in front of a brick wall", "close up",
]
# Captions with no occupation, including whole-word traps for both matchers.
NON_OCCUPATION = [
    "Fresh chocolate chip cookies on a plate", "Internal combustion engine parts on a table",
    "Sunset over the hills", "The hero of the story returns", "Shepherd's pie recipe with vegetables",
    "Abstract watercolor background", "Mountain lake with reflections", "Vintage car on the road",
    "Themed birthday party decorations", "Wooden table with a cup of coffee", "Cookbook cover design",
    "Internship application form template", "Engineering drawing of a bridge", "Theatre stage lights",
]


def _a(word: str) -> str:
    return f"{indefinite_article(word)} {word}"


def make_caption(rng: np.random.Generator, occupations: list[str]) -> tuple[str, list[str], str, list[str]]:
    """One synthetic caption: (text, occupations in it, explicit caption gender, evidence kinds)."""
    occ = occupations[rng.integers(len(occupations))]
    adj = ADJECTIVES[rng.integers(len(ADJECTIVES))]
    ctx = CONTEXTS[rng.integers(len(CONTEXTS))]
    kind = rng.choice(["word", "pronoun", "name", "plain", "prompt_like", "plural", "two"],
                      p=[0.22, 0.14, 0.14, 0.22, 0.12, 0.08, 0.08])
    male = rng.random() < 0.5
    if kind == "word":
        w = (MALE_WORDS if male else FEMALE_WORDS)[rng.integers(4)]
        return f"Portrait of {_a(adj)} {w} {occ} {ctx}", [occ], "male" if male else "female", ["word"]
    if kind == "pronoun":
        p = "his" if male else "her"
        return f"{occ.capitalize()} working at {p} desk {ctx}", [occ], "male" if male else "female", ["pronoun"]
    if kind == "name":
        first = (MALE_NAMES if male else FEMALE_NAMES)[rng.integers(10)]
        last = SURNAMES[rng.integers(10)]
        return f"{occ.title()} {first} {last} speaks {ctx}", [occ], "male" if male else "female", ["name"]
    if kind == "plain":
        return f"{_a(adj).capitalize()} {occ} {ctx}", [occ], "none", []
    if kind == "prompt_like":
        return f"A photo of {_a(occ)} smiling", [occ], "none", []
    if kind == "plural":
        return f"Group of {plural(occ)} {ctx}", [occ], "none", []
    other = occupations[rng.integers(len(occupations))]
    if other == occ:
        return f"Portrait of {_a(occ)} {ctx}", [occ], "none", []
    both = sorted({occ, other}, key=occupations.index)
    return f"{occ.capitalize()} and {other} discussing a project", both, "none", []


def _scraped(text: str, i: int, kinds: list[str]) -> str:
    """Some captions as web text holds them (ground truth unchanged, no random draw): a NUL between
    the occupation and a person's name (1 name caption in 50), a zero-width space for a space (1
    caption without indicators in 97). The caption scan makes both spaces (normalise_captions)."""
    if kinds == ["name"] and i % 50 == 7:
        return text.replace(" ", "\x00", 1)
    if not kinds and i % 97 == 11:
        return text.replace(" ", "\u200b", 1)
    return text


def generate(rows: int, seed: int = 0, occupation_share: float = 0.5, bad_share: float = 0.01,
             occupations: list[str] | None = None) -> pa.Table:
    """``rows`` synthetic LAION-like rows; ``occupation_share`` of them name an occupation."""
    occupations = occupations or DEFAULT_OCCUPATIONS
    rng = np.random.default_rng(seed)
    text, url, gt_occ, gt_gender, gt_kinds = [], [], [], [], []
    for i in range(rows):
        r = rng.random()
        if r < bad_share:
            t, o, g, k = (None, "", "   ")[i % 3], [], "none", []
        elif r < bad_share + occupation_share:
            t, o, g, k = make_caption(rng, occupations)
            t = _scraped(t, i, k)
        else:
            t, o, g, k = NON_OCCUPATION[rng.integers(len(NON_OCCUPATION))] + f" {rng.integers(1000)}", [], "none", []
        text.append(t)
        url.append(f"https://images.example.org/synthetic/{seed}/{i:09d}.jpg")
        gt_occ.append(o)
        gt_gender.append(g)
        gt_kinds.append(k)
    return pa.table(
        {
            "URL": pa.array(url, pa.string()),
            "TEXT": pa.array(text, pa.string()),
            "WIDTH": pa.array(rng.integers(256, 1024, rows), pa.int32()),
            "HEIGHT": pa.array(rng.integers(256, 1024, rows), pa.int32()),
            "similarity": pa.array(rng.uniform(0.28, 0.4, rows), pa.float32()),
            "gt_occupations": pa.array(gt_occ, pa.list_(pa.string())),
            "gt_caption_gender": pa.array(gt_gender, pa.string()),
            "gt_indicator_kinds": pa.array(gt_kinds, pa.list_(pa.string())),
        },
        metadata={b"synthetic": b"true", b"generator": b"pipelines/synthetic_laion.py", b"seed": str(seed).encode()},
    )


def write(table: pa.Table, path: str | Path, files: int = 1) -> list[Path]:
    """Write ``table`` as one parquet file, or ``files`` part files in a directory."""
    path = Path(path)
    if files == 1:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=8192, **WRITE_OPTIONS)
        return [path]
    path.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    out = []
    for i in range(files):
        p = path / f"part-{i:05d}.parquet"
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), p, row_group_size=8192, **WRITE_OPTIONS)
        out.append(p)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=30000, help="number of rows (default 30000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--occupation-share", type=float, default=0.5, help="share of captions naming an occupation")
    ap.add_argument("--files", type=int, default=1, help="split into this many parquet files (a directory)")
    ap.add_argument("--output", required=True, help="output .parquet file, or directory when --files > 1")
    args = ap.parse_args(argv)
    paths = write(generate(args.rows, args.seed, args.occupation_share), args.output, args.files)
    print(f"wrote {args.rows} synthetic rows to {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
