"""Grounded segmentation (paper 004, section 5 "Detecting generated objects"): tiny random
GroundingDINO / OWLv2 / SAM stand-ins saved with save_pretrained and loaded through the production
loaders; the outputs' contract; the pieces checked against transformers' own processors and
post-processing; the NMS, label-mapping and chunking rules on hand-built inputs."""

import logging
import re
import shutil
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.image_grounded_segmentation import GroundedSegmenter
from operators.support.grounding import (
    DEFAULT_TAGS_FILE,
    assign_labels,
    boxes_to_pixels,
    chunk_labels,
    grounding_caption,
    image_vocabulary,
    merge_and_suppress,
    normalize_label,
    read_tags,
)
from operators.support.grounding_models import FAMILY_GROUNDING_DINO, FAMILY_OWLV2, _pixels
from operators.support import rle
from operators.support.codec import pack_rgb8
from operators.support.models import ModelLoadError
from pipelines.standins.grounding import (
    build_tiny_grounding_dino,
    build_tiny_owlv2,
    build_tiny_sam,
)
from schemas.exposed import (
    DETECTION_COLUMNS,
    DETECTION_STATUS,
    OBJECT_BOXES,
    OBJECT_LABELS,
    OBJECT_MASKS,
    OBJECT_SCORES,
    PROMPT_NOUNS,
    DetectionStatus,
)
from schemas.images import GENERATION_STATUS, IMAGE, GenerationStatus

VOCAB = ["cat", "dog", "bow tie", "tree"]


class _Heard(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("grounding")
    return {"gdino": build_tiny_grounding_dino(root / "gdino"), "owlv2": build_tiny_owlv2(root / "owlv2"),
            "sam": build_tiny_sam(root / "sam")}


def _quietly(fn):
    heard = _Heard()
    logging.getLogger("transformers").addHandler(heard)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fn()
    finally:
        logging.getLogger("transformers").removeHandler(heard)
    return out, [str(w.message) for w in caught] + heard.messages


@pytest.fixture(scope="module")
def gdino(models):
    # random stand-ins: thresholds lowered so that boxes come out
    seg, heard = _quietly(lambda: GroundedSegmenter(models["gdino"], models["sam"], box_threshold=0.0,
                                                    text_threshold=0.0, vocabulary=VOCAB, device="cpu"))
    seg.heard = heard
    return seg


@pytest.fixture(scope="module")
def owl(models):
    seg, heard = _quietly(lambda: GroundedSegmenter(models["owlv2"], models["sam"], box_threshold=0.0,
                                                    vocabulary=VOCAB, device="cpu"))
    seg.heard = heard
    return seg


def images_u8(n, h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def as_tensor(u8):
    return torch.from_numpy(u8).permute(0, 3, 1, 2).float() / 255.0


def check_contract(out, n, h, w, vocabs, box_threshold=0.0):
    assert set(out) == {f.name for f in DETECTION_COLUMNS}
    for col in out.values():
        assert len(col) == n
    for i in range(n):
        labels, scores, boxes, masks = (out[OBJECT_LABELS][i], out[OBJECT_SCORES][i], out[OBJECT_BOXES][i],
                                        out[OBJECT_MASKS][i])
        assert out[DETECTION_STATUS][i] == DetectionStatus.OK
        assert len(labels) == len(scores) == len(boxes) == len(masks)
        assert set(labels) <= set(vocabs[i])
        assert all(isinstance(s, float) and s > box_threshold for s in scores)
        assert scores == sorted(scores, reverse=True)
        for x0, y0, x1, y1 in boxes:
            assert 0.0 <= x0 < x1 <= w and 0.0 <= y0 < y1 <= h
        for counts in masks:
            assert all(isinstance(c, int) for c in counts)
            m = rle.decode(counts, h, w)
            assert m.shape == (h, w) and m.dtype == bool


# --- loading -----------------------------------------------------------------------------------------------


def test_standins_load_without_warnings_and_record_provenance(gdino, owl, models):
    assert gdino.heard == [] and owl.heard == []
    assert gdino.family == FAMILY_GROUNDING_DINO and owl.family == FAMILY_OWLV2
    rec = gdino.record
    assert rec["stage"] == "grounded_segmentation"
    assert (rec["box_threshold"], rec["text_threshold"], rec["nms_iou"]) == (0.0, 0.0, 0.5)
    assert rec["max_text_len"] == 256 and owl.record["text_threshold"] is None
    assert rec["vocabulary_size"] == len(VOCAB) and len(rec["vocabulary_sha256"]) == 64
    for role, path in (("detector", models["gdino"]), ("segmenter", models["sam"])):
        r = rec[role]
        assert r["model"] == path and r["source"] == "directory" and r["revision"] is None
        assert r["dtype"] == "float32" and r["device"] == "cpu"
        assert len(r["weights_sha256"]) == 64 and list(r["weight_files"]) == ["model.safetensors"]
        assert "random weights" in r["standin"]
        assert r["preprocessing_on_device"] is True
    assert rec["detector"]["model_class"] == "GroundingDinoForObjectDetection"
    assert rec["segmenter"]["model_class"] == "SamModel"
    assert owl.record["detector"]["model_class"] == "Owlv2ForObjectDetection"


def test_default_thresholds_are_grounded_sams():
    import inspect

    sig = inspect.signature(GroundedSegmenter.__init__).parameters
    assert sig["detector"].default == "IDEA-Research/grounding-dino-tiny"
    assert sig["segmenter"].default == "facebook/sam-vit-huge"
    assert (sig["box_threshold"].default, sig["text_threshold"].default, sig["nms_iou"].default) == (0.25, 0.2, 0.5)
    assert GroundedSegmenter.stage_name == "grounded_segmentation"
    r = GroundedSegmenter.resources
    assert (r.num_cpus, r.num_gpus, r.batch_size, r.actors) == (1, 1, 8, 1)


def test_missing_model_is_a_model_load_error(models, tmp_path):
    with pytest.raises(ModelLoadError, match="save_pretrained"):
        GroundedSegmenter(str(tmp_path / "nowhere"), models["sam"], device="cpu")
    with pytest.raises(ModelLoadError, match="SamModel"):
        GroundedSegmenter(models["gdino"], str(tmp_path / "no-sam"), device="cpu")
    with pytest.raises(ModelLoadError, match="not one of"):   # a SAM is no detector
        GroundedSegmenter(models["sam"], models["sam"], device="cpu")
    with pytest.raises(ModelLoadError, match="not a 'sam'"):  # a detector is no SAM
        GroundedSegmenter(models["gdino"], models["gdino"], device="cpu")


def test_config_weight_mismatch_is_an_error(models, tmp_path):
    import json

    bad = tmp_path / "gdino-more-queries"
    shutil.copytree(models["gdino"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["num_queries"] = 20  # the query embeddings saved have 12 rows
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="do not match|mismatched"):
        GroundedSegmenter(str(bad), models["sam"], device="cpu")


def test_missing_weights_are_an_error(models, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "sam-partial"
    shutil.copytree(models["sam"], bad)
    weights = load_file(bad / "model.safetensors")
    dropped = next(k for k in weights if k.startswith("mask_decoder."))
    del weights[dropped]
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="do not match: the weights lack 1 parameters"):
        GroundedSegmenter(models["gdino"], str(bad), device="cpu")


# --- outputs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["gdino", "owl"])
def test_detect_tensor_contract(which, gdino, owl):
    seg = {"gdino": gdino, "owl": owl}[which]
    u8 = images_u8(3, 40, 56)
    nouns = [["Man"], None, ["woman", "cat"]]
    out = seg.detect_tensor(as_tensor(u8), nouns)
    vocabs = [image_vocabulary(n, VOCAB) for n in nouns]
    assert vocabs[0] == ["man", *VOCAB] and vocabs[2] == ["woman", *VOCAB]
    check_contract(out, 3, 40, 56, vocabs)
    assert sum(len(x) for x in out[OBJECT_LABELS]) > 0  # thresholds at 0: the random models find things


def test_thresholds_filter_boxes(models, gdino):
    u8 = images_u8(2, 48, 48, seed=2)
    strict = GroundedSegmenter(models["gdino"], models["sam"], box_threshold=0.9, text_threshold=0.0,
                               vocabulary=VOCAB, device="cpu")
    out = strict.detect_tensor(as_tensor(u8), [[], []])
    check_contract(out, 2, 48, 48, [VOCAB, VOCAB], box_threshold=0.9)
    loose = gdino.detect_tensor(as_tensor(u8), [[], []])
    assert sum(map(len, out[OBJECT_SCORES])) < sum(map(len, loose[OBJECT_SCORES]))
    nothing = GroundedSegmenter(models["gdino"], models["sam"], box_threshold=1.0, vocabulary=VOCAB, device="cpu")
    out = nothing.detect_tensor(as_tensor(u8), [[], []])
    assert out[OBJECT_LABELS] == [[], []] and out[OBJECT_MASKS] == [[], []]
    assert out[DETECTION_STATUS] == [DetectionStatus.OK] * 2


def test_empty_vocabulary_gives_no_objects(models):
    seg = GroundedSegmenter(models["gdino"], models["sam"], box_threshold=0.0, text_threshold=0.0, device="cpu")
    out = seg.detect_tensor(as_tensor(images_u8(2, 32, 32)), [[], ["cat"]])
    assert out[OBJECT_LABELS][0] == [] and out[DETECTION_STATUS] == ["ok", "ok"]
    assert set(out[OBJECT_LABELS][1]) == {"cat"} and len(out[OBJECT_LABELS][1]) > 0


def test_payload_batch_matches_tensor_and_marks_missing_images(gdino):
    u8a = images_u8(2, 40, 56, seed=3)
    u8b = images_u8(1, 32, 48, seed=4)
    payload = pack_rgb8([u8a[0], u8b[0], u8a[1], u8a[0], u8a[0]])
    data = payload["image"].to_pylist()
    data[3] = None                                           # no image
    table = pa.table({
        IMAGE: pa.array(data, pa.binary()),
        "image_encoding": payload["image_encoding"], "image_height": payload["image_height"],
        "image_width": payload["image_width"],
        GENERATION_STATUS: pa.array([GenerationStatus.OK, None, GenerationStatus.OK, GenerationStatus.OK, "nsfw"]),
        PROMPT_NOUNS: pa.array([["man"], ["woman"], None, ["man"], ["man"]], pa.list_(pa.string())),
    })
    out = gdino(table)
    assert out.num_rows == 5
    for f in DETECTION_COLUMNS:
        assert out.schema.field(f.name).type == f.type
    status = out.column(DETECTION_STATUS).to_pylist()
    assert status == ["ok", "ok", "ok", "no_image", "no_image"]
    for r in (3, 4):
        for name in (OBJECT_LABELS, OBJECT_SCORES, OBJECT_BOXES, OBJECT_MASKS):
            assert out.column(name)[r].as_py() == []
    # the payload path and the tensor path detect the same (two image sizes: two groups)
    same = gdino.detect_tensor(as_tensor(u8a), [["man"], None])
    other = gdino.detect_tensor(as_tensor(u8b), [["woman"]])
    for name in (OBJECT_LABELS, OBJECT_BOXES, OBJECT_MASKS):
        assert out.column(name)[0].as_py() == same[name][0]
        assert out.column(name)[2].as_py() == same[name][1]
        assert out.column(name)[1].as_py() == other[name][0]
    np.testing.assert_allclose(out.column(OBJECT_SCORES)[0].as_py(), same[OBJECT_SCORES][0], rtol=1e-6)
    for r in (0, 1, 2):
        h, w = (32, 48) if r == 1 else (40, 56)
        for counts in out.column(OBJECT_MASKS)[r].as_py():
            assert rle.decode(counts, h, w).shape == (h, w)


def test_undecodable_payload_is_no_image(gdino):
    table = pa.table({IMAGE: pa.array([b"not an image", None], pa.binary())})
    out = gdino(table)
    assert out.column(DETECTION_STATUS).to_pylist() == ["no_image", "no_image"]
    assert out.column(OBJECT_LABELS).to_pylist() == [[], []]


def test_a_failing_batch_is_marked_error(gdino, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("device lost")

    monkeypatch.setattr(gdino, "_detect", boom)
    table = pa.table({IMAGE: pack_rgb8([images_u8(1, 16, 16)[0]])["image"],
                      "image_encoding": pa.array(["rgb8"]), "image_height": pa.array([16], pa.int32()),
                      "image_width": pa.array([16], pa.int32())})
    out = gdino(table)
    assert out.column(DETECTION_STATUS).to_pylist() == ["error"]
    assert out.column(OBJECT_LABELS).to_pylist() == [None]


# --- against transformers' own processing -------------------------------------------------------------------


def test_grounding_dino_matches_transformers_post_processing(models):
    seg = GroundedSegmenter(models["gdino"], models["sam"], box_threshold=0.3, text_threshold=0.2, nms_iou=1.0,
                            device="cpu")
    labels = ["man", "cat", "bow tie"]
    u8 = images_u8(2, 40, 56, seed=5)
    proc = seg.detector.processor
    inputs = proc(images=list(u8), text=[grounding_caption(labels)] * 2, return_tensors="pt")
    # the processor's pixels, computed from the uint8 tensor, and the caption's tokens
    ours_px = _pixels(seg.detector, torch.from_numpy(u8).permute(0, 3, 1, 2))
    torch.testing.assert_close(ours_px["pixel_values"], inputs["pixel_values"], rtol=0, atol=0)
    assert seg.queries(labels)[0].input_ids == inputs["input_ids"][0].tolist()
    with torch.no_grad():
        raw = seg.detector.model(**inputs)
    ref = proc.post_process_grounded_object_detection(raw, inputs["input_ids"], threshold=0.3, text_threshold=0.2,
                                                      target_sizes=[(40, 56)] * 2)
    out = seg.detect_tensor(as_tensor(u8), [labels, labels])
    for i in range(2):
        ref_boxes = boxes_clip(ref[i]["boxes"], 56, 40)
        ref_scores = ref[i]["scores"].tolist()
        assert len(out[OBJECT_SCORES][i]) > 0
        phrases = [phrase_words(p) for p in ref[i]["text_labels"]]
        named = [k for k, words in enumerate(phrases) if words & {"man", "cat", "bow", "tie"}]
        assert len(out[OBJECT_SCORES][i]) == len(named)      # the boxes whose phrase names a label
        for s, box, lab in zip(out[OBJECT_SCORES][i], out[OBJECT_BOXES][i], out[OBJECT_LABELS][i]):
            k = int(np.argmin([abs(s - r) for r in ref_scores]))
            assert abs(ref_scores[k] - s) < 1e-6
            np.testing.assert_allclose(box, ref_boxes[k], atol=1e-4)
            # the label is one the processor's phrase names
            assert set(lab.split()) & phrases[k]


def phrase_words(phrase: str) -> set[str]:
    """The words of a decoded phrase ("man. cat. bow tie. [SEP]"), separators and special tokens left out."""
    return set(re.findall(r"[a-z]+", re.sub(r"\[[A-Z]+\]", " ", phrase)))


def boxes_clip(boxes, w, h):
    b = boxes.clone()
    b[:, 0::2] = b[:, 0::2].clamp(0, w)
    b[:, 1::2] = b[:, 1::2].clamp(0, h)
    return b.tolist()


def test_owlv2_matches_transformers_post_processing(models):
    seg = GroundedSegmenter(models["owlv2"], models["sam"], box_threshold=0.0, nms_iou=1.0, device="cpu")
    labels = ["man", "cat", "bow tie"]
    u8 = images_u8(2, 40, 56, seed=6)
    proc = seg.detector.processor
    inputs = proc(images=list(u8), text=[labels, labels], return_tensors="pt")
    ours_px = _pixels(seg.detector, torch.from_numpy(u8).permute(0, 3, 1, 2))
    torch.testing.assert_close(ours_px["pixel_values"], inputs["pixel_values"], rtol=0, atol=1e-6)
    with torch.no_grad():
        raw = seg.detector.model(**inputs)
    ref = proc.post_process_grounded_object_detection(raw, threshold=0.0, target_sizes=[(40, 56)] * 2,
                                                      text_labels=[labels] * 2)
    out = seg.detect_tensor(as_tensor(u8), [labels, labels])
    for i in range(2):
        clipped = np.array(boxes_clip(ref[i]["boxes"], 56, 40))
        area = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])
        expected = sorted(((float(s), lab, tuple(b)) for s, lab, b, a in
                           zip(ref[i]["scores"].tolist(), ref[i]["text_labels"], clipped, area) if a),
                          key=lambda x: -x[0])
        got = list(zip(out[OBJECT_SCORES][i], out[OBJECT_LABELS][i], out[OBJECT_BOXES][i]))
        assert len(got) == len(expected) > 0
        for (s, lab, box), (es, elab, ebox) in zip(got, expected):
            assert abs(s - es) < 1e-6 and lab == elab
            np.testing.assert_allclose(box, ebox, atol=1e-4)


def test_sam_masks_match_transformers_post_processing(gdino):
    u8 = images_u8(1, 40, 56, seed=7)
    boxes = [[5.0, 6.0, 30.0, 35.0], [20.0, 3.0, 55.0, 39.0]]
    proc = gdino.segmenter.processor
    inputs = proc(images=[u8[0]], input_boxes=[boxes], return_tensors="pt")
    with torch.no_grad():
        raw = gdino.segmenter.model(pixel_values=inputs["pixel_values"], input_boxes=inputs["input_boxes"].float(),
                                    multimask_output=False)
    ref = proc.post_process_masks(raw.pred_masks, inputs["original_sizes"], inputs["reshaped_input_sizes"])[0][:, 0]
    with torch.inference_mode():
        ours = gdino._segment(torch.from_numpy(u8).permute(0, 3, 1, 2), [torch.tensor(boxes)])[0]
    assert ours.shape == (2, 40, 56) and ours.dtype == torch.bool
    assert torch.equal(ours, ref)
    assert 0 < ref.float().mean() < 1


def test_boxes_decoded_in_chunks_give_the_same_masks(gdino, monkeypatch):
    """SAM decodes each box independently: chunks of one box equal all boxes in one call."""
    import operators.image_grounded_segmentation as G

    u8 = torch.from_numpy(images_u8(1, 40, 56, seed=9)).permute(0, 3, 1, 2)
    boxes = [torch.tensor([[5.0, 6.0, 30.0, 35.0], [20.0, 3.0, 55.0, 39.0], [0.0, 0.0, 56.0, 40.0]])]
    with torch.inference_mode():
        whole = gdino._segment(u8, boxes)[0]
        monkeypatch.setattr(G, "SAM_BOX_CHUNK", 1)
        chunked = gdino._segment(u8, boxes)[0]
    assert whole.shape == (3, 40, 56) and torch.equal(whole, chunked)


def test_one_mask_per_box_from_the_boxes_found(gdino):
    u8 = images_u8(2, 40, 56, seed=8)
    with torch.inference_mode():
        t = torch.from_numpy(u8).permute(0, 3, 1, 2)
        found = gdino._detect(t, [VOCAB, VOCAB])
        masks = gdino._segment(t, [f[0] for f in found])
    out = gdino.detect_tensor(as_tensor(u8), [[], []])
    for i in range(2):
        assert masks[i].shape[0] == found[i][0].shape[0] == len(out[OBJECT_MASKS][i])
        assert rle.encode_many(masks[i].numpy()) == out[OBJECT_MASKS][i]


# --- label mapping, NMS, boxes ------------------------------------------------------------------------------


def test_assign_labels_by_token_position():
    # caption "[CLS] man . bow tie . [SEP] [PAD]": positions -> labels
    pos = torch.tensor([-1, 0, -1, 1, 1, -1, -1, -1])
    probs = torch.tensor([
        [0.9, 0.8, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0],   # phrase "man" -> man
        [0.1, 0.3, 0.0, 0.1, 0.5, 0.0, 0.0, 0.0],   # phrase "man tie": two labels, tie's token is higher -> bow tie
        [0.1, 0.1, 0.9, 0.1, 0.1, 0.7, 0.9, 0.0],   # only "." and [SEP] above threshold -> none
        [0.9, 0.1, 0.1, 0.15, 0.1, 0.0, 0.0, 0.0],  # only [CLS] -> none
        [0.1, 0.6, 0.0, 0.6, 0.0, 0.0, 0.0, 0.0],   # a tie between the labels -> the earlier one
        [0.1, 0.25, 0.0, 0.1, 0.21, 0.0, 0.0, 0.0], # man 0.25 and tie 0.21 both above 0.2 -> man
    ])
    labels, scores = assign_labels(probs, pos, 2, text_threshold=0.2)
    assert labels.tolist() == [0, 1, -1, -1, 0, 0]
    np.testing.assert_allclose(scores.tolist(), [0.8, 0.5, 0.0, 0.0, 0.6, 0.25], atol=1e-6)
    # the threshold is strict, as the demo's "logit > text_threshold"
    labels, _ = assign_labels(torch.tensor([[0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]), pos, 2, 0.2)
    assert labels.tolist() == [-1]
    labels, _ = assign_labels(torch.zeros(0, 8), pos, 2, 0.2)
    assert labels.shape == (0,)


def test_merge_and_suppress_is_class_agnostic():
    boxes = torch.tensor([
        [0.0, 0.0, 10.0, 10.0],    # 0: score 0.9 label 0
        [0.0, 0.0, 10.0, 9.0],     # 1: IoU 0.9 with 0, another label -> suppressed
        [20.0, 20.0, 30.0, 30.0],  # 2: apart -> kept
        [0.0, 0.0, 10.0, 5.0],     # 3: IoU exactly 0.5 with 0 -> kept (suppression needs IoU > 0.5)
        [5.0, 5.0, 5.0, 8.0],      # 4: no area -> dropped
        [20.0, 20.0, 30.0, 30.0],  # 5: a duplicate of 2 from another query, higher score -> keeps, 2 goes
    ])
    scores = torch.tensor([0.9, 0.8, 0.5, 0.4, 0.95, 0.6])
    labels = torch.tensor([0, 1, 2, 0, 3, 4])
    b, s, lab = merge_and_suppress(boxes, scores, labels, 0.5)
    assert s.tolist() == pytest.approx([0.9, 0.6, 0.4])
    assert lab.tolist() == [0, 4, 0]
    assert b.tolist() == [[0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 10, 5]]
    b, s, lab = merge_and_suppress(boxes, scores, labels, 1.0)  # IoU > 1 never: only the area rule
    assert len(s) == 5
    b, s, lab = merge_and_suppress(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.long), 0.5)
    assert b.shape == (0, 4)


def test_boxes_to_pixels_clips_to_the_image():
    rel = torch.tensor([[0.5, 0.5, 0.2, 0.4], [0.0, 1.0, 0.4, 0.4], [0.5, 0.5, 1.0, 1.0]])
    px = boxes_to_pixels(rel, width=100, height=50)
    np.testing.assert_allclose(px.tolist(), [[40, 15, 60, 35], [0, 40, 20, 50], [0, 0, 100, 50]], atol=1e-4)
    # OWLv2: relative to the image padded to a square (100 x 100), clipped to the 100 x 50 image
    px = boxes_to_pixels(torch.tensor([[0.5, 0.5, 0.2, 0.8]]), 100, 50, 100, 100)
    np.testing.assert_allclose(px.tolist(), [[40, 10, 60, 50]], atol=1e-4)


# --- vocabulary and chunking ----------------------------------------------------------------------------------


def test_vocabulary_rules():
    assert normalize_label("  Bow  Tie ") == "bow tie"
    assert normalize_label("St. Mary") == "st mary"
    assert image_vocabulary(["Man", "cat"],
                            ["cat", "St. Mary", " bow  tie ", "", "MAN"]) == ["man", "cat", "st mary", "bow tie"]
    assert image_vocabulary(None, ()) == []
    assert grounding_caption(["cat", "bow tie"]) == "cat. bow tie."


def test_chunk_labels_packs_greedily():
    assert chunk_labels([2, 2, 2, 2], budget=5) == [[0, 1], [2, 3]]
    assert chunk_labels([3, 1, 1, 4, 1], budget=5) == [[0, 1, 2], [3, 4]]
    assert chunk_labels([1] * 5, budget=None, max_labels=2) == [[0, 1], [2, 3], [4]]
    assert chunk_labels([1] * 5, budget=3, max_labels=2) == [[0, 1], [2, 3], [4]]
    assert chunk_labels([], budget=5) == []
    with pytest.raises(ValueError):
        chunk_labels([2, 7], budget=5)


def test_long_vocabulary_is_split_into_queries_and_merged(models, monkeypatch):
    words = ["cat", "dog", "tree", "hat", "car", "park", "table", "chair", "cake", "salad"]
    long_vocab = [f"{a} {b}" for a in words for b in words][:95]   # 2 tokens + "." each: 285 > 254
    seg = GroundedSegmenter(models["gdino"], models["sam"], box_threshold=0.0, text_threshold=0.0, nms_iou=1.0,
                            vocabulary=long_vocab, device="cpu")
    queries = seg.queries(seg.vocabulary)
    assert len(queries) == 2
    assert [i for q in queries for i in q.labels] == list(range(95))          # every label once, in order
    for q in queries:
        assert len(q.input_ids) <= 256
        assert q.input_ids[0] == seg._cls and q.input_ids[-1] == seg._sep
        assert sorted(set(q.position_labels) - {-1}) == list(range(len(q.labels)))
    # the boxes of both queries are merged before NMS
    calls = []
    original = seg._grounding_dino

    def spy(pixels, idx, qs, h, w):
        res = original(pixels, idx, qs, h, w)
        calls.append(res)
        return res

    monkeypatch.setattr(seg, "_grounding_dino", spy)
    u8 = images_u8(1, 32, 32, seed=9)
    out = seg.detect_tensor(as_tensor(u8), [[]])
    assert len(calls) == 2
    merged = merge_and_suppress(torch.cat([c[0][0] for c in calls]), torch.cat([c[0][1] for c in calls]),
                                torch.cat([c[0][2] for c in calls]), 1.0)
    assert out[OBJECT_SCORES][0] == pytest.approx(merged[1].tolist())
    assert out[OBJECT_LABELS][0] == [seg.vocabulary[j] for j in merged[2].tolist()]
    first, second = set(long_vocab[:len(queries[0].labels)]), set(long_vocab[len(queries[0].labels):])
    assert set(out[OBJECT_LABELS][0]) & first and set(out[OBJECT_LABELS][0]) & second
    check_contract(out, 1, 32, 32, [seg.vocabulary])


def test_max_labels_per_query(models):
    seg = GroundedSegmenter(models["owlv2"], models["sam"], box_threshold=0.0, vocabulary=VOCAB, device="cpu",
                            max_labels_per_query=3)
    assert [q.labels for q in seg.queries(image_vocabulary(["man"], VOCAB))] == [[0, 1, 2], [3, 4]]
    out = seg.detect_tensor(as_tensor(images_u8(2, 32, 32)), [["man"], []])
    check_contract(out, 2, 32, 32, [image_vocabulary(["man"], VOCAB), VOCAB])


def test_bad_settings_are_refused(models):
    with pytest.raises(ValueError):
        GroundedSegmenter(models["gdino"], models["sam"], box_threshold=1.5, device="cpu")
    with pytest.raises(ValueError):
        GroundedSegmenter(models["gdino"], models["sam"], max_labels_per_query=0, device="cpu")
    with pytest.raises(TypeError):
        GroundedSegmenter(models["gdino"], models["sam"], vocabulary="configs/exposed_tags.txt", device="cpu")


# --- the default tag list --------------------------------------------------------------------------------------

COCO_80 = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis",
    "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich",
    "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant", "bed",
    "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone", "microwave", "oven",
    "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)
PAPER_OBJECTS = (
    "suit", "tie", "bow tie", "dress", "cocktail dress", "veil", "bikini", "shawl", "suspender", "fedora", "apron",
    "boot", "leggings", "ponytail", "beard", "brunette", "baseball team", "skateboarder", "golfer", "football player",
    "bodybuilder", "football team", "tennis court", "salad", "meal", "cotton candy", "park", "church", "basement",
    "cabinet", "stone building", "dirt field", "grass", "tree", "crowd", "backdrop", "carpet", "store",
    "passenger train", "dinner party", "person", "people", "man", "woman", "men", "women", "child", "family", "girl",
    "boy", "businessman")


def test_default_tag_list():
    tags = read_tags(DEFAULT_TAGS_FILE)
    assert 150 <= len(tags) <= 250
    assert len(set(tags)) == len(tags)
    assert all(t == normalize_label(t) for t in tags)                 # lower case, no ".", single spaces
    assert set(COCO_80) <= set(tags)
    assert set(PAPER_OBJECTS) <= set(tags)
