"""Rebuild the dataset-layout fixtures of tests/data/datasets/ from real rows nobody here wrote.

Two steps (see the section "Real dataset rows" of tests/data/README.md for the provenance):

  python tests/data/datasets/make_fixtures.py extract \
      --test-10000 <img2dataset checkout>/tests/test_files/test_10000.parquet \
      --original-png <img2dataset checkout>/tests/blur_test_files/original.png

      Picks rows of img2dataset's test_10000.parquet (URL, TEXT): every row whose TEXT names an
      occupation of paper 002 (Tables 6 and 7) plus the first NON_MATCHING rows (in file order)
      that name none, and writes them verbatim, with their row number in the source file, to
      sources/img2dataset_test_10000_extract.parquet. Also records the size and SHA-256 of
      img2dataset's blur test image (the image test_bbox.parquet's URL points to) in
      sources/img2dataset_original_png.json.

  python tests/data/datasets/make_fixtures.py build

      Writes the fixtures from the files in sources/ only (no network, no img2dataset checkout).

Every column a source has no real value for is a typed null, except where the value follows from
the row itself (documented per column in the README and in the COLUMN NOTES below).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import html
import json
import re
import struct
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "sources"
DATA = HERE.parent  # tests/data
EXTRACT = SOURCES / "img2dataset_test_10000_extract.parquet"
PNG_FACTS = SOURCES / "img2dataset_original_png.json"
BBOX_SOURCE = SOURCES / "img2dataset_test_bbox.parquet"
COYO_README = SOURCES / "coyo-dataset_README.md"
NON_MATCHING = 104  # with the 196 matching rows of test_10000.parquet: 300 rows

# ---------------------------------------------------------------------------------------------
# Occupations of paper 002 and the matcher used to pick and count rows (whole words, case
# insensitive, the name or its regular English plural; underscores in names are spaces).


def occupation_names() -> list[str]:
    names = set()
    for table in ("paper002_table6.csv", "paper002_table7.csv"):
        with open(DATA / table, newline="") as f:
            names.update(row["occupation"] for row in csv.DictReader(f))
    return sorted(n.replace("_", " ") for n in names)


def _plural(term: str) -> str:
    if re.search(r"(s|x|z|ch|sh)$", term):
        return term + "es"
    if term.endswith("y") and not re.search(r"[aeiou]y$", term):
        return term[:-1] + "ies"
    return term + "s"


def occupation_patterns() -> dict[str, re.Pattern]:
    return {
        n: re.compile(r"\b(%s|%s)\b" % (re.escape(n), re.escape(_plural(n))), re.IGNORECASE)
        for n in occupation_names()
    }


def occupations_in(text: str | None, patterns) -> list[str]:
    return [n for n, p in patterns.items() if text and p.search(text)]


def occupation_counts(texts, patterns) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in texts:
        for n in occupations_in(t, patterns):
            counts[n] = counts.get(n, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# ---------------------------------------------------------------------------------------------
# MurmurHash3 x64 128 (seed 0), first half as a signed 64-bit integer: mmh3.hash64(b)[0], the
# function LAION used for the `hash` column (rom1504/laion-prepro laion5B/safety/join.py:
# mmh3.hash64((url + text).encode("utf-8"))[0], None counted as "").

_M = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M
    k ^= k >> 33
    return k


def murmur3_x64_128(data: bytes, seed: int = 0) -> tuple[int, int]:
    c1, c2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
    h1 = h2 = seed & _M
    n = len(data)
    nblocks = n // 16
    for i in range(nblocks):
        k1, k2 = struct.unpack_from("<QQ", data, 16 * i)
        k1 = (_rotl((k1 * c1) & _M, 31) * c2) & _M
        h1 ^= k1
        h1 = (((_rotl(h1, 27) + h2) & _M) * 5 + 0x52DCE729) & _M
        k2 = (_rotl((k2 * c2) & _M, 33) * c1) & _M
        h2 ^= k2
        h2 = (((_rotl(h2, 31) + h1) & _M) * 5 + 0x38495AB5) & _M
    tail = data[16 * nblocks:]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl((k2 * c2) & _M, 33) * c1) & _M
    if len(tail) > 0:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl((k1 * c1) & _M, 31) * c2) & _M
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M
    h2 = (h2 + h1) & _M
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _M
    h2 = (h2 + h1) & _M
    return h1, h2


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def laion_hash(url: str | None, text: str | None) -> int:
    return _signed(murmur3_x64_128(((url or "") + (text or "")).encode("utf-8"))[0])


# ---------------------------------------------------------------------------------------------
# Layouts: (name, Arrow type) in file order. Sources are listed in the README.

LAION2B_EN = [  # laion/laion2B-en (and LAION-400M's laion400m-meta, same names)
    ("SAMPLE_ID", pa.int64()), ("URL", pa.string()), ("TEXT", pa.string()),
    ("HEIGHT", pa.int32()), ("WIDTH", pa.int32()), ("LICENSE", pa.string()),
    ("NSFW", pa.string()), ("similarity", pa.float64()),
]
LAION2B_EN_JOINED = [  # laion/laion2B-en-joined (with punsafe/pwatermark)
    ("URL", pa.string()), ("TEXT", pa.string()), ("WIDTH", pa.int32()), ("HEIGHT", pa.int32()),
    ("similarity", pa.float64()), ("hash", pa.int64()), ("punsafe", pa.float32()),
    ("pwatermark", pa.float32()),
]
RELAION2B_EN_RESEARCH = [  # laion/relaion2B-en-research(-safe); order verified, types not
    ("url", pa.string()), ("similarity", pa.float64()), ("hash", pa.int64()),
    ("pwatermark", pa.float32()), ("punsafe", pa.float32()), ("caption", pa.string()),
    ("key", pa.string()), ("status", pa.string()), ("error_message", pa.string()),
    ("width", pa.int32()), ("height", pa.int32()), ("original_width", pa.int32()),
    ("original_height", pa.int32()), ("exif", pa.string()), ("md5", pa.string()),
]
COYO700M = [  # kakaobrain/coyo-700m (card: long / string / integer / float)
    ("id", pa.int64()), ("url", pa.string()), ("text", pa.string()), ("width", pa.int32()),
    ("height", pa.int32()), ("image_phash", pa.string()), ("text_length", pa.int32()),
    ("word_count", pa.int32()), ("num_tokens_bert", pa.int32()), ("num_tokens_gpt", pa.int32()),
    ("num_faces", pa.int32()), ("clip_similarity_vitb32", pa.float32()),
    ("clip_similarity_vitl14", pa.float32()), ("nsfw_score_opennsfw2", pa.float32()),
    ("nsfw_score_gantman", pa.float32()), ("watermark_score", pa.float32()),
    ("aesthetic_score_laion_v2", pa.float32()),
]
DATACOMP = [  # mlfoundations/datacomp_{small,medium,large,xlarge} (CommonPool) and datacomp_1b
    ("uid", pa.string()), ("url", pa.string()), ("text", pa.string()),
    ("original_width", pa.int64()), ("original_height", pa.int64()),
    ("clip_b32_similarity_score", pa.float32()), ("clip_l14_similarity_score", pa.float32()),
    ("face_bboxes", pa.list_(pa.list_(pa.float64()))), ("sha256", pa.string()),
]


def table(layout, columns: dict, n: int) -> pa.Table:
    """The layout's columns in order; a column not given is all typed nulls."""
    arrays = []
    for name, typ in layout:
        values = columns.get(name)
        arrays.append(pa.nulls(n, typ) if values is None else pa.array(values, type=typ))
    return pa.Table.from_arrays(arrays, schema=pa.schema([pa.field(nm, t) for nm, t in layout]))


# ---------------------------------------------------------------------------------------------
# extract


def png_size(path: Path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def extract(args) -> None:
    source = pq.read_table(args.test_10000, columns=["URL", "TEXT"])
    urls, texts = source["URL"].to_pylist(), source["TEXT"].to_pylist()
    patterns = occupation_patterns()
    matching = [i for i, t in enumerate(texts) if occupations_in(t, patterns)]
    others = [i for i, t in enumerate(texts) if not occupations_in(t, patterns)][:NON_MATCHING]
    rows = sorted(matching + others)
    out = pa.table({
        "source_row": pa.array(rows, pa.int64()),
        "URL": pa.array([urls[i] for i in rows], pa.string()),
        "TEXT": pa.array([texts[i] for i in rows], pa.string()),
    })
    pq.write_table(out, EXTRACT, compression="zstd")
    print(f"{EXTRACT.name}: {out.num_rows} rows ({len(matching)} naming an occupation)")
    if args.original_png:
        raw = Path(args.original_png).read_bytes()
        w, h = png_size(Path(args.original_png))
        facts = {"path": "tests/blur_test_files/original.png", "width": w, "height": h,
                 "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
        PNG_FACTS.write_text(json.dumps(facts, indent=2) + "\n")
        print(f"{PNG_FACTS.name}: {facts}")


# ---------------------------------------------------------------------------------------------
# build


def coyo_readme_rows() -> list[dict]:
    """The 7 example rows of the COYO-700M README table (all 17 columns real)."""
    rows = []
    for line in COYO_README.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 17 or not cells[0].isdigit():
            continue
        src = re.search(r'src="([^"]+)"', cells[1])
        rows.append({
            "id": int(cells[0]), "url": html.unescape(src.group(1)), "text": cells[2],
            "width": int(cells[3]), "height": int(cells[4]), "image_phash": cells[5],
            **{k: int(v) for k, v in zip(
                ("text_length", "word_count", "num_tokens_bert", "num_tokens_gpt", "num_faces"),
                cells[6:11])},
            **{k: float(v) for k, v in zip(
                ("clip_similarity_vitb32", "clip_similarity_vitl14", "nsfw_score_opennsfw2",
                 "nsfw_score_gantman", "watermark_score", "aesthetic_score_laion_v2"),
                cells[11:17])},
        })
    if len(rows) != 7:
        raise ValueError(f"expected 7 example rows in {COYO_README.name}, found {len(rows)}")
    return rows


def build(_args) -> dict[str, dict]:
    ext = pq.read_table(EXTRACT)
    urls, texts = ext["URL"].to_pylist(), ext["TEXT"].to_pylist()
    n = ext.num_rows
    hashes = [laion_hash(u, t) for u, t in zip(urls, texts)]
    patterns = occupation_patterns()
    written = {}

    def write(name: str, tbl: pa.Table, text_col: str) -> None:
        path = HERE / name
        pq.write_table(tbl, path, compression="zstd")
        written[name] = {"rows": tbl.num_rows, "bytes": path.stat().st_size,
                         "occupations": occupation_counts(tbl[text_col].to_pylist(), patterns)}

    write("laion2b_en.parquet", table(LAION2B_EN, {"URL": urls, "TEXT": texts}, n), "TEXT")
    write("laion2b_en_joined.parquet",
          table(LAION2B_EN_JOINED, {"URL": urls, "TEXT": texts, "hash": hashes}, n), "TEXT")
    write("relaion2b_en_research.parquet",
          table(RELAION2B_EN_RESEARCH, {"url": urls, "caption": texts, "hash": hashes}, n),
          "caption")

    coyo = coyo_readme_rows()
    cols = {name: [r[name] for r in coyo] + [None] * n for name, _ in COYO700M}
    cols["url"] = [r["url"] for r in coyo] + urls
    cols["text"] = [r["text"] for r in coyo] + texts
    cols["text_length"] = [r["text_length"] for r in coyo] + [len(t) for t in texts]
    write("coyo700m.parquet", table(COYO700M, cols, len(coyo) + n), "text")

    bbox = pq.read_table(BBOX_SOURCE).to_pylist()  # url, txt, bboxes
    png = json.loads(PNG_FACTS.read_text())
    m = len(bbox)
    cols = {
        "url": urls + [r["url"] for r in bbox],
        "text": texts + [r["txt"] for r in bbox],
        "original_width": [None] * n + [png["width"]] * m,
        "original_height": [None] * n + [png["height"]] * m,
        "face_bboxes": [None] * n + [r["bboxes"] for r in bbox],
        "sha256": [None] * n + [png["sha256"]] * m,
    }
    write("datacomp_commonpool.parquet", table(DATACOMP, cols, n + m), "text")

    k = 20
    amb = pa.table({
        "url": pa.array(urls[:k], pa.string()), "caption": pa.array(texts[:k], pa.string()),
        "URL": pa.array(urls[:k], pa.string()), "text": pa.array(texts[:k], pa.string()),
        "similarity": pa.nulls(k, pa.float64()),
    })
    write("ambiguous_columns.parquet", amb, "caption")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("extract")
    p.add_argument("--test-10000", required=True, help="img2dataset tests/test_files/test_10000.parquet")
    p.add_argument("--original-png", help="img2dataset tests/blur_test_files/original.png")
    sub.add_parser("build")
    args = parser.parse_args(argv)
    if args.command == "extract":
        extract(args)
    else:
        for name, facts in build(args).items():
            print(name, json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
