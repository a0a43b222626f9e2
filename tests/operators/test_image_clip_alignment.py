"""CLIP image-text alignment head (paper 000, App. D.1): a tiny random open_clip saved to a temp dir and
loaded through the production path; unit embeddings, cosine = their dot product, and the generator's
tensor path agrees with the payload path."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.image_clip_alignment import ALIGNMENT_MODEL, ALIGNMENT_PRETRAINED, ClipAlignmentScorer
from operators.image_clip_embedding import embeddings_of
from operators.support.codec import pack_rgb8
from operators.support.models import ModelLoadError
from pipelines.standins.clip import build_tiny_open_clip
from schemas.alignment import CLIP_ALIGNMENT_COLUMNS, CLIP_COSINE, CLIP_IMAGE_EMBEDDING, CLIP_TEXT_EMBEDDING
from schemas.subsets import PROMPT

PROMPTS = ["a red bus on a street", "two dogs on a sofa", "a red bus on a street"]


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    torch.set_num_threads(1)
    return ClipAlignmentScorer(build_tiny_open_clip(tmp_path_factory.mktemp("clip")), None, device="cpu")


def float_images(n=3, size=48, seed=0):
    """Generator-like float images in [0, 1], not on 8-bit levels."""
    return torch.from_numpy(np.random.default_rng(seed).random((n, 3, size, size), dtype=np.float32))


def as_payload(images) -> list[np.ndarray]:
    """The generator's RGB8 payload of float images: round(x * 255)."""
    return list((images * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())


def test_head_declaration():
    assert ClipAlignmentScorer.stage_name == "clip_alignment"
    assert ClipAlignmentScorer.takes_prompts is True
    assert ClipAlignmentScorer.output_fields.equals(CLIP_ALIGNMENT_COLUMNS)
    assert ClipAlignmentScorer.resources.num_gpus == 0  # the caller decides
    assert (ALIGNMENT_MODEL, ALIGNMENT_PRETRAINED) == ("ViT-B-32", "openai")


def test_unit_embeddings_and_cosine_is_their_dot_product(scorer):
    out = scorer.classify_tensor(float_images(), prompts=PROMPTS)
    img, txt, cos = out[CLIP_IMAGE_EMBEDDING], out[CLIP_TEXT_EMBEDDING], out[CLIP_COSINE]
    assert img.shape == (3, 32) and txt.shape == (3, 32) and cos.shape == (3,)
    assert img.dtype == np.float32 and txt.dtype == np.float32 and cos.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(img, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(txt, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(cos, (img * txt).sum(axis=1), atol=1e-6)
    np.testing.assert_allclose(txt[0], txt[2], atol=1e-6)      # the same prompt, the same text embedding
    assert np.abs(txt[0] - txt[1]).max() > 1e-3
    np.testing.assert_allclose(txt, scorer.embed_texts(PROMPTS), atol=1e-6)


def test_tensor_path_equals_payload_path(scorer):
    images = float_images(seed=1)
    from_tensor = scorer.classify_tensor(images, prompts=PROMPTS)
    batch = pa.table({**pack_rgb8(as_payload(images)), PROMPT: pa.array(PROMPTS)})
    out = scorer(batch)
    assert out.num_rows == 3
    img, valid_img = embeddings_of(out.column(CLIP_IMAGE_EMBEDDING))
    txt, valid_txt = embeddings_of(out.column(CLIP_TEXT_EMBEDDING))
    assert valid_img.all() and valid_txt.all()
    np.testing.assert_allclose(img, from_tensor[CLIP_IMAGE_EMBEDDING], atol=1e-5)
    np.testing.assert_allclose(txt, from_tensor[CLIP_TEXT_EMBEDDING], atol=1e-6)
    np.testing.assert_allclose(out.column(CLIP_COSINE).to_numpy(), from_tensor[CLIP_COSINE], atol=1e-5)
    for f in CLIP_ALIGNMENT_COLUMNS:
        assert out.schema.field(f.name).type == f.type


def test_null_and_broken_images_and_null_prompts_keep_their_rows(scorer):
    good = pack_rgb8(as_payload(float_images(n=1, seed=2)))
    batch = pa.table({
        "image": pa.array([good["image"][0].as_py(), b"not an image", None, good["image"][0].as_py()], pa.binary()),
        "image_encoding": pa.array(["rgb8", "encoded", None, "rgb8"]),
        "image_height": pa.array([48, None, None, 48], pa.int32()),
        "image_width": pa.array([48, None, None, 48], pa.int32()),
        PROMPT: pa.array(["a cat", "a cat", "a cat", None]),
    })
    out = scorer(batch)
    assert out.num_rows == 4
    assert embeddings_of(out.column(CLIP_IMAGE_EMBEDDING))[1].tolist() == [True, False, False, True]
    assert embeddings_of(out.column(CLIP_TEXT_EMBEDDING))[1].tolist() == [True, True, True, False]
    assert out.column(CLIP_COSINE).is_valid().to_pylist() == [True, False, False, False]


def test_prompts_must_match_the_images(scorer):
    with pytest.raises(ValueError, match="prompts"):
        scorer.classify_tensor(float_images(n=2), prompts=["one"])
    with pytest.raises(ValueError, match=PROMPT):
        scorer(pa.table(pack_rgb8(as_payload(float_images(n=1)))))


def test_missing_model_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError):
        ClipAlignmentScorer(str(tmp_path / "nowhere"), None, device="cpu")


def test_as_a_generator_head_it_scores_the_saved_images_alike(scorer, tmp_path):
    """In the generator (with the FID head beside it): the columns it fills from the device tensor
    equal what the payload path computes from the saved RGB8 images."""
    from operators.image_fid_features import FidFeatureExtractor
    from operators.image_generation import ImageGenerator
    from pipelines.standins.diffusion import build_tiny_stable_diffusion
    from schemas.alignment import FID_FEATURES
    from schemas.images import SEED

    fid_head = FidFeatureExtractor("pipelines.standins.fid:tiny_fid_extractor", device="cpu")
    gen = ImageGenerator(build_tiny_stable_diffusion(tmp_path / "sd", seed=0), steps=2, device="cpu",
                         micro_batch=2, heads=[scorer, fid_head])
    prompts = ["a red bus on a street", "two dogs on a sofa", None]
    out = gen(pa.table({PROMPT: pa.array(prompts), SEED: pa.array([1, 2, 3], pa.int64())}))
    assert out.num_rows == 3
    for f in (*CLIP_ALIGNMENT_COLUMNS, *fid_head.output_fields):
        assert out.schema.field(f.name).type == f.type
    assert out.column(CLIP_COSINE).is_valid().to_pylist() == [True, True, False]
    again = fid_head(scorer(out.drop_columns([CLIP_IMAGE_EMBEDDING, CLIP_TEXT_EMBEDDING, CLIP_COSINE, FID_FEATURES])))
    for name in (CLIP_IMAGE_EMBEDDING, CLIP_TEXT_EMBEDDING, FID_FEATURES):
        head_vectors, head_valid = embeddings_of(out.column(name))
        payload_vectors, payload_valid = embeddings_of(again.column(name))
        assert head_valid.tolist() == [True, True, False] and payload_valid[:2].all()
        np.testing.assert_allclose(head_vectors[:2], payload_vectors[:2], atol=1e-5)
    np.testing.assert_allclose(out.column(CLIP_COSINE).to_numpy(zero_copy_only=False)[:2],
                               again.column(CLIP_COSINE).to_numpy(zero_copy_only=False)[:2], atol=1e-5)


def test_norms_restore_the_raw_clip_features_on_both_paths(scorer):
    """The released R-precision ranks raw (unnormalised) CLIP features: unit vector x stored norm."""
    from operators.support.clip import encode_image_tensor, encode_texts
    from operators.support.codec import rgb_levels
    from schemas.alignment import CLIP_IMAGE_NORM, CLIP_TEXT_NORM

    images = float_images(seed=2)
    out = scorer.classify_tensor(images, prompts=PROMPTS)
    raw_img = encode_image_tensor(scorer.bundle, rgb_levels(images).div_(255.0), 8).detach().float().numpy()
    raw_txt = encode_texts(scorer.bundle, PROMPTS).detach().float().numpy()
    np.testing.assert_allclose(out[CLIP_IMAGE_EMBEDDING] * out[CLIP_IMAGE_NORM][:, None], raw_img, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[CLIP_TEXT_EMBEDDING] * out[CLIP_TEXT_NORM][:, None], raw_txt, rtol=1e-4, atol=1e-5)
    assert np.abs(out[CLIP_IMAGE_NORM] - 1).max() > 1e-3      # not unit: a real scale to restore
    packed = pa.table(pack_rgb8(as_payload(images) + as_payload(images[:1])))
    t = scorer(packed.append_column(PROMPT, pa.array(PROMPTS + [None])))
    np.testing.assert_allclose(t[CLIP_IMAGE_NORM].to_numpy(zero_copy_only=False)[:3], out[CLIP_IMAGE_NORM], rtol=1e-4)
    assert t[CLIP_IMAGE_NORM].null_count == 0 and t[CLIP_TEXT_NORM].null_count == 1   # a null prompt: no text norm
