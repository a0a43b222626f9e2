"""A tiny random-weight DETR object detector, saved with ``save_pretrained`` the way the hub
checkpoints are (paper 000, section 4.1: DALL-Eval's skill evaluation uses DETR-R101-DC5 trained
on COCO, ``facebook/detr-resnet-101-dc5``).

It is a random stand-in: its detections are meaningless. It exists so that tests and the offline
embedded run exercise the production loading, preprocessing and post-processing code
(``operators.image_object_detection``) without downloading the real model.

``build_tiny_detr`` writes a ``DetrForObjectDetection`` with the real checkpoint's label space (the
91-entry COCO ``id2label`` of ``facebook/detr-resnet-*``, "N/A" at COCO's unused category ids, plus
DETR's "no object" class), ``TINY_QUERIES`` (20) object queries instead of 100, a 32-wide
transformer (1 encoder and 2 decoder layers) and a tiny backbone:

- default: a transformers ``ResNetConfig`` backbone (basic blocks, 8-32 channels; ~50 k parameters
  in all), the cheapest choice;
- ``timm_backbone="resnet18"`` (any timm model name): a timm backbone configured the way the real
  checkpoint's is (``use_timm_backbone``, ``dilation`` for DC5 gives ``output_stride`` 16),
  saved in transformers 5's form (``backbone_config`` of type ``timm_backbone``). The timm model
  is created with random weights (never ImageNet ones: nothing is downloaded); resnet18 makes a
  ~45 MB checkpoint.

The image processor is ``facebook/detr-resnet-101-dc5``'s ``DetrImageProcessor`` (COCO detection
format, ImageNet mean and std, bilinear, padding with a pixel mask) with a small size
(``shortest_edge`` 64, ``longest_edge`` 96 instead of 800 / 1333) to keep the CPU cost low.

Scores: with transformers' initialisation a DETR this small gives every query nearly the same
output and a softmax close to uniform over the 92 classes (scores ~0.01), so nothing passes a 0.3
recording floor and an end-to-end run would have no detections to judge. So the stand-in is
initialised with a larger ``init_std`` (0.2), spread-out query position embeddings (std 3) and
its class head (weights and bias) multiplied by ``logit_gain`` (default 4.0): then most of the 20
queries of a typical image score above 0.3 (a handful above 0.7) with a few different labels that
change with the image. ``logit_gain=1.0`` keeps the (larger-init) head as initialised, which gives
(almost) no detections above 0.3. Deterministic for a seed; which labels come out is arbitrary.
"""

from __future__ import annotations

from typing import Sequence

from pipelines.standins.tiny import IMAGENET_MEAN, IMAGENET_STD, output_dir, save_model, seeded

TINY_SIZE = {"shortest_edge": 64, "longest_edge": 96}
TINY_QUERIES = 20
TINY_HIDDEN = 32
TINY_INIT_STD = 0.2
QUERY_SPREAD = 3.0
LOGIT_GAIN = 4.0
FAVOUR_BOOST = 4.0

# The id2label of the facebook/detr-resnet-* checkpoints: COCO's 91 category ids (0 and the ids
# COCO 2017 does not use are "N/A"), 80 object classes.
COCO_DETR_LABELS = (
    "N/A", "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "N/A", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse",
    "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "N/A", "backpack", "umbrella", "N/A",
    "N/A", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite", "baseball bat",
    "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle", "N/A", "wine glass", "cup", "fork",
    "knife",
    "spoon", "bowl", "banana", "apple", "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza",
    "donut", "cake", "chair", "couch", "potted plant", "bed", "N/A", "dining table", "N/A", "N/A",
    "toilet", "N/A", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone", "microwave", "oven",
    "toaster", "sink", "refrigerator", "N/A", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)


def coco_id2label() -> dict[int, str]:
    """The facebook/detr-resnet-* ``id2label`` (91 entries, "N/A" gaps)."""
    return dict(enumerate(COCO_DETR_LABELS))


def detr_image_processor(shortest_edge: int, longest_edge: int):
    """``facebook/detr-resnet-101-dc5``'s image processor with another size."""
    # deferred: transformers
    from transformers import DetrImageProcessor
    from transformers.image_utils import PILImageResampling

    return DetrImageProcessor(
        format="coco_detection", do_resize=True, size={"shortest_edge": int(shortest_edge), "longest_edge": int(longest_edge)},
        resample=PILImageResampling.BILINEAR, do_rescale=True, do_normalize=True, image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD, do_pad=True)


def build_tiny_detr(directory, seed: int = 0, timm_backbone: str | None = None, dilation: bool = True,
                    logit_gain: float = LOGIT_GAIN, favour: Sequence[str] = (), favour_boost: float = FAVOUR_BOOST) -> str:
    """Build a tiny random DETR object detector and its image processor in ``directory`` (created if
    needed); return the absolute directory path. The same arguments write the same weights.

    ``timm_backbone``: None for a tiny transformers ResNet backbone, else a timm model name (e.g.
    "resnet18") used as the real checkpoint uses its timm resnet101, with ``dilation`` (DC5).
    ``logit_gain``: the factor on the class head (module docstring). ``favour``: labels whose class
    logits get ``favour_boost`` added (the objects a run's prompts name), so that the stand-in's
    detections are mostly of those labels, still chosen by random weights."""
    # deferred: torch, transformers
    import torch
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    out = output_dir(directory)
    id2label = coco_id2label()
    common = dict(num_queries=TINY_QUERIES, d_model=TINY_HIDDEN, encoder_layers=1, decoder_layers=2,
                  encoder_ffn_dim=2 * TINY_HIDDEN, decoder_ffn_dim=2 * TINY_HIDDEN, encoder_attention_heads=2,
                  decoder_attention_heads=2, init_std=TINY_INIT_STD, id2label=id2label,
                  # "N/A" is there several times: as in the hub configs, label2id keeps its last id
                  label2id={name: i for i, name in id2label.items()})
    if timm_backbone:
        config = DetrConfig(use_timm_backbone=True, backbone=str(timm_backbone), dilation=bool(dilation), **common)
    else:
        backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1],
                                layer_type="basic", out_features=["stage4"])
        config = DetrConfig(backbone_config=backbone, use_timm_backbone=False, **common)
    with seeded(seed):
        model = DetrForObjectDetection(config)
        with torch.no_grad():
            model.model.query_position_embeddings.weight.normal_(0.0, QUERY_SPREAD)
            model.class_labels_classifier.weight.mul_(float(logit_gain))
            model.class_labels_classifier.bias.mul_(float(logit_gain))
            unknown = sorted(set(favour) - set(id2label.values()))
            if unknown:
                raise ValueError(f"favour: {unknown} are not COCO labels of DETR")
            for i, name in id2label.items():
                if name in set(favour):
                    model.class_labels_classifier.bias[i] += float(favour_boost)
    save_model(model, out)
    size = TINY_SIZE
    detr_image_processor(size["shortest_edge"], size["longest_edge"]).save_pretrained(out)
    backbone_note = f"timm {timm_backbone}{' (dilation, DC5)' if dilation else ''}" if timm_backbone \
        else "transformers ResNet (tiny)"
    (out / "STANDIN.txt").write_text(
        f"Tiny DETR stand-in: random weights (seed {seed}), {backbone_note} backbone, {TINY_QUERIES} queries, "
        f"COCO labels, class head x{float(logit_gain):g}"
        + (f", +{float(favour_boost):g} on the logits of {', '.join(sorted(set(favour)))}" if favour else "")
        + "; its detections are meaningless.\n")
    return str(out)


__all__ = ["COCO_DETR_LABELS", "build_tiny_detr", "coco_id2label", "detr_image_processor"]
