"""The fitted parts of the stand-in models: the generators' face decoder, the skill detector's
favoured labels, the calibrated CLIP. They exist so that a stand-in run reaches the branches a real
run reaches (a face found, a gender counted, a skin tone measured, a detection of the prompt's
object); these tests check that they do, through the production operators."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines.standins import face_decoder as F
from pipelines.standins.diffusion import build_tiny_stable_diffusion
from pipelines.standins.face_decoder import build_tiny_vae


@pytest.fixture(scope="module")
def face_images(tmp_path_factory):
    """Images of the two stand-in generators a study builds (seeds 0 and 1, faces=True)."""
    from operators.image_generation import ImageGenerator

    prompts = [f"a photo of a {o}" for o in ("nurse", "ceo", "pilot", "chef", "farmer", "lawyer")]
    out = []
    for seed in (0, 1):
        path = build_tiny_stable_diffusion(tmp_path_factory.mktemp(f"sdf{seed}"), seed=seed, faces=True)
        gen = ImageGenerator(path, steps=5, device="cpu", dtype="float32")
        out += [gen.regenerate(p, i) for i, p in enumerate(prompts)]
    return out


def test_the_shipped_decoder_fits_the_standin_vae_and_a_wrong_one_is_refused(tmp_path):
    vae = build_tiny_vae(seed=1)
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    F.load_face_decoder(vae)
    after = vae.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(k.startswith(("decoder.", "post_quant_conv.")) for k in changed)
    assert not any(k.startswith("encoder.") for k in changed)
    from safetensors.torch import save_file

    bad = tmp_path / "bad.safetensors"
    save_file({"decoder.conv_in.weight": torch.zeros(1)}, str(bad))
    with pytest.raises(RuntimeError, match="refit"):
        F.load_face_decoder(build_tiny_vae(seed=1), bad)


def test_without_faces_the_standin_is_unchanged_random(tmp_path):
    from safetensors.torch import load_file

    plain = build_tiny_stable_diffusion(tmp_path / "plain", seed=0)
    faces = build_tiny_stable_diffusion(tmp_path / "faces", seed=0, faces=True)
    a = load_file(f"{plain}/vae/diffusion_pytorch_model.safetensors")
    b = load_file(f"{faces}/vae/diffusion_pytorch_model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a if k.startswith("encoder."))
    assert not all(torch.equal(a[k], b[k]) for k in a if k.startswith("decoder."))
    for part in ("unet", "text_encoder"):   # only the decoder is fitted
        name = "diffusion_pytorch_model.safetensors" if part == "unet" else "model.safetensors"
        x, y = load_file(f"{plain}/{part}/{name}"), load_file(f"{faces}/{part}/{name}")
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_generated_images_show_faces_of_both_templates_and_several_skin_tones(face_images):
    from operators.image_face_filter import FaceFilter
    from operators.image_skin_tone import SkinToneDetector

    found = [FaceFilter().evaluate(im)[0] for im in face_images]
    assert found.count("ok") >= 0.8 * len(face_images), found
    skin = [SkinToneDetector().measure(im) for im in face_images]
    tones = {s["skin_tone"] for s in skin if s["skin_status"] == "ok"}
    assert sum(s["skin_status"] == "ok" for s in skin) >= 0.7 * len(face_images)
    assert len(tones) >= 2, tones
    woman, man = (((t.permute(1, 2, 0).numpy() + 1) * 127.5) for t in F.face_templates())
    nearer = {"woman" if np.abs(im - woman).mean() < np.abs(im - man).mean() else "man" for im in face_images}
    assert nearer == {"woman", "man"}


def test_the_calibrated_clip_counts_both_genders_among_the_standin_faces(face_images, tmp_path):
    from operators.image_clip_gender import ClipGenderClassifier
    from pipelines.engine.run.models import build_standin_clip

    from schemas.images import Gender

    clf = ClipGenderClassifier(model=build_standin_clip(str(tmp_path)), pretrained=None, device="cpu")
    images = torch.tensor(np.stack(face_images)).permute(0, 3, 1, 2).float() / 255
    res = clf.classify_tensor(images)
    genders = list(res["gender"])
    assert {Gender.MALE, Gender.FEMALE} <= set(genders), genders


def test_refitting_writes_a_loadable_decoder(tmp_path):
    out = tmp_path / "refit.safetensors"
    assert F.main(["--steps", "2", "--batch", "2", "--output", str(out)]) == 0
    F.load_face_decoder(build_tiny_vae(seed=1), out)


def test_the_detector_favours_the_given_labels_and_refuses_unknown_ones(tmp_path):
    from transformers import DetrForObjectDetection

    from pipelines.standins.detection import FAVOUR_BOOST, build_tiny_detr, coco_id2label

    plain = DetrForObjectDetection.from_pretrained(build_tiny_detr(tmp_path / "a", seed=0))
    fav = DetrForObjectDetection.from_pretrained(build_tiny_detr(tmp_path / "b", seed=0, favour=["dog", "bench"]))
    diff = (fav.class_labels_classifier.bias - plain.class_labels_classifier.bias).detach()
    ids = {i for i, n in coco_id2label().items() if n in ("dog", "bench")}
    assert torch.allclose(diff[sorted(ids)], torch.tensor(FAVOUR_BOOST))
    assert torch.count_nonzero(diff) == len(ids)
    assert "dog" in (tmp_path / "b" / "STANDIN.txt").read_text()
    with pytest.raises(ValueError, match="unicorn"):
        build_tiny_detr(tmp_path / "c", favour=["unicorn"])


def test_each_clip_tokenizer_is_a_copy_of_the_one_built_once():
    """The stand-ins' CLIP tokenizer is built once per process and each builder gets a copy: one
    that changes its tokenizer (OWLv2's pad token and length) leaves the next one CLIP's."""
    from pipelines.standins.diffusion import build_clip_tokenizer

    first = build_clip_tokenizer()
    pad, length = first.pad_token, first.model_max_length
    first.pad_token, first.model_max_length = "!", 16
    second = build_clip_tokenizer()
    assert second is not first and (second.pad_token, second.model_max_length) == (pad, length) == ("<|endoftext|>", 77)
    assert second("a photo of a nurse").input_ids == first("a photo of a nurse").input_ids
