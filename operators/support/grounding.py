"""The vocabulary and box post-processing of grounded segmentation
(``operators.image_grounded_segmentation``, whose module docstring gives the rules): an image's
labels, GroundingDINO's captions and their split into queries, the label of each box by token
position, boxes in pixels, and the class-agnostic NMS over an image's merged queries.

torch and torchvision are imported inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

DEFAULT_TAGS_FILE = Path(__file__).resolve().parents[2] / "configs" / "exposed_tags.txt"


# --- vocabulary ---------------------------------------------------------------------------------------------


def normalize_label(label) -> str:
    """A vocabulary entry as a label: lower case, "." replaced by a space, whitespace collapsed."""
    return " ".join(str(label).lower().replace(".", " ").split())


def image_vocabulary(nouns, vocabulary) -> list[str]:
    """An image's labels: its prompt nouns, then the configured vocabulary, normalised
    (``normalize_label``), without empty entries and duplicates (first occurrence kept)."""
    seen: dict[str, None] = {}
    for word in [*(nouns or ()), *(vocabulary or ())]:
        label = normalize_label(word)
        if label and label not in seen:
            seen[label] = None
    return list(seen)


def read_tags(path=DEFAULT_TAGS_FILE) -> list[str]:
    """The tags of a tag file: one per line, blank lines and lines starting with # skipped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]


def chunk_labels(costs: Sequence[int], budget: int | None, max_labels: int | None = None) -> list[list[int]]:
    """Split labels (their ``costs``, e.g. tokens each takes in a caption) into consecutive groups,
    greedily in order, each costing at most ``budget`` (None: no limit) and holding at most
    ``max_labels`` labels (None: no limit). Returns the label indices of each group."""
    if max_labels is not None and max_labels < 1:
        raise ValueError(f"max_labels must be >= 1 or None, got {max_labels}")
    chunks: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, cost in enumerate(costs):
        cost = int(cost)
        if budget is not None and cost > budget:
            raise ValueError(f"label {i} takes {cost} tokens, more than a query holds ({budget})")
        full = (budget is not None and used + cost > budget) or (max_labels is not None and len(current) >= max_labels)
        if current and full:
            chunks.append(current)
            current, used = [], 0
        current.append(i)
        used += cost
    if current:
        chunks.append(current)
    return chunks


def grounding_caption(labels: Sequence[str]) -> str:
    """GroundingDINO's text prompt: ``"label one. label two."``."""
    return ". ".join(labels) + "."


# --- post-processing helpers ----------------------------------------------------------------------------


def assign_labels(probs, position_labels, num_labels: int, text_threshold: float):
    """Map GroundingDINO boxes to one label each, by token position.

    ``probs`` (Q, L): token probabilities of Q boxes over a caption of L positions;
    ``position_labels`` (L,): the label index of each position, -1 for separators, special tokens
    and padding. A label is a candidate for a box when one of its tokens has a probability >
    ``text_threshold`` (the demo's phrase); the box gets the candidate with the highest token score
    (its best token probability; ties: the lower index). Returns (labels (Q,) long, -1 where no
    label is a candidate; label_scores (Q,) float, the chosen label's token score, 0 for -1)."""
    import torch  # deferred: torch

    probs = torch.as_tensor(probs).float()
    pos = torch.as_tensor(position_labels, device=probs.device).long()
    q, length = probs.shape
    if pos.shape != (length,):
        raise ValueError(f"position_labels must have {length} entries, got {tuple(pos.shape)}")
    if q == 0 or num_labels == 0:
        return torch.full((q,), -1, dtype=torch.long, device=probs.device), torch.zeros(q, device=probs.device)
    column = torch.where(pos >= 0, pos, torch.full_like(pos, num_labels))  # -1 -> a dropped extra column
    index = column.unsqueeze(0).expand(q, length)
    score = torch.zeros(q, num_labels + 1, device=probs.device).scatter_reduce(
        1, index, probs, reduce="amax", include_self=True)[:, :num_labels]
    hit = torch.zeros(q, num_labels + 1, device=probs.device).scatter_reduce(
        1, index, (probs > text_threshold).float(), reduce="amax", include_self=True)[:, :num_labels] > 0
    masked = torch.where(hit, score, torch.full_like(score, -1.0))
    best_score, best = masked.max(dim=1)      # first maximum on ties
    none = ~hit.any(dim=1)
    labels = torch.where(none, torch.full_like(best, -1), best)
    return labels, torch.where(none, torch.zeros_like(best_score), best_score)


def boxes_to_pixels(cxcywh, width: float, height: float, scale_w: float | None = None, scale_h: float | None = None):
    """Relative (cx, cy, w, h) boxes -> [x0, y0, x1, y1] pixels (relative to ``scale_w`` x
    ``scale_h``, default the image), clipped to the ``width`` x ``height`` image."""
    import torch  # deferred: torch

    b = torch.as_tensor(cxcywh).float()
    sw = float(width if scale_w is None else scale_w)
    sh = float(height if scale_h is None else scale_h)
    cx, cy, w, h = b.unbind(-1)
    xyxy = torch.stack([(cx - 0.5 * w) * sw, (cy - 0.5 * h) * sh, (cx + 0.5 * w) * sw, (cy + 0.5 * h) * sh], -1)
    limit = torch.tensor([width, height, width, height], dtype=xyxy.dtype, device=xyxy.device)
    return torch.minimum(xyxy.clamp(min=0.0), limit)


def merge_and_suppress(boxes, scores, labels, iou: float):
    """Class-agnostic NMS over one image's merged boxes (from all its queries): boxes without area
    dropped first, then ``torchvision.ops.nms`` (IoU > ``iou`` suppresses the lower-scoring box,
    whatever the labels). Returns (boxes, scores, labels) of the kept boxes by decreasing score."""
    import torch  # deferred: torch
    from torchvision.ops import nms  # deferred: torchvision

    boxes = torch.as_tensor(boxes).float().reshape(-1, 4)
    scores = torch.as_tensor(scores, device=boxes.device).float().reshape(-1)
    labels = torch.as_tensor(labels, device=boxes.device).long().reshape(-1)
    area = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    boxes, scores, labels = boxes[area], scores[area], labels[area]
    if boxes.shape[0] == 0:
        return boxes, scores, labels
    keep = nms(boxes, scores, float(iou))  # sorted by decreasing score
    return boxes[keep], scores[keep], labels[keep]
