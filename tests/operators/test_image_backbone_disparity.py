"""ResNet and DINO disparity heads (paper 004, section 4, "Image space"): tiny random stand-ins saved
with save_pretrained and loaded through the production loader; preprocessing against the
transformers image processors; the head's contract (shape, dtype, PAIRS order)."""

import json
import logging
import warnings

import numpy as np
import pytest
import torch

from operators.image_backbone_disparity import (
    ARCH_CLASSIFIER,
    ARCH_VIT,
    DEFAULT_MODELS,
    BackboneDisparity,
    image_settings,
    load_backbone,
    output_size,
    preprocess,
)
from operators.support.disparity import PAIR_INDEX, pair_cosines
from operators.support.models import ModelLoadError
from pipelines.standins.vision import build_tiny_dino, build_tiny_resnet
from schemas.exposed import Space

# The hub checkpoints' preprocessor_config.json (legacy feature-extractor format), as
# AutoImageProcessor reads them for microsoft/resnet-50 and facebook/dino-vits16.
RESNET50_PREPROCESSOR = {"crop_pct": 0.875, "do_normalize": True, "do_resize": True,
                         "feature_extractor_type": "ConvNextFeatureExtractor",
                         "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
                         "resample": 3, "size": 224}
DINO_PREPROCESSOR = {"do_normalize": True, "do_resize": True, "feature_extractor_type": "ViTFeatureExtractor",
                     "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
                     "resample": 2, "size": 224}


class _Heard(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vision")
    return {"resnet": build_tiny_resnet(root / "resnet"), "dino": build_tiny_dino(root / "dino")}


@pytest.fixture(scope="module")
def heads(models):
    heard = _Heard()
    logging.getLogger("transformers").addHandler(heard)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = {Space.RESNET: BackboneDisparity(Space.RESNET, models["resnet"], device="cpu"),
                   Space.DINO: BackboneDisparity(Space.DINO, models["dino"], device="cpu")}
    finally:
        logging.getLogger("transformers").removeHandler(heard)
    out["warnings"] = [str(w.message) for w in caught] + heard.messages
    return out


def smooth(h, w, seed):
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(4):
            fx, fy, ph = r.uniform(1, 8), r.uniform(1, 8), r.uniform(0, 6)
            img[..., c] += np.sin(2 * np.pi * (fx * xx + fy * yy) + ph)
    img = (img - img.min()) / (img.max() - img.min())
    return (img * 255).round().astype(np.uint8)


def units(u=2, size=80, seed=0):
    return torch.rand((u, 3, 3, size, size), generator=torch.Generator().manual_seed(seed))


# --- loading -----------------------------------------------------------------------------------------------


def test_standins_load_through_the_production_loader_without_warnings(heads, models):
    assert heads["warnings"] == []
    rec = heads[Space.RESNET].record
    assert rec["model_class"] == "ResNetForImageClassification" and rec["space"] == Space.RESNET
    assert rec["image_processor_class"].startswith("ConvNextImageProcessor") and rec["crop_pct"] == 0.875
    assert rec["resize"] == "shortest_edge_crop_pct" and rec["interpolation"] == "bicubic"
    assert rec["activation"] == "relu" and rec["num_labels"] == 10
    rec = heads[Space.DINO].record
    assert rec["model_class"] == "ViTModel" and rec["resize"] == "squash" and rec["interpolation"] == "bilinear"
    assert not hasattr(heads[Space.DINO].bundle.model, "pooler") or heads[Space.DINO].bundle.model.pooler is None
    for space in (Space.RESNET, Space.DINO):
        rec = heads[space].record
        assert rec["dtype"] == "float32" and rec["device"] == "cpu" and rec["source"] == "directory"
        assert rec["commit"] is None and list(rec["weight_files"]) == ["model.safetensors"]
        assert len(rec["weights_sha256"]) == 64 and "random weights" in rec["standin"]
        assert rec["image_mean"] == [0.485, 0.456, 0.406]
    assert DEFAULT_MODELS == {Space.RESNET: "microsoft/resnet-50", Space.DINO: "facebook/dino-vits16"}


def test_same_seed_same_weights(tmp_path, heads):
    again = build_tiny_resnet(tmp_path / "again")
    rec = load_backbone(again, ARCH_CLASSIFIER, device="cpu").record
    assert rec["weights_sha256"] == heads[Space.RESNET].record["weights_sha256"]


def test_missing_model_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="save_pretrained"):
        BackboneDisparity(Space.RESNET, str(tmp_path / "nowhere"), device="cpu")
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        BackboneDisparity(Space.DINO, "no-such-org/no-such-model", device="cpu")
    with pytest.raises(ValueError):
        BackboneDisparity(Space.CLIP, str(tmp_path), device="cpu")


def test_wrong_architecture_is_a_model_load_error(models):
    with pytest.raises(ModelLoadError, match="not a 'vit'"):
        BackboneDisparity(Space.DINO, models["resnet"], device="cpu")


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_weights_that_do_not_match_the_config_are_an_error(tmp_path):
    fewer = build_tiny_dino(tmp_path / "fewer")            # checkpoint has 2 layers, config says 1
    _edit_config(tmp_path / "fewer", num_hidden_layers=1)
    with pytest.raises(ModelLoadError, match="not used by the model"):
        load_backbone(fewer, ARCH_VIT, device="cpu")
    more = build_tiny_dino(tmp_path / "more")              # config says 3: the third is missing
    _edit_config(tmp_path / "more", num_hidden_layers=3)
    with pytest.raises(ModelLoadError, match="lack"):
        load_backbone(more, ARCH_VIT, device="cpu")
    labels = build_tiny_resnet(tmp_path / "labels")        # 10 logits saved, 12 asked for
    _edit_config(tmp_path / "labels", id2label={str(i): f"L{i}" for i in range(12)},
                 label2id={f"L{i}": i for i in range(12)})
    with pytest.raises(ModelLoadError):
        load_backbone(labels, ARCH_CLASSIFIER, device="cpu")


def test_a_vit_checkpoint_with_a_pooler_loads_and_records_it(tmp_path):
    from transformers import ViTImageProcessor, ViTModel

    src = build_tiny_dino(tmp_path / "src")
    with_pooler = tmp_path / "pooler"
    net = ViTModel.from_pretrained(src, add_pooling_layer=True)   # the pooler is new here, fine
    net.save_pretrained(with_pooler)
    ViTImageProcessor.from_pretrained(src).save_pretrained(with_pooler)
    bundle = load_backbone(str(with_pooler), ARCH_VIT, device="cpu")
    assert bundle.record["ignored_checkpoint_weights"] == ["pooler.dense.bias", "pooler.dense.weight"]


def test_a_processor_that_does_not_fit_the_vit_is_an_error(tmp_path):
    from transformers import ViTImageProcessor

    path = build_tiny_dino(tmp_path / "dino")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    with pytest.raises(ModelLoadError, match="config.image_size"):
        load_backbone(path, ARCH_VIT, device="cpu")


# --- preprocessing -------------------------------------------------------------------------------------------


def _processors(tmp_path, models):
    from transformers import AutoImageProcessor

    out = {}
    for name, cfg in (("resnet-50", RESNET50_PREPROCESSOR), ("dino-vits16", DINO_PREPROCESSOR)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "preprocessor_config.json").write_text(json.dumps(cfg))
    for name, path in (("tiny-resnet", models["resnet"]), ("tiny-dino", models["dino"]),
                       ("resnet-50", tmp_path / "resnet-50"), ("dino-vits16", tmp_path / "dino-vits16")):
        out[name] = AutoImageProcessor.from_pretrained(str(path))
        out[name + "/pil"] = AutoImageProcessor.from_pretrained(str(path), backend="pil")
    return out


def test_settings_of_the_hub_processors(tmp_path, models):
    procs = _processors(tmp_path, models)
    r50 = image_settings(procs["resnet-50"])
    assert r50["resize"] == "shortest_edge_crop_pct" and r50["resize_size"] == [224] and r50["crop_pct"] == 0.875
    assert r50["interpolation"] == "bicubic" and output_size(r50, 512, 512) == (224, 224)
    dino = image_settings(procs["dino-vits16"])
    assert dino["resize"] == "squash" and dino["resize_size"] == [224, 224] and dino["interpolation"] == "bilinear"
    assert dino["image_std"] == [0.229, 0.224, 0.225] and output_size(dino, 300, 500) == (224, 224)


# The documented tolerance: the emulation rounds each resize pass as PIL and torch's uint8 CPU
# kernels do, but their fixed-point weights differ from float ones: at most 2 levels of 255 on
# a pixel, under 0.1 level on average.
MAX_LEVELS, MEAN_LEVELS = 2.0, 0.1


@pytest.mark.parametrize("name", ["tiny-resnet", "tiny-dino", "resnet-50", "dino-vits16"])
def test_preprocessing_matches_the_image_processor_on_cpu(tmp_path, models, name):
    procs = _processors(tmp_path, models)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (2, 96, 128, 3), dtype=np.uint8),       # landscape noise
               np.stack([smooth(300, 256, 1), smooth(300, 256, 2)]),        # portrait, smooth
               np.stack([smooth(512, 512, 3)])]                             # the generator's size
    for backend in ("", "/pil"):
        proc = procs[name + backend]
        settings = image_settings(proc)
        for arr in batches:
            ref = proc(images=list(arr), return_tensors="pt")["pixel_values"]
            ours = preprocess(torch.from_numpy(arr).permute(0, 3, 1, 2).float() / 255.0, settings)
            assert ours.shape == ref.shape and ours.dtype == torch.float32
            assert tuple(ours.shape[-2:]) == output_size(settings, *arr.shape[1:3])
            std = torch.tensor(settings["image_std"]).view(1, 3, 1, 1)
            levels = ((ours - ref) * std * 255.0).abs()
            assert levels.max() <= MAX_LEVELS + 1e-3, (name, backend, arr.shape)
            assert levels.mean() <= MEAN_LEVELS, (name, backend, arr.shape)


# --- features and the head's contract --------------------------------------------------------------------


def test_features_are_the_logits_and_the_class_token(heads):
    x = units(1)[0]
    res, dino = heads[Space.RESNET], heads[Space.DINO]
    with torch.inference_mode():
        logits = res.bundle.model(pixel_values=preprocess(x, res.bundle.settings)).logits
        hidden = dino.bundle.model(pixel_values=preprocess(x, dino.bundle.settings)).last_hidden_state
    f = res.features(x)
    assert f.shape == (3, 10)
    torch.testing.assert_close(f, logits)
    g = dino.features(x)
    assert g.shape == (3, 32)
    torch.testing.assert_close(g, hidden[:, 0])
    assert not torch.allclose(g, hidden[:, 1:].mean(1))


@pytest.mark.parametrize("space", [Space.RESNET, Space.DINO])
def test_identical_images_have_cosine_one(heads, space):
    x = units(2)
    x[:, 1] = x[:, 0]
    x[:, 2] = x[:, 0]
    out = heads[space].triplet_similarities(x)
    assert set(out) == {space}
    np.testing.assert_allclose(out[space], 1.0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("space", [Space.RESNET, Space.DINO])
def test_outputs_are_float64_pair_cosines_in_pairs_order(heads, space):
    head = heads[space]
    x = units(2, seed=1)
    x[1, 2] = x[1, 1]                                      # unit 1: feminine == masculine
    out = head.triplet_similarities(x)[space]
    assert out.shape == (2, 3) and out.dtype == np.float64
    feats = head.features(x.reshape(6, 3, 80, 80)).reshape(2, 3, -1).double()
    for k, (i, j) in enumerate(PAIR_INDEX):
        cos = torch.nn.functional.cosine_similarity(feats[:, i], feats[:, j], dim=-1).numpy()
        np.testing.assert_allclose(out[:, k], cos, rtol=0, atol=1e-6)
    assert abs(out[1, 2] - 1.0) < 1e-6 and out[1, 0] < 1 - 1e-4
    assert abs(out[0, 0] - out[0, 1]) > 1e-5                # the test can tell the columns apart
    swapped = head.triplet_similarities(x[:, [0, 2, 1]])[space]   # feminine <-> masculine
    np.testing.assert_allclose(swapped, out[:, [1, 0, 2]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(pair_cosines(feats), out, rtol=0, atol=1e-6)


def test_batches_give_the_same_features(models):
    small = BackboneDisparity(Space.DINO, models["dino"], device="cpu", batch_size=2)
    big = BackboneDisparity(Space.DINO, models["dino"], device="cpu", batch_size=64)
    x = units(3, seed=2)
    np.testing.assert_allclose(small.triplet_similarities(x)[Space.DINO], big.triplet_similarities(x)[Space.DINO],
                               rtol=0, atol=1e-6)
    assert small.triplet_similarities(torch.zeros((0, 3, 3, 80, 80)))[Space.DINO].shape == (0, 3)
    with pytest.raises(ValueError):
        small.triplet_similarities(torch.zeros((2, 3, 80, 80)))
