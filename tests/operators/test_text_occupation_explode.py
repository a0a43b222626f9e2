import numpy as np
import pyarrow as pa

from operators.text_occupation_explode import (
    OccupationExploder,
    caption_ids,
    sample_keys,
)


def table(caps, occs, urls=None):
    return pa.table({"caption": caps, "url": urls or [f"u{i}" for i in range(len(caps))],
                     "occupations": pa.array(occs, pa.list_(pa.string()))})


def test_one_row_per_caption_and_occupation():
    out = OccupationExploder(seed=0)(table(["Engineer and nurse", "a pilot"], [["engineer", "nurse"], ["pilot"]]))
    assert out.column("occupation").to_pylist() == ["engineer", "nurse", "pilot"]
    assert out.column("caption").to_pylist() == ["Engineer and nurse", "Engineer and nurse", "a pilot"]
    ids = out.column("caption_id").to_pylist()
    assert ids[0] == ids[1] != ids[2]
    keys = out.column("sample_key").to_pylist()
    assert keys[0] != keys[1] and all(0 <= k < 1 for k in keys)
    assert "occupations" not in out.column_names


def test_ids_and_keys_do_not_depend_on_batching():
    caps = [f"caption {i}" for i in range(100)]
    occs = [["nurse"]] * 100
    whole = OccupationExploder(seed=5)(table(caps, occs))
    parts = [OccupationExploder(seed=5)(table(caps[i:i + 7], occs[i:i + 7], [f"u{j}" for j in range(i, min(i + 7, 100))]))
             for i in range(0, 100, 7)]
    assert pa.concat_tables(parts).equals(whole)


def test_seed_changes_keys_not_ids():
    t = table(["a nurse"] * 3, [["nurse"]] * 3)
    a, b = OccupationExploder(seed=0)(t), OccupationExploder(seed=1)(t)
    assert a.column("caption_id").equals(b.column("caption_id"))
    assert a.column("sample_key").to_pylist() != b.column("sample_key").to_pylist()


def test_same_caption_other_url_is_another_caption():
    ids = caption_ids(["u1", "u2", None], ["a nurse", "a nurse", "a nurse"])
    assert len(set(ids.tolist())) == 3 and (ids >= 0).all()


def test_sample_keys_are_uniform():
    ids = caption_ids([f"u{i}" for i in range(20000)], ["x"] * 20000)
    keys = sample_keys(ids, pa.array(["nurse"] * 20000), seed=0)
    hist, _ = np.histogram(keys, bins=10, range=(0, 1))
    assert abs(keys.mean() - 0.5) < 0.01
    assert hist.min() > 1800 and hist.max() < 2200  # expected 2000 per bin, sd ~42
