import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from operators.support.codec import pack_rgb8
from operators.image_sink import ImageSink
from schemas import images as I
from schemas.captions import URL


def test_rgb8_saved_as_lossless_png_and_batch_unchanged(tmp_path):
    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 256, (8, 12, 3), dtype=np.uint8) for _ in range(3)]
    batch = pa.table(pack_rgb8(imgs)).append_column(I.SEED, pa.array([5, 6, 7], pa.int64()))
    batch = batch.set_column(0, I.IMAGE, pa.array([batch.column(I.IMAGE)[0].as_py(), None,
                                                    batch.column(I.IMAGE)[2].as_py()], pa.binary()))
    out = ImageSink(str(tmp_path / "gen"), [I.SEED])(batch)
    assert out.equals(batch)
    files = list((tmp_path / "gen").glob("*.parquet"))
    assert len(files) == 1
    saved = pq.read_table(files[0])
    assert saved.column(I.SEED).to_pylist() == [5, 7]          # the row without an image is not written
    for seed, data in zip([5, 7], saved.column(I.IMAGE).to_pylist()):
        back = np.asarray(Image.open(io.BytesIO(data["bytes"])))
        assert np.array_equal(back, imgs[seed - 5])


def test_encoded_images_saved_verbatim(tmp_path):
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buf, "JPEG")
    batch = pa.table({URL: ["u1"], I.IMAGE: pa.array([buf.getvalue()], pa.binary()),
                      I.IMAGE_ENCODING: [I.ENCODED]})
    ImageSink(str(tmp_path / "t"), [URL])(batch)
    saved = pq.read_table(next((tmp_path / "t").glob("*.parquet")))
    assert saved.column(I.IMAGE)[0].as_py()["bytes"] == buf.getvalue() and saved.column(URL)[0].as_py() == "u1"


def test_saved_images_load_with_datasets_as_an_image_feature(tmp_path):
    import datasets

    imgs = [np.full((6, 8, 3), v, np.uint8) for v in (10, 200)]
    batch = pa.table(pack_rgb8(imgs)).append_column(I.SEED, pa.array([1, 2], pa.int64()))
    ImageSink(str(tmp_path / "gen"), [I.SEED])(batch)
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "gen" / "*.parquet"), split="train",
                               cache_dir=str(tmp_path / "cache"))
    assert isinstance(ds.features[I.IMAGE], datasets.Image) and ds.features[I.SEED] == datasets.Value("int64")
    assert [np.asarray(r[I.IMAGE]).tolist() for r in ds] == [i.tolist() for i in imgs]


def test_batches_without_images_write_nothing(tmp_path):
    ImageSink(str(tmp_path / "x"), [URL])(pa.table({URL: ["a"], I.IMAGE: pa.array([None], pa.binary())}))
    assert not list((tmp_path / "x").glob("*.parquet"))


def test_a_batch_saved_again_by_a_retried_task_replaces_its_part(tmp_path):
    imgs = [np.full((4, 4, 3), v, np.uint8) for v in (10, 20)]
    batch = pa.table(pack_rgb8(imgs)).append_column(I.SEED, pa.array([1, 2], pa.int64()))
    sink = ImageSink(str(tmp_path / "gen"), [I.SEED])
    sink(batch)
    sink(batch)  # the same block again: Ray retried the task after its worker died
    assert len(list((tmp_path / "gen").iterdir())) == 1  # one part, no temporary files
    sink(batch.slice(1))  # other rows: a part of their own
    assert sorted(pq.read_table(tmp_path / "gen").column(I.SEED).to_pylist()) == [1, 2, 2]
