"""SSIM and Diff. Pix.: the pixel-level image-space disparities (paper 004, section 4, "Image space").

"To measure image structural differences, we use the average of SSIM scores over all pixels as
one of our disparity metrics SSIM. Additionally, the ratio of the number of pixels in the
contours with higher SSIM scores is used as another disparity metric Diff. Pix."

Both are computed for the three pairs of a unit (``schemas.exposed.PAIRS``) in torch, on the
device the images are on (a disparity head: ``operators.support.disparity``).

SSIM (``Space.SSIM``, higher = closer)
    The images are first quantised to the 8-bit RGB the generator writes (``round(x * 255)``) and
    converted to grayscale with ITU-R BT.601 luma (0.299 R + 0.587 G + 0.114 B) exactly as
    OpenCV's ``COLOR_RGB2GRAY`` does on uint8: in 15-bit fixed point,
    ``(9798 R + 19235 G + 3735 B + 2**14) >> 15`` (equal to cv2 5.0 on all 2**24 colours;
    a float formula rounded differs from it on about 0.1% of colours). The SSIM map is the
    standard one of Wang et al. (2004) as scikit-image computes it with its defaults: a
    ``win_size`` x ``win_size`` (7 x 7) uniform window with reflect (half-sample symmetric)
    padding, sample covariances (``N / (N - 1)``), K1 = 0.01, K2 = 0.03 and a data range of
    255, all in float64. The score is the mean of the map without its ``(win_size - 1) // 2``
    pixel border, i.e. ``skimage.metrics.structural_similarity(gray_a, gray_b, data_range=255)``
    on the uint8 grayscale images (tested to agree to 1e-9). Identical images give exactly 1.

Diff. Pix. (``Space.DIFF_PIX``, a percentage, lower = closer)
    The paper's sentence is read as the common "SSIM difference" recipe (SSIM map -> Otsu
    threshold -> external contours -> their area), made precise as follows:

    1. the full SSIM map above (border included) is clipped to [0, 1] and scaled to uint8 as
       ``(map * 255).astype(uint8)`` (truncation);
    2. Otsu's threshold t of that uint8 map is computed as OpenCV's ``THRESH_OTSU`` computes it
       (256-bin histogram, the first level maximising the between-class variance), and the
       *differing* pixels are those at or below it (``THRESH_BINARY_INV``: ``level <= t``),
       i.e. the low-SSIM side. A map with a single level has no Otsu split: it has no differing
       pixels (so identical images, whose map is 1 everywhere, give exactly 0; OpenCV would
       return t = 0 there and flag all pixels only when that single level is 0);
    3. the region inside the differing pixels' outer contours (``cv2.findContours(RETR_EXTERNAL)``
       drawn with ``thickness=FILLED``) is the differing mask with its holes filled, where a hole
       is a background (non-differing) region that is not 4-connected to the image border
       (OpenCV's contours follow 8-connected foreground, hence 4-connected background). Holes
       are filled in torch by growing the border's background region with 4-neighbour
       dilations constrained to the background until it stops changing;
    4. Diff. Pix. = 100 x (pixels in that region) / (all pixels).

    Tested against OpenCV (threshold, findContours, drawContours) on structured and random
    images, and on known answers: identical images -> 0, an image against itself with one square
    region replaced -> about the square's share of the image (enlarged by the window).

Cost: five 7 x 7 box filters (float64) and one histogram per pair; the hole filling needs as many
dilation steps as the longest path through the border's background (checked for convergence
every ``CHECK_EVERY`` steps, one device synchronisation each).
"""

from __future__ import annotations

import numpy as np

from operators.base import Resources
from operators.support.codec import rgb_levels
from operators.support.disparity import PAIR_INDEX, check_units
from operators.support.models import pick_device
from schemas.exposed import Space

STAGE_SSIM_DISPARITY = "ssim_disparity"

K1 = 0.01
K2 = 0.03
DATA_RANGE = 255.0
# OpenCV's fixed-point BT.601 luma for 8-bit RGB -> gray (15-bit coefficients summing to 2**15,
# rounded shift); checked equal to cv2.cvtColor(COLOR_RGB2GRAY) on every 8-bit colour
LUMA_R, LUMA_G, LUMA_B, LUMA_SHIFT = 9798, 19235, 3735, 15
CHECK_EVERY = 16          # hole filling: dilation steps between convergence checks
_OTSU_EPS = float(np.finfo(np.float32).eps)  # OpenCV's FLT_EPSILON guard on the class weights


# --- grayscale and the SSIM map -----------------------------------------------------------------------


def to_uint8_levels(images):
    """(..., 3, H, W) float in [0, 1] -> int32 levels 0-255, as the generator's RGB8 payload
    (``round(x * 255)`` clamped)."""
    import torch  # deferred: torch

    return rgb_levels(images).to(torch.int32)


def luma(levels):
    """(..., 3, H, W) int RGB levels -> (..., H, W) int32 gray levels, as OpenCV's
    ``cvtColor(COLOR_RGB2GRAY)`` on uint8 (BT.601 coefficients in 15-bit fixed point, rounded)."""
    r, g, b = levels[..., 0, :, :], levels[..., 1, :, :], levels[..., 2, :, :]
    return (r * LUMA_R + g * LUMA_G + b * LUMA_B + (1 << (LUMA_SHIFT - 1))) >> LUMA_SHIFT


def grayscale(images):
    """(..., 3, H, W) float images in [0, 1] -> (..., H, W) uint8-valued gray levels (int32)."""
    return luma(to_uint8_levels(images))


def _symmetric_index(n: int, p: int, device):
    import torch  # deferred: torch

    return torch.cat([torch.arange(p - 1, -1, -1, device=device), torch.arange(n, device=device),
                      torch.arange(n - 1, n - 1 - p, -1, device=device)])


def box_mean(x, win_size: int):
    """Mean over a ``win_size`` x ``win_size`` window centred on each pixel of (B, H, W) float64,
    with half-sample symmetric padding (scipy.ndimage.uniform_filter's ``mode="reflect"``)."""
    import torch.nn.functional as F  # deferred: torch

    p = win_size // 2
    h, w = x.shape[-2:]
    x = x.index_select(-2, _symmetric_index(h, p, x.device)).index_select(-1, _symmetric_index(w, p, x.device))
    return F.avg_pool2d(x.unsqueeze(1), kernel_size=win_size, stride=1).squeeze(1)


def ssim_map(a, b, win_size: int = 7, data_range: float = DATA_RANGE):
    """The full SSIM map (B, H, W) float64 of gray images ``a``, ``b`` (B, H, W), computed as
    ``skimage.metrics.structural_similarity(..., full=True)`` with its defaults (uniform window,
    sample covariance, K1 = 0.01, K2 = 0.03)."""
    import torch  # deferred: torch

    x = a.to(torch.float64)
    y = b.to(torch.float64)
    n = win_size * win_size
    cov_norm = n / (n - 1)
    ux, uy = box_mean(x, win_size), box_mean(y, win_size)
    uxx, uyy, uxy = box_mean(x * x, win_size), box_mean(y * y, win_size), box_mean(x * y, win_size)
    vx = cov_norm * (uxx - ux * ux)
    vy = cov_norm * (uyy - uy * uy)
    vxy = cov_norm * (uxy - ux * uy)
    c1 = (K1 * data_range) ** 2
    c2 = (K2 * data_range) ** 2
    a1, a2 = 2 * ux * uy + c1, 2 * vxy + c2
    b1, b2 = ux ** 2 + uy ** 2 + c1, vx + vy + c2
    return (a1 * a2) / (b1 * b2)


def mean_ssim(smap, win_size: int = 7):
    """(B,) float64: the mean of each map without its ``(win_size - 1) // 2`` border, as
    scikit-image reports it."""
    p = (win_size - 1) // 2
    h, w = smap.shape[-2:]
    return smap[..., p:h - p, p:w - p].mean(dim=(-2, -1))


# --- Diff. Pix. -----------------------------------------------------------------------------------------


def map_to_uint8(smap):
    """SSIM map -> int64 levels 0-255: clipped to [0, 1], then ``(map * 255).astype(uint8)``."""
    import torch  # deferred: torch

    return (smap.clamp(0.0, 1.0) * 255.0).floor().to(torch.int64)


def otsu_threshold(levels):
    """Otsu's threshold of each (B, H, W) uint8-valued map, as OpenCV's ``THRESH_OTSU``: the first
    level t maximising the between-class variance of {<= t} and {> t}. Returns (thresholds (B,)
    int64, split (B,) bool); ``split`` is False where the map has a single level (no threshold
    separates anything)."""
    import torch  # deferred: torch

    bsz = levels.shape[0]
    flat = levels.reshape(bsz, -1)
    hist = torch.zeros((bsz, 256), dtype=torch.float64, device=levels.device)
    hist.scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float64))
    p = hist / flat.shape[1]
    i = torch.arange(256, dtype=torch.float64, device=levels.device)
    q1 = p.cumsum(1)
    m1 = (p * i).cumsum(1)
    mu = m1[:, -1:]
    q2 = 1.0 - q1
    valid = (q1 >= _OTSU_EPS) & (q2 >= _OTSU_EPS) & (q1 <= 1.0 - _OTSU_EPS) & (q2 <= 1.0 - _OTSU_EPS)
    mu1 = m1 / q1.clamp_min(1e-300)
    mu2 = (mu - m1) / q2.clamp_min(1e-300)
    sigma = torch.where(valid, q1 * q2 * (mu1 - mu2) ** 2, torch.zeros_like(q1))
    best = sigma.max(dim=1)
    split = best.values > 0
    # argmax returns the first maximal index, as OpenCV keeps the first strictly larger sigma
    return torch.where(split, best.indices, torch.zeros_like(best.indices)), split


def differing_pixels(smap):
    """(B, H, W) bool: the low-SSIM side of Otsu's threshold of the uint8 map (``level <= t``,
    OpenCV's THRESH_BINARY_INV | THRESH_OTSU); all False where the map has a single level."""
    levels = map_to_uint8(smap)
    t, split = otsu_threshold(levels)
    return (levels <= t.view(-1, 1, 1)) & split.view(-1, 1, 1)


def fill_holes(mask, check_every: int = CHECK_EVERY):
    """(B, H, W) bool ``mask`` with its holes filled: background pixels not 4-connected to the
    image border become foreground (the area inside ``mask``'s outer contours)."""
    import torch  # deferred: torch

    background = ~mask
    outside = torch.zeros_like(mask)
    outside[:, 0, :] = background[:, 0, :]
    outside[:, -1, :] = background[:, -1, :]
    outside[:, :, 0] = background[:, :, 0]
    outside[:, :, -1] = background[:, :, -1]
    while True:
        before = outside.clone()
        for _ in range(check_every):
            grown = outside.clone()
            grown[:, 1:, :] |= outside[:, :-1, :]
            grown[:, :-1, :] |= outside[:, 1:, :]
            grown[:, :, 1:] |= outside[:, :, :-1]
            grown[:, :, :-1] |= outside[:, :, 1:]
            outside = grown & background
        if torch.equal(outside, before):
            return ~outside


def diff_pix(smap, check_every: int = CHECK_EVERY):
    """(B,) float64 Diff. Pix. of full SSIM maps (B, H, W): 100 x the share of pixels inside the
    outer contours of the Otsu-thresholded low-SSIM pixels (module docstring)."""
    import torch  # deferred: torch

    filled = fill_holes(differing_pixels(smap), check_every)
    h, w = smap.shape[-2:]
    return filled.sum(dim=(-2, -1)).to(torch.float64) * (100.0 / (h * w))


# --- the head -------------------------------------------------------------------------------------------


class SsimDisparity:
    """Disparity head: SSIM (mean of the SSIM map) and Diff. Pix. of each pair of a unit."""

    stage_name = STAGE_SSIM_DISPARITY
    resources = Resources(num_cpus=1, batch_size=16, actors=1)
    spaces = (Space.SSIM, Space.DIFF_PIX)

    def __init__(self, device: str = "auto", win_size: int = 7):
        """``device``: "auto" computes where the images are (the generator's device, no copy);
        anything else ("cpu", "cuda", "cuda:1") moves them there first."""
        if int(win_size) != win_size or win_size < 3 or win_size % 2 == 0:
            raise ValueError(f"win_size must be an odd integer >= 3, got {win_size}")
        self.win_size = int(win_size)
        self.device = None if device in (None, "auto") else pick_device(device)
        self.record = {
            "stage": self.stage_name,
            "spaces": list(self.spaces),
            "device": self.device or "the images' device",
            "grayscale": "ITU-R BT.601 luma of the RGB8 image, OpenCV COLOR_RGB2GRAY fixed point",
            "ssim": {"window": f"uniform {self.win_size}x{self.win_size}", "padding": "reflect (symmetric)",
                     "covariance": "sample", "K1": K1, "K2": K2, "data_range": DATA_RANGE,
                     "score": f"mean of the map without its {(self.win_size - 1) // 2}-pixel border "
                              "(skimage.metrics.structural_similarity)"},
            "diff_pix": "100 x share of pixels inside the outer contours (holes filled, 4-connected background) "
                        "of the uint8 SSIM map's pixels at or below its Otsu threshold; a single-level map: 0",
        }

    def pair_maps(self, images):
        """Full SSIM maps of every pair: (U, 3, H, W) float64 in PAIRS order."""
        import torch  # deferred: torch

        check_units(images)
        h, w = images.shape[-2:]
        if h < self.win_size or w < self.win_size:
            raise ValueError(f"images of {h}x{w} pixels are smaller than the {self.win_size}x{self.win_size} window")
        if self.device is not None:
            images = images.to(self.device)
        gray = grayscale(images)                                  # (U, 3, H, W) int32
        a = torch.stack([gray[:, i] for i, _ in PAIR_INDEX], dim=1).reshape(-1, h, w)
        b = torch.stack([gray[:, j] for _, j in PAIR_INDEX], dim=1).reshape(-1, h, w)
        return ssim_map(a, b, self.win_size).reshape(images.shape[0], len(PAIR_INDEX), h, w)

    def triplet_similarities(self, images) -> dict[str, np.ndarray]:
        """{SSIM: (U, 3), DIFF_PIX: (U, 3)} float64 of (U, 3, 3, H, W) float images in [0, 1]."""
        import torch  # deferred: torch

        check_units(images)
        if images.shape[0] == 0:
            return {space: np.zeros((0, len(PAIR_INDEX)), np.float64) for space in self.spaces}
        with torch.inference_mode():
            maps = self.pair_maps(images)
            units = maps.shape[0]
            flat = maps.reshape(-1, *maps.shape[-2:])
            ssim = mean_ssim(flat, self.win_size).reshape(units, len(PAIR_INDEX))
            pix = diff_pix(flat).reshape(units, len(PAIR_INDEX))
        return {Space.SSIM: ssim.cpu().numpy().astype(np.float64),
                Space.DIFF_PIX: pix.cpu().numpy().astype(np.float64)}
