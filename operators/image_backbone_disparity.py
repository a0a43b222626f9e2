"""ResNet and DINO: feature-space image disparities (paper 004, section 4 "Image space", App. A).

"To quantify differences in higher-level semantics, we apply latent vectors of pre-trained neural
networks, adopting the last fully-connected layer of ResNet-50, the CLIP image encoder, and the
last layer of DINO ... For all metrics, we compute the cosine similarity between the latent
vectors from image pairs." App. A: "For DINO, we use DINO-s16 following (Ruiz et al. 2023)".

One head per space (``BackboneDisparity(space=...)``), each a transformers model:

- ``Space.RESNET``: ``microsoft/resnet-50`` loaded with ``AutoModelForImageClassification``; the
  latent vector is the output of the last fully-connected layer, i.e. the 1000 ImageNet logits
  (before any softmax).
- ``Space.DINO``: ``facebook/dino-vits16`` (DINO ViT-S/16) loaded with ``AutoModel`` as a
  ``ViTModel`` without the pooling layer (the DINO checkpoints have none); the latent vector is
  the last layer's class token after the final layer norm, ``last_hidden_state[:, 0]``, the
  feature DINO's k-NN evaluation and DreamBooth's DINO metric (Ruiz et al. 2023) use.

The similarity of a pair is the cosine of its two vectors (``operators.support.disparity``).

Loading (``load_backbone``, shared with ``operators.image_split_product``): ``model`` is a hub id
(pinned with ``revision``; cached or reachable) or a local directory written by
``save_pretrained`` (``pipelines.standins.vision`` builds tiny random ones). Any weight the model
lacks, any checkpoint weight it does not use, or a shape mismatch is an error (transformers only
warns; a partly random model would give meaningless similarities). The one exception: a ViT
checkpoint's ``pooler.*`` weights, which these features never use, are ignored and recorded.
dtype "auto" is float32 on every device: these backbones are small next to the generator, and
float32 keeps the cosines at the precision of the tables (``dtype="float16"`` opts in).

Preprocessing happens on the images' device, in torch, emulating the checkpoint's own image
processor (``preprocessor_config.json`` through ``AutoImageProcessor``) on the 8-bit image:

1. the (B, 3, H, W) floats in [0, 1] are quantised to 0-255 levels as the generator's RGB8
   payload is (``round(x * 255)``), so a tensor and its payload are preprocessed alike;
2. resize, as the processor says: ``size={"height", "width"}`` resizes to that size (ViT);
   ``size={"shortest_edge": s}`` resizes the shorter side to s keeping the aspect ratio
   (``int(s * long / short)`` for the other side); ConvNeXt's processor (the one of
   ``microsoft/resnet-50``) with ``s < 384`` resizes the shorter side to ``int(s / crop_pct)``
   and center-crops s x s (s >= 384: resize to s x s). The interpolation is the config's
   ``resample`` (bicubic 3, bilinear 2, nearest 0), antialiased, done as PIL and torch's uint8
   CPU kernels do it: the width first, then the height, each pass clamped and rounded to
   levels (in float32 with ``F.interpolate``, so it runs on any device). Against the processor
   on the CPU (its default torchvision backend and its PIL backend, uint8 input) the pixel
   values differ by at most 2 levels (of 255, before normalisation) and by under 0.1 level on
   average (tested on random and smooth images; the kernels' fixed-point weights cause it). On
   a GPU the torchvision backend interpolates in one float pass instead, without rounding
   between the passes: it differs from this by rounding only (a level on some pixels);
3. ``do_center_crop`` with ``crop_size`` (offsets ``int((H - h) / 2)``, zero padding where the
   image is smaller), as the processor;
4. rescale (``rescale_factor``) and normalise with ``image_mean`` / ``image_std``.

Processors that pad, or resize in other ways (``longest_edge``, ``max_height``...), are refused
at load time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from operators.base import Resources
from operators.support.codec import rgb_levels
from operators.support.disparity import unit_similarities
from operators.support.models import (ModelLoadError, check_loading_info, dtype_kwarg, hub_load_error, loaded_record,
                                     loading, local_record, pick_device, resolve_dtype)
from schemas.exposed import Space

STAGE_BACKBONE_DISPARITY = "backbone_disparity"

# what a loader builds: an image classifier whose logits are the feature, or a ViT encoder
ARCH_CLASSIFIER = "classifier"
ARCH_VIT = "vit"

DEFAULT_MODELS = {Space.RESNET: "microsoft/resnet-50", Space.DINO: "facebook/dino-vits16"}
SPACE_ARCH = {Space.RESNET: ARCH_CLASSIFIER, Space.DINO: ARCH_VIT}
FEATURES = {
    Space.RESNET: "logits: the output of the last fully-connected layer (classifier), before softmax",
    Space.DINO: "last_hidden_state[:, 0]: the last layer's class token after the final layer norm",
}

_INTERPOLATIONS = {0: "nearest", 2: "bilinear", 3: "bicubic"}   # PIL resampling codes
CONVNEXT_FULL_RESIZE = 384  # ConvNeXt's processor: from this shortest_edge on it warps without crop_pct


# --- the image processor, emulated in torch ---------------------------------------------------------------


def _size_get(size, key):
    if size is None:
        return None
    if isinstance(size, Mapping):
        return size.get(key)
    return getattr(size, key, None)


def _interpolation(resample) -> str:
    if resample is None:
        return "bilinear"  # what the processors do without one
    if isinstance(getattr(resample, "value", None), str):  # a torchvision InterpolationMode
        name = resample.value
    else:  # a PIL resampling code (int or PILImageResampling)
        name = _INTERPOLATIONS.get(int(resample), str(resample))
    if name not in ("nearest", "bilinear", "bicubic"):
        raise ValueError(f"image processor resample {resample!r} is not supported (nearest, bilinear, bicubic)")
    return name


def image_settings(image_processor) -> dict:
    """What the torch emulation needs from a loaded transformers image processor (and what the
    record shows): resize rule and size, crop, interpolation, rescale and normalisation."""
    name = type(image_processor).__name__
    if getattr(image_processor, "do_pad", None):
        raise ValueError(f"{name}: image processors that pad are not supported")
    do_resize = bool(getattr(image_processor, "do_resize", True))
    size = getattr(image_processor, "size", None)
    height, width = _size_get(size, "height"), _size_get(size, "width")
    shortest = _size_get(size, "shortest_edge")
    others = [k for k in ("longest_edge", "max_height", "max_width", "min_pixels", "max_pixels") if _size_get(size, k)]
    resize, resize_size, crop_pct = None, None, None
    if do_resize:
        if others:
            raise ValueError(f"{name}: resizing by {others} is not supported (only height/width or shortest_edge)")
        if height and width:
            resize, resize_size = "squash", [int(height), int(width)]
        elif shortest:
            resize, resize_size = "shortest_edge", [int(shortest)]
            if name.startswith("ConvNextImageProcessor"):
                crop_pct = float(getattr(image_processor, "crop_pct", None) or 224 / 256)
                if int(shortest) >= CONVNEXT_FULL_RESIZE:
                    resize, resize_size, crop_pct = "squash", [int(shortest), int(shortest)], None
                else:
                    resize = "shortest_edge_crop_pct"
        else:
            raise ValueError(f"{name}: image processor size {size!r} has neither (height, width) nor shortest_edge")
    crop_size = None
    if getattr(image_processor, "do_center_crop", None):
        cs = getattr(image_processor, "crop_size", None)
        ch, cw = _size_get(cs, "height"), _size_get(cs, "width")
        if not ch or not cw:
            raise ValueError(f"{name}: center crop size {cs!r} has no (height, width)")
        crop_size = [int(ch), int(cw)]
    mean = getattr(image_processor, "image_mean", None)
    std = getattr(image_processor, "image_std", None)
    do_normalize = bool(getattr(image_processor, "do_normalize", True))
    if do_normalize:
        mean = [float(mean)] * 3 if isinstance(mean, (int, float)) else [float(m) for m in mean]
        std = [float(std)] * 3 if isinstance(std, (int, float)) else [float(s) for s in std]
    return {
        "image_processor_class": name,
        "resize": resize,                 # None, "squash", "shortest_edge", "shortest_edge_crop_pct"
        "resize_size": resize_size,       # [h, w] for squash, [s] for the shortest-edge rules
        "crop_pct": crop_pct,
        "interpolation": _interpolation(getattr(image_processor, "resample", None)) if do_resize else None,
        "crop_size": crop_size,           # processor center crop [h, w], None without one
        "do_rescale": bool(getattr(image_processor, "do_rescale", True)),
        "rescale_factor": float(getattr(image_processor, "rescale_factor", 1 / 255)),
        "do_normalize": do_normalize,
        "image_mean": mean if do_normalize else None,
        "image_std": std if do_normalize else None,
    }


def _shortest_edge_size(h: int, w: int, s: int) -> tuple[int, int]:
    """transformers' ``get_resize_output_image_size(size=s, default_to_square=False)``."""
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = s, int(s * long / short)
    return (new_long, new_short) if w <= h else (new_short, new_long)


def output_size(settings: dict, height: int, width: int) -> tuple[int, int]:
    """(h, w) of the pixel values the processor makes of an image of ``height`` x ``width``."""
    h, w = int(height), int(width)
    rule = settings["resize"]
    if rule == "squash":
        h, w = settings["resize_size"]
    elif rule == "shortest_edge":
        h, w = _shortest_edge_size(h, w, settings["resize_size"][0])
    elif rule == "shortest_edge_crop_pct":
        h = w = settings["resize_size"][0]
    if settings["crop_size"]:
        h, w = settings["crop_size"]
    return int(h), int(w)


def fixed_output_size(settings: dict) -> tuple[int, int] | None:
    """The processor's output size when it does not depend on the input's, else None."""
    if settings["crop_size"]:
        return tuple(settings["crop_size"])
    if settings["resize"] == "squash":
        return tuple(settings["resize_size"])
    if settings["resize"] == "shortest_edge_crop_pct":
        return (settings["resize_size"][0],) * 2
    return None


def _resize_levels(x, size: tuple[int, int], interpolation: str):
    """Resize (B, 3, H, W) 0-255 levels to ``size``: the width, then the height, each pass
    antialiased and clamped and rounded to levels, as PIL and torch's uint8 CPU kernels do."""
    import torch.nn.functional as F  # deferred: torch

    th, tw = size
    if tuple(x.shape[-2:]) == (th, tw):
        return x
    if interpolation == "nearest":
        return F.interpolate(x, size=(th, tw), mode="nearest")
    kw = {"mode": interpolation, "align_corners": False, "antialias": True}
    if x.shape[-1] != tw:
        x = F.interpolate(x, size=(x.shape[-2], tw), **kw).clamp_(0.0, 255.0).round_()
    if x.shape[-2] != th:
        x = F.interpolate(x, size=(th, tw), **kw).clamp_(0.0, 255.0).round_()
    return x


def _center_crop(x, size: tuple[int, int]):
    """The processors' center crop: offsets ``int((H - h) / 2)``, zero padding where smaller."""
    import torch.nn.functional as F  # deferred: torch

    h, w = x.shape[-2:]
    th, tw = size
    if th > h or tw > w:
        pl, pt = ((tw - w) // 2 if tw > w else 0), ((th - h) // 2 if th > h else 0)
        pr, pb = ((tw - w + 1) // 2 if tw > w else 0), ((th - h + 1) // 2 if th > h else 0)
        x = F.pad(x, (pl, pr, pt, pb), value=0.0)
        h, w = x.shape[-2:]
    top, left = int((h - th) / 2.0), int((w - tw) / 2.0)
    return x[..., top:top + th, left:left + tw]


def preprocess(images, settings: dict):
    """(B, 3, H, W) float images in [0, 1] on any device -> pixel values (B, 3, h, w) float32 on
    that device, as the image processor described by ``settings`` makes them of the RGB8 image
    (module docstring)."""
    import torch  # deferred: torch

    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    x = rgb_levels(images)
    rule = settings["resize"]
    h, w = x.shape[-2:]
    if rule == "squash":
        x = _resize_levels(x, tuple(settings["resize_size"]), settings["interpolation"])
    elif rule == "shortest_edge":
        x = _resize_levels(x, _shortest_edge_size(h, w, settings["resize_size"][0]), settings["interpolation"])
    elif rule == "shortest_edge_crop_pct":
        s = settings["resize_size"][0]
        x = _resize_levels(x, _shortest_edge_size(h, w, int(s / settings["crop_pct"])), settings["interpolation"])
        x = _center_crop(x, (s, s))
    if settings["crop_size"]:
        x = _center_crop(x, tuple(settings["crop_size"]))
    if settings["do_rescale"]:
        x = x * settings["rescale_factor"]
    if settings["do_normalize"]:
        mean = torch.tensor(settings["image_mean"], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(settings["image_std"], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        x = (x - mean) / std
    return x.contiguous()


# --- loading ------------------------------------------------------------------------------------------


@dataclass
class BackboneBundle:
    """A loaded vision backbone: the model (eval mode, on ``device``), its image processor, the
    preprocessing settings and provenance."""

    model: Any
    image_processor: Any
    device: str
    dtype: Any
    settings: dict
    arch: str
    record: dict = field(default_factory=dict)


def _load_error(model: str, revision: str | None, arch: str, exc: BaseException) -> ModelLoadError:
    what = ("an image classifier (e.g. ResNetForImageClassification, microsoft/resnet-50)" if arch == ARCH_CLASSIFIER
            else "a ViT encoder (ViTModel, e.g. facebook/dino-vits16 or facebook/dino-vitb8)")
    return hub_load_error(
        "vision backbone", model, revision, exc,
        f"Provide {what} as a local directory written by save_pretrained() (config.json, model.safetensors and "
        f"the image processor's preprocessor_config.json), or as a hub id",
        "--standin-models builds tiny random ones (pipelines.standins.vision).")


def load_backbone(model: str, arch: str, revision: str | None = None, device: str = "auto",
                  dtype: str = "auto") -> BackboneBundle:
    """Load a transformers vision backbone for inference, or raise ModelLoadError naming it and
    saying how to provide it. ``arch``: ``ARCH_CLASSIFIER`` (AutoModelForImageClassification; its
    logits are the feature) or ``ARCH_VIT`` (a ViTModel, loaded without the pooling layer).
    ``dtype="auto"``: float32 everywhere."""
    from transformers import (  # deferred: transformers
        AutoConfig,
        AutoImageProcessor,
        AutoModel,
        AutoModelForImageClassification,
    )

    if arch not in (ARCH_CLASSIFIER, ARCH_VIT):
        raise ValueError(f"arch must be {ARCH_CLASSIFIER!r} or {ARCH_VIT!r}, got {arch!r}")
    dev = pick_device(device)
    torch_dtype = resolve_dtype(dtype, dev, cuda_auto="float32")
    with loading(lambda exc: _load_error(model, revision, arch, exc)):
        config = AutoConfig.from_pretrained(model, revision=revision)
        model_type = getattr(config, "model_type", None)
        if arch == ARCH_VIT:
            if model_type != "vit":
                raise ValueError(f"its config is a {model_type!r} model, not a 'vit' one")
            net, info = AutoModel.from_pretrained(model, revision=revision, add_pooling_layer=False,
                                                  output_loading_info=True, **dtype_kwarg(torch_dtype))
        else:
            net, info = AutoModelForImageClassification.from_pretrained(
                model, revision=revision, output_loading_info=True, **dtype_kwarg(torch_dtype))
        ignored = check_loading_info(info, lambda k: arch == ARCH_VIT and k.split(".")[0] == "pooler")
        image_processor = AutoImageProcessor.from_pretrained(model, revision=revision)
        settings = image_settings(image_processor)
        if arch == ARCH_VIT:
            size = fixed_output_size(settings)
            image_size = config.image_size
            image_size = tuple(image_size) if isinstance(image_size, (list, tuple)) else (image_size, image_size)
            if size is None or tuple(size) != tuple(int(s) for s in image_size):
                raise ValueError(f"the image processor makes {size or 'input-dependent'} pixel values, the ViT takes "
                                 f"{tuple(image_size)} (config.image_size)")
        net = net.to(dev).eval()

    record = loaded_record(model, revision, net, config, torch_dtype, dev, lead={"arch": arch}, fields={
        "model_type": model_type,
        "activation": getattr(config, "hidden_act", None),
        **settings,
    })
    if ignored:
        record["ignored_checkpoint_weights"] = ignored
    if arch == ARCH_VIT:
        record.update(patch_size=int(config.patch_size), image_size=int(config.image_size),
                      hidden_size=int(config.hidden_size), num_hidden_layers=int(config.num_hidden_layers))
    else:
        record["num_labels"] = int(config.num_labels)
    record.update(local_record(model))
    return BackboneBundle(model=net, image_processor=image_processor, device=dev, dtype=torch_dtype,
                          settings=settings, arch=arch, record=record)


def run_backbone(bundle: BackboneBundle, images, batch_size: int, take):
    """``take(model outputs)`` of (B, 3, H, W) float images in [0, 1] on any device, computed in
    batches of ``batch_size`` on the model's device and concatenated (float32)."""
    import torch  # deferred: torch

    out = []
    with torch.inference_mode():
        for start in range(0, images.shape[0], batch_size):
            pv = preprocess(images[start:start + batch_size].to(bundle.device), bundle.settings)
            outputs = bundle.model(pixel_values=pv.to(bundle.dtype))
            out.append(take(outputs).float())
    return torch.cat(out) if out else None


# --- the head -------------------------------------------------------------------------------------------


class BackboneDisparity:
    """Disparity head: cosine of ResNet-50 logits (``Space.RESNET``) or of DINO ViT-S/16's last-layer
    class token (``Space.DINO``) for each pair of a unit."""

    stage_name = STAGE_BACKBONE_DISPARITY
    resources = Resources(num_cpus=1, batch_size=32, actors=1)
    spaces: tuple[str, ...]   # the one space this instance measures (set from ``space``)

    def __init__(self, space: str = Space.RESNET, model: str | None = None, revision: str | None = None,
                 device: str = "auto", dtype: str = "auto", batch_size: int = 32):
        if space not in SPACE_ARCH:
            raise ValueError(f"space must be one of {sorted(SPACE_ARCH)}, got {space!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.space = space
        self.spaces = (space,)
        self.batch_size = int(batch_size)
        self.bundle = load_backbone(model or DEFAULT_MODELS[space], SPACE_ARCH[space], revision, device, dtype)
        self.device = self.bundle.device
        self.record = {"stage": self.stage_name, "space": space, "feature": FEATURES[space],
                       "similarity": "cosine", "batch_size": self.batch_size, **self.bundle.record}

    def features(self, images):
        """(B, d) float32 feature vectors (on the model's device) of (B, 3, H, W) float images in [0, 1]."""
        if self.space == Space.RESNET:
            return run_backbone(self.bundle, images, self.batch_size, lambda o: o.logits)
        return run_backbone(self.bundle, images, self.batch_size, lambda o: o.last_hidden_state[:, 0])

    def triplet_similarities(self, images) -> dict[str, np.ndarray]:
        """{space: (U, 3) float64 cosines in PAIRS order} of (U, 3, 3, H, W) float images in [0, 1]."""
        return unit_similarities(images, self.space, self.features)
