"""Closed-vocabulary object detection of generated images for DALL-Eval's visual-reasoning skills
(paper 000, section 4.1: object recognition, counting and spatial relations are scored from an
object detector's output).

The paper detects objects with DETR (ResNet-101 backbone, DC5 in its v2+ versions: App. A.2 says
it replaced the earlier DETR-R50), initialised from the official COCO checkpoint and **fine-tuned
on its PaintSkills simulator images**, one detector per skill. Those fine-tuned weights are not
public, so this stage uses the COCO checkpoint ``facebook/detr-resnet-101-dc5`` zero-shot: the
skill accuracies measured with it are not the paper's Table 2 numbers (the study says so in its
report). Any transformers object detector (a config that ``AutoModelForObjectDetection`` maps: DETR,
Conditional / Deformable DETR, Table Transformer, YOLOS, RT-DETR, ...) can be configured instead;
open-vocabulary detectors that need a text query (GroundingDINO, OWL) are refused.

What is recorded (``schemas.paintskills.DETECTION_COLUMNS``), per image: every detection whose
confidence is above ``record_threshold`` (0.3), as the detector's class names (``config.id2label``;
the COCO checkpoints also name their unused category ids "N/A", kept as they come), confidences
(float32, descending; ties keep the model's query order) and boxes (x0, y0, x1, y1) as fractions
of the image's width and height (y down), clipped to [0, 1]; at most ``max_detections`` (100,
DETR's number of queries) of the highest-scoring ones; and the detector (its id or directory).
The study judges the skills later, on the driver, at the scoring threshold (0.7, the paper's
code) from these stored detections, so another threshold needs no new detection run: **the
recording floor must be <= every scoring threshold used** (a detection below the floor is not
stored and cannot be counted later).

Scores and boxes are the model's own post-processing, the image processor's
``post_process_object_detection(outputs, threshold=record_threshold, target_sizes=(H, W))``: for
DETR the softmax over the classes and "no object", the best real class per query, kept when its
probability is > the threshold (Deformable DETR / RT-DETR: their sigmoid top-k); boxes in pixels of
the image, then divided by its width and height here.

Preprocessing is the checkpoint's own image processor (resize shortest edge 800 / longest 1333,
ImageNet normalisation, padding with a pixel mask for DETR). Images are first quantised to the
8-bit levels of the RGB8 payload (``operators.support.codec.rgb_levels``), so detecting the
generator's float tensor (``classify_tensor``, the generator's head hook) and detecting the saved
8-bit image (``__call__``) give the same input. With transformers 5 the processors are
torchvision-backed and run on the tensors' device (the images do not leave the GPU); a processor
without that backend runs on CPU copies; the record says which. Images of different sizes are
never batched together (``__call__`` groups them by size), so no image is padded for another and
an image's detections do not depend on its batch-mates' sizes.

dtype "auto" is float32 on every device (DETR was trained and evaluated in float32; float16 moves
confidences near the threshold); ``dtype="float16"`` / ``"bfloat16"`` are honoured. The class
scores and boxes are post-processed in float32 whatever the model's dtype.

Loading: ``model`` is a hub id (pinned with ``revision``; cached or reachable) or a local
directory written by ``save_pretrained`` with its image processor (``pipelines.standins.detection``
builds a tiny random one). A weight the model lacks, a checkpoint weight it does not use, or a
shape mismatch is an error (transformers only warns). The COCO DETR checkpoints use a timm ResNet
backbone (``use_timm_backbone``, ``backbone`` "resnet101", ``dilation``): transformers 5 creates it
with random weights and then loads the checkpoint's (``use_pretrained_backbone`` is dropped; no
ImageNet weights are ever downloaded). A config written by transformers 4.x with
``backbone_kwargs`` (e.g. ``{"out_indices": [1, 2, 3, 4], "in_chans": 3, "output_stride": 16}``)
and no ``backbone_config`` makes transformers 5 ask the hub whether the timm name is a hub repo
(``HfApi.repo_exists``), which fails offline; such a config is converted here into the
``timm_backbone`` sub-config the same call yields online (a timm name is no hub repo), so it loads
with HF_HUB_OFFLINE=1; the record notes the conversion.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from operators.base import Resources, with_column
from operators.support.codec import decode_rows, generated_image_rows, rgb_levels
from operators.support.models import (ModelLoadError, check_loading_info, dtype_kwarg, hub_load_error, loaded_record,
                                     loading, local_record, pick_device, resolve_dtype)
from schemas.paintskills import DET_BOXES, DET_LABELS, DET_SCORES, DETECTION_COLUMNS, DETECTOR

STAGE_DETECT_OBJECTS = "detect_objects"
DEFAULT_DETECTOR = "facebook/detr-resnet-101-dc5"
BASELINE_DETECTOR = "facebook/detr-resnet-50"   # the paper's detector before v2 (App. A.2)
RECORD_THRESHOLD = 0.3
MAX_DETECTIONS = 100
BATCH_SIZE = 16


# --- loading ------------------------------------------------------------------------------------------------


@dataclass
class DetectorBundle:
    """A loaded object detector (eval mode, on ``device``) with its image processor and provenance."""

    model: Any
    image_processor: Any
    device: str
    dtype: Any
    record: dict = field(default_factory=dict)


def _load_error(model: str, revision: str | None, exc: BaseException) -> ModelLoadError:
    return hub_load_error(
        "the object detector", model, revision, exc,
        f"Provide a transformers object detector (AutoModelForObjectDetection: DETR, e.g. {DEFAULT_DETECTOR}, "
        f"Deformable DETR, YOLOS, RT-DETR, ...) with its image processor as a local directory written by "
        f"save_pretrained() (config.json, model.safetensors, preprocessor_config.json), or as a hub id",
        "--standin-models builds a tiny random one (pipelines.standins.detection).")


def _detection_types() -> dict[str, str]:
    """model_type -> class name of every transformers object detector (AutoModelForObjectDetection)."""
    # deferred: transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES

    return dict(MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES)


def legacy_timm_backbone(config_dict: dict) -> dict | None:
    """For a config dict written by transformers 4.x with a timm backbone given as ``backbone`` +
    ``backbone_kwargs`` (no ``backbone_config``): the dict with the ``timm_backbone`` sub-config
    that transformers 5 builds from it online (module docstring); None for any other config."""
    bk = config_dict.get("backbone_kwargs")
    name = config_dict.get("backbone")
    if (config_dict.get("backbone_config") is not None or not bk or not isinstance(name, str) or not name
            or not config_dict.get("use_timm_backbone", True)):
        return None
    fixed = dict(config_dict)
    fixed["backbone_config"] = {"model_type": "timm_backbone", "backbone": name, **bk}
    fixed["backbone"] = None
    fixed.pop("backbone_kwargs", None)
    return fixed


def _config(model: str, revision: str | None):
    """The model's config, and whether a legacy timm-backbone config was converted."""
    from transformers import AutoConfig, PretrainedConfig  # deferred: transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # deferred: transformers

    config_dict, _ = PretrainedConfig.get_config_dict(model, revision=revision)
    fixed = legacy_timm_backbone(config_dict)
    if fixed is None:
        return AutoConfig.from_pretrained(model, revision=revision), False
    model_type = fixed.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"its config has an unknown model_type {model_type!r}")
    return CONFIG_MAPPING[model_type].from_dict(fixed), True


def backbone_settings(config) -> dict:
    """What the record says about a detector's backbone: timm or transformers, its name, dilation."""
    bc = getattr(config, "backbone_config", None)
    bc_type = getattr(bc, "model_type", None)
    timm = bc_type == "timm_backbone" or (bc is None and bool(getattr(config, "use_timm_backbone", False)))
    name = getattr(bc, "backbone", None) if bc_type == "timm_backbone" else (
        bc_type if bc is not None else getattr(config, "backbone", None))
    output_stride = getattr(bc, "output_stride", None) if bc is not None else None
    dilation = getattr(config, "dilation", None)
    if dilation is None and output_stride is not None:
        dilation = int(output_stride) < 32
    return {"use_timm_backbone": bool(timm), "backbone": name,
            "dilation": None if dilation is None else bool(dilation),
            "backbone_output_stride": None if output_stride is None else int(output_stride),
            # transformers 5 never loads pretrained backbone weights when building a detector from
            # a checkpoint (the timm model is created with pretrained=False, then the checkpoint loads)
            "use_pretrained_backbone": False}


def _on_device(image_processor) -> bool:
    """Whether the image processor runs torch ops on the tensors' device (transformers 5's
    torchvision backend, 4.x's fast processors)."""
    return getattr(image_processor, "backend", None) == "torchvision" or type(image_processor).__name__.endswith("Fast")


def _size_record(image_processor) -> dict | None:
    size = getattr(image_processor, "size", None)
    if size is None:
        return None
    items = size.items() if hasattr(size, "items") else vars(size).items()
    return {k: int(v) for k, v in items if v is not None and not str(k).startswith("_")}


def load_object_detector(model: str = DEFAULT_DETECTOR, revision: str | None = None, device: str = "auto",
                         dtype: str = "auto") -> DetectorBundle:
    """Load a transformers object detector (``AutoModelForObjectDetection``) and its image processor
    (``AutoImageProcessor``) for inference, or raise ModelLoadError naming the model and saying how
    to provide it. ``device="auto"``: cuda when available, else cpu; ``dtype="auto"``: float32."""
    from transformers import AutoImageProcessor, AutoModelForObjectDetection  # deferred: transformers

    dev = pick_device(device)
    torch_dtype = resolve_dtype(dtype, dev, cuda_auto="float32")
    with loading(lambda exc: _load_error(model, revision, exc)):
        config, converted = _config(model, revision)
        model_type = getattr(config, "model_type", None)
        types = _detection_types()
        if model_type not in types:
            raise ValueError(f"its config is a {model_type!r} model, not an object detector that "
                             f"AutoModelForObjectDetection loads (one of {sorted(types)})")
        net, info = AutoModelForObjectDetection.from_pretrained(model, revision=revision, config=config,
                                                                output_loading_info=True, **dtype_kwarg(torch_dtype))
        check_loading_info(info)
        image_processor = AutoImageProcessor.from_pretrained(model, revision=revision)
        if not hasattr(image_processor, "post_process_object_detection"):
            raise ValueError(f"its image processor {type(image_processor).__name__} has no "
                             f"post_process_object_detection")
        if not getattr(config, "id2label", None):
            raise ValueError("its config has no id2label (class names)")
        net = net.to(dev).eval()

    record = loaded_record(model, revision, net, config, torch_dtype, dev,
                           packages=("transformers", "torch", "timm"), fields={
        "model_type": model_type,
        **backbone_settings(config),
        "legacy_backbone_config_converted": converted,
        "num_queries": getattr(config, "num_queries", None),
        "num_labels": len(config.id2label),
        "image_processor_class": type(image_processor).__name__,
        "image_size": _size_record(image_processor),
        "preprocessing_on_device": _on_device(image_processor),
    })
    record.update(local_record(model))
    return DetectorBundle(model=net, image_processor=image_processor, device=dev, dtype=torch_dtype, record=record)


# --- the stage ---------------------------------------------------------------------------------------------


class ObjectDetector:
    """Detect objects in each image with a closed-vocabulary detector (DETR-R101-DC5 on COCO by
    default); adds ``schemas.paintskills.DETECTION_COLUMNS``. A head of
    ``operators.image_generation.ImageGenerator`` (``classify_tensor``) or a stage of its own over
    image payloads (``__call__``)."""

    stage_name = STAGE_DETECT_OBJECTS
    resources = Resources(num_cpus=1, num_gpus=1, batch_size=BATCH_SIZE, actors=1)
    output_fields = DETECTION_COLUMNS   # what classify_tensor returns, for the generator

    def __init__(self, model: str = DEFAULT_DETECTOR, revision: str | None = None,
                 record_threshold: float = RECORD_THRESHOLD, max_detections: int | None = MAX_DETECTIONS,
                 batch_size: int = BATCH_SIZE, device: str = "auto", dtype: str = "auto"):
        if not 0.0 <= float(record_threshold) < 1.0:
            raise ValueError(f"record_threshold must be in [0, 1), got {record_threshold}")
        if max_detections is not None and int(max_detections) < 1:
            raise ValueError(f"max_detections must be >= 1 or None, got {max_detections}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = str(model)
        self.record_threshold = float(record_threshold)
        self.max_detections = None if max_detections is None else int(max_detections)
        self.batch_size = int(batch_size)
        self.bundle = load_object_detector(self.model, revision, device, dtype)
        self.device = self.bundle.device
        self.id2label = {int(k): str(v) for k, v in self.bundle.model.config.id2label.items()}
        # DETR-like models take the processor's padding mask; YOLOS and RT-DETR do not
        self._takes_mask = "pixel_mask" in inspect.signature(self.bundle.model.forward).parameters
        self.record = {
            "stage": self.stage_name,
            "record_threshold": self.record_threshold,
            "max_detections": self.max_detections,
            "batch_size": self.batch_size,
            "post_processing": f"{type(self.bundle.image_processor).__name__}.post_process_object_detection"
                               f"(threshold=record_threshold, target_sizes=image sizes)",
            "labels": "config.id2label",
            "boxes": "(x0, y0, x1, y1) / (width, height, width, height), clipped to [0, 1], y down",
            "quantisation": "round(x * 255) (operators.support.codec.rgb_levels), as the RGB8 payload",
            "note": "zero-shot: the paper fine-tuned DETR on PaintSkills; those weights are not public",
            "detector": self.bundle.record,
        }

    # -- detection ----------------------------------------------------------------------------------------

    def _pixels(self, u8) -> dict:
        """The image processor's outputs for (B, 3, H, W) uint8 images, on their device when it can."""
        import torch  # deferred: torch

        ip = self.bundle.image_processor
        if _on_device(ip):
            out = ip(images=list(u8), return_tensors="pt", device=u8.device)
        else:
            out = ip(images=[a.permute(1, 2, 0).cpu().numpy() for a in u8], return_tensors="pt")
        return {k: v.to(self.device) for k, v in out.items() if isinstance(v, torch.Tensor)}

    def _forward(self, u8) -> list[dict]:
        """Detections of one micro-batch of equally sized (b, 3, H, W) uint8 images on the device."""
        import torch  # deferred: torch

        b, _, height, width = u8.shape
        pixels = self._pixels(u8)
        values = pixels.pop("pixel_values").to(self.bundle.dtype)
        mask = pixels.get("pixel_mask") if self._takes_mask else None
        out = self.bundle.model(pixel_values=values, **({} if mask is None else {"pixel_mask": mask}))
        for name in ("logits", "pred_boxes"):
            if name in out and out[name] is not None:
                out[name] = out[name].float()
        sizes = torch.tensor([[height, width]] * b, device=self.device)
        results = self.bundle.image_processor.post_process_object_detection(
            out, threshold=self.record_threshold, target_sizes=sizes)
        scale = torch.tensor([width, height, width, height], dtype=torch.float32, device=self.device)
        found = []
        for r in results:
            scores = r["scores"].float()
            order = torch.sort(scores, descending=True, stable=True).indices
            if self.max_detections is not None:
                order = order[:self.max_detections]
            boxes = (r["boxes"].float()[order] / scale).clamp_(0.0, 1.0).reshape(-1, 4)
            found.append({"scores": scores[order], "labels": r["labels"][order], "boxes": boxes})
        return found

    def detect_u8(self, u8) -> dict[str, list]:
        """Detect (B, 3, H, W) uint8 images of one size on any device, in micro-batches of
        ``batch_size``; returns each of ``output_fields`` as a list of length B."""
        import torch  # deferred: torch

        if u8.ndim != 4 or u8.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(u8.shape)}")
        columns: dict[str, list] = {f.name: [] for f in DETECTION_COLUMNS}
        with torch.inference_mode():
            for start in range(0, int(u8.shape[0]), self.batch_size):
                chunk = u8[start:start + self.batch_size].to(self.device)
                for d in self._forward(chunk):
                    columns[DET_LABELS].append([self.id2label.get(int(i), str(int(i))) for i in d["labels"].tolist()])
                    columns[DET_SCORES].append(d["scores"].cpu().numpy().astype(np.float32).tolist())
                    columns[DET_BOXES].append(d["boxes"].cpu().numpy().astype(np.float32).tolist())
                    columns[DETECTOR].append(self.model)
        return columns

    def classify_tensor(self, images) -> dict[str, list]:
        """The generator's hook: detect (B, 3, H, W) float images in [0, 1] on any device, quantised
        to the RGB8 payload's levels first. Returns each of ``output_fields`` as a list of length B."""
        import torch  # deferred: torch

        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
        return self.detect_u8(rgb_levels(images).to(torch.uint8))

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Detect the image payload of each row (IMAGE + IMAGE_ENCODING / IMAGE_HEIGHT / IMAGE_WIDTH);
        rows without a usable image (null or undecodable payload, GENERATION_STATUS other than ok)
        get null detection columns. No row is dropped; a detector failure raises."""
        import torch  # deferred: torch

        n = batch.num_rows
        columns: dict[str, list] = {f.name: [None] * n for f in DETECTION_COLUMNS}
        for members, arrays in decode_rows(batch, generated_image_rows(batch)).by_size().values():
            u8 = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
            res = self.detect_u8(u8)
            for k, r in enumerate(members):
                for name, values in res.items():
                    columns[name][r] = values[k]
        for f in DETECTION_COLUMNS:
            batch = with_column(batch, f.name, pa.array(columns[f.name], f.type))
        return batch


__all__ = [
    "BASELINE_DETECTOR", "DEFAULT_DETECTOR", "DetectorBundle", "ObjectDetector", "backbone_settings",
    "legacy_timm_backbone", "load_object_detector",
]
