"""Random-weight stand-ins for the FID feature extractor (``operators.image_fid_features``).

- ``tiny_fid_extractor``: a small convolutional plug-in (``"pipelines.standins.fid:tiny_fid_extractor"``)
  with 64-d features, its weights drawn from a fixed seed so every process builds the same network.
- ``build_random_inception``: a state dict of torch-fidelity's real Inception v3 architecture with
  random weights, written where ``load_fid_extractor("inception", weights=path)`` loads it through
  torch-fidelity's own loader (strict keys), so tests exercise the production Inception path
  without the real weights.

Their features, and every FID computed from them, are meaningless.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from operators.image_fid_features import INCEPTION_FEATURE, INCEPTION_NAME

TINY_SEED = 0
TINY_DIM = 64
TINY_SIZE = 32  # the tiny net's input side, after an antialiased resize


def _tiny_net():
    # deferred: torch
    import torch
    import torch.nn.functional as F
    from torch import nn

    class TinyFidNet(nn.Module):
        """uint8 (B, 3, H, W) -> (B, 64) float32: resize to 32 x 32, three convolutions, average pool."""

        num_features = TINY_DIM

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.conv3 = nn.Conv2d(32, TINY_DIM, 3, padding=1)

        def forward(self, x):
            if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
                raise ValueError(f"expected uint8 (B, 3, H, W) images, got {x.dtype} {tuple(x.shape)}")
            x = x.float().div(127.5).sub(1.0)
            if tuple(x.shape[-2:]) != (TINY_SIZE, TINY_SIZE):
                x = F.interpolate(x, size=(TINY_SIZE, TINY_SIZE), mode="bilinear", align_corners=False,
                                  antialias=True)
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            return self.conv3(x).mean(dim=(2, 3))

    return TinyFidNet


def tiny_fid_extractor(weights: str | None = None):
    """The tiny plug-in extractor: random weights from seed ``TINY_SEED`` (the same in every process),
    or the state dict saved at ``weights``."""
    import torch  # deferred: torch

    net_class = _tiny_net()
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(TINY_SEED)
        net = net_class()
    if weights is not None:
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return net.eval().requires_grad_(False)


def build_random_inception(path, seed: int = 0) -> str:
    """Write a random-weight state dict of torch-fidelity's Inception v3 (``inception-v3-compat``)
    to ``path`` (about 95 MB) and return its absolute path. The same seed writes the same weights.

    torch-fidelity's constructor always loads a state dict; a subclass that ignores that one load
    (fed an empty file) builds the architecture so its ``state_dict()`` (every key, with the real
    shapes) can be harvested. Convolutions are re-drawn He-normal so activations keep their scale
    through the network (the batch norms are identities: running mean 0, variance 1).
    """
    # deferred: torch, torch_fidelity
    import torch
    from torch import nn
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class _Unloaded(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, strict=True, assign=False):  # the constructor's one load
            return None

    out = Path(path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, empty = tempfile.mkstemp(suffix=".pth")
    os.close(fd)
    try:
        torch.save({}, empty)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = _Unloaded(INCEPTION_NAME, [INCEPTION_FEATURE], feature_extractor_weights_path=empty)
            for m in net.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
    finally:
        os.unlink(empty)
    state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    torch.save(state, str(out))
    return str(out)
