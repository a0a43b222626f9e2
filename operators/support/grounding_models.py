"""Loading the two models of grounded segmentation (``operators.image_grounded_segmentation``): the
open-vocabulary detector (GroundingDINO or OWLv2) and SAM, each with its processor, checked against
its checkpoint, with its provenance record; and the image processor's inputs computed on the
images' device where the processor can.

transformers and torch are imported inside the functions that need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from operators.support.models import (ModelLoadError, check_loading_info, dtype_kwarg, hub_load_error, loaded_record,
                                     loading, local_record, pick_device, resolve_dtype)

DEFAULT_DETECTOR = "IDEA-Research/grounding-dino-tiny"
DEFAULT_SEGMENTER = "facebook/sam-vit-huge"
ALTERNATIVE_DETECTOR = "google/owlv2-base-patch16-ensemble"

FAMILY_GROUNDING_DINO = "grounding-dino"
FAMILY_OWLV2 = "owlv2"
DETECTOR_CLASSES = {FAMILY_GROUNDING_DINO: "GroundingDinoForObjectDetection", FAMILY_OWLV2: "Owlv2ForObjectDetection"}
SEGMENTER_TYPE = "sam"


@dataclass
class ModelBundle:
    """A loaded model (eval mode, on ``device``) with its processor and provenance."""

    model: Any
    processor: Any
    family: str
    device: str
    dtype: Any
    record: dict = field(default_factory=dict)


def _load_error(role: str, model: str, revision: str | None, exc: BaseException) -> ModelLoadError:
    if role == "detector":
        what = (f"an open-vocabulary detector, GroundingDinoForObjectDetection (e.g. {DEFAULT_DETECTOR}) or "
                f"Owlv2ForObjectDetection (e.g. {ALTERNATIVE_DETECTOR}), with its processor (image processor and "
                f"tokenizer)")
    else:
        what = f"a SamModel (e.g. {DEFAULT_SEGMENTER}) with its SamProcessor"
    return hub_load_error(
        f"the grounded-segmentation {role}", model, revision, exc,
        f"Provide {what} as a local directory written by save_pretrained() (config.json, model.safetensors and "
        f"the processor files), or as a hub id",
        "--standin-models builds tiny random ones (pipelines.standins.grounding).")


def _on_device(image_processor) -> bool:
    """Whether the image processor runs torch ops on the tensors' device (transformers 5's
    torchvision backend, 4.x's fast processors)."""
    return getattr(image_processor, "backend", None) == "torchvision" or type(image_processor).__name__.endswith("Fast")


def _load(role: str, model: str, revision: str | None, device: str, dtype: str) -> ModelBundle:
    import transformers  # deferred: transformers
    from transformers import AutoConfig, AutoProcessor  # deferred: transformers

    dev = pick_device(device)
    torch_dtype = resolve_dtype(dtype, dev, cuda_auto="float32")
    with loading(lambda exc: _load_error(role, model, revision, exc)):
        config = AutoConfig.from_pretrained(model, revision=revision)
        family = getattr(config, "model_type", None)
        if role == "detector":
            if family not in DETECTOR_CLASSES:
                raise ValueError(f"its config is a {family!r} model, not one of {sorted(DETECTOR_CLASSES)}")
            cls = getattr(transformers, DETECTOR_CLASSES[family])
        else:
            if family != SEGMENTER_TYPE:
                raise ValueError(f"its config is a {family!r} model, not a {SEGMENTER_TYPE!r} one")
            cls = transformers.SamModel
        net, info = cls.from_pretrained(model, revision=revision, output_loading_info=True, **dtype_kwarg(torch_dtype))
        check_loading_info(info)
        processor = AutoProcessor.from_pretrained(model, revision=revision)
        if getattr(processor, "image_processor", None) is None:
            raise ValueError(f"its processor {type(processor).__name__} has no image processor")
        if role == "detector" and getattr(processor, "tokenizer", None) is None:
            raise ValueError(f"its processor {type(processor).__name__} has no tokenizer")
        net = net.to(dev).eval()

    image_processor = processor.image_processor
    record = loaded_record(model, revision, net, config, torch_dtype, dev, fields={
        "model_type": family,
        "processor_class": type(processor).__name__,
        "image_processor_class": type(image_processor).__name__,
        "preprocessing_on_device": _on_device(image_processor),
    })
    if getattr(processor, "tokenizer", None) is not None:
        record["tokenizer_class"] = type(processor.tokenizer).__name__
    record.update(local_record(model))
    return ModelBundle(model=net, processor=processor, family=family, device=dev, dtype=torch_dtype, record=record)


def load_detector(model: str = DEFAULT_DETECTOR, revision: str | None = None, device: str = "auto",
                  dtype: str = "auto") -> ModelBundle:
    """Load a GroundingDINO or OWLv2 detector and its processor, or raise ModelLoadError."""
    return _load("detector", model, revision, device, dtype)


def load_segmenter(model: str = DEFAULT_SEGMENTER, revision: str | None = None, device: str = "auto",
                   dtype: str = "auto") -> ModelBundle:
    """Load a SAM model and its processor, or raise ModelLoadError."""
    return _load("segmenter", model, revision, device, dtype)


def _pixels(bundle: ModelBundle, u8) -> dict:
    """The image processor's outputs for (B, 3, H, W) uint8 images, computed on their device when
    the processor can (module docstring), else on CPU copies; tensors moved to the model's device."""
    import torch  # deferred: torch

    ip = bundle.processor.image_processor
    if _on_device(ip):
        out = ip(images=list(u8), return_tensors="pt", device=u8.device)
    else:
        out = ip(images=[a.permute(1, 2, 0).cpu().numpy() for a in u8], return_tensors="pt")
    return {k: (v.to(bundle.device) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
