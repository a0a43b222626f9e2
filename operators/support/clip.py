"""CLIP through open_clip, for every operator that uses it: resolving and loading a model (built-in
architecture with a tag or checkpoint, a local directory, or an ``hf-hub:`` repository; revision
pinning; weights provenance; the QuickGELU activation check), and encoding images and texts with
the model's own preprocessing as torch ops on the image's device (resize the shortest side with
antialiased bicubic interpolation, center crop, normalise), so generated images are never
re-encoded or copied to the CPU. The gender classifier, the alignment scorer and the image
embedder are heads built on it."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from operators.support.models import ModelLoadError, pick_device, weights_provenance

# paper 002's CLIP (section 2.2): ViT-L/14 with OpenAI's weights
DEFAULT_MODEL = "ViT-L-14"
DEFAULT_PRETRAINED = "openai"

LOCAL_DIR = "local-dir:"
HF_HUB = "hf-hub:"
SOURCE_BUILTIN = "builtin"
SOURCE_LOCAL_DIR = "local-dir"
SOURCE_HF_HUB = "hf-hub"
SOURCE_CHECKPOINT = "checkpoint file"

# The weight files open_clip looks for in a local directory, in its order of preference
# (open_clip.factory._find_checkpoint_in_dir).
_PREFERRED_WEIGHTS = (
    "open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth", "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth",
)


@dataclass
class ClipBundle:
    """A loaded CLIP: the model (eval mode, on ``device``) and what preprocessing needs."""

    model: Any                      # open_clip CLIP / CustomTextCLIP
    tokenizer: Any
    mean: Any                       # torch float32 (3,) on device
    std: Any                        # torch float32 (3,) on device
    image_size: tuple[int, int]     # (height, width) the vision tower takes
    device: str
    interpolation: str = "bicubic"  # "bicubic" or "bilinear"
    resize_mode: str = "shortest"   # "shortest" (resize + center crop), "longest" (resize + pad), "squash"
    fill_color: int = 0
    record: dict = field(default_factory=dict)


def _weights_in_dir(directory: Path) -> Path | None:
    for name in _PREFERRED_WEIGHTS:
        if (directory / name).is_file():
            return directory / name
    found = sorted(p for ext in ("*.safetensors", "*.bin", "*.pth") for p in directory.glob(ext))
    return found[0] if found else None


def resolve_clip_spec(model: str, pretrained: str | None) -> tuple[str, str | None, dict]:
    """(model name for open_clip, pretrained for open_clip, provenance) for a model spec.

    A plain directory path is read as ``local-dir:``; ``local-dir:`` and ``hf-hub:`` specs ignore
    ``pretrained``; a built-in architecture takes a pretrained tag or a checkpoint file path.
    """
    if not model.startswith((LOCAL_DIR, HF_HUB)) and os.path.isdir(model):
        model = LOCAL_DIR + model
    if model.startswith(LOCAL_DIR):
        path = Path(model[len(LOCAL_DIR):]).expanduser().resolve()
        return LOCAL_DIR + str(path), None, {"source": SOURCE_LOCAL_DIR, "path": str(path)}
    if model.startswith(HF_HUB):
        return model, None, {"source": SOURCE_HF_HUB}
    if pretrained and os.path.isfile(pretrained):
        return model, pretrained, {"source": SOURCE_CHECKPOINT, "path": str(Path(pretrained).resolve())}
    return model, pretrained, {"source": SOURCE_BUILTIN}


# open_clip only warns when the activation it builds differs from the one the weights were trained
# with (warnings.warn in open_clip 3, e.g. "QuickGELU mismatch between final model config ...";
# the same as warnings or log records in 2.x); every CLIP output would be perturbed, so it is an error.
_ACTIVATION_MISMATCH = r".*(QuickGELU mismatch|trained with QuickGELU|QuickGELU activation)"


@contextlib.contextmanager
def activation_mismatch_is_an_error():
    """Raise (ValueError, or the warning itself) where open_clip warns or logs that the model's
    activation does not match its pretrained weights'."""
    heard: list[str] = []
    pattern = re.compile(_ACTIVATION_MISMATCH, re.IGNORECASE)

    class _Listen(logging.Handler):
        def emit(self, rec):
            if pattern.match(rec.getMessage()):
                heard.append(rec.getMessage())

    listener = _Listen(logging.WARNING)
    logging.getLogger().addHandler(listener)  # open_clip logs to the root logger
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=_ACTIVATION_MISMATCH)
            yield
    finally:
        logging.getLogger().removeHandler(listener)
    if heard:
        raise ValueError(f"open_clip: {heard[0]}")


def clip_architecture(name: str, pretrained: str | None) -> tuple[dict, str | None]:
    """``create_model`` keyword arguments that build a built-in architecture with the activation its
    pretrained tag's weights were trained with, and that activation ("QuickGELU" / "GELU"; None
    where the tag is not in open_clip's registry, or the spec carries its own config).

    open_clip builds ``ViT-L-14`` with GELU while OpenAI's weights (tag ``openai``) were trained
    with QuickGELU (its registry says ``quick_gelu=True``); the ``-quickgelu`` names build QuickGELU."""
    import open_clip  # deferred: open_clip

    if not pretrained or name.startswith((LOCAL_DIR, HF_HUB)):
        return {}, None
    arch = name.replace("/", "-")
    cfg = open_clip.get_pretrained_cfg(arch, pretrained)
    if not cfg:
        return {}, None
    quick = bool(cfg.get("quick_gelu", False))
    built_quick = bool((open_clip.get_model_config(arch) or {}).get("quick_gelu", False))
    return ({"force_quick_gelu": True} if quick and not built_quick else {}), ("QuickGELU" if quick else "GELU")


def clip_activation(net) -> str | None:
    """The activation class of the model's transformer MLPs ("QuickGELU", "GELU"; "+"-joined when
    the towers differ), None where they have none of open_clip's blocks (timm / HF towers)."""
    found = sorted({type(m).__name__ for n, m in net.named_modules() if n.endswith("mlp.gelu")})
    return "+".join(found) or None


def _resolve_weights(name: str, tag: str | None, record: dict,
                     revision: str | None) -> tuple[str, str | None, str | None]:
    """(model name, pretrained value for ``create_model``, the local weight file it loads), reading
    or downloading hub files into the Hugging Face cache pinned to ``revision``; errors propagate."""
    from open_clip import pretrained as oc_pretrained  # deferred: open_clip

    source = record["source"]
    if revision is not None and source in (SOURCE_CHECKPOINT, SOURCE_LOCAL_DIR):
        raise ValueError(f"a revision pins hub weights; {record['path']} is a local {source}")
    if source == SOURCE_CHECKPOINT:
        return name, tag, record["path"]
    if source == SOURCE_LOCAL_DIR:
        found = _weights_in_dir(Path(record["path"]))
        return name, tag, str(found) if found is not None else None
    if source == SOURCE_HF_HUB:
        # open_clip's hf-hub: loader takes no revision: fetch the config and weights of the revision's
        # snapshot and build from that directory (open_clip picks its weights as _weights_in_dir does)
        repo = name[len(HF_HUB):]
        config = oc_pretrained.download_pretrained_from_hf(repo, filename="open_clip_config.json", revision=revision)
        oc_pretrained.download_pretrained_from_hf(repo, revision=revision)
        snapshot = Path(config).parent
        found = _weights_in_dir(snapshot)
        return LOCAL_DIR + str(snapshot), None, str(found) if found is not None else None
    cfg = oc_pretrained.get_pretrained_cfg(name.replace("/", "-"), tag) if tag else {}
    if not cfg:
        return name, tag, None  # unknown tag: create_model reports it
    if revision is None:
        return name, tag, oc_pretrained.download_pretrained(cfg) or None  # the file create_model loads
    if not cfg.get("hf_hub"):
        raise ValueError(f"pretrained tag {tag!r} of {name} is not on the Hugging Face hub: a revision cannot pin it")
    repo, filename = os.path.split(cfg["hf_hub"])
    path = oc_pretrained.download_pretrained_from_hf(repo, filename=filename or None, revision=revision)
    return name, path, path  # built from the file; the tag's preprocessing is passed along (load_clip)


def load_clip(model: str = DEFAULT_MODEL, pretrained: str | None = DEFAULT_PRETRAINED,
              device: str = "auto", revision: str | None = None) -> ClipBundle:
    """Load an open_clip model for inference, or raise ModelLoadError saying how to provide it.

    ``model`` is a built-in architecture (``ViT-L-14``) with ``pretrained`` a tag (``openai``,
    fetched through open_clip's cache) or a checkpoint file; ``local-dir:/path`` or a plain
    directory (``open_clip_config.json`` + weights); or ``hf-hub:org/repo``. ``revision`` (a hub
    commit, branch or tag) pins an ``hf-hub:`` model or a tag whose weights are on the hub. A model
    whose weights cannot be found is an error, never a silently random model; so is one built with
    another activation than its weights were trained with (``openai`` tags get QuickGELU).
    """
    import open_clip  # deferred: open_clip
    import torch  # deferred: torch

    name, tag, where = resolve_clip_spec(model, pretrained)
    record = {"model": model, "pretrained": tag, "revision": revision, **where}  # pretrained: None where ignored
    dev = pick_device(device)
    try:
        arch_kwargs, trained_with = clip_architecture(name, tag)
        name, weights_arg, weights = _resolve_weights(name, tag, record, revision)
        if weights_arg != tag:  # a tag's file fetched at a revision: keep the tag's preprocessing
            arch_kwargs["force_preprocess_cfg"] = open_clip.get_pretrained_cfg(name.replace("/", "-"), tag)
        with activation_mismatch_is_an_error():
            net = open_clip.create_model(name, pretrained=weights_arg, device=dev, require_pretrained=True, **arch_kwargs)
        tokenizer = open_clip.get_tokenizer(name)
        built = clip_activation(net)
        if trained_with is not None and built is not None and built != trained_with:
            raise ValueError(f"open_clip built {model} with {built}, but the {tag!r} weights were trained with "
                             f"{trained_with}")
    except Exception as exc:  # open_clip raises RuntimeError, FileNotFoundError, ValueError, hub errors...
        raise ModelLoadError(
            f"cannot load CLIP model {model!r} (pretrained {pretrained!r}, revision {revision!r}): "
            f"{type(exc).__name__}: {exc}. "
            f"Provide it in one of these ways: a built-in open_clip architecture with a pretrained tag "
            f"whose weights are in the Hugging Face / open_clip cache (download once online, or point "
            f"HF_HOME at a pre-filled cache on every node); --clip-model local-dir:/path/to/dir (a "
            f"directory with open_clip_config.json and open_clip_model.safetensors); a built-in "
            f"architecture with a checkpoint file path as the pretrained value; or hf-hub:org/repo "
            f"(cached, or reachable from every node)."
        ) from exc
    record["activation"] = built  # QuickGELU for OpenAI's weights (paper 002 / 001 / 000 all use them)
    if trained_with is not None:
        record["weights_activation"] = trained_with
    net.eval()
    if weights is not None and os.path.isfile(weights):
        # the snapshot path (not the blob it links to): it names the hub commit that loaded
        record["weights"] = os.path.abspath(weights)
        record.update(weights_provenance([weights], Path(record["weights"]).parent))
        record["sha256"] = record["weight_files"][Path(weights).name]
    else:
        record.update(sha256=None, commit=None, weight_files=None, weights_sha256=None)
    if record["source"] == SOURCE_LOCAL_DIR:
        try:
            note = json.loads((Path(record["path"]) / "open_clip_config.json").read_text()).get("standin")
        except (OSError, ValueError):
            note = None
        if note:
            record["standin"] = note
    cfg = open_clip.get_model_preprocess_cfg(net)
    size = cfg.get("size", net.visual.image_size)
    size = (int(size), int(size)) if isinstance(size, (int, float)) else (int(size[0]), int(size[1]))
    mean, std = cfg.get("mean"), cfg.get("std")
    mean = (mean,) * 3 if isinstance(mean, (int, float)) else mean
    std = (std,) * 3 if isinstance(std, (int, float)) else std
    record.update({
        "image_size": list(size),
        "interpolation": cfg.get("interpolation", "bicubic"),
        "resize_mode": cfg.get("resize_mode", "shortest"),
        "open_clip_version": importlib.metadata.version("open_clip_torch"),
    })
    return ClipBundle(
        model=net,
        tokenizer=tokenizer,
        mean=torch.tensor(mean, dtype=torch.float32, device=dev),
        std=torch.tensor(std, dtype=torch.float32, device=dev),
        image_size=size,
        device=dev,
        interpolation=record["interpolation"],
        resize_mode=record["resize_mode"],
        fill_color=int(cfg.get("fill_color", 0) or 0),
        record=record,
    )




# --- preprocessing on the image's device ------------------------------------------------------------


def _resize(x, size: tuple[int, int], interpolation: str):
    import torch.nn.functional as F  # deferred: torch

    mode = "bilinear" if interpolation == "bilinear" else "bicubic"
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    # torchvision's tensor Resize: antialiased; PIL (open_clip's path) clamps to the pixel range
    return F.interpolate(x, size=size, mode=mode, align_corners=False, antialias=True).clamp_(0.0, 1.0)


def _center_crop(x, size: tuple[int, int], fill: float):
    """torchvision's center_crop (crop offsets rounded), padding with ``fill`` where the image is smaller."""
    import torch.nn.functional as F  # deferred: torch

    h, w = x.shape[-2:]
    th, tw = size
    if th > h or tw > w:
        pt, pl = (th - h) // 2 if th > h else 0, (tw - w) // 2 if tw > w else 0
        pb, pr = (th - h + 1) // 2 if th > h else 0, (tw - w + 1) // 2 if tw > w else 0
        x = F.pad(x, (pl, pr, pt, pb), value=fill)
        h, w = x.shape[-2:]
    top, left = round((h - th) / 2.0), round((w - tw) / 2.0)
    return x[..., top:top + th, left:left + tw]


def preprocess_tensor(images, bundle: ClipBundle):
    """(B, 3, H, W) float in [0, 1] on any device -> normalised (B, 3, h, w) float32 on that device,
    following open_clip's eval transform for the model's ``resize_mode``."""
    x = images.float()
    h, w = x.shape[-2:]
    th, tw = bundle.image_size
    fill = bundle.fill_color / 255.0
    if bundle.resize_mode == "squash":
        x = _resize(x, (th, tw), bundle.interpolation)
    elif bundle.resize_mode == "longest":
        scale = max(th, tw) / max(h, w)
        x = _resize(x, (max(1, round(h * scale)), max(1, round(w * scale))), bundle.interpolation)
        x = _center_crop(x, (th, tw), fill)
    else:  # shortest, as torchvision Resize(int): short side -> target, long side truncated
        target = min(th, tw) if th == tw else None
        if target is not None:
            if h <= w:
                new = (target, int(target * w / h))
            else:
                new = (int(target * h / w), target)
        else:  # open_clip ResizeKeepRatio for a non-square target
            ratio = min(h / th, w / tw)
            new = (max(1, round(h / ratio)), max(1, round(w / ratio)))
        x = _center_crop(_resize(x, new, bundle.interpolation), (th, tw), fill)
    mean = bundle.mean.to(x.device).view(1, 3, 1, 1)
    std = bundle.std.to(x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def _encode_preprocessed(bundle: ClipBundle, x):
    """Image features of preprocessed images (fp16 autocast on CUDA), float32 on the model's device."""
    import torch  # deferred: torch

    x = x.to(bundle.device)
    if x.device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.float16):
            return bundle.model.encode_image(x).float()
    return bundle.model.encode_image(x).float()


def _empty_features(bundle: ClipBundle):
    import torch  # deferred: torch

    dim = getattr(bundle.model, "embed_dim", None) or bundle.model.text_projection.shape[-1]
    return torch.zeros((0, int(dim)), dtype=torch.float32)


def encode_image_tensor(bundle: ClipBundle, images, batch_size: int = 64):
    """CLIP image features (float32, on the model's device) of (B, 3, H, W) float images in [0, 1]
    on any device, preprocessed where they are (never copied to the CPU)."""
    import torch  # deferred: torch

    feats = []
    with torch.inference_mode():
        for start in range(0, images.shape[0], batch_size):
            feats.append(_encode_preprocessed(bundle, preprocess_tensor(images[start:start + batch_size], bundle)))
    return torch.cat(feats) if feats else _empty_features(bundle)


def encode_image_batch(bundle: ClipBundle, images, batch_size: int = 64):
    """``encode_image_tensor`` of a (B, 3, H, W) batch, the shape a stage's ``classify_tensor``
    takes; ValueError for any other shape."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    return encode_image_tensor(bundle, images, batch_size)


def encode_image_arrays(bundle: ClipBundle, arrays: list[np.ndarray], batch_size: int = 64):
    """Features of decoded (H, W, 3) uint8 images, in order: same-size images are resized together."""
    import torch  # deferred: torch

    dev = bundle.device
    th, tw = bundle.image_size
    pre = torch.empty((len(arrays), 3, th, tw), dtype=torch.float32, device=dev)
    by_shape: dict[tuple, list[int]] = {}
    for i, a in enumerate(arrays):
        by_shape.setdefault(a.shape, []).append(i)
    with torch.inference_mode():
        for idx in by_shape.values():
            for start in range(0, len(idx), batch_size):
                part = idx[start:start + batch_size]
                stacked = np.stack([arrays[i] for i in part])
                x = torch.from_numpy(stacked).to(dev).permute(0, 3, 1, 2).float().div_(255.0)
                pre[torch.as_tensor(part, device=dev)] = preprocess_tensor(x, bundle)
        feats = [_encode_preprocessed(bundle, pre[s:s + batch_size]) for s in range(0, len(arrays), batch_size)]
    return torch.cat(feats) if feats else _empty_features(bundle)


def encode_texts(bundle: ClipBundle, texts: list[str], batch_size: int = 256):
    """CLIP text features (float32, on the model's device) of ``texts``, in order."""
    import torch  # deferred: torch

    feats = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            tokens = bundle.tokenizer(list(texts[start:start + batch_size])).to(bundle.device)
            feats.append(bundle.model.encode_text(tokens).float())
    return torch.cat(feats) if feats else _empty_features(bundle)


def unit_embeddings(features) -> list:
    """Each row of CLIP image ``features`` (torch, any device) L2-normalised, as float16 numpy rows."""
    import torch  # deferred: torch

    with torch.no_grad():
        unit = torch.nn.functional.normalize(features.float(), dim=-1)
    return list(unit.cpu().numpy().astype(np.float16))


