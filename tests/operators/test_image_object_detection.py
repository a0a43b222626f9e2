"""Object detection for DALL-Eval's skills (paper 000, section 4.1): the tiny random DETR stand-in
saved with save_pretrained and loaded through the production loader; the output contract
(schemas.paintskills.DETECTION_COLUMNS); the tensor hook against the payload path; the loader's
errors; a DETR with a timm backbone (as facebook/detr-resnet-101-dc5 has) loaded with the network
blocked, in transformers 5's and in transformers 4.x's config forms."""

import json
import re
import shutil
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.base import Stage
from operators.image_object_detection import (
    DEFAULT_DETECTOR,
    ObjectDetector,
    backbone_settings,
    legacy_timm_backbone,
    load_object_detector,
)
from operators.support.codec import pack_rgb8, rgb_levels
from operators.support.models import ModelLoadError
from pipelines.standins.detection import COCO_DETR_LABELS, build_tiny_detr, coco_id2label
from schemas.images import ENCODED, GENERATION_STATUS, IMAGE, IMAGE_ENCODING, GenerationStatus
from schemas.paintskills import DET_BOXES, DET_LABELS, DET_SCORES, DETECTION_COLUMNS, DETECTOR

FLOOR = 0.3


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return build_tiny_detr(tmp_path_factory.mktemp("detr"), seed=0)


@pytest.fixture(scope="module")
def detector(standin):
    return ObjectDetector(standin, record_threshold=FLOOR, batch_size=3, device="cpu")


def _images(n=5, height=48, width=64, seed=0) -> torch.Tensor:
    """(n, 3, H, W) float images in [0, 1], off the 8-bit grid: noise, gradients, flat colours."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    out = [torch.rand(3, height, width, generator=g) for _ in range(max(0, n - 2))]
    out.append(torch.stack([xx, yy, xx * yy]))
    out.append(torch.full((3, height, width), 0.7013))
    return torch.stack(out[:n])


def _payload(images: torch.Tensor) -> dict:
    u8 = rgb_levels(images).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return pack_rgb8(list(u8))


def _check_contract(cols: dict, n: int, id2label: dict, floor: float, model: str):
    names = set(id2label.values())
    assert set(cols) == {f.name for f in DETECTION_COLUMNS}
    assert all(len(v) == n for v in cols.values())
    for labels, scores, boxes, det in zip(cols[DET_LABELS], cols[DET_SCORES], cols[DET_BOXES], cols[DETECTOR]):
        assert det == model
        assert len(labels) == len(scores) == len(boxes)
        assert set(labels) <= names
        assert all(s > floor for s in scores) and all(s <= 1.0 for s in scores)
        assert scores == sorted(scores, reverse=True)
        for x0, y0, x1, y1 in boxes:
            assert 0.0 <= x0 <= x1 <= 1.0 and 0.0 <= y0 <= y1 <= 1.0


# --- the stand-in and the loader ----------------------------------------------------------------------------


def test_standin_labels_are_the_coco_detr_ones():
    id2label = coco_id2label()
    assert len(id2label) == 91 and sum(v != "N/A" for v in id2label.values()) == 80
    assert id2label[1] == "person" and id2label[18] == "dog" and id2label[90] == "toothbrush"
    assert [i for i, v in id2label.items() if v == "N/A"] == [0, 12, 26, 29, 30, 45, 66, 68, 69, 71, 83]
    # the study's objects (Table 11, in COCO's names) are classes the detector can name
    from pipelines.studies.dalleval.skills import OBJECTS

    assert set(OBJECTS) <= set(COCO_DETR_LABELS)


def test_loader_records_provenance(standin, detector):
    rec = detector.bundle.record
    assert rec["model"] == standin and rec["source"] == "directory"
    assert rec["model_class"] == "DetrForObjectDetection" and rec["model_type"] == "detr"
    assert rec["num_queries"] == 20 and rec["num_labels"] == 91
    assert rec["use_timm_backbone"] is False and rec["use_pretrained_backbone"] is False
    assert rec["image_size"] == {"shortest_edge": 64, "longest_edge": 96}
    assert rec["dtype"] == "float32" and rec["device"] == "cpu"
    assert len(rec["weights_sha256"]) == 64 and list(rec["weight_files"]) == ["model.safetensors"]
    assert "random weights" in rec["standin"]
    assert rec["transformers_version"] and rec["torch_version"]
    assert detector.record["record_threshold"] == FLOOR and detector.record["detector"] is rec


def test_head_interface():
    assert ObjectDetector.stage_name == "detect_objects"
    assert ObjectDetector.resources.num_gpus == 1 and ObjectDetector.resources.batch_size == 16
    assert ObjectDetector.resources.actors == 1
    assert ObjectDetector.output_fields == DETECTION_COLUMNS
    assert DEFAULT_DETECTOR == "facebook/detr-resnet-101-dc5"


def test_stage_builds_with_the_generators_device(standin):
    head = Stage(ObjectDetector, {"model": standin, "record_threshold": FLOOR, "batch_size": 2}).build(device="cpu")
    assert head.device == "cpu" and head.batch_size == 2


def test_unloadable_model_names_it(tmp_path):
    empty = tmp_path / "no-detector-here"
    empty.mkdir()
    with pytest.raises(ModelLoadError) as err:
        load_object_detector(str(empty), device="cpu")
    msg = str(err.value)
    assert str(empty) in msg
    for hint in ("save_pretrained", "HF_HUB_OFFLINE", "--standin-models"):
        assert hint in msg


def test_non_detector_is_refused(tmp_path):
    from pipelines.standins.vision import build_tiny_resnet

    path = build_tiny_resnet(tmp_path / "resnet")
    with pytest.raises(ModelLoadError, match=r"'resnet' model, not an object detector"):
        load_object_detector(path, device="cpu")


@pytest.mark.parametrize("layers", [1, 3])
def test_weights_that_do_not_match_the_config_are_an_error(standin, tmp_path, layers):
    bad = tmp_path / "bad"
    shutil.copytree(standin, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["decoder_layers"] = layers  # 1: unused checkpoint weights; 3: weights the model lacks
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="config and weights do not match") as err:
        load_object_detector(str(bad), device="cpu")
    assert str(bad) in str(err.value)


# --- detections ---------------------------------------------------------------------------------------------


def test_classify_tensor_contract(standin, detector):
    images = _images(5)
    cols = detector.classify_tensor(images)
    _check_contract(cols, 5, detector.id2label, FLOOR, standin)
    # the stand-in's class head is scaled so that typical images have detections above the floor
    assert sum(len(x) for x in cols[DET_LABELS]) > 0
    assert len(cols[DET_LABELS][0]) <= 20  # at most one per query


def test_tensor_equals_payload(standin, detector):
    images = _images(5)
    from_tensor = detector.classify_tensor(images)
    table = detector(pa.table(_payload(images)))
    assert table.num_rows == 5
    for f in DETECTION_COLUMNS:
        assert table.schema.field(f.name).type == f.type
    got = {f.name: table.column(f.name).to_pylist() for f in DETECTION_COLUMNS}
    assert got[DET_LABELS] == from_tensor[DET_LABELS]
    assert got[DETECTOR] == from_tensor[DETECTOR] == [standin] * 5
    for a, b in zip(got[DET_SCORES], from_tensor[DET_SCORES]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    for a, b in zip(got[DET_BOXES], from_tensor[DET_BOXES]):
        np.testing.assert_allclose(np.reshape(a, (-1, 4)), np.reshape(b, (-1, 4)), rtol=0, atol=1e-6)


def test_same_as_transformers_own_pipeline(detector):
    """The stage's detections are transformers' processor -> model -> post-processing, boxes
    divided by the image size."""
    images = _images(2, height=40, width=72, seed=3)
    cols = detector.classify_tensor(images)
    bundle = detector.bundle
    arrays = list(rgb_levels(images).to(torch.uint8).permute(0, 2, 3, 1).numpy())
    with torch.inference_mode():
        inputs = bundle.image_processor(images=arrays, return_tensors="pt")
        out = bundle.model(**inputs)
    ref = bundle.image_processor.post_process_object_detection(out, threshold=FLOOR, target_sizes=[(40, 72)] * 2)
    for i, r in enumerate(ref):
        order = torch.argsort(r["scores"], descending=True, stable=True)
        assert cols[DET_LABELS][i] == [bundle.model.config.id2label[int(k)] for k in r["labels"][order]]
        np.testing.assert_allclose(cols[DET_SCORES][i], r["scores"][order].numpy(), atol=1e-5)
        expected = (r["boxes"][order] / torch.tensor([72.0, 40.0, 72.0, 40.0])).clamp(0, 1).numpy()
        np.testing.assert_allclose(np.reshape(cols[DET_BOXES][i], (-1, 4)), expected, atol=1e-5)


def test_higher_floor_and_cap_keep_a_prefix(standin, detector):
    """A detection run at a higher floor (or with a cap) keeps exactly the leading detections of a
    lower-floor run: the study can rescore stored detections at any threshold >= the floor."""
    images = _images(5, seed=1)
    low = detector.classify_tensor(images)
    high = ObjectDetector(standin, record_threshold=0.45, max_detections=3, batch_size=5, device="cpu")
    top = high.classify_tensor(images)
    for i in range(5):
        keep = [k for k, s in enumerate(low[DET_SCORES][i]) if s > 0.45][:3]
        assert top[DET_LABELS][i] == [low[DET_LABELS][i][k] for k in keep]
        np.testing.assert_allclose(top[DET_SCORES][i], [low[DET_SCORES][i][k] for k in keep], atol=1e-6)


def test_rows_without_a_usable_image_get_null_columns(standin, detector):
    images = _images(3)
    small = _images(2, height=32, width=40, seed=5)
    good = _payload(images)
    other = _payload(small)
    payload = [good[IMAGE][0].as_py(), None, b"not an image", other[IMAGE][0].as_py(), good[IMAGE][1].as_py(),
               good[IMAGE][2].as_py()]
    table = pa.table({
        IMAGE: pa.array(payload, pa.binary()),
        IMAGE_ENCODING: pa.array(["rgb8", "rgb8", ENCODED, "rgb8", "rgb8", "rgb8"]),
        "image_height": pa.array([48, None, None, 32, 48, 48], pa.int32()),
        "image_width": pa.array([64, None, None, 40, 64, 64], pa.int32()),
        GENERATION_STATUS: pa.array([GenerationStatus.OK, GenerationStatus.OK, None, GenerationStatus.OK,
                                     GenerationStatus.NSFW_BLOCKED, None]),
        "row": pa.array(range(6)),
    })
    out = detector(table)
    assert out.num_rows == 6 and out.column("row").to_pylist() == list(range(6))
    detected = out.column(DETECTOR).to_pylist()
    assert detected == [standin, None, None, standin, None, standin]
    for f in DETECTION_COLUMNS:
        col = out.column(f.name).to_pylist()
        assert col[1] is None and col[2] is None and col[4] is None
    # images of another size are detected on their own, as they would be alone
    alone = detector.classify_tensor(small[:1])
    assert out.column(DET_LABELS)[3].as_py() == alone[DET_LABELS][0]
    first = detector.classify_tensor(images[:1])
    assert out.column(DET_LABELS)[0].as_py() == first[DET_LABELS][0]


def test_batch_without_images(detector):
    out = detector(pa.table({"row": pa.array([0, 1])}))
    assert out.num_rows == 2
    for f in DETECTION_COLUMNS:
        assert out.column(f.name).null_count == 2 and out.schema.field(f.name).type == f.type


def test_bad_arguments(standin, detector):
    with pytest.raises(ValueError):
        detector.classify_tensor(torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError):
        ObjectDetector(standin, record_threshold=1.5, device="cpu")
    with pytest.raises(ValueError):
        ObjectDetector(standin, max_detections=0, device="cpu")


# --- a timm backbone, offline (facebook/detr-resnet-101-dc5: timm resnet101, dilation) ------------------------


def test_legacy_timm_backbone_conversion():
    legacy = {"model_type": "detr", "backbone": "resnet101", "use_timm_backbone": True, "dilation": True,
              "use_pretrained_backbone": True, "backbone_config": None,
              "backbone_kwargs": {"in_chans": 3, "out_indices": [1, 2, 3, 4], "output_stride": 16}}
    fixed = legacy_timm_backbone(legacy)
    assert fixed["backbone_config"] == {"model_type": "timm_backbone", "backbone": "resnet101", "in_chans": 3,
                                        "out_indices": [1, 2, 3, 4], "output_stride": 16}
    assert fixed["backbone"] is None and "backbone_kwargs" not in fixed and legacy["backbone_kwargs"]
    # configs transformers 5 reads offline as they are: left alone
    assert legacy_timm_backbone({**legacy, "backbone_kwargs": None}) is None
    assert legacy_timm_backbone({**legacy, "backbone_config": {"model_type": "timm_backbone"}}) is None
    assert legacy_timm_backbone({**legacy, "use_timm_backbone": False}) is None


@pytest.fixture(scope="module")
def timm_detr(tmp_path_factory):
    # resnet10t: a timm ResNet like resnet101, a quarter of resnet18's weights
    return build_tiny_detr(tmp_path_factory.mktemp("detr-timm"), seed=0, timm_backbone="resnet10t", dilation=True)


def _legacy_copy(src, dst, backbone_kwargs: bool):
    """``src`` as transformers 4.x saved a timm-backbone DETR: backbone / use_timm_backbone /
    use_pretrained_backbone (true) at the top level, no backbone_config, with or without
    backbone_kwargs, and the 4.x weight names (backbone.conv_encoder, out_proj, fc1/fc2)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    bc = cfg.pop("backbone_config")
    cfg.update(backbone=bc["backbone"], use_timm_backbone=True, use_pretrained_backbone=True, backbone_config=None)
    if backbone_kwargs:
        cfg["backbone_kwargs"] = {"in_chans": 3, "out_indices": [1, 2, 3, 4], "output_stride": bc["output_stride"]}
    (dst / "config.json").write_text(json.dumps(cfg))
    weights = load_file(dst / "model.safetensors")
    renamed = {}
    for key, value in weights.items():
        key = key.replace("model.backbone.model.", "model.backbone.conv_encoder.model.").replace(".o_proj.", ".out_proj.")
        renamed[re.sub(r"layers\.(\d+)\.mlp\.fc", r"layers.\1.fc", key)] = value
    save_file(renamed, dst / "model.safetensors", metadata={"format": "pt"})
    return str(dst)


@pytest.fixture
def no_network(monkeypatch):
    """Any connection or name lookup fails (and is recorded); the hub client is offline; every timm
    model created is recorded with its ``pretrained`` flag."""
    import huggingface_hub.constants
    import timm

    attempts, created = [], []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access in a test")

    real_create = timm.create_model

    def create(name, *args, **kwargs):
        created.append((name, kwargs.get("pretrained", False), kwargs.get("output_stride")))
        return real_create(name, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(timm, "create_model", create)
    return attempts, created


@pytest.mark.parametrize("form", ["transformers5", "legacy", "legacy+backbone_kwargs"])
def test_timm_backbone_detr_loads_offline_without_imagenet_weights(timm_detr, tmp_path, no_network, form):
    attempts, created = no_network
    path = timm_detr if form == "transformers5" else _legacy_copy(
        Path(timm_detr), tmp_path / "legacy", backbone_kwargs=form.endswith("kwargs"))
    bundle = load_object_detector(path, device="cpu")
    rec = bundle.record
    assert attempts == []
    assert created == [("resnet10t", False, 16)]   # random init (then the checkpoint), never ImageNet weights
    assert rec["use_timm_backbone"] is True and rec["backbone"] == "resnet10t" and rec["dilation"] is True
    assert rec["backbone_output_stride"] == 16 and rec["use_pretrained_backbone"] is False
    assert rec["legacy_backbone_config_converted"] is (form == "legacy+backbone_kwargs")
    assert getattr(bundle.model.config.backbone_config, "use_pretrained_backbone", False) is False
    # the checkpoint's weights, not a fresh init: same detections as the transformers-5 form
    if form != "transformers5":
        ref = load_object_detector(timm_detr, device="cpu").model
        for (name, a), (_, b) in zip(sorted(bundle.model.state_dict().items()), sorted(ref.state_dict().items())):
            assert torch.equal(a, b), name


def test_backbone_settings_of_a_transformers_backbone(detector):
    s = backbone_settings(detector.bundle.model.config)
    assert s["use_timm_backbone"] is False and s["backbone"] == "resnet"
