"""Known dataset layouts (schemas/datasets.py) and the choice of the caption / URL columns
(pipelines/engine/storage/datasets.py, pipelines/engine/storage/inputs.py), on real-row fixtures of every layout
(tests/data/README.md "Real dataset rows"); hf:// through a local fake filesystem; the full input
identity; parquet page checksums. Fast tier: no Ray, no models."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from pipelines.engine.storage import io
from pipelines.engine.storage.datasets import ColumnError, choose_columns, named_dataset
from pipelines.engine.storage.input_integrity import page_checksummed
from pipelines.engine.storage.inputs import IDENTITIES, choose_input_columns, resolve_parquet_inputs
from schemas.datasets import BY_KEY, COYO, DATACOMP, LAION, RELAION

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets"
FIXTURES = sorted(p.name for p in DATA.glob("*.parquet"))


def names_of(path: Path) -> list[str]:
    return pq.read_schema(path).names


def files_of(*paths: Path) -> list[tuple[str, list[str]]]:
    return [(str(p), names_of(p)) for p in paths]


# ---------------------------------------------------------------------------------------------
# 1. every fixture is recognised from its footer

# file -> (layout, caption, url, variant, extras in the layout's order)
EXPECTED = {
    "laion2b_en.parquet": (LAION, "TEXT", "URL", "LAION-2B-en",
                           ["SAMPLE_ID", "WIDTH", "HEIGHT", "LICENSE", "NSFW", "similarity"]),
    "laion2b_en_joined.parquet": (LAION, "TEXT", "URL", "LAION-2B-en-joined",
                                  ["WIDTH", "HEIGHT", "similarity", "hash", "punsafe", "pwatermark"]),
    "relaion2b_en_research.parquet": (RELAION, "caption", "url", "Re-LAION-2B-en research",
                                      ["key", "similarity", "hash", "pwatermark", "punsafe", "status", "error_message",
                                       "width", "height", "original_width", "original_height", "exif", "md5"]),
    "coyo700m.parquet": (COYO, "text", "url", "COYO-700M", list(COYO.extras) + ["id"]),
    "datacomp_commonpool.parquet": (DATACOMP, "text", "url", "DataComp CommonPool", list(DATACOMP.extras) + ["uid"]),
}


def test_every_fixture_is_covered():
    assert set(FIXTURES) == set(EXPECTED) | {"ambiguous_columns.parquet"}
    # the fixtures really are in their layouts: every signature column and every extra present
    for name, (layout, caption, url, _, extras) in EXPECTED.items():
        cols = names_of(DATA / name)
        assert set(layout.signature) <= set(cols) and {caption, url} <= set(cols), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_choose_columns_recognises_each_layout(name):
    layout, caption, url, variant, extras = EXPECTED[name]
    path = DATA / name
    choice = choose_columns(files_of(path), paths=[str(path)])
    assert (choice.caption, choice.url) == (caption, url)
    assert choice.layout is layout and choice.layout.key == layout.key
    assert choice.variant == variant and choice.variant_from == "from the path"
    assert choice.name is None and choice.dataset == variant
    assert choice.extras == extras
    assert choice.why_caption == choice.why_url == f"the {layout.title} layout: columns {', '.join(layout.signature)}"
    line = choice.line()
    assert line.startswith("input columns: ") and "\n" not in line
    assert f"caption {caption!r}" in line and f"URL {url!r}" in line
    assert line.endswith(f"; dataset: {variant} (from the path)")
    assert layout.title in line  # why: the layout's columns
    record = choice.record()
    assert record == {"dataset": variant, "layout": layout.key, "variant": variant, "name": None,
                      "caption_column": caption, "url_column": url, "why_caption": choice.why_caption,
                      "why_url": choice.why_url, "extra_columns": extras, "variant_from": "from the path"}
    json.dumps(record)  # recorded in run.json as it is


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_choose_input_columns_reads_the_footers(name):
    """The same choice through ``inputs``: schemas from the footers (resolve_parquet_inputs)."""
    layout, caption, url, variant, extras = EXPECTED[name]
    inp = resolve_parquet_inputs(str(DATA / name))
    choice = choose_input_columns(inp, None, None, paths=[str(DATA / name)])
    assert (choice.layout, choice.caption, choice.url, choice.variant, choice.extras) == (layout, caption, url,
                                                                                          variant, extras)


def test_variant_from_a_folder_path(tmp_path):
    """Re-LAION's two releases share one layout: only the path tells research from research-safe,
    also in the upstream spelling (relaion2B-en-...) and with the variant in a folder name."""
    safe = tmp_path / "relaion2B-en-research-safe" / "part-00000.parquet"
    plain = tmp_path / "relaion2B-en-research" / "part-00000.parquet"
    for p in (safe, plain):
        p.parent.mkdir(parents=True)
        shutil.copy(DATA / "relaion2b_en_research.parquet", p)
    assert choose_columns(files_of(safe), paths=[str(safe.parent)]).variant == "Re-LAION-2B-en research-safe"
    assert choose_columns(files_of(plain), paths=[str(plain.parent)]).variant == "Re-LAION-2B-en research"
    # through the footers of a folder
    inp = resolve_parquet_inputs(str(safe.parent))
    choice = choose_input_columns(inp, None, None, paths=[str(safe.parent)])
    assert choice.variant == "Re-LAION-2B-en research-safe"
    assert choice.line().endswith("dataset: Re-LAION-2B-en research-safe (from the path)")
    # no variant in the path: the layout's title, and no "from the path"
    bare = tmp_path / "captions.parquet"
    shutil.copy(DATA / "relaion2b_en_research.parquet", bare)
    choice = choose_columns(files_of(bare), paths=[str(bare)])
    assert choice.layout is RELAION and choice.variant is None and choice.variant_from == ""
    assert choice.dataset == RELAION.title and choice.line().endswith(f"dataset: {RELAION.title}")


# ---------------------------------------------------------------------------------------------
# 2. flags: --caption-column / --url-column / --dataset-name


def test_an_explicit_caption_column_wins():
    path = DATA / "relaion2b_en_research.parquet"
    choice = choose_columns(files_of(path), caption_flag="error_message", paths=[str(path)])
    assert choice.caption == "error_message" and choice.why_caption == "--caption-column"
    assert choice.url == "url" and choice.layout is RELAION  # the layout still gives the URL
    assert "caption 'error_message' (--caption-column)" in choice.line()
    # case-insensitive: the file's own spelling
    choice = choose_columns(files_of(path), caption_flag="KEY", url_flag="URL")
    assert (choice.caption, choice.url) == ("key", "url")
    assert choice.why_caption == "--caption-column" and choice.why_url == "--url-column"
    laion = DATA / "laion2b_en.parquet"
    assert choose_columns(files_of(laion), caption_flag="text").caption == "TEXT"
    # a flag naming no column is an error naming the column and the flag
    with pytest.raises(ColumnError, match=r"has no caption column 'prompt' \(--caption-column; columns: SAMPLE_ID"):
        choose_columns(files_of(laion), caption_flag="prompt")
    # --url-column none: no URL
    choice = choose_columns(files_of(laion), url_flag="None")
    assert choice.url is None and choice.why_url == "--url-column none"
    assert "no URL column (--url-column none)" in choice.line()


def test_dataset_name_as_key_and_as_variant():
    path = DATA / "relaion2b_en_research.parquet"
    assert named_dataset("relaion") == (RELAION, None)
    assert named_dataset("relaion2B-en-research-safe") == (RELAION, "Re-LAION-2B-en research-safe")
    assert named_dataset("Re-LAION-2B-en research") == (RELAION, "Re-LAION-2B-en research")
    assert named_dataset("LAION2B_EN") == (LAION, "LAION-2B-en")
    assert named_dataset("my crawl") == (None, None)

    choice = choose_columns(files_of(path), dataset_name="relaion")
    assert choice.layout is RELAION and choice.variant_from == "--dataset-name" and choice.name is None
    assert (choice.caption, choice.url) == ("caption", "url")
    # a variant name: that variant, even though the file name says "research"
    choice = choose_columns(files_of(path), dataset_name="relaion2B-en-research-safe", paths=[str(path)])
    assert choice.layout is RELAION and choice.variant == "Re-LAION-2B-en research-safe"
    assert choice.record()["variant_from"] == "--dataset-name"
    assert choice.line().endswith("dataset: Re-LAION-2B-en research-safe (--dataset-name)")
    # --dataset-name picks the layout's columns: on the ambiguous file it decides the layout, not the columns
    with pytest.raises(ColumnError, match="ambiguous"):
        choose_columns(files_of(DATA / "ambiguous_columns.parquet"), dataset_name="relaion")


def test_dataset_name_of_another_layout_is_an_error():
    laion = DATA / "laion2b_en.parquet"
    with pytest.raises(ColumnError) as err:
        choose_columns(files_of(laion), dataset_name="coyo")
    msg = str(err.value)
    assert str(laion) in msg and "not in the COYO-700M layout (--dataset-name coyo)" in msg
    assert "it lacks id, url, text" in msg and "\n" not in msg
    # the check is exact: LAION's upper-case URL/TEXT are not Re-LAION's url/caption
    with pytest.raises(ColumnError, match="it lacks url, caption"):
        choose_columns(files_of(laion), dataset_name="relaion")
    # through io: an InputError (one line)
    inp = resolve_parquet_inputs(str(laion))
    with pytest.raises(io.InputError, match="lacks id, url, text"):
        choose_input_columns(inp, None, None, dataset_name="coyo")


def test_a_free_text_dataset_name_is_recorded():
    path = DATA / "datacomp_commonpool.parquet"
    choice = choose_columns(files_of(path), dataset_name="  my DataComp sample  ", paths=[str(path)])
    assert choice.name == "my DataComp sample" and choice.dataset == "my DataComp sample"
    assert choice.layout is DATACOMP and (choice.caption, choice.url) == ("text", "url")  # still recognised
    record = choice.record()
    assert record["name"] == "my DataComp sample" and record["dataset"] == "my DataComp sample"
    assert record["layout"] == "datacomp" and record["variant_from"] == "--dataset-name"
    assert "dataset: my DataComp sample (--dataset-name)" in choice.line()


# ---------------------------------------------------------------------------------------------
# 3. errors and the fallback rule


def test_ambiguous_columns_name_both_candidates_and_the_flag():
    amb = DATA / "ambiguous_columns.parquet"
    assert names_of(amb) == ["url", "caption", "URL", "text", "similarity"]
    with pytest.raises(ColumnError) as err:
        choose_columns(files_of(amb))
    msg = str(err.value)
    assert str(amb) in msg and "ambiguous" in msg and "'caption'" in msg and "'text'" in msg
    assert "--caption-column" in msg and "\n" not in msg
    # the caption flagged, the URL is still ambiguous
    with pytest.raises(ColumnError) as err:
        choose_columns(files_of(amb), caption_flag="caption")
    msg = str(err.value)
    assert "'url'" in msg and "'URL'" in msg and "--url-column" in msg and "caption" not in msg.split(":", 1)[1]
    # both flagged (the URL by its exact spelling): chosen
    choice = choose_columns(files_of(amb), caption_flag="text", url_flag="URL")
    assert (choice.caption, choice.url) == ("text", "URL")
    # without URLs only the caption is ambiguous
    choice = choose_columns(files_of(amb), caption_flag="caption", url=False)
    assert choice.caption == "caption" and choice.url is None
    # through io: a one-line InputError
    inp = resolve_parquet_inputs(str(amb))
    with pytest.raises(io.InputError, match=r"'caption' and also 'text'; choose with --caption-column"):
        choose_input_columns(inp, None, None)


def test_files_of_two_layouts_in_one_input(tmp_path):
    laion, relaion = DATA / "laion2b_en.parquet", DATA / "relaion2b_en_research.parquet"
    with pytest.raises(ColumnError) as err:
        choose_columns(files_of(laion, relaion))
    msg = str(err.value)
    assert "different column layouts" in msg and str(laion) in msg and str(relaion) in msg
    assert LAION.title in msg and RELAION.title in msg and "--caption-column" in msg
    # a recognised file beside an unrecognised one too
    with pytest.raises(ColumnError, match=r"unrecognised"):
        choose_columns(files_of(laion) + [("other.parquet", ["TEXT", "link"])])
    # a folder holding both: the same error from the footers
    for p in (laion, relaion):
        shutil.copy(p, tmp_path / p.name)
    inp = resolve_parquet_inputs(str(tmp_path))
    with pytest.raises(io.InputError, match="different column layouts") as err:
        choose_input_columns(inp, None, None)
    assert "laion2b_en.parquet" in str(err.value) and "relaion2b_en_research.parquet" in str(err.value)
    # the two files of one layout in one folder are fine (their common extras only)
    both = tmp_path / "laion"
    both.mkdir()
    shutil.copy(DATA / "laion2b_en.parquet", both / "a.parquet")
    shutil.copy(DATA / "laion2b_en_joined.parquet", both / "b.parquet")
    choice = choose_input_columns(resolve_parquet_inputs(str(both)), None, None)
    assert choice.layout is LAION and choice.extras == ["WIDTH", "HEIGHT", "similarity"]


def test_no_caption_like_column_is_an_error():
    with pytest.raises(ColumnError) as err:
        choose_columns([("x.parquet", ["url", "prompt_id", "score"])])
    msg = str(err.value)
    assert msg.startswith("x.parquet has no caption column") and "TEXT" in msg and "--caption-column" in msg
    with pytest.raises(ColumnError, match="has no url column .*--url-column none"):
        choose_columns([("x.parquet", ["alt", "link"])])


def test_the_only_caption_like_column_is_chosen():
    choice = choose_columns([("crawl.parquet", ["Alt_Text", "image_url", "n"])])
    assert choice.layout is None and choice.dataset == "unrecognised layout"
    assert (choice.caption, choice.url) == ("Alt_Text", "image_url")
    assert choice.why_caption == "the only caption-like column" and choice.why_url == "the only url-like column"
    assert "caption 'Alt_Text' (the only caption-like column)" in choice.line()
    assert choice.extras == [] and choice.record()["layout"] is None
    # two caption-like columns and no layout: ambiguous
    with pytest.raises(ColumnError, match=r"caption candidates 'sentence', 'alt'; choose with --caption-column"):
        choose_columns([("c.parquet", ["sentence", "alt", "url"])])


def test_variant_of_paths():
    from pipelines.engine.storage.datasets import variant_of

    assert variant_of(DATACOMP, ["s3://bucket/datacomp_small/shards/0000.parquet"]) == "DataComp CommonPool small"
    assert variant_of(LAION, ["/data/LAION2B_EN_JOINED/part-1.parquet"]) == "LAION-2B-en-joined"
    assert variant_of(LAION, ["/data/laion400m-meta/part-1.parquet"]) == "LAION-400M"
    assert variant_of(COYO, ["hf://datasets/kakaobrain/coyo-700m/data/part.parquet"]) == "COYO-700M"
    assert variant_of(RELAION, ["/data/relaion1B-nolang-research-safe/x.parquet"]) == "Re-LAION-1B-nolang research-safe"
    assert variant_of(RELAION, ["/data/captions.parquet"]) is None and variant_of(None, ["/laion2B-en"]) is None
    assert set(BY_KEY) == {"laion", "relaion", "coyo", "datacomp"}


def test_amplification_validate_input_records_the_dataset(tmp_path, capsys):
    from types import SimpleNamespace

    from pipelines.studies.amplification.caption_settings import validate_input

    src = tmp_path / "laion2B-en-joined" / "part-0.parquet"
    src.parent.mkdir()
    shutil.copy(DATA / "laion2b_en_joined.parquet", src)
    args = SimpleNamespace(captions=[str(src.parent)], caption_column=None, url_column=None, dataset_name=None,
                           keep_columns=["hash"], input_identity="full")
    inp, columns, kept = validate_input(args, SimpleNamespace(execution={}))
    assert columns["text_column"] == "TEXT" and columns["url_column"] == "URL"
    assert columns["kept_columns"] == ["hash"] and [f.name for f in kept] == ["hash"]
    assert columns["dataset"]["variant"] == "LAION-2B-en-joined" and columns["dataset"]["layout"] == "laion"
    assert "sha256=" in inp.identities[0]
    assert "dataset: LAION-2B-en-joined (from the path)" in capsys.readouterr().out
    args.captions = [str(DATA / "ambiguous_columns.parquet")]
    with pytest.raises(io.InputError, match="ambiguous"):
        validate_input(args, SimpleNamespace(execution={}))


def test_url_false_reads_no_url():
    path = DATA / "coyo700m.parquet"
    choice = choose_columns(files_of(path), url=False)
    assert choice.caption == "text" and choice.url is None and choice.why_url == "not read"
    assert "no URL column (not read)" in choice.line()
    # a file without any URL column is fine then
    choice = choose_columns([("t.parquet", ["caption", "n"])], url=False)
    assert choice.caption == "caption" and choice.url is None
    with pytest.raises(ColumnError, match="no input files"):
        choose_columns([])


# ---------------------------------------------------------------------------------------------
# 4. the studies: Exposed triplets, DALL-Eval alignment


def _runs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def test_exposed_triplets_recognises_relaion(tmp_path, capsys):
    from pipelines import exposed

    src = tmp_path / "relaion2b_en_research.parquet"
    shutil.copy(DATA / "relaion2b_en_research.parquet", src)
    assert exposed.main(["triplets", "--captions", str(src), "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    line = next(ln.strip() for ln in out.splitlines() if "input columns:" in ln)
    assert line == ("input columns: caption 'caption' (the Re-LAION-5B layout: columns url, caption), "
                    "no URL column (not read); dataset: Re-LAION-2B-en research (from the path)")
    [run] = _runs(tmp_path / "out")
    config = json.loads((run / "run.json").read_text())["config"]
    assert config["column"] == "caption"
    assert config["dataset"]["layout"] == "relaion" and config["dataset"]["variant"] == "Re-LAION-2B-en research"
    assert config["dataset"]["caption_column"] == "caption" and config["dataset"]["url_column"] is None
    assert "key" in config["dataset"]["extra_columns"]
    details = json.loads((run / "triplets_config.json").read_text())
    assert details["dataset"] == config["dataset"]
    # the captions really were read from that column
    counts = {r["triplet_status"]: r["count"] for r in json.loads((run / "triplet_counts.json").read_text())
              if r["human_word"] is None}
    assert sum(counts.values()) == 300 and counts["human_word"] > 100  # captions, not URLs
    # no identity flag: the default footer identity (no content hash)
    [data] = config["input"]["data"].values()
    assert "footer=" in data and "sha256=" not in data


def test_exposed_triplets_explicit_column_wins(tmp_path, capsys):
    from pipelines import exposed

    src = tmp_path / "relaion2b_en_research.parquet"
    shutil.copy(DATA / "relaion2b_en_research.parquet", src)
    assert exposed.main(["triplets", "--captions", str(src), "--caption-column", "url",
                         "--output", str(tmp_path / "out"), "--input-identity", "full"]) == 0
    assert "input columns: caption 'url' (--caption-column)" in capsys.readouterr().out
    [run] = _runs(tmp_path / "out")
    config = json.loads((run / "run.json").read_text())["config"]
    assert config["column"] == "url" and config["dataset"]["why_caption"] == "--caption-column"
    [data] = config["input"]["data"].values()
    assert f"sha256={hashlib.sha256(src.read_bytes()).hexdigest()}" in data
    # --column (deprecated spelling) and --dataset-name
    assert exposed.main(["triplets", "--captions", str(src), "--column", "CAPTION", "--dataset-name",
                         "relaion2B-en-research-safe", "--output", str(tmp_path / "out2")]) == 0
    [run] = _runs(tmp_path / "out2")
    config = json.loads((run / "run.json").read_text())["config"]
    assert config["column"] == "caption" and config["dataset"]["variant"] == "Re-LAION-2B-en research-safe"


def test_exposed_triplets_recognises_a_csv_header(tmp_path, capsys):
    from pipelines import exposed

    src = tmp_path / "captions.csv"
    pa.table({"id": ["1", "2"], "Caption": ["a person reads a book", "a man cooks"]}).to_pandas().to_csv(
        src, index=False)
    assert exposed.main(["triplets", "--captions", str(src), "--output", str(tmp_path / "out")]) == 0
    assert "input columns: caption 'Caption' (the only caption-like column)" in capsys.readouterr().out
    [run] = _runs(tmp_path / "out")
    config = json.loads((run / "run.json").read_text())["config"]
    assert config["column"] == "Caption" and config["dataset"]["layout"] is None


def test_exposed_triplets_ambiguous_input_fails_in_one_line(tmp_path, capsys):
    from pipelines import exposed

    src = tmp_path / "ambiguous_columns.parquet"
    shutil.copy(DATA / "ambiguous_columns.parquet", src)
    assert exposed.main(["triplets", "--captions", str(src), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("error: ") and "'caption'" in err and "'text'" in err and "--caption-column" in err
    assert not (tmp_path / "out").exists() or not _runs(tmp_path / "out")  # nothing written
    # --dataset-name of another layout: the missing columns, one line
    assert exposed.main(["triplets", "--captions", str(src), "--dataset-name", "coyo",
                         "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lacks id" in err


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_alignment_read_captions_recognises_the_caption_column(tmp_path, capsys, suffix):
    from pipelines.studies.dalleval.alignment_inputs import read_captions
    from schemas.subsets import PROMPT

    table = pa.table({"image_id": ["1", "2", "3"], "caption": ["a doctor  reads", "a nurse walks", " "]})
    path = tmp_path / f"captions{suffix}"
    if suffix == ".csv":
        table.to_pandas().to_csv(path, index=False)
    else:
        pq.write_table(table, path)
    out, counts = read_captions({"input": str(path)})
    assert out[PROMPT].to_pylist() == ["a doctor reads", "a nurse walks"]
    assert counts["read"] == 3 and counts["kept"] == 2
    assert "captions: input columns: caption 'caption' (the only caption-like column)" in capsys.readouterr().out
    # two caption-like columns: the error says how to choose
    bad = tmp_path / "bad.csv"
    pa.table({"text": ["a"], "caption": ["b"]}).to_pandas().to_csv(bad, index=False)
    with pytest.raises(io.InputError, match="ambiguous.*captions.column / --caption-column"):
        read_captions({"input": str(bad)})


# ---------------------------------------------------------------------------------------------
# 5. hf:// through a local fake filesystem

HF_ROOT = "hf://datasets/laion/relaion2B-en-research"


class FakeHfFileSystem(LocalFileSystem):
    """hf://datasets/ORG/NAME/... read from a local folder (``roots``: "ORG/NAME" -> folder, whose
    name says nothing of the dataset); records the token of every instance."""

    protocol = "hf"
    cachable = False
    roots: dict[str, str] = {}
    tokens: list = []

    def __init__(self, token=None, **kwargs):
        super().__init__(**kwargs)
        type(self).tokens.append(token)

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith("hf://"):
            rest = path[len("hf://"):]
            assert rest.startswith("datasets/"), path
            org, name, *tail = rest[len("datasets/"):].split("/")
            path = "/".join([cls.roots[f"{org}/{name}"], *tail])
        return super()._strip_protocol(path)


class GatedRepoError(OSError):
    pass


class GatedHfFileSystem(FakeHfFileSystem):
    def info(self, path, **kwargs):
        raise GatedRepoError(f"401 Client Error. Cannot access gated repo for url https://huggingface.co/{path}.\n"
                             "Access to dataset laion/relaion2B-en-research is restricted.")

    def isdir(self, path):
        self.info(path)

    exists = isdir


class GatedOnOpenHfFileSystem(FakeHfFileSystem):
    """A gated dataset whose file list is visible (as the Hub shows a gated repository's files)
    while reading a file is refused."""

    def _open(self, path, mode="rb", **kwargs):
        raise GatedRepoError("401 Client Error. Cannot access gated repo for url https://huggingface.co/x.\n"
                             "Access to dataset laion/relaion2B-en-research is restricted.")


class UnauthorizedHfFileSystem(FakeHfFileSystem):
    def isdir(self, path):
        raise RuntimeError("401 Client Error: Unauthorized for url: https://huggingface.co/api/datasets/x\nmore")


@pytest.fixture
def hf_fake(tmp_path, monkeypatch):
    """Registers a fsspec filesystem class for "hf" (restored afterwards); yields a function that
    installs one of the classes above."""
    reg = sys.modules["fsspec.registry"]
    before = reg._registry.get("hf", None)
    had = "hf" in reg._registry
    repo = tmp_path / "hub-store-1"
    repo.mkdir()
    shutil.copy(DATA / "relaion2b_en_research.parquet", repo / "part-00000.parquet")
    shutil.copy(DATA / "relaion2b_en_research.parquet", repo / "part-00001.parquet")
    (repo / ".gitattributes").write_text("*.parquet filter=lfs\n")
    monkeypatch.setattr(FakeHfFileSystem, "roots", {"laion/relaion2B-en-research": str(repo)})
    monkeypatch.setattr(FakeHfFileSystem, "tokens", [])
    for var in io.HF_TOKEN_VARS:
        monkeypatch.delenv(var, raising=False)

    def install(cls=FakeHfFileSystem):
        fsspec.register_implementation("hf", cls, clobber=True)
        return cls

    install()
    try:
        yield install
    finally:
        if had:
            reg._registry["hf"] = before
        else:
            reg._registry.pop("hf", None)


def test_hf_footer_read_through_the_fake_with_the_token(hf_fake, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_123")
    assert io.storage_options(f"{HF_ROOT}/part-00000.parquet") == {"token": "hf_test_token_123"}
    assert io.storage_options("/local/file.parquet") == {}
    inp = resolve_parquet_inputs(f"{HF_ROOT}/part-00000.parquet")
    assert FakeHfFileSystem.tokens and set(FakeHfFileSystem.tokens) == {"hf_test_token_123"}
    assert inp.protocol == "hf" and len(inp.files) == 1 and inp.num_rows == 300
    assert inp.schemas[0].names == names_of(DATA / "relaion2b_en_research.parquet")
    assert all(d.startswith("hf://") for d in inp.data_identity())
    choice = choose_input_columns(inp, None, None, paths=[f"{HF_ROOT}/part-00000.parquet"])
    # the store's folder name says nothing: the variant comes from the hf:// path
    assert "relaion" not in inp.files[0].lower()
    assert choice.layout is RELAION and choice.variant == "Re-LAION-2B-en research"
    assert (choice.caption, choice.url) == ("caption", "url")
    # a folder: both parts, hidden files skipped
    inp = resolve_parquet_inputs(f"{HF_ROOT}/")
    assert len(inp.files) == 2 and inp.num_rows == 600
    # the other variable name
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_other")
    FakeHfFileSystem.tokens.clear()
    resolve_parquet_inputs(f"{HF_ROOT}/part-00001.parquet")
    assert set(FakeHfFileSystem.tokens) == {"hf_other"}


def test_hf_without_a_token_passes_none(hf_fake):
    assert io.storage_options(f"{HF_ROOT}/x.parquet") == {}
    resolve_parquet_inputs(f"{HF_ROOT}/part-00000.parquet")
    assert set(FakeHfFileSystem.tokens) == {None}


def test_exposed_triplets_from_hf(hf_fake, monkeypatch, tmp_path, capsys):
    from pipelines import exposed

    monkeypatch.setenv("HF_TOKEN", "hf_test_token_123")
    assert exposed.main(["triplets", "--captions", f"{HF_ROOT}/", "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "dataset: Re-LAION-2B-en research (from the path)" in out and "input columns: caption 'caption'" in out
    assert FakeHfFileSystem.tokens and set(FakeHfFileSystem.tokens) == {"hf_test_token_123"}
    [run] = _runs(tmp_path / "out")
    assert run.name.startswith("exposed-triplets-")
    config = json.loads((run / "run.json").read_text())["config"]
    assert config["dataset"]["variant"] == "Re-LAION-2B-en research" and config["column"] == "caption"
    assert len(config["input"]["files"]) == 2 and all(f.startswith("hf://") for f in config["input"]["files"])
    assert config["source"] == "relaion2B-en-research"
    counts = json.loads((run / "triplet_counts.json").read_text())
    assert sum(r["count"] for r in counts if r["human_word"] is None) == 600  # both parts read


@pytest.mark.parametrize("cls", [GatedHfFileSystem, UnauthorizedHfFileSystem])
def test_hf_gated_dataset_error_has_the_hint(hf_fake, tmp_path, capsys, cls):
    hf_fake(cls)
    with pytest.raises(io.InputError) as err:
        resolve_parquet_inputs(f"{HF_ROOT}/part-00000.parquet")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cannot read {HF_ROOT}/part-00000.parquet: ")
    assert "401" in msg and "gated or private Hub dataset" in msg and "HF_TOKEN" in msg
    # the command: exit 2, that line
    from pipelines import exposed

    assert exposed.main(["triplets", "--captions", f"{HF_ROOT}/part-00000.parquet",
                         "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gated or private Hub dataset" in err and "Traceback" not in err


def test_hf_gated_error_when_reading_the_footer_has_the_hint(hf_fake, tmp_path, capsys):
    hf_fake(GatedOnOpenHfFileSystem)
    with pytest.raises(io.InputError) as err:
        resolve_parquet_inputs(f"{HF_ROOT}/part-00000.parquet")
    msg = str(err.value)
    assert "401" in msg  # the cause is named either way
    assert "\n" not in msg and "gated or private Hub dataset" in msg


def test_listing_error_hint_only_for_hf():
    exc = PermissionError("403 Forbidden\nsecond line")
    assert io.listing_error("s3://bucket/x", exc) == "cannot read s3://bucket/x: PermissionError: 403 Forbidden"
    assert "gated" in io.listing_error("hf://datasets/a/b", exc)
    assert "gated" not in io.listing_error("hf://datasets/a/b", FileNotFoundError("no such file"))


# ---------------------------------------------------------------------------------------------
# 6. --input-identity full


def _footer_hash(path: Path) -> str:
    sink = pa.BufferOutputStream()
    pq.read_metadata(path).write_metadata_file(sink)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def _swap(raw: bytes, a: str, b: str) -> bytes:
    """``raw`` with the (equal-length) values ``a`` and ``b`` swapped in place; each must occur
    exactly once (in the data page: no statistics, no dictionary, no compression)."""
    ea, eb = a.encode(), b.encode()
    assert len(ea) == len(eb) and raw.count(ea) == 1 and raw.count(eb) == 1
    out = bytearray(raw)
    i, j = raw.index(ea), raw.index(eb)
    out[i:i + len(ea)], out[j:j + len(eb)] = eb, ea
    assert len(out) == len(raw)
    return bytes(out)


def test_full_identity_sees_a_rewrite_that_keeps_size_footer_and_time(tmp_path):
    path = tmp_path / "captions.parquet"
    a, b = "a doctor reads a book", "a nurse walks the dog"
    assert len(a) == len(b)
    pq.write_table(pa.table({"TEXT": [a, b], "URL": ["u1", "u2"]}), path, compression="none",
                   write_statistics=False, use_dictionary=False)
    st = path.stat()
    footer = _footer_hash(path)
    before = {i: resolve_parquet_inputs(str(path), i).identities[0] for i in IDENTITIES}

    raw = _swap(path.read_bytes(), a, b)
    path.write_bytes(raw)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    assert pq.read_table(path)["TEXT"].to_pylist() == [b, a]  # the data changed
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert _footer_hash(path) == footer
    after = {i: resolve_parquet_inputs(str(path), i).identities[0] for i in IDENTITIES}
    # what the default does not see
    assert after["footer"] == before["footer"]
    # what "full" adds: the content hash
    assert after["full"] != before["full"]
    assert after["full"].startswith(after["footer"] + " sha256=")
    assert after["full"].endswith(hashlib.sha256(raw).hexdigest())
    with pytest.raises(io.InputError, match=r"--input-identity 'sha1': expected one of footer, full"):
        resolve_parquet_inputs(str(path), "sha1")


def test_full_identity_through_exposed_triplets_gets_a_new_run(tmp_path, capsys):
    """The same rewrite through the command: under the default identity the old run is found
    again (its triplets reused: the documented limit); under --input-identity full the rewritten
    file is another input, with a run folder of its own."""
    from pipelines import exposed

    path = tmp_path / "captions.parquet"
    a, b = "a person reads a book", "a person walks a dog"
    b = b + " " * (len(a) - len(b))
    pq.write_table(pa.table({"TEXT": [a, b]}), path, compression="none", write_statistics=False,
                   use_dictionary=False)
    st = path.stat()
    footer = ["triplets", "--captions", str(path), "--output", str(tmp_path / "out")]
    full = [*footer, "--input-identity", "full"]
    assert exposed.main(footer) == 0 and exposed.main(full) == 0
    assert len(_runs(tmp_path / "out")) == 2
    path.write_bytes(_swap(path.read_bytes(), a, b))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    capsys.readouterr()
    assert exposed.main(footer) == 0
    assert "finished earlier" in capsys.readouterr().out and len(_runs(tmp_path / "out")) == 2
    assert exposed.main(full) == 0
    assert "finished earlier" not in capsys.readouterr().out and len(_runs(tmp_path / "out")) == 3


# ---------------------------------------------------------------------------------------------
# 7. page checksums


MARKER = "checksum-marker-0123456789-abcdefghij"


def _flip_in_marker(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    i = raw.find(MARKER.encode())
    assert i > 0, "the marker value is not stored verbatim"
    raw[i + 5] ^= 0x01
    path.write_bytes(bytes(raw))


def _table() -> pa.Table:
    return pa.table({"TEXT": [MARKER, "another caption"], "n": [1, 2]})


def test_write_table_has_page_checksums(tmp_path):
    fs = pafs.LocalFileSystem()
    path = tmp_path / "t.parquet"
    io.write_table(_table(), fs, str(path))
    assert io.read_parquet(str(path)).equals(_table())
    assert pq.read_table(str(path)).equals(_table())
    assert io.parquet_bytes(_table())[:4] == b"PAR1"
    _flip_in_marker(path)
    with pytest.raises(OSError, match="(?i)crc|checksum"):
        io.read_parquet(str(path))
    # without verification the flipped byte is read as data: a changed caption, no error
    plain = pq.read_table(str(path))
    assert plain["TEXT"][0].as_py() != MARKER and plain["n"].to_pylist() == [1, 2]
    # a file written without checksums reads through io.read_parquet as before (no checksum to check)
    bare = tmp_path / "bare.parquet"
    pq.write_table(_table(), bare)
    _flip_in_marker(bare)
    assert io.read_parquet(str(bare))["TEXT"][0].as_py() != MARKER


def test_rundir_parts_are_checksummed(tmp_path):
    from pipelines.engine.run.rundir import RunDir

    rd = RunDir(str(tmp_path), "run-1")
    p1 = rd.write_part("scan", _table(), key="a")
    rd.write_part("scan", pa.table({"TEXT": ["x"], "n": [3]}), key="b")
    assert rd.read_parts("scan", _table().schema)["n"].to_pylist() == [1, 2, 3]
    assert rd.read_part("scan", "a", _table().schema).equals(_table())
    _flip_in_marker(Path(p1))
    with pytest.raises(OSError, match="(?i)crc|checksum"):
        rd.read_parts("scan", _table().schema)
    with pytest.raises(OSError, match="(?i)crc|checksum"):
        rd.read_part("scan", "a", _table().schema)


@pytest.mark.parametrize("options", [{}, {"use_dictionary": False}, {"data_page_version": "2.0"},
                                     {"compression": "none"}, {"compression": "zstd", "use_dictionary": False}])
def test_page_checksums_are_told_from_the_first_page_header(tmp_path, options):
    """Whether a file's pages carry CRCs, read from its first page header, as the writer set it."""
    for checksum in (True, False):
        path = tmp_path / f"t-{checksum}.parquet"
        pq.write_table(_table(), path, write_page_checksum=checksum, **options)
        with open(path, "rb") as fh:
            assert page_checksummed(fh, pq.read_metadata(path)) is checksum, (options, checksum)
    empty = tmp_path / "empty.parquet"   # no row group: no page to tell by
    pq.ParquetWriter(empty, _table().schema).close()
    with open(empty, "rb") as fh:
        assert page_checksummed(fh, pq.read_metadata(empty)) is None


def test_the_input_record_says_how_many_files_can_be_verified(tmp_path, capsys):
    """An input of files with and without page checksums: the record counts and names them, the
    captions study says so once before any work, and the bundled sample has them."""
    from pipelines import amplification
    from pipelines.studies.amplification import captions

    for i, checksum in enumerate((True, False, False)):
        pq.write_table(_table(), tmp_path / f"part-{i}.parquet", write_page_checksum=checksum)
    inp = resolve_parquet_inputs(str(tmp_path))
    rec = inp.checksum_record()
    assert rec | {"without_checksums_examples": None} == {"files": 3, "verified": 1, "without_checksums": 2,
                                                          "no_pages": 0, "without_checksums_examples": None}
    assert rec["without_checksums_examples"] == [str(tmp_path / "part-1.parquet"), str(tmp_path / "part-2.parquet")]
    assert inp.subset([inp.files[0]]).checksum_record()["verified"] == 1
    args = amplification.build_parser().parse_args(["captions", "--output", str(tmp_path / "out"),
                                                    "--captions", str(tmp_path), "--url-column", "none"])
    captions.validate_input(args)
    out = capsys.readouterr().out
    assert out.count("written without page checksums") == 1 and "2 of 3 input file(s)" in out
    from helpers import REPO_ROOT

    sample = resolve_parquet_inputs(str(REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet"))
    assert sample.checksum_record()["verified"] == 1
    written = synthetic_written(tmp_path / "syn")
    assert resolve_parquet_inputs(str(written)).checksum_record()["verified"] == 2


def synthetic_written(path):
    from pipelines.synthetic_laion import generate, write

    write(generate(50, 1, 0.5), path, files=2)
    return path
