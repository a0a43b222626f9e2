"""Open-vocabulary object detection and segmentation of generated images (paper 004, section 5
"Detecting generated objects", App. A).

The paper runs RAM-Grounded-SAM (github.com/IDEA-Research/Grounded-Segment-Anything): RAM tags the
image, GroundingDINO-T proposes boxes for the tags, SAM (ViT-H) segments each box. RAM is not a
package, so the tags here are a fixed vocabulary: the image's prompt nouns
(``schemas.exposed.PROMPT_NOUNS``) plus the configured ``vocabulary`` (the study's default is
``configs/exposed_tags.txt``). Everything else follows the Grounded-SAM demo
(``automatic_label_ram_demo.py``), with the transformers ports of the models:

1. **Vocabulary** of an image: its prompt nouns, then the configured vocabulary, each lower-cased,
   with "." replaced by a space (a "." separates phrases in GroundingDINO's caption) and runs of
   whitespace collapsed; empty entries dropped, duplicates kept once (first occurrence). An image
   with an empty vocabulary gets no objects (status ok).
2. **Boxes**, with ``detector`` (the family is read from the loaded config):

   - GroundingDINO (``IDEA-Research/grounding-dino-tiny``, ``GroundingDinoForObjectDetection``): the
     caption is the labels joined as ``"label one. label two."`` (the format of transformers'
     processor and of the GroundingDINO paper; the RAM demo itself joins RAM's tags with ", "). The
     text encoder takes at most ``config.max_text_len`` (256) tokens, [CLS] and [SEP] included, and
     the original implementation silently truncates longer captions; here a long vocabulary is
     split into several captions (*queries*), packed greedily in vocabulary order, each within the
     token budget and, with ``max_labels_per_query``, within that many labels. Each query is one
     forward pass over the same pixels; the boxes of all queries of an image are merged before NMS.
     A query's tokens are the concatenation ``[CLS] label "." label "." ... [SEP]``, checked
     against the tokenizer's own encoding of the caption, so every token position is known to
     belong to one label (or to a separator / special token).
     A box's score is its highest token probability over the whole caption (sigmoid of the
     logits), as in the demo and in transformers' ``post_process_grounded_object_detection``; a box
     is kept when that score is > ``box_threshold`` (0.25).
     **Label mapping**: the demo's phrase is the tokens whose probability is > ``text_threshold``
     (0.2). Here that phrase is matched back to the vocabulary by token position: the candidate
     labels are those with at least one token in the phrase ("." separators, [CLS], [SEP] and
     padding never count). One candidate: that label. Several (a phrase spanning labels, e.g. "man
     woman"): the label with the highest token score (its best token probability); ties go to the
     earlier label of the query. None (no label token above ``text_threshold``: the demo's empty or
     separator-only phrase): the box is dropped, before NMS, since it names no object of the
     vocabulary.
   - OWLv2 (``google/owlv2-base-patch16-ensemble``, ``Owlv2ForObjectDetection``): every label is one
     text query (the plain label, OWL's 16-token queries, longer ones truncated); a box's label is
     its best query, its score that query's sigmoid probability (transformers'
     ``post_process_object_detection``); kept when > ``box_threshold``. ``text_threshold`` does not
     apply. Labels are split into queries only with ``max_labels_per_query``.

   Boxes are converted to [x0, y0, x1, y1] pixels of the image (OWLv2's are relative to the image
   padded to a square, as its processor pads), clipped to the image, and boxes left without area
   dropped.
3. **NMS**: class-agnostic, as the demo (``torchvision.ops.nms`` over all boxes of an image,
   whatever their labels, IoU > ``nms_iou`` = 0.5 suppresses the lower-scoring box), after merging
   the queries; objects are listed by decreasing score.
4. **Masks**: SAM (``facebook/sam-vit-huge``, ``SamModel``; the paper used ViT-H) with the kept boxes
   as prompts, one mask per box (``multimask_output=False``, as the demo's
   ``predict_torch(boxes=..., multimask_output=False)``). The image embedding is computed once per
   image; the boxes are scaled as ``SamProcessor`` scales them; the low-resolution mask logits are
   post-processed as ``SamImageProcessor.post_process_masks``: upsampled (bilinear) to the padded
   input size, cropped to the resized image, upsampled to the image size, then > 0. Masks are
   stored as uncompressed COCO RLE (``operators.support.rle``) at the image's size.

Output (``schemas.exposed.DETECTION_COLUMNS``): per image the lists ``object_labels``,
``object_scores``, ``object_boxes`` and ``object_masks`` (equal lengths, one entry per object,
decreasing score) and ``detection_status``: ok; no_image (null or undecodable payload, or a
GENERATION_STATUS other than ok) with empty lists; error (the models raised on the image's batch;
logged) with null lists. No row is dropped.

Preprocessing: the images are quantised to 8-bit levels as the RGB8 payload is (``round(x *
255)``), so an image handed over on the generator's device (``detect_tensor``) and its payload
(``__call__``) are detected alike. The checkpoints' own image processors are then run on the
images' device: with transformers 5 they are torchvision-backed and take uint8 tensors on any
device (``device=``), so the preprocessing is the processor's own, not an emulation of it, and the
images never leave the device until the masks are encoded. A processor without a torchvision
backend (older transformers) runs on CPU copies instead; the record says which.

dtype "auto" is float32 for both models on every device (the demo runs them in float32; float16
through GroundingDINO's deformable attention is not what it was evaluated with);
``dtype="float16"`` / ``"bfloat16"`` applies to both.

Loading: ``detector`` and ``segmenter`` are hub ids (pinned with ``*_revision``; cached or reachable)
or local directories written by ``save_pretrained`` with their processors
(``pipelines.standins.grounding`` builds tiny random ones). Any weight the model lacks, any
checkpoint weight it does not use, or a shape mismatch is an error (transformers only warns).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from operators.base import Resources, with_column
from operators.support import rle
from operators.support.codec import decode_rows, generated_image_rows, rgb_levels
from operators.support.grounding import (
    assign_labels,
    boxes_to_pixels,
    chunk_labels,
    grounding_caption,
    image_vocabulary,
    merge_and_suppress,
    normalize_label,
    read_tags,
)
from operators.support.grounding_models import (
    DEFAULT_DETECTOR,
    DEFAULT_SEGMENTER,
    FAMILY_GROUNDING_DINO,
    _pixels,
    load_detector,
    load_segmenter,
)
from operators.support.models import ModelLoadError
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

log = logging.getLogger(__name__)

STAGE_GROUNDED_SEGMENTATION = "grounded_segmentation"

# the Grounded-SAM demo's thresholds (automatic_label_ram_demo.py)
BOX_THRESHOLD = 0.25
TEXT_THRESHOLD = 0.2
NMS_IOU = 0.5
MASK_THRESHOLD = 0.0  # SAM's mask logits > 0
SAM_BOX_CHUNK = 32    # boxes per SAM decoder call (bounds memory; each box is decoded independently)


# --- the stage ---------------------------------------------------------------------------------------------


@dataclass
class _Query:
    """One detector query of one image: its labels (indices into the image's vocabulary) and, for
    GroundingDINO, the caption's token ids and the label index of each token position."""

    labels: list[int]
    input_ids: list[int] | None = None
    position_labels: list[int] | None = None


class GroundedSegmenter:
    """Detect the vocabulary's objects in each image (GroundingDINO or OWLv2 boxes, class-agnostic
    NMS) and segment each with SAM; adds ``schemas.exposed.DETECTION_COLUMNS``."""

    stage_name = STAGE_GROUNDED_SEGMENTATION
    resources = Resources(num_cpus=1, num_gpus=1, batch_size=8, actors=1)
    output_fields = tuple(DETECTION_COLUMNS)

    def __init__(self, detector: str = DEFAULT_DETECTOR, segmenter: str = DEFAULT_SEGMENTER,
                 detector_revision: str | None = None, segmenter_revision: str | None = None,
                 box_threshold: float = BOX_THRESHOLD, text_threshold: float = TEXT_THRESHOLD,
                 nms_iou: float = NMS_IOU, vocabulary: Sequence[str] = (), device: str = "auto",
                 dtype: str = "auto", max_labels_per_query: int | None = None):
        for name, value in (("box_threshold", box_threshold), ("text_threshold", text_threshold), ("nms_iou", nms_iou)):
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if max_labels_per_query is not None and int(max_labels_per_query) < 1:
            raise ValueError(f"max_labels_per_query must be >= 1 or None, got {max_labels_per_query}")
        if isinstance(vocabulary, str):
            raise TypeError("vocabulary must be a sequence of labels (read a tag file with read_tags())")
        self.box_threshold = float(box_threshold)
        self.text_threshold = float(text_threshold)
        self.nms_iou = float(nms_iou)
        self.max_labels_per_query = None if max_labels_per_query is None else int(max_labels_per_query)
        self.vocabulary = image_vocabulary((), vocabulary)
        self.detector = load_detector(detector, detector_revision, device, dtype)
        self.segmenter = load_segmenter(segmenter, segmenter_revision, self.detector.device, dtype)
        self.device = self.detector.device
        self.family = self.detector.family
        self._label_ids: dict[str, list[int]] = {}
        if self.family == FAMILY_GROUNDING_DINO:
            tok = self.detector.processor.tokenizer
            self.max_text_len = int(self.detector.model.config.max_text_len)
            self._cls, self._sep = int(tok.cls_token_id), int(tok.sep_token_id)
            self._dot = self._ids(".")
            if not self._dot:
                raise ModelLoadError(f"the detector's tokenizer ({type(tok).__name__}) has no token for '.'")
        else:
            self.max_text_len = None
        sam_ip = self.segmenter.processor.image_processor
        self._sam_longest = int(_size(sam_ip.size, "longest_edge"))
        self._sam_pad = (int(_size(sam_ip.pad_size, "height")), int(_size(sam_ip.pad_size, "width")))
        self.record = {
            "stage": self.stage_name,
            "detector_family": self.family,
            "box_threshold": self.box_threshold,
            "text_threshold": self.text_threshold if self.family == FAMILY_GROUNDING_DINO else None,
            "nms_iou": self.nms_iou,
            "nms": "class-agnostic (torchvision.ops.nms over all boxes of an image, all queries merged)",
            "label_mapping": ("token positions of the phrase (probability > text_threshold) -> the candidate label "
                              "with the highest token score; boxes matching no label dropped"
                              if self.family == FAMILY_GROUNDING_DINO else "best text query"),
            "mask_threshold": MASK_THRESHOLD,
            "multimask_output": False,
            "max_labels_per_query": self.max_labels_per_query,
            "max_text_len": self.max_text_len,
            "vocabulary_size": len(self.vocabulary),
            "vocabulary_sha256": hashlib.sha256("\n".join(self.vocabulary).encode()).hexdigest(),
            "mask_encoding": "uncompressed COCO RLE (column-major, zeros first)",
            "detector": self.detector.record,
            "segmenter": self.segmenter.record,
        }

    # -- queries --------------------------------------------------------------------------------------

    def _ids(self, text: str) -> list[int]:
        ids = self._label_ids.get(text)
        if ids is None:
            ids = list(self.detector.processor.tokenizer(text, add_special_tokens=False)["input_ids"])
            self._label_ids[text] = ids
        return ids

    def queries(self, labels: Sequence[str]) -> list[_Query]:
        """The detector queries covering ``labels`` (an image's vocabulary), in order."""
        if not labels:
            return []
        if self.family != FAMILY_GROUNDING_DINO:
            return [_Query(labels=c) for c in chunk_labels([1] * len(labels), None, self.max_labels_per_query)]
        costs = [len(self._ids(lab)) + len(self._dot) for lab in labels]
        out = []
        for chunk in chunk_labels(costs, self.max_text_len - 2, self.max_labels_per_query):
            ids, pos = [self._cls], [-1]
            for k, i in enumerate(chunk):
                lab = self._ids(labels[i])
                ids += lab + self._dot
                pos += [k] * len(lab) + [-1] * len(self._dot)
            ids.append(self._sep)
            pos.append(-1)
            caption = grounding_caption([labels[i] for i in chunk])
            expected = list(self.detector.processor.tokenizer(caption)["input_ids"])
            if expected != ids:
                raise ValueError(f"the tokenizer does not encode {caption!r} as its labels' tokens joined by '.'")
            out.append(_Query(labels=chunk, input_ids=ids, position_labels=pos))
        return out

    # -- detection ----------------------------------------------------------------------------------------

    def _grounding_dino(self, pixels: dict, idx: list[int], queries: list[_Query], height: int, width: int):
        import torch  # deferred: torch

        model = self.detector.model
        length = max(len(q.input_ids) for q in queries)
        ids = torch.zeros(len(queries), length, dtype=torch.long)
        mask = torch.zeros(len(queries), length, dtype=torch.long)
        for r, q in enumerate(queries):
            ids[r, :len(q.input_ids)] = torch.tensor(q.input_ids)
            mask[r, :len(q.input_ids)] = 1
        sel = torch.as_tensor(idx, device=self.device)
        out = model(pixel_values=pixels["pixel_values"][sel].to(self.detector.dtype),
                    pixel_mask=pixels["pixel_mask"][sel] if "pixel_mask" in pixels else None,
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                    token_type_ids=torch.zeros_like(ids).to(self.device))
        probs = out.logits.float().sigmoid()            # (b, Q, max_text_len); padding positions 0
        boxes = out.pred_boxes.float()
        results = []
        for r, q in enumerate(queries):
            score = probs[r].max(dim=-1).values
            keep = score > self.box_threshold
            pos = torch.full((probs.shape[-1],), -1, dtype=torch.long, device=probs.device)
            pos[:len(q.position_labels)] = torch.tensor(q.position_labels, device=probs.device)
            lab, _ = assign_labels(probs[r][keep], pos, len(q.labels), self.text_threshold)
            named = lab >= 0
            chunk = torch.tensor(q.labels, dtype=torch.long, device=probs.device)
            results.append((boxes_to_pixels(boxes[r][keep][named], width, height), score[keep][named],
                            chunk[lab[named]]))
        return results

    def _owlv2(self, pixels: dict, idx: list[int], queries: list[_Query], vocabs: list[list[str]],
               height: int, width: int):
        import torch  # deferred: torch

        tok = self.detector.processor.tokenizer
        n_max = max(len(q.labels) for q in queries)
        length = int(getattr(self.detector.model.config.text_config, "max_position_embeddings", 16))
        ids = torch.zeros(len(queries), n_max, length, dtype=torch.long)
        mask = torch.zeros(len(queries), n_max, length, dtype=torch.long)
        mask[:, :, 0] = 1  # padding queries: all-zero ids (masked by the model), one attended position
        for r, (q, vocab) in enumerate(zip(queries, vocabs)):
            enc = tok([vocab[i] for i in q.labels], padding="max_length", truncation=True, max_length=length,
                      return_tensors="pt")
            ids[r, :len(q.labels)] = enc["input_ids"]
            mask[r, :len(q.labels)] = enc["attention_mask"]
        sel = torch.as_tensor(idx, device=self.device)
        out = self.detector.model(input_ids=ids.reshape(-1, length).to(self.device),
                                  attention_mask=mask.reshape(-1, length).to(self.device),
                                  pixel_values=pixels["pixel_values"][sel].to(self.detector.dtype))
        logits = out.logits.float()                      # (b, patches, n_max), padding queries at the minimum
        best, lab = logits.max(dim=-1)
        score = best.sigmoid()
        side = float(max(height, width))                 # boxes are relative to the image padded to a square
        results = []
        for r, q in enumerate(queries):
            keep = score[r] > self.box_threshold
            chunk = torch.tensor(q.labels, dtype=torch.long, device=logits.device)
            results.append((boxes_to_pixels(out.pred_boxes[r][keep].float(), width, height, side, side),
                            score[r][keep], chunk[lab[r][keep]]))
        return results

    def _detect(self, u8, vocabs: list[list[str]]):
        """Boxes of (B, 3, H, W) uint8 images on the model's device: per image (boxes (n, 4) pixels,
        scores (n,), label indices into its vocabulary (n,)) after NMS, by decreasing score."""
        import torch  # deferred: torch

        b, _, height, width = u8.shape
        queries = [self.queries(v) for v in vocabs]
        found: list[list[tuple]] = [[] for _ in range(b)]
        rounds = max((len(q) for q in queries), default=0)
        if rounds:
            pixels = _pixels(self.detector, u8)
            for j in range(rounds):  # one forward pass per query index, over the images that have it
                idx = [i for i in range(b) if len(queries[i]) > j]
                if self.family == FAMILY_GROUNDING_DINO:
                    res = self._grounding_dino(pixels, idx, [queries[i][j] for i in idx], height, width)
                else:
                    res = self._owlv2(pixels, idx, [queries[i][j] for i in idx], [vocabs[i] for i in idx],
                                      height, width)
                for i, r in zip(idx, res):
                    found[i].append(r)
        out = []
        for i in range(b):
            if not found[i]:
                empty = torch.zeros(0, device=u8.device)
                out.append((empty.reshape(0, 4), empty, empty.long()))
                continue
            boxes = torch.cat([f[0] for f in found[i]])
            scores = torch.cat([f[1] for f in found[i]])
            labels = torch.cat([f[2] for f in found[i]])
            out.append(merge_and_suppress(boxes, scores, labels, self.nms_iou))
        return out

    # -- segmentation -----------------------------------------------------------------------------------

    def _segment(self, u8, boxes: list) -> list:
        """SAM masks, (n_i, H, W) bool on the device, of ``boxes[i]`` (n_i, 4) pixels of image i."""
        import torch  # deferred: torch
        import torch.nn.functional as F  # deferred: torch

        b, _, height, width = u8.shape
        masks = [torch.zeros(0, height, width, dtype=torch.bool, device=u8.device) for _ in range(b)]
        idx = [i for i in range(b) if boxes[i].shape[0]]
        if not idx:
            return masks
        model = self.segmenter.model
        pixels = _pixels(self.segmenter, u8[idx])
        embeddings = model.get_image_embeddings(pixels["pixel_values"].to(self.segmenter.dtype))
        scale = self._sam_longest / max(height, width)            # SamImageProcessor._get_preprocess_shape
        rh, rw = int(height * scale + 0.5), int(width * scale + 0.5)
        factor = torch.tensor([rw / width, rh / height, rw / width, rh / height], device=self.segmenter.device)
        for k, i in enumerate(idx):
            parts = []
            # boxes in chunks: the padded-size upsampling costs 4 MB per box at SAM's 1024 px, so a
            # detector that keeps hundreds of boxes must not upsample them all at once
            for start in range(0, int(boxes[i].shape[0]), SAM_BOX_CHUNK):
                chunk = boxes[i][start:start + SAM_BOX_CHUNK]
                prompts = (chunk.to(self.segmenter.device).float() * factor)[None]   # (1, n, 4), as SamProcessor
                out = model(image_embeddings=embeddings[k:k + 1], input_boxes=prompts.to(self.segmenter.dtype),
                            multimask_output=False)
                low = out.pred_masks[0].float()                        # (n, 1, h, w) logits
                up = F.interpolate(low, self._sam_pad, mode="bilinear", align_corners=False)[..., :rh, :rw]
                up = F.interpolate(up, (height, width), mode="bilinear", align_corners=False)
                parts.append((up[:, 0] > MASK_THRESHOLD).to(u8.device))
                del out, low, up
            masks[i] = torch.cat(parts)
        return masks

    # -- entry points ----------------------------------------------------------------------------------

    def detect_u8(self, u8, nouns_per_image) -> list[dict]:
        """Detect and segment (B, 3, H, W) uint8 images: per image {"labels": [str], "scores": (n,),
        "boxes": (n, 4), "masks": (n, H, W) bool}, tensors on the models' device."""
        import torch  # deferred: torch

        b = int(u8.shape[0])
        if len(nouns_per_image) != b:
            raise ValueError(f"{len(nouns_per_image)} label lists for {b} images")
        vocabs = [image_vocabulary(nouns, self.vocabulary) for nouns in nouns_per_image]
        with torch.inference_mode():
            u8 = u8.to(self.device)
            detections = self._detect(u8, vocabs)
            masks = self._segment(u8, [d[0] for d in detections])
        return [{"labels": [vocabs[i][j] for j in labels.tolist()], "scores": scores, "boxes": boxes, "masks": m}
                for i, ((boxes, scores, labels), m) in enumerate(zip(detections, masks))]

    @staticmethod
    def columns(found: list[dict]) -> dict[str, list]:
        """``detect_u8``'s results as the lists of ``DETECTION_COLUMNS`` (masks RLE-encoded)."""
        out: dict[str, list] = {f.name: [] for f in DETECTION_COLUMNS}
        for d in found:
            out[OBJECT_LABELS].append(list(d["labels"]))
            out[OBJECT_SCORES].append([float(s) for s in d["scores"].float().cpu().numpy()])
            out[OBJECT_BOXES].append(d["boxes"].float().cpu().numpy().astype(np.float32).tolist())
            out[OBJECT_MASKS].append(rle.encode_many(d["masks"].cpu().numpy()))
            out[DETECTION_STATUS].append(DetectionStatus.OK)
        return out

    def _run_u8(self, u8, nouns_per_image) -> dict[str, list]:
        return self.columns(self.detect_u8(u8, nouns_per_image))

    def detect_tensor(self, images, labels_per_image) -> dict[str, list]:
        """Detect and segment (B, 3, H, W) float images in [0, 1] on any device (e.g. the generator's
        output). ``labels_per_image[i]``: image i's prompt nouns (None: none); its vocabulary is those
        plus the configured ``vocabulary``. Returns each of ``output_fields`` as a list of length B."""
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
        if any(isinstance(x, str) for x in labels_per_image):
            raise TypeError("labels_per_image must hold one list of labels per image, not strings")
        return self._run_u8(to_u8(images), [list(x or ()) for x in labels_per_image])

    def __call__(self, batch: pa.Table) -> pa.Table:
        import torch  # deferred: torch

        n = batch.num_rows
        columns: dict[str, list] = {OBJECT_LABELS: [[] for _ in range(n)], OBJECT_SCORES: [[] for _ in range(n)],
                                    OBJECT_BOXES: [[] for _ in range(n)], OBJECT_MASKS: [[] for _ in range(n)],
                                    DETECTION_STATUS: [DetectionStatus.NO_IMAGE] * n}
        nouns = batch.column(PROMPT_NOUNS).to_pylist() if PROMPT_NOUNS in batch.column_names else [None] * n
        for shape, (members, arrays) in decode_rows(batch, generated_image_rows(batch)).by_size().items():
            u8 = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
            try:
                res = self._run_u8(u8, [list(nouns[r] or ()) for r in members])
            except Exception as exc:  # noqa: BLE001 -- recorded per row; the stage never drops rows
                log.warning("grounded segmentation failed on %d images of size %s: %s: %s", len(members), shape,
                            type(exc).__name__, exc)
                for r in members:
                    for name in (OBJECT_LABELS, OBJECT_SCORES, OBJECT_BOXES, OBJECT_MASKS):
                        columns[name][r] = None
                    columns[DETECTION_STATUS][r] = DetectionStatus.ERROR
                continue
            for k, r in enumerate(members):
                for name, values in res.items():
                    columns[name][r] = values[k]
        for f in self.output_fields:
            batch = with_column(batch, f.name, pa.array(columns[f.name], f.type))
        return batch


def to_u8(images):
    """(B, 3, H, W) floats in [0, 1] -> uint8 levels as the RGB8 payload has them (round(x * 255))."""
    import torch  # deferred: torch

    return rgb_levels(images).to(torch.uint8)


def _size(size, key):
    value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
    if value is None and hasattr(size, "__getitem__"):
        try:
            value = size[key]
        except (KeyError, TypeError):
            value = None
    if value is None:
        raise ModelLoadError(f"SAM image processor size {size!r} has no {key!r}")
    return value


__all__ = [
    "GroundedSegmenter", "assign_labels", "boxes_to_pixels", "chunk_labels", "grounding_caption", "image_vocabulary",
    "load_detector", "load_segmenter", "merge_and_suppress", "normalize_label", "read_tags", "to_u8",
]
