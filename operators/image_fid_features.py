"""FID feature vectors of images (paper 000, App. D.2: Fréchet Inception Distance).

FID compares the mean and covariance of Inception v3 pool3 features (2048-d) of generated images
with those of real images. The stage stores each image's feature vector
(``schemas.alignment.FID_FEATURES``); the distance itself is computed on the driver from the stored
matrices (``pipelines.studies.dalleval.alignment_metrics.fid``), so another reference set needs no
new images.

The default extractor is torch-fidelity's ``FeatureExtractorInceptionV3`` ("inception-v3-compat",
feature "2048"): the port of the TensorFlow Inception graph (2015-12-05) that FID numbers are
reported with (torchmetrics' FrechetInceptionDistance uses the same one). It takes uint8 images of
any size and resizes them to 299 x 299 itself, the way the TensorFlow graph does. The released DALL-Eval code
instead extracts with torchvision's ImageNet Inception v3 (``"torchvision"`` here: the network
``inception_v3(pretrained=True)`` builds, with ImageNet normalisation, pool features 2048-d); its
figures are comparable only with features of that network. A plug-in
extractor is named ``"package.module:callable"``: ``callable(weights=<path or None>)`` returns a
torch ``nn.Module`` mapping uint8 (B, 3, H, W) images to (B, d) features.

Generated images are processed on the generator's device (``classify_tensor``, the generator's head
hook), quantised first to the 8-bit levels of their RGB8 payload (``round(x * 255)``,
``operators.support.codec.rgb_levels``); decoded images (the reference set) from their payload
(``__call__``). Both paths feed the extractor the same uint8 pixels.

Reads IMAGE (+ IMAGE_ENCODING / IMAGE_HEIGHT / IMAGE_WIDTH); adds FID_FEATURES (null where there is
no image or it does not decode) and, with ``status=True``, REFERENCE_STATUS.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from operators.base import Resources, with_column
from operators.image_clip_embedding import embedding_array
from operators.support.codec import decode_rows, rgb_levels
from operators.support.models import ModelLoadError, file_sha256, pick_device
from schemas.alignment import FID_COLUMNS, FID_FEATURES, REFERENCE_STATUS, ReferenceStatus

STAGE_FID_FEATURES = "fid_features"
INCEPTION = "inception"
INCEPTION_NAME = "inception-v3-compat"   # torch-fidelity's registry name of the TF-compatible port
INCEPTION_FEATURE = "2048"               # pool3
INCEPTION_DIM = 2048
# torch-fidelity's converted TF Inception weights; torch hub names a checkpoint <name>-<sha256 prefix>.<ext>
INCEPTION_WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_SHA256_PREFIX = "6726825d"
TORCHVISION = "torchvision"
# torchvision's ImageNet Inception v3 weights (IMAGENET1K_V1; torch hub cache name)
TORCHVISION_WEIGHTS_FILE = "inception_v3_google-0cc3c7bd.pth"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class FidExtractor:
    """A loaded FID feature extractor: ``model`` maps uint8 (B, 3, H, W) on ``device`` to (B, dim)."""

    model: Any
    device: str
    dim: int
    record: dict = field(default_factory=dict)


def _torch_fidelity_version() -> str | None:
    try:
        return importlib.metadata.version("torch-fidelity")
    except importlib.metadata.PackageNotFoundError:
        return None


class _FirstOutput:
    """Calls a torch-fidelity extractor (which returns a tuple of the requested features) and
    returns its one feature tensor."""

    def __init__(self, net):
        self.net = net

    def __call__(self, x):
        return self.net(x)[0]


def _cached_inception_weights() -> str | None:
    """Where torch hub keeps torch-fidelity's Inception weights once fetched (None when absent)."""
    import torch  # deferred: torch

    path = os.path.join(torch.hub.get_dir(), "checkpoints", INCEPTION_WEIGHTS_FILE)
    return path if os.path.isfile(path) else None


def _load_inception(weights: str | None, dev: str):
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3  # deferred: torch_fidelity

    if weights is not None and not os.path.isfile(weights):
        raise FileNotFoundError(f"no weights file at {weights!r}")
    net = FeatureExtractorInceptionV3(INCEPTION_NAME, [INCEPTION_FEATURE], feature_extractor_weights_path=weights)
    return net.to(dev).eval(), INCEPTION_DIM


def _load_torchvision(weights: str | None, dev: str):
    """torchvision's Inception v3 as ``inception_v3(pretrained=True)`` builds it (aux logits,
    ``transform_input=True``), its ImageNet weights from ``weights`` or the torch hub cache, the
    classifier removed: uint8 (B, 3, H, W) -> bilinear 299 x 299 -> [0, 1] -> ImageNet mean/std ->
    (B, 2048) pool features."""
    import torch  # deferred: torch
    from torchvision.models import inception_v3  # deferred: torchvision

    path = weights or os.path.join(torch.hub.get_dir(), "checkpoints", TORCHVISION_WEIGHTS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no weights file at {path!r}")
    net = inception_v3(weights=None, aux_logits=True, transform_input=True, init_weights=False)
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    net.fc = torch.nn.Identity()
    return _torchvision_module()(net).to(dev).eval(), 2048, path


def _torchvision_module():
    """The feature module's class (defined on first use: the module imports torch lazily)."""
    import torch  # deferred: torch

    class TorchvisionFeatures(torch.nn.Module):
        num_features = 2048

        def __init__(self, net):
            super().__init__()
            self.net = net
            self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

        def forward(self, x):
            x = x.to(self.mean.dtype)
            x = torch.nn.functional.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False) / 255.0
            out = self.net((x - self.mean) / self.std)
            return out.logits if hasattr(out, "logits") else out

    return TorchvisionFeatures


def _load_plugin(spec: str, weights: str | None, dev: str, factory=None):
    """A plug-in extractor: ``factory`` (a callable given by the caller), else the one the user's
    ``package.module:callable`` string names (a study file's setting)."""
    import torch  # deferred: torch

    if factory is None:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise ValueError(f"a plug-in extractor is 'package.module:callable', got {spec!r}")
        factory = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
    net = factory(weights=weights)
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f"{spec} returned {type(net).__name__}, not a torch nn.Module")
    net = net.to(dev).eval()
    dim = getattr(net, "num_features", None)
    if dim is None:  # ask the module: one black 64 x 64 image
        with torch.inference_mode():
            out = net(torch.zeros((1, 3, 64, 64), dtype=torch.uint8, device=dev))
        if out.ndim != 2 or out.shape[0] != 1:
            raise ValueError(f"{spec} must map (B, 3, H, W) uint8 to (B, d) features, got shape {tuple(out.shape)}")
        dim = out.shape[1]
    return net, int(dim)


def load_fid_extractor(extractor: str = INCEPTION, weights: str | None = None, device: str = "auto",
                       factory=None) -> FidExtractor:
    """Load the FID feature extractor, or raise ModelLoadError saying how to provide it.

    ``extractor``: ``"inception"`` (torch-fidelity's TF-compatible Inception v3, pool3 2048-d;
    ``weights`` a local copy of its weight file, or None to let torch-fidelity fetch it into the
    torch hub cache) or ``"package.module:callable"`` (a plug-in, called with ``weights=weights``);
    with ``factory`` (a callable returning the feature module) ``extractor`` is only its name.
    """
    dev = pick_device(device)
    record = {"extractor": extractor, "device": dev, "torch_fidelity_version": _torch_fidelity_version()}
    try:
        if extractor == INCEPTION:
            net, dim = _load_inception(weights, dev)
            model = _FirstOutput(net)
            used = weights if weights is not None else _cached_inception_weights()
            record["feature"] = f"{INCEPTION_NAME}:{INCEPTION_FEATURE}"
        elif extractor == TORCHVISION:
            model, dim, used = _load_torchvision(weights, dev)
            record["feature"] = "torchvision inception_v3 (ImageNet, transform_input=True): avgpool 2048"
        elif factory is not None or ":" in extractor:
            model, dim = _load_plugin(extractor, weights, dev, factory)
            used = weights
        else:
            raise ValueError(f"unknown extractor {extractor!r}: use {INCEPTION!r}, {TORCHVISION!r} or "
                             f"'package.module:callable'")
    except Exception as exc:  # noqa: BLE001 -- download, file, import and state-dict errors alike
        import torch  # deferred: torch

        cache = os.path.join(torch.hub.get_dir(), "checkpoints", INCEPTION_WEIGHTS_FILE)
        hint = (f"For {INCEPTION!r}: torch-fidelity fetches {INCEPTION_WEIGHTS_FILE} from GitHub on first use; "
                f"offline, pass a local copy of that file via the study's fid.weights setting, or pre-fill the "
                f"torch hub cache ({cache}; TORCH_HOME moves it) on every node. For {TORCHVISION!r}: "
                f"{TORCHVISION_WEIGHTS_FILE} (torchvision's IMAGENET1K_V1) in fid.weights or the torch hub cache. "
                f"A plug-in is 'package.module:callable' returning a torch nn.Module that maps "
                f"uint8 (B, 3, H, W) images to (B, d) features.")
        raise ModelLoadError(f"cannot load FID extractor {extractor!r} (weights {weights!r}): "
                             f"{type(exc).__name__}: {exc}. {hint}") from exc
    record["weights"] = os.path.abspath(used) if used else None
    record["sha256"] = file_sha256(used) if used else None
    if extractor == INCEPTION:
        # the official file's sha256 starts with the prefix in its name (torch hub convention)
        record["official_weights"] = bool(record["sha256"] and record["sha256"].startswith(INCEPTION_SHA256_PREFIX))
    record["feature_dim"] = int(dim)
    return FidExtractor(model=model, device=dev, dim=int(dim), record=record)


def extract_features(extractor: FidExtractor, images_uint8, batch_size: int = 32) -> np.ndarray:
    """(B, d) float32 features of uint8 (B, 3, H, W) images on any device."""
    import torch  # deferred: torch

    feats = []
    with torch.inference_mode():
        for start in range(0, images_uint8.shape[0], batch_size):
            x = images_uint8[start:start + batch_size].to(extractor.device)
            out = extractor.model(x)
            if out.ndim != 2 or out.shape[1] != extractor.dim:
                raise ValueError(f"the FID extractor returned shape {tuple(out.shape)}, expected (B, {extractor.dim})")
            feats.append(out.detach().float().cpu().numpy())
    return np.concatenate(feats) if feats else np.zeros((0, extractor.dim), np.float32)


def extract_array_features(extractor: FidExtractor, arrays: list[np.ndarray], batch_size: int = 32) -> np.ndarray:
    """(n, d) float32 features of decoded (H, W, 3) uint8 images, in order; same-size images go together."""
    import torch  # deferred: torch

    out = np.zeros((len(arrays), extractor.dim), np.float32)
    by_shape: dict[tuple, list[int]] = {}
    for i, a in enumerate(arrays):
        by_shape.setdefault(a.shape, []).append(i)
    for idx in by_shape.values():
        for start in range(0, len(idx), batch_size):
            part = idx[start:start + batch_size]
            x = torch.from_numpy(np.stack([arrays[i] for i in part])).permute(0, 3, 1, 2).contiguous()
            out[part] = extract_features(extractor, x, batch_size)
    return out


class FidFeatureExtractor:
    """Adds FID_FEATURES: the FID extractor's feature vector of each row's image."""

    stage_name = STAGE_FID_FEATURES
    resources = Resources(num_cpus=1, batch_size=64, actors=1)  # num_gpus: the caller's decision
    output_fields = FID_COLUMNS  # what classify_tensor returns, for the generator

    def __init__(self, extractor: str = INCEPTION, weights: str | None = None, device: str = "auto",
                 batch_size: int = 32, status: bool = False, factory=None):
        self.extractor = load_fid_extractor(extractor, weights, device, factory)
        self.batch_size = int(batch_size)
        self.status = bool(status)
        self.record = {**self.extractor.record, "quantise": "rgb8 levels (round(x * 255)) as uint8"}

    @property
    def dim(self) -> int:
        return self.extractor.dim

    def features_tensor(self, images) -> np.ndarray:
        """(B, d) float32 features of (B, 3, H, W) float images in [0, 1] on any device, quantised to
        the 8-bit levels of their RGB8 payload."""
        import torch  # deferred: torch

        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
        return extract_features(self.extractor, rgb_levels(images).to(torch.uint8), self.batch_size)

    def classify_tensor(self, images) -> dict[str, np.ndarray]:
        """The generator's hook: {FID_FEATURES: (B, d) float32}."""
        return {FID_FEATURES: self.features_tensor(images)}

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        vectors = np.zeros((n, self.dim), np.float32)
        valid = np.zeros(n, bool)
        dec = decode_rows(batch)
        if len(dec.rows):
            vectors[dec.rows] = extract_array_features(self.extractor, dec.arrays, self.batch_size)
            valid[dec.rows] = True
        out = with_column(batch, FID_FEATURES, embedding_array(vectors, valid))
        if self.status:
            codes = np.where(valid, ReferenceStatus.OK, ReferenceStatus.DECODE_ERROR)
            out = with_column(out, REFERENCE_STATUS, pa.array(codes.tolist(), pa.string()))
        return out
