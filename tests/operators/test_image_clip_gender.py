import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from operators.support.models import ModelLoadError
from operators.image_clip_gender import ClipGenderClassifier, decide, zero_shot_probs
from operators.support.clip import SOURCE_CHECKPOINT, SOURCE_LOCAL_DIR, load_clip, preprocess_tensor, resolve_clip_spec
from operators.support.codec import pack_rgb8
from pipelines.standins.clip import build_tiny_open_clip
from schemas.images import (
    ENCODED,
    FACE_STATUS,
    GENDER,
    GENDER_COLUMNS,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    P_FEMALE,
    P_MALE,
    FaceStatus,
    Gender,
)


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    return build_tiny_open_clip(tmp_path_factory.mktemp("tiny_clip"), seed=0)


@pytest.fixture(scope="module")
def clf(tiny_clip):
    return ClipGenderClassifier(tiny_clip, device="cpu")


@pytest.fixture
def fresh_clf(tiny_clip):
    """A classifier a test may tamper with (text features, logit scale, options)."""
    return ClipGenderClassifier(tiny_clip, device="cpu", only_face_ok=True)


def rgb(image: np.ndarray) -> np.ndarray:
    return np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image[..., :3]


@pytest.fixture(scope="module")
def photos():
    from skimage import data

    return [rgb(data.astronaut()), rgb(data.camera())]


def encode(image: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format=fmt)
    return buf.getvalue()


def encoded_table(payloads, **extra) -> pa.Table:
    cols = {IMAGE: pa.array(payloads, pa.binary()), IMAGE_ENCODING: pa.array([ENCODED] * len(payloads))}
    cols.update(extra)
    return pa.table(cols)


def to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255.0


def random_images(rng, shape, n):
    return [rng.integers(0, 256, size=shape + (3,), dtype=np.uint8) for _ in range(n)]


# --- decide --------------------------------------------------------------------------------------------------


def test_decide_threshold_is_inclusive_for_both_classes():
    probs = np.array([[0.9, 0.1], [0.1, 0.9], [0.8999, 0.1001], [0.1001, 0.8999], [0.5, 0.5], [1.0, 0.0]])
    assert decide(probs, 0.9).tolist() == [Gender.MALE, Gender.FEMALE, Gender.AMBIGUOUS, Gender.AMBIGUOUS,
                                           Gender.AMBIGUOUS, Gender.MALE]
    # the columns as stored (float32): 0.9 still counts, compared in float32
    assert decide(probs.astype(np.float32), 0.9).tolist() == decide(probs, 0.9).tolist()
    # another threshold moves the boundary
    assert decide(probs, 0.8).tolist()[2:4] == [Gender.MALE, Gender.FEMALE]


def test_decide_rejects_bad_threshold_and_shape_and_nan_is_ambiguous():
    with pytest.raises(ValueError):
        decide(np.array([[0.6, 0.4]]), 0.49)
    with pytest.raises(ValueError):
        decide(np.array([[0.6, 0.4]]), 1.01)
    # 0.5 is the argmax; an exact tie stays ambiguous
    assert decide(np.array([[0.6, 0.4], [0.4, 0.6], [0.5, 0.5]]), 0.5).tolist() == [
        Gender.MALE, Gender.FEMALE, Gender.AMBIGUOUS]
    near = np.array([[0.49999997, 0.49999994]], np.float32)   # both below 0.5 in float32: still the argmax
    assert decide(near, 0.5).tolist() == [Gender.MALE]
    with pytest.raises(ValueError):
        decide(np.array([0.6, 0.4]), 0.9)
    assert decide(np.array([[np.nan, np.nan]]), 0.9).tolist() == [Gender.AMBIGUOUS]


# --- zero_shot_probs ------------------------------------------------------------------------------------------


def test_zero_shot_probs_on_controlled_embeddings():
    rng = np.random.default_rng(1)
    man, woman = rng.normal(size=(2, 16))
    text = np.stack([man, woman])
    near_woman = woman + 0.05 * rng.normal(size=16)
    images = np.stack([woman, 3.0 * near_woman, man])  # the norm of a feature must not matter
    p = zero_shot_probs(images, text, 5.0)
    assert p.shape == (3, 2)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    assert p[0, 1] > p[0, 0] and p[1, 1] > p[1, 0] and p[2, 0] > p[2, 1]

    def cos(a, b):
        return a @ b / np.linalg.norm(a) / np.linalg.norm(b)

    # two classes: p_female = sigmoid(scale * (cos(img, woman) - cos(img, man)))
    expected = 1.0 / (1.0 + np.exp(-5.0 * (cos(near_woman, woman) - cos(near_woman, man))))
    assert p[1, 1] == pytest.approx(expected, rel=1e-9)
    # the scale sharpens the decision; scale 0 is a coin toss
    p_low, p_high = zero_shot_probs(near_woman[None], text, 1.0), zero_shot_probs(near_woman[None], text, 20.0)
    assert 0.5 < p_low[0, 1] < p[1, 1] < p_high[0, 1]
    np.testing.assert_allclose(zero_shot_probs(near_woman[None], text, 0.0), [[0.5, 0.5]])


def test_zero_shot_probs_accepts_torch_tensors():
    rng = np.random.default_rng(2)
    img, txt = rng.normal(size=(4, 8)), rng.normal(size=(2, 8))
    from_torch = zero_shot_probs(torch.tensor(img, dtype=torch.float32), torch.tensor(txt), torch.tensor(30.0))
    np.testing.assert_allclose(from_torch, zero_shot_probs(img, txt, 30.0), atol=1e-5)


# --- loading -------------------------------------------------------------------------------------------------------


def test_standin_is_deterministic_per_seed(tmp_path, tiny_clip):
    spec_a = build_tiny_open_clip(tmp_path / "a", seed=0)
    spec_b = build_tiny_open_clip(tmp_path / "b", seed=1)
    assert spec_a.startswith("local-dir:") and str(tmp_path / "a") in spec_a
    sha = {s: load_clip(s, device="cpu").record["sha256"] for s in (tiny_clip, spec_a, spec_b)}
    assert sha[spec_a] == sha[tiny_clip] != sha[spec_b]


def test_load_record_and_plain_directory(tiny_clip):
    directory = tiny_clip[len("local-dir:"):]
    bundle = load_clip(directory, pretrained="openai", device="cpu")  # a plain directory reads as local-dir
    rec = bundle.record
    assert rec["source"] == SOURCE_LOCAL_DIR and rec["model"] == directory and rec["pretrained"] is None
    assert len(rec["sha256"]) == 64 and rec["open_clip_version"]
    assert "meaningless" in rec["standin"]
    assert bundle.image_size == (64, 64) and not bundle.model.training
    assert resolve_clip_spec("ViT-L-14", rec["weights"])[2]["source"] == SOURCE_CHECKPOINT


def test_mean_and_std_come_from_the_model_config(tmp_path, tiny_clip):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_clip[len("local-dir:"):], copy)
    cfg = json.loads((copy / "open_clip_config.json").read_text())
    cfg["preprocess_cfg"].update(mean=[0.1, 0.2, 0.3], std=[0.5, 0.6, 0.7])
    (copy / "open_clip_config.json").write_text(json.dumps(cfg))
    bundle = load_clip(f"local-dir:{copy}", device="cpu")
    np.testing.assert_allclose(bundle.mean.numpy(), [0.1, 0.2, 0.3])
    np.testing.assert_allclose(bundle.std.numpy(), [0.5, 0.6, 0.7])


@pytest.mark.parametrize("spec, pretrained", [
    ("local-dir:/nonexistent/clip-dir", None),
    ("/nonexistent/clip-dir", None),
    ("ViT-Nope-99", "openai"),
    ("hf-hub:nobody/no-such-clip", None),
])
def test_unloadable_spec_raises_model_load_error(spec, pretrained):
    with pytest.raises(ModelLoadError) as err:
        load_clip(spec, pretrained, device="cpu")
    assert spec in str(err.value) and "local-dir:" in str(err.value)


def test_directory_without_weights_is_an_error_not_a_random_model(tmp_path, tiny_clip):
    copy = tmp_path / "no_weights"
    copy.mkdir()
    shutil.copy(f"{tiny_clip[len('local-dir:'):]}/open_clip_config.json", copy)
    with pytest.raises(ModelLoadError, match="no_weights"):
        ClipGenderClassifier(f"local-dir:{copy}", device="cpu")


# --- preprocessing -------------------------------------------------------------------------------------------------


def test_preprocessing_matches_open_clips_eval_transform(clf, photos, tiny_clip):
    import open_clip

    _, _, transform = open_clip.create_model_and_transforms(tiny_clip)
    for image in (photos[0][40:340, 100:300], photos[1][:200, :]):  # portrait and landscape crops
        ref = transform(Image.fromarray(image))
        ours = preprocess_tensor(to_tensor([image]), clf.bundle)[0]
        assert ours.shape == ref.shape
        # PIL resamples and rounds to uint8; torch keeps floats: one uint8 step is ~0.015 here
        assert (ours - ref).abs().mean() < 0.01
        assert (ours - ref).abs().max() < 0.2


# --- the classifier --------------------------------------------------------------------------------------------------


def test_threshold_rule_end_to_end_with_controlled_text_features(fresh_clf, photos):
    a, b = photos
    feats = fresh_clf.encode_images(to_tensor([a, b]))
    fa, fb = (f / f.norm() for f in feats)
    cos_ab = float(fa @ fb)
    assert cos_ab < 0.999  # the two photos must differ in feature space for the test to mean anything
    fresh_clf.text_features = torch.stack([fb, fa])  # "man" looks like b, "woman" looks like a
    images = to_tensor([a, b])

    def scale_for(p):  # the logit scale that gives the matching image exactly probability p
        return float(np.log(p / (1 - p)) / (1 - cos_ab))

    fresh_clf.logit_scale = scale_for(0.97)
    out = fresh_clf.classify_tensor(images)
    assert out[GENDER].tolist() == [Gender.FEMALE, Gender.MALE]
    np.testing.assert_allclose(out[P_FEMALE], [0.97, 0.03], atol=1e-4)
    fresh_clf.logit_scale = scale_for(0.85)
    out = fresh_clf.classify_tensor(images)
    assert out[GENDER].tolist() == [Gender.AMBIGUOUS, Gender.AMBIGUOUS]
    np.testing.assert_allclose(out[P_MALE], [0.15, 0.85], atol=1e-4)


def test_tensor_path_matches_rgb8_payload_path_and_micro_batches(fresh_clf):
    rng = np.random.default_rng(3)
    images = random_images(rng, (80, 120), 3) + random_images(rng, (96, 96), 2) + random_images(rng, (80, 120), 2)
    table = pa.table(pack_rgb8(images))
    out = fresh_clf(table)
    order = [0, 1, 2, 5, 6, 3, 4]
    fresh_clf.batch_size = 2  # micro-batches must not change anything
    wide = fresh_clf.classify_tensor(to_tensor([images[i] for i in order[:5]]))
    square = fresh_clf.classify_tensor(to_tensor(images[3:5]))
    tensor_p = np.empty(7, np.float32)
    tensor_p[order[:5]] = wide[P_FEMALE]
    tensor_p[[3, 4]] = square[P_FEMALE]
    np.testing.assert_allclose(out.column(P_FEMALE).to_numpy(), tensor_p, atol=1e-5)
    p_f = out.column(P_FEMALE).to_numpy()
    assert np.ptp(p_f) > 0  # different images, different probabilities


def test_encoded_photos_classify_like_raw_pixels(clf, photos):
    png = clf(encoded_table([encode(p, "PNG") for p in photos]))  # lossless: identical pixels
    raw = clf(pa.table(pack_rgb8(photos)))
    np.testing.assert_allclose(png.column(P_FEMALE).to_numpy(), raw.column(P_FEMALE).to_numpy(), atol=1e-6)
    jpeg = clf(encoded_table([encode(p, "JPEG") for p in photos]))
    p_m, p_f = jpeg.column(P_MALE).to_numpy(), jpeg.column(P_FEMALE).to_numpy()
    assert np.all((p_m >= 0) & (p_m <= 1) & (p_f >= 0) & (p_f <= 1))
    np.testing.assert_allclose(p_m + p_f, 1.0, atol=1e-6)
    assert set(jpeg.column(GENDER).to_pylist()) <= set(Gender.ALL) - {Gender.DECODE_ERROR}
    np.testing.assert_allclose(p_f, raw.column(P_FEMALE).to_numpy(), atol=0.05)  # JPEG is lossy, but close


def test_face_status_gating_and_decode_errors(fresh_clf, photos):
    good = encode(photos[0], "PNG")
    statuses = [FaceStatus.OK, FaceStatus.NO_FACE, None, FaceStatus.OK, FaceStatus.OK, FaceStatus.MANY_FACES]
    payloads = [good, good, good, b"not an image", None, good]
    face = pa.array(statuses, pa.string()).dictionary_encode()  # as status columns travel
    for face_col in (face, face.cast(pa.string())):
        out = fresh_clf(encoded_table(payloads, **{FACE_STATUS: face_col}))
        assert out.num_rows == 6
        assert out.schema.field(FACE_STATUS).type == face_col.type  # input columns untouched
        for f in GENDER_COLUMNS:
            assert out.schema.field(f.name).type == f.type
        assert out.column(GENDER).to_pylist()[1:] == [None, None, Gender.DECODE_ERROR, Gender.DECODE_ERROR, None]
        assert out.column(GENDER).to_pylist()[0] in Gender.ALL
        assert out.column(P_MALE).is_valid().to_pylist() == [True, False, False, False, False, False]
        assert out.column(P_FEMALE).null_count == 5

    fresh_clf.only_face_ok = False  # every row with an image, whatever its face status
    out = fresh_clf(encoded_table(payloads, **{FACE_STATUS: face}))
    gender = out.column(GENDER).to_pylist()
    assert gender[3] == Gender.DECODE_ERROR and gender[4] is None
    assert all(g in Gender.ALL and g != Gender.DECODE_ERROR for g in (gender[i] for i in (0, 1, 2, 5)))
    p = out.column(P_FEMALE).to_numpy(zero_copy_only=False)
    np.testing.assert_allclose(p[[0, 1, 2, 5]], p[0], atol=1e-6)  # the same image everywhere


def test_without_face_column_every_image_row_and_bad_rgb8(clf, photos):
    raw = pack_rgb8([photos[0], photos[1]])
    table = pa.table({
        IMAGE: pa.array([raw[IMAGE][0].as_py(), b"\x00" * 10, None], pa.binary()),
        IMAGE_ENCODING: pa.array(["rgb8", "rgb8", "rgb8"]),
        IMAGE_HEIGHT: pa.array([512, 512, None], pa.int32()),
        IMAGE_WIDTH: pa.array([512, 512, None], pa.int32()),
    })
    out = clf(table)
    assert out.column(GENDER).to_pylist()[1:] == [Gender.DECODE_ERROR, None]
    assert out.column(GENDER)[0].as_py() in Gender.ALL
    assert out.column(P_MALE).null_count == 2
    assert clf(table.slice(0, 0)).num_rows == 0


def test_record_names_model_prompts_and_threshold(tiny_clip):
    c = ClipGenderClassifier(tiny_clip, prompts=("a man", "a woman"), threshold=0.95, device="cpu")
    assert c.record["model"] == tiny_clip and c.record["prompts"] == ["a man", "a woman"]
    assert c.record["threshold"] == 0.95 and c.record["sha256"]
    with pytest.raises(ValueError):
        ClipGenderClassifier(tiny_clip, prompts=("only one",), device="cpu")


# --- activation: OpenAI's weights were trained with QuickGELU ---------------------------


def _configured_clips() -> list[tuple[str, str]]:
    """Every (model, pretrained) pair the study presets in configs/ name, wherever it sits."""
    import yaml

    import configs

    found = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("model"), str) and isinstance(node.get("pretrained"), str):
                found.add((node["model"], node["pretrained"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted(Path(configs.__file__).parent.glob("*.yaml")):
        walk(yaml.safe_load(path.read_text()))
    return sorted(found)


CONFIGURED_CLIPS = _configured_clips()


def _activations(net) -> set[str]:
    """The activation class in the MLP of every residual block of both towers."""
    blocks = list(net.visual.transformer.resblocks) + list(net.transformer.resblocks)
    return {type(b.mlp.gelu).__name__ for b in blocks}


def test_the_presets_name_clip_models():
    assert len(CONFIGURED_CLIPS) >= 1


@pytest.mark.parametrize("model, pretrained", CONFIGURED_CLIPS)
def test_every_configured_clip_is_built_with_the_activation_its_weights_were_trained_with(
        model, pretrained, tmp_path, monkeypatch):
    from open_clip import factory
    from open_clip import pretrained as oc_pretrained

    tag_cfg = oc_pretrained.get_pretrained_cfg(model, pretrained)
    assert tag_cfg, f"{model} / {pretrained} is not in open_clip's pretrained registry"
    trained_with = "QuickGELU" if tag_cfg.get("quick_gelu", False) else "GELU"
    # offline and without the weights: the production loader builds the architecture on the meta
    # device (random, unallocated parameters); only the download and the state-dict copy are skipped
    placeholder = tmp_path / "not-loaded.bin"
    placeholder.write_bytes(b"weights are not read in this test")
    for module in (factory, oc_pretrained):
        monkeypatch.setattr(module, "download_pretrained", lambda *a, **k: str(placeholder))
    monkeypatch.setattr(factory, "load_checkpoint", lambda *a, **k: None)
    with torch.device("meta"):
        bundle = load_clip(model, pretrained, device="meta")
    assert _activations(bundle.model) == {trained_with}
    assert bundle.record["activation"] == bundle.record["weights_activation"] == trained_with


def _register(monkeypatch, name: str, model_quick_gelu: bool, tag: str, tag_cfg: dict):
    from open_clip import factory
    from open_clip import pretrained as oc_pretrained

    from pipelines.standins.clip import TINY_MODEL_CFG

    monkeypatch.setitem(factory._MODEL_CONFIGS, name, {**json.loads(json.dumps(TINY_MODEL_CFG)),
                                                      "quick_gelu": model_quick_gelu})
    monkeypatch.setitem(oc_pretrained._PRETRAINED, name, {tag: tag_cfg})


def test_a_quickgelu_tag_on_a_gelu_architecture_loads_with_quickgelu(tiny_clip, monkeypatch):
    weights = str(Path(tiny_clip[len("local-dir:"):]) / "open_clip_model.safetensors")
    _register(monkeypatch, "Tiny-ViT", False, "openai_like", {"file": weights, "quick_gelu": True})
    bundle = load_clip("Tiny-ViT", "openai_like", device="cpu")
    assert _activations(bundle.model) == {"QuickGELU"} and bundle.record["activation"] == "QuickGELU"
    _register(monkeypatch, "Tiny-ViT-gelu", False, "gelu_tag", {"file": weights})
    assert _activations(load_clip("Tiny-ViT-gelu", "gelu_tag", device="cpu").model) == {"GELU"}


def test_an_activation_mismatch_open_clip_only_warns_about_is_an_error(tiny_clip, monkeypatch):
    weights = str(Path(tiny_clip[len("local-dir:"):]) / "open_clip_model.safetensors")
    # a -quickgelu architecture with weights trained with GELU: open_clip builds it and warns
    _register(monkeypatch, "Tiny-ViT-quickgelu", True, "gelu_tag", {"file": weights, "quick_gelu": False})
    with pytest.raises(ModelLoadError, match="QuickGELU"):
        load_clip("Tiny-ViT-quickgelu", "gelu_tag", device="cpu")


def test_a_logged_activation_mismatch_is_an_error_too():
    import logging

    from operators.support.clip import activation_mismatch_is_an_error

    with pytest.raises(ValueError, match="QuickGELU"):  # how some open_clip 2.x releases report it
        with activation_mismatch_is_an_error():
            logging.getLogger().warning("These pretrained weights were trained with QuickGELU activation but the "
                                        "model config does not have that enabled.")
    with activation_mismatch_is_an_error():  # other messages pass
        logging.getLogger().warning("No pretrained weights loaded for model 'ViT-L-14-quickgelu'.")


def test_a_local_dir_model_is_built_as_its_config_says_and_records_it(tiny_clip, tmp_path):
    directory = Path(tiny_clip[len("local-dir:"):])
    said = json.loads((directory / "open_clip_config.json").read_text())["model_cfg"].get("quick_gelu", False)
    bundle = load_clip(tiny_clip, device="cpu")
    assert bundle.record["activation"] == ("QuickGELU" if said else "GELU") == _activations(bundle.model).pop()
    flipped = tmp_path / "flipped"
    shutil.copytree(directory, flipped)
    cfg = json.loads((flipped / "open_clip_config.json").read_text())
    cfg["model_cfg"]["quick_gelu"] = not said
    (flipped / "open_clip_config.json").write_text(json.dumps(cfg))
    assert load_clip(f"local-dir:{flipped}", device="cpu").record["activation"] == ("GELU" if said else "QuickGELU")


def test_embeddings_option_adds_unit_clip_embeddings_of_the_classified_images(tiny_clip, photos):
    """Paper 002, section 5.2 needs the CLIP image embeddings of training and generated images: with
    ``embeddings=True`` every classified row gets its L2-normalised embedding (float16), the others
    null, on the payload and the tensor path alike; off (the default), no column."""
    from schemas.images import CLIP_EMBEDDING

    emb = ClipGenderClassifier(tiny_clip, device="cpu", embeddings=True)
    plain = ClipGenderClassifier(tiny_clip, device="cpu")
    assert [f.name for f in emb.output_fields] == [GENDER, P_MALE, P_FEMALE, CLIP_EMBEDDING]
    assert plain.output_fields == GENDER_COLUMNS and emb.record["embeddings"] is True
    table = encoded_table([encode(photos[0], "PNG"), encode(photos[1], "JPEG"), encode(photos[0], "PNG")],
                          **{FACE_STATUS: pa.array([FaceStatus.OK, FaceStatus.OK, FaceStatus.NO_FACE])})
    out = emb(table)
    assert CLIP_EMBEDDING not in plain(table).column_names
    assert out.schema.field(CLIP_EMBEDDING).type == pa.list_(pa.float16())
    vectors = out.column(CLIP_EMBEDDING).to_pylist()
    assert vectors[2] is None and all(v is not None for v in vectors[:2])
    for v in vectors[:2]:
        assert abs(np.linalg.norm(np.asarray(v, np.float32)) - 1.0) < 2e-3
    assert out.column(GENDER).to_pylist()[:2] == plain(table).column(GENDER).to_pylist()[:2]
    # the same image through the tensor path (the generator's head) gives the same vector
    tensor = emb.classify_tensor(to_tensor([photos[0]]))[CLIP_EMBEDDING][0]
    assert tensor.dtype == np.float16
    np.testing.assert_allclose(np.asarray(tensor, np.float32), np.asarray(vectors[0], np.float32), atol=2e-2)
