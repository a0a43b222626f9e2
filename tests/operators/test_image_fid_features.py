"""FID feature extraction (paper 000, App. D.2): torch-fidelity's Inception v3 with random weights written
by the stand-in and loaded through torch-fidelity's own (strict) loader, the plug-in path, and the
generator's tensor path against the payload path."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.image_clip_embedding import embeddings_of
from operators.image_fid_features import (
    INCEPTION_DIM,
    FidFeatureExtractor,
    extract_features,
    load_fid_extractor,
)
from operators.support.codec import pack_rgb8
from operators.support.models import ModelLoadError, file_sha256
from pipelines.standins.fid import TINY_DIM, build_random_inception, tiny_fid_extractor
from schemas.alignment import FID_COLUMNS, FID_FEATURES, REFERENCE_STATUS

TINY = "pipelines.standins.fid:tiny_fid_extractor"


@pytest.fixture(scope="module")
def inception_weights(tmp_path_factory):
    torch.set_num_threads(1)
    return build_random_inception(tmp_path_factory.mktemp("fid") / "random-inception.pth")


@pytest.fixture(scope="module")
def inception(inception_weights):
    return FidFeatureExtractor("inception", weights=inception_weights, device="cpu")


@pytest.fixture(scope="module")
def tiny():
    return FidFeatureExtractor(TINY, device="cpu", status=True)


def float_images(n=2, size=40, seed=0):
    """Generator-like float images in [0, 1], not on 8-bit levels."""
    return torch.from_numpy(np.random.default_rng(seed).random((n, 3, size, size), dtype=np.float32))


def as_payload(images) -> list[np.ndarray]:
    return list((images * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())


def test_head_declaration():
    assert FidFeatureExtractor.stage_name == "fid_features"
    assert FidFeatureExtractor.output_fields.equals(FID_COLUMNS)
    assert not getattr(FidFeatureExtractor, "takes_prompts", False)


def test_random_inception_loads_through_torch_fidelity_and_paths_agree(inception, inception_weights):
    assert inception.dim == INCEPTION_DIM == 2048
    rec = inception.record
    assert rec["extractor"] == "inception" and rec["feature_dim"] == 2048
    assert rec["weights"] == inception_weights and rec["sha256"] == file_sha256(inception_weights)
    assert rec["official_weights"] is False and rec["torch_fidelity_version"]
    images = float_images()
    from_tensor = inception.classify_tensor(images)[FID_FEATURES]
    assert from_tensor.shape == (2, 2048) and from_tensor.dtype == np.float32
    assert np.isfinite(from_tensor).all() and np.abs(from_tensor[0] - from_tensor[1]).max() > 1e-4
    out = inception(pa.table(pack_rgb8(as_payload(images))))
    vectors, valid = embeddings_of(out.column(FID_FEATURES))
    assert valid.all()
    np.testing.assert_allclose(vectors, from_tensor, rtol=1e-5, atol=1e-5)


def test_inception_weights_are_loaded_with_strict_keys(inception_weights, tmp_path):
    state = torch.load(inception_weights, weights_only=True)
    state.pop(next(iter(state)))
    torch.save(state, tmp_path / "short.pth")
    with pytest.raises(ModelLoadError, match="Missing key"):  # torch-fidelity loads strictly
        load_fid_extractor("inception", weights=str(tmp_path / "short.pth"), device="cpu")


def test_plugin_extractor(tiny):
    assert tiny.dim == TINY_DIM == 64
    assert tiny.record["extractor"] == TINY and tiny.record["weights"] is None
    images = float_images(n=3, size=24, seed=1)
    from_tensor = tiny.features_tensor(images)
    assert from_tensor.shape == (3, 64)
    # seeded: a second build (another process would do the same) gives the same features
    again = extract_features(load_fid_extractor(TINY, device="cpu"),
                             (images * 255).round().to(torch.uint8))
    np.testing.assert_array_equal(from_tensor, again)
    # mixed sizes, a broken and a missing image: rows kept, nulls where there is nothing to read
    small = as_payload(images)
    big = as_payload(float_images(n=1, size=50, seed=2))
    payload = pack_rgb8([small[0], big[0], small[1]])
    batch = pa.table({
        "image": pa.array(payload["image"].to_pylist() + [b"junk", None], pa.binary()),
        "image_encoding": pa.array(payload["image_encoding"].to_pylist() + ["encoded", None]),
        "image_height": pa.array(payload["image_height"].to_pylist() + [None, None], pa.int32()),
        "image_width": pa.array(payload["image_width"].to_pylist() + [None, None], pa.int32()),
    })
    out = tiny(batch)
    vectors, valid = embeddings_of(out.column(FID_FEATURES))
    assert valid.tolist() == [True, True, True, False, False]
    np.testing.assert_allclose(vectors[[0, 2]], from_tensor[:2], atol=1e-6)
    assert out.column(REFERENCE_STATUS).to_pylist() == ["ok", "ok", "ok", "decode_error", "decode_error"]


def test_plugin_weights_are_loaded_and_recorded(tmp_path):
    net = tiny_fid_extractor()
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(2.0)
    path = tmp_path / "tiny.pt"
    torch.save(net.state_dict(), path)
    ext = load_fid_extractor(TINY, weights=str(path), device="cpu")
    assert ext.record["sha256"] == file_sha256(path)
    x = torch.full((1, 3, 32, 32), 200, dtype=torch.uint8)
    assert not np.allclose(extract_features(ext, x), extract_features(load_fid_extractor(TINY, device="cpu"), x))


@pytest.mark.parametrize("spec", ["not-an-extractor", "no_such_module_xyz:make", "pipelines.standins.fid:nothing",
                                  "pipelines.standins.fid:build_random_inception"])
def test_bad_extractor_spec_is_a_model_load_error(spec):
    with pytest.raises(ModelLoadError, match="FID extractor"):
        load_fid_extractor(spec, device="cpu")


def test_missing_inception_weights_file_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="weights-inception-2015-12-05-6726825d.pth"):
        load_fid_extractor("inception", weights=str(tmp_path / "absent.pth"), device="cpu")


# ---------------------------------- the released DALL-Eval code's network: torchvision Inception v3
@pytest.fixture(scope="module")
def torchvision_weights(tmp_path_factory):
    from torchvision.models import inception_v3

    torch.manual_seed(0)
    net = inception_v3(weights=None, aux_logits=True, transform_input=True, init_weights=True)
    path = tmp_path_factory.mktemp("tv") / "inception_v3_google-0cc3c7bd.pth"
    torch.save(net.state_dict(), path)
    return str(path), net


def test_torchvision_inception_loads_imagenet_weights_and_gives_pool_features(torchvision_weights):
    import torch.nn.functional as F

    path, net = torchvision_weights
    ex = load_fid_extractor("torchvision", path, device="cpu")
    assert ex.dim == 2048 and ex.record["sha256"] == file_sha256(path) and ex.record["extractor"] == "torchvision"
    x = torch.randint(0, 256, (2, 3, 50, 70), dtype=torch.uint8)
    got = extract_features(ex, x)
    # by hand: bilinear 299 x 299, [0, 1], ImageNet mean/std, then the network without its classifier
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    y = F.interpolate(x.float(), size=(299, 299), mode="bilinear", align_corners=False) / 255.0
    net = net.eval()
    net.fc = torch.nn.Identity()
    with torch.inference_mode():
        want = net((y - mean) / std).numpy()
    assert got.shape == (2, 2048)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    with pytest.raises(ModelLoadError, match="inception_v3_google"):
        load_fid_extractor("torchvision", path + ".missing", device="cpu")


def test_a_plugin_given_as_a_function_is_not_looked_up_by_its_name():
    ext = load_fid_extractor("standin (no such module)", device="cpu", factory=tiny_fid_extractor)
    assert ext.dim == TINY_DIM and ext.record["extractor"] == "standin (no such module)"
    head = FidFeatureExtractor("standin", device="cpu", factory=tiny_fid_extractor)
    assert head.dim == TINY_DIM
