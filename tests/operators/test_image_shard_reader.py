"""Damaged img2dataset shards: a webdataset ``.tar`` whose header is broken in
mid-archive (a failed checksum, a zeroed block), that is cut inside a member, or that is no tar at
all is named as corrupt (its path, the byte where it breaks, the cause) in the status detail of
every sample it could not deliver, never read short in silence nor raised as a traceback; the run
counts and names the corrupt shards. Shards written here with ``tarfile`` in img2dataset's layout
(``<key>.jpg``, ``<key>.txt``, ``<key>.json`` and the ``NNNNN.parquet`` metadata)."""

from __future__ import annotations

import io
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators.image_shard_index import ShardIndex
from operators.image_shard_reader import NO_IMAGE, ShardImageReader
from operators.support import img2dataset_shards as shards
from pipelines.studies.amplification import training_shards
from schemas import images as I
from schemas.captions import URL

N = 6


def _image(i: int) -> bytes:
    return bytes([0xFF, 0xD8]) + bytes([i + 1]) * 3000 + bytes([0xFF, 0xD9])   # the reader never decodes


def _url(i: int) -> str:
    return f"https://images.example.org/{i}.jpg"


def write_shard(folder, damage=None, omit=()) -> dict:
    """``00000.tar`` with N samples (less the members ``omit``) and its metadata in ``folder``;
    ``damage(raw, members)`` returns the bytes written instead. Returns {name: (offset,
    offset_data, size)} of the intact archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(N):
            for ext, data in (("jpg", _image(i)), ("txt", b"a photo of a nurse"), ("json", b"{}")):
                if f"{i:09d}.{ext}" in omit:
                    continue
                info = tarfile.TarInfo(f"{i:09d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        members = {m.name: (m.offset, m.offset_data, m.size) for m in tar}
    (folder / "00000.tar").write_bytes(raw if damage is None else damage(bytearray(raw), members))
    pq.write_table(pa.table({"url": [_url(i) for i in range(N)], "key": [f"{i:09d}" for i in range(N)],
                             "status": ["success"] * N, "error_message": pa.nulls(N, pa.string()),
                             "width": [64] * N, "height": [64] * N, "original_width": [64] * N,
                             "original_height": [64] * N}), folder / "00000.parquet")
    return members


def read_all(folder) -> tuple[pa.Table, str]:
    """Every sample of the folder's shard through the two shard stages: (rows by URL, the shard's URI)."""
    source = training_shards.discover(str(folder))
    wanted = [_url(i) for i in range(N)]
    index = ShardIndex(wanted)(source.table())
    found = training_shards.choose(index, pa.table({URL: wanted, "join_key": wanted}))
    assert found.num_rows == N and set(found.column(I.FETCH_STATUS).to_pylist()) == {"ok"}
    return ShardImageReader()(found).sort_by(URL), source.shards[0]


def _statuses(out: pa.Table) -> list[tuple[str, str | None]]:
    return list(zip(out.column(I.FETCH_STATUS).to_pylist(), out.column(I.FETCH_ERROR).to_pylist()))


def _delivered(out: pa.Table, n: int) -> None:
    """The first ``n`` samples came with their bytes, the rest with none."""
    images = out.column(I.IMAGE).to_pylist()
    assert images[:n] == [_image(i) for i in range(n)] and images[n:] == [None] * (N - n)
    assert out.column(I.FETCH_STATUS).to_pylist()[:n] == ["ok"] * n


def test_a_whole_shard_is_read_and_a_missing_key_is_not_called_corruption(tmp_path):
    write_shard(tmp_path)
    out, _ = read_all(tmp_path)
    _delivered(out, N)
    assert training_shards.corrupt_shards(out) == []
    # a key the metadata lists but the (whole) archive lacks keeps the plain reason
    write_shard(tmp_path, omit=(f"{N - 1:09d}.jpg",))
    out, _ = read_all(tmp_path)
    _delivered(out, N - 1)
    assert _statuses(out)[-1] == ("shard_failed", NO_IMAGE)
    assert training_shards.corrupt_shards(out) == []


def test_a_header_damaged_in_mid_archive_names_the_shard_the_byte_and_the_cause(tmp_path):
    members = write_shard(tmp_path, damage=lambda raw, m: _overwrite(raw, m["000000003.jpg"][0] + 20, b"#" * 40))
    out, shard = read_all(tmp_path)
    _delivered(out, 3)     # tarfile stops at the bad header without an error: samples 3-5 are lost
    at = members["000000003.jpg"][0]
    for status, detail in _statuses(out)[3:]:
        assert status == "shard_failed"
        assert detail.startswith(f"shard {shard} is corrupt at byte {at}: damaged tar header (bad checksum)")
    assert training_shards.corrupt_shards(out) == [
        {"shard": shard, "at_byte": at, "cause": shards.parse_corrupt_detail(_statuses(out)[3][1])[1].cause,
         "samples_lost": 3}]


def test_a_zeroed_header_block_is_not_taken_for_the_end_of_the_archive(tmp_path):
    members = write_shard(tmp_path, damage=lambda raw, m: _overwrite(raw, m["000000002.jpg"][0], b"\0" * 512))
    out, shard = read_all(tmp_path)
    _delivered(out, 2)
    at = members["000000002.jpg"][0]
    detail = _statuses(out)[2][1]
    assert detail.startswith(f"shard {shard} is corrupt at byte {at}: damaged tar header (a block of zeros")
    assert f"data follows at byte {members['000000002.jpg'][1]:,}" in detail


def test_a_shard_cut_inside_a_member_is_named_truncated_not_a_traceback(tmp_path):
    cut = {}

    def truncate(raw, m):
        cut["at"] = m["000000004.jpg"][1] + 1000
        return bytes(raw[:cut["at"]])

    members = write_shard(tmp_path, damage=truncate)
    out, shard = read_all(tmp_path)
    _delivered(out, 4)
    start, size = members["000000004.jpg"][1], members["000000004.jpg"][2]
    for status, detail in _statuses(out)[4:]:
        assert status == "shard_failed"
        assert detail.startswith(f"shard {shard} is corrupt at byte {start}: truncated: the file ends inside "
                                 f"000000004.jpg")
        assert f"{start + size:,}, the file has {cut['at']:,})" in detail
    # cut inside a member the reader skips (a caption file): found when the next header is sought
    members = write_shard(tmp_path, damage=lambda raw, m: bytes(raw[:m["000000001.txt"][1] + 5]))
    out, shard = read_all(tmp_path)
    _delivered(out, 2)
    assert _statuses(out)[2][1].startswith(f"shard {shard} is corrupt at byte {members['000000001.txt'][1]}: "
                                           f"truncated: the file ends inside 000000001.txt")
    # cut at a member boundary: no end-of-archive blocks
    members = write_shard(tmp_path, damage=lambda raw, m: bytes(raw[:m["000000005.jpg"][0]]))
    out, shard = read_all(tmp_path)
    _delivered(out, 5)
    assert _statuses(out)[5][1] == (f"shard {shard} is corrupt at byte {members['000000005.jpg'][0]}: truncated: "
                                    f"the file ends at byte {members['000000005.jpg'][0]:,} without tar's "
                                    f"end-of-archive blocks")


@pytest.mark.parametrize("damage", [lambda raw, m: _overwrite(raw, 10, b"#" * 40), lambda raw, m: b""],
                         ids=["first-header", "empty-file"])
def test_a_shard_that_is_no_tar_at_all_is_named_for_each_of_its_samples(tmp_path, damage):
    write_shard(tmp_path, damage=damage)
    out, shard = read_all(tmp_path)
    _delivered(out, 0)
    details = {d for _, d in _statuses(out)}
    assert len(details) == 1 and details.pop().startswith(f"shard {shard} is corrupt at byte 0: no tar archive")


def test_the_run_counts_and_names_the_corrupt_shards(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    members = write_shard(tmp_path / "a", damage=lambda raw, m: _overwrite(raw, m["000000004.jpg"][0] + 20,
                                                                            b"#" * 40))
    write_shard(tmp_path / "b")
    out_a, shard_a = read_all(tmp_path / "a")
    out_b, _ = read_all(tmp_path / "b")
    source = training_shards.discover(str(tmp_path / "a"))
    stats = training_shards.shard_statistics(source, pa.concat_tables([out_a, out_b]))
    assert (stats["shards"], stats["corrupt"], stats["samples_lost_to_corrupt_shards"]) == (1, 1, 2)
    (rec,) = stats["corrupt_shards"]
    assert (rec["shard"], rec["at_byte"], rec["samples_lost"]) == (shard_a, members["000000004.jpg"][0], 2)
    note = training_shards.corrupt_note(stats["corrupt_shards"])
    assert "1 corrupt img2dataset shard(s), 2 sample(s)" in note and shard_a in note and "bad checksum" in note
    assert training_shards.corrupt_note([]) is None
    # only shard_failed rows count (a sample fetched live with the same text would not)
    ok = out_a.set_column(out_a.schema.get_field_index(I.FETCH_STATUS), I.FETCH_STATUS,
                          pa.array(["ok"] * out_a.num_rows, pa.string()))
    assert training_shards.corrupt_shards(ok) == []


def _overwrite(raw: bytearray, at: int, data: bytes) -> bytes:
    raw[at:at + len(data)] = data
    return bytes(raw)
