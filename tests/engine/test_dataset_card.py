"""The dataset card of a run folder: every table a datasets configuration."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from operators.image_sink import ImageSink
from operators.support.codec import pack_rgb8
from pipelines.engine.storage import dataset_card, io
from schemas import images as I


def test_a_run_folder_card_lists_its_tables_and_they_load(tmp_path):
    import datasets

    run = tmp_path / "run"
    (run / "_work").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), run / "_work" / "checkpoint.parquet")       # not a table of the run
    pq.write_table(pa.table({"occupation": ["nurse", "pilot"], "percent_female": [80.0, 10.0],
                             "embedding": pa.array([[0.1, 0.2], [0.3, 0.4]], pa.list_(pa.float32()))}),
                   run / "generated_percentages.parquet")
    (run / "images.parquet").mkdir()
    pq.write_table(pa.table({"seed": [1, 2]}), run / "images.parquet" / "part-0.parquet")
    batch = pa.table(pack_rgb8([np.zeros((4, 4, 3), np.uint8)])).append_column(I.SEED, pa.array([3], pa.int64()))
    ImageSink(str(run / "images" / "generated"), [I.SEED])(batch)
    metrics = {"headline": {"standin": True, "protocol": {"prompts": "abc"},
                            "interval": {"level": 0.95, "method": "bca", "resamples": 2000, "seed": 0},
                            "subjects": [{"name": "CompVis/stable-diffusion-v1-4", "metrics": [
                                {"key": "k", "label": "E[A], naive", "unit": "occupation", "value": 0.1, "low": 0.05,
                                 "high": 0.2, "method": "bootstrap-bca", "n": 49, "level": 0.95, "scale": 100}]}]},
               "models": [{"role": "generator", "model": "CompVis/stable-diffusion-v1-4", "standin": True,
                           "detail": {"commit": "abc123", "weights_sha256": "f00d"}}]}
    fs, root = io.output_fs(str(run))
    found = dataset_card.write(fs, root, "paper002-amplification: run r1", "paper002-amplification", metrics)
    text = (run / "README.md").read_text()
    header = yaml.safe_load(text.split("---")[1])
    configs = {c["config_name"]: c["data_files"][0]["path"] for c in header["configs"]}
    assert configs == {"generated_percentages": "generated_percentages.parquet",
                       "images": "images.parquet/*.parquet", "images_generated": "images/generated/*.parquet"}
    assert [t["rows"] for t in found] == [2, 1, 2]
    for name, path in configs.items():
        ds = datasets.load_dataset("parquet", data_files=str(run / path), split="train", cache_dir=str(tmp_path / "c"))
        assert ds.num_rows == {"generated_percentages": 2, "images": 2, "images_generated": 1}[name]
    assert "Stand-in models" in text and "10.00 [5.00, 20.00]" in text and "| f00d |" in text
    assert "Seshadri, Preethi" in text and "CC-BY 4.0" in text and '"prompts": "abc"' in text
