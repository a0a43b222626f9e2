"""SSIM and Diff. Pix. (paper 004, section 4, "Image space"): the torch head against the CPU
reference it defines (OpenCV grayscale, scikit-image SSIM, OpenCV Otsu threshold + external
contours filled), and against answers known in advance."""

import numpy as np
import pytest
import torch

from operators.image_ssim_disparity import (
    SsimDisparity,
    differing_pixels,
    fill_holes,
    grayscale,
    luma,
    map_to_uint8,
    mean_ssim,
    ssim_map,
)
from operators.support.disparity import PAIR_INDEX
from schemas.exposed import PAIRS, Space

cv2 = pytest.importorskip("cv2")  # opencv-python-headless comes with img2dataset
skimage_metrics = pytest.importorskip("skimage.metrics")


def smooth(h, w, seed):
    """A smooth RGB8 test image: a sum of random plane waves per channel."""
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(4):
            fx, fy, ph = r.uniform(1, 8), r.uniform(1, 8), r.uniform(0, 6)
            img[..., c] += np.sin(2 * np.pi * (fx * xx + fy * yy) + ph)
    img = (img - img.min()) / (img.max() - img.min())
    return (img * 255).round().astype(np.uint8)


def noise(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def as_tensor(rgb8):
    return torch.from_numpy(np.ascontiguousarray(rgb8)).permute(2, 0, 1).float() / 255.0


def units_of(*triplets):
    """(U, 3, 3, H, W) float images from (neutral, feminine, masculine) RGB8 triplets."""
    return torch.stack([torch.stack([as_tensor(a) for a in t]) for t in triplets])


def reference(a_rgb8, b_rgb8):
    """The CPU reference of one pair: (mean SSIM, Diff. Pix., differing mask, filled mask)."""
    ga = cv2.cvtColor(a_rgb8, cv2.COLOR_RGB2GRAY)
    gb = cv2.cvtColor(b_rgb8, cv2.COLOR_RGB2GRAY)
    score, smap = skimage_metrics.structural_similarity(ga, gb, full=True, data_range=255)
    diff = (np.clip(smap, 0, 1) * 255).astype(np.uint8)
    _, thresh = cv2.threshold(diff, 0, 255, cv2.THRESH_BINARY_INV | cv2.THRESH_OTSU)
    contours, _ = cv2.findContours(thresh.copy(), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    filled = np.zeros_like(thresh)
    cv2.drawContours(filled, contours, -1, 255, thickness=cv2.FILLED)
    return score, 100.0 * (filled > 0).sum() / filled.size, thresh > 0, filled > 0


@pytest.fixture(scope="module")
def head():
    torch.set_num_threads(1)
    return SsimDisparity(device="cpu")


# --- grayscale and SSIM against OpenCV / scikit-image -----------------------------------------------------


def test_grayscale_is_opencv_rgb2gray_on_8_bit_colours():
    r, g, b = np.meshgrid(np.arange(256), np.arange(256), np.arange(0, 256, 7), indexing="ij")
    rgb = np.stack([r, g, b], -1).reshape(256, -1, 3).astype(np.uint8)
    ours = luma(torch.from_numpy(rgb.astype(np.int32)).permute(2, 0, 1)).numpy()
    np.testing.assert_array_equal(ours, cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
    # from float images in [0, 1]: quantised to RGB8 first, as the generator's payload
    img = noise(33, 47, 1)
    np.testing.assert_array_equal(grayscale(as_tensor(img)).numpy(), cv2.cvtColor(img, cv2.COLOR_RGB2GRAY))


PAIRS_OF_IMAGES = {
    "noise": (noise(40, 40, 1), noise(40, 40, 2)),
    "smooth": (smooth(64, 80, 1), smooth(64, 80, 2)),
    "smooth-vs-noisy-copy": (smooth(57, 43, 3),
                             np.clip(smooth(57, 43, 3).astype(int) + np.random.default_rng(0).integers(-30, 31, (57, 43, 3)),
                                     0, 255).astype(np.uint8)),
    "flat-vs-smooth": (np.full((32, 48, 3), 128, np.uint8), smooth(32, 48, 4)),
}


@pytest.mark.parametrize("name", sorted(PAIRS_OF_IMAGES))
@pytest.mark.parametrize("win_size", [7, 5])
def test_ssim_map_and_mean_match_skimage(name, win_size):
    a, b = PAIRS_OF_IMAGES[name]
    ga, gb = cv2.cvtColor(a, cv2.COLOR_RGB2GRAY), cv2.cvtColor(b, cv2.COLOR_RGB2GRAY)
    score, smap = skimage_metrics.structural_similarity(ga, gb, full=True, data_range=255, win_size=win_size)
    ours = ssim_map(torch.from_numpy(ga)[None], torch.from_numpy(gb)[None], win_size)
    assert ours.dtype == torch.float64
    np.testing.assert_allclose(ours[0].numpy(), smap, rtol=0, atol=1e-9)
    assert abs(mean_ssim(ours, win_size).item() - score) < 1e-9
    assert -1.0 <= score < 0.999  # the pairs differ: the test could fail


# --- Diff. Pix. against OpenCV's threshold + contours --------------------------------------------------


@pytest.mark.parametrize("name", sorted(PAIRS_OF_IMAGES))
def test_ssim_and_diff_pix_equal_the_opencv_recipe(head, name):
    a, b = PAIRS_OF_IMAGES[name]
    score, pix, differing, filled = reference(a, b)
    smap = head.pair_maps(units_of((a, b, b)))[0, 0]
    np.testing.assert_array_equal(differing_pixels(smap[None])[0].numpy(), differing)
    np.testing.assert_array_equal(fill_holes(torch.from_numpy(differing)[None])[0].numpy(), filled)
    out = head.triplet_similarities(units_of((a, b, b)))
    assert abs(out[Space.SSIM][0, 0] - score) < 1e-9
    assert out[Space.DIFF_PIX][0, 0] == pytest.approx(pix, abs=1e-12)
    assert 0.0 < pix < 100.0


def test_otsu_split_matches_opencv_on_many_histograms():
    rng = np.random.default_rng(0)
    maps = [rng.integers(0, 256, (30, 30)), rng.normal(120, 40, (30, 30)),
            np.where(rng.random((30, 30)) < 0.3, 40, 200), np.where(rng.random((30, 30)) < 0.5, 0, 255),
            rng.choice([10, 11, 200, 250], (30, 30)), np.concatenate([rng.normal(60, 5, 450), rng.normal(190, 20, 450)])]
    for m in maps:
        level = np.clip(np.asarray(m, float).reshape(30, 30), 0, 255).astype(np.uint8)
        smap = torch.from_numpy(level.astype(np.float64) / 255.0 + 1e-9)   # maps back to the same uint8 levels
        assert np.array_equal(map_to_uint8(smap[None])[0].numpy(), level)
        _, ref = cv2.threshold(level, 0, 255, cv2.THRESH_BINARY_INV | cv2.THRESH_OTSU)
        np.testing.assert_array_equal(differing_pixels(smap[None])[0].numpy(), ref > 0)


def test_hole_filling_matches_opencv_external_contours_and_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(1)
    for k in range(60):
        h, w = rng.integers(8, 48, 2)
        if k % 2:
            mask = ndimage.gaussian_filter(rng.random((h, w)), 2) > 0.5
            mask |= rng.random((h, w)) < 0.05
        else:
            mask = rng.random((h, w)) < rng.uniform(0.3, 0.7)
        img = (mask * 255).astype(np.uint8)
        contours, _ = cv2.findContours(img.copy(), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        ref = np.zeros_like(img)
        cv2.drawContours(ref, contours, -1, 255, thickness=cv2.FILLED)
        ours = fill_holes(torch.from_numpy(mask)[None], check_every=3)[0].numpy()
        np.testing.assert_array_equal(ours, ref > 0)
        np.testing.assert_array_equal(ours, ndimage.binary_fill_holes(mask))


def test_a_ring_is_filled_but_a_gap_to_the_border_is_not():
    ring = np.zeros((12, 12), bool)
    ring[2:9, 2:9] = True
    ring[4:7, 4:7] = False                 # a hole: filled
    out = fill_holes(torch.from_numpy(ring)[None])[0].numpy()
    assert out[2:9, 2:9].all() and out.sum() == 49
    u = ring.copy()
    u[5, 0:5] = False                      # the hole now reaches the border (4-connected): kept open
    out = fill_holes(torch.from_numpy(u)[None])[0].numpy()
    assert not out[5, 4] and not out[5, 5]
    diag = ring.copy()
    diag[2, 2] = False                     # the corner opens to the outside...
    diag[3, 3] = False                     # ...and touches the hole only diagonally: still a hole
    out = fill_holes(torch.from_numpy(diag)[None])[0].numpy()
    assert out[3, 3] and out[5, 5] and not out[2, 2]
    for mask in (ring, u, diag):           # as OpenCV's external contours, filled
        contours, _ = cv2.findContours((mask * 255).astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        ref = np.zeros(mask.shape, np.uint8)
        cv2.drawContours(ref, contours, -1, 255, thickness=cv2.FILLED)
        np.testing.assert_array_equal(fill_holes(torch.from_numpy(mask)[None])[0].numpy(), ref > 0)


# --- answers known in advance --------------------------------------------------------------------------


def test_identical_images_give_ssim_one_and_no_differing_pixels(head):
    a, b = smooth(48, 64, 1), noise(48, 64, 2)
    out = head.triplet_similarities(units_of((a, a, a), (b, b, b)))
    assert np.array_equal(out[Space.SSIM], np.ones((2, 3)))        # exactly
    assert np.array_equal(out[Space.DIFF_PIX], np.zeros((2, 3)))   # exactly


def test_single_level_maps_have_no_differing_pixels():
    for value in (1.0, 0.5, 0.0):
        smap = torch.full((1, 10, 10), value, dtype=torch.float64)
        assert not differing_pixels(smap).any()
    two = torch.full((1, 10, 10), 0.9, dtype=torch.float64)
    two[0, 2:5, 2:5] = 0.1
    assert differing_pixels(two)[0].sum() == 9


@pytest.mark.parametrize("base", ["smooth", "noise"])
def test_one_changed_square_is_about_its_share_of_the_image(head, base):
    size, side = 96, 24
    a = smooth(size, size, 1) if base == "smooth" else noise(size, size, 1)
    b = a.copy()
    b[30:30 + side, 40:40 + side] = smooth(size, size, 2)[30:30 + side, 40:40 + side]
    out = head.triplet_similarities(units_of((a, a, b)))
    share = 100.0 * side * side / size ** 2                      # 6.25 %
    grown = 100.0 * (side + 6) ** 2 / size ** 2                  # the square and the 7x7 window's reach
    assert out[Space.DIFF_PIX][0, 0] == 0.0
    for k in (1, 2):                                             # (neutral, masculine), (feminine, masculine)
        assert 0.85 * share <= out[Space.DIFF_PIX][0, k] <= grown
        assert out[Space.SSIM][0, k] < 0.97
    # the differing region is where the square is
    smap = head.pair_maps(units_of((a, a, b)))[0, 1]
    filled = fill_holes(differing_pixels(smap[None]))[0].numpy()
    assert filled[30 + side // 2, 40 + side // 2] and not filled[5, 5] and not filled[90, 90]


# --- the head's contract ---------------------------------------------------------------------------------


def test_outputs_are_float64_in_pairs_order_and_follow_the_variants(head):
    n, f, m = smooth(40, 40, 1), smooth(40, 40, 2), noise(40, 40, 3)
    out = head.triplet_similarities(units_of((n, f, m), (m, n, n)))
    assert set(out) == {Space.SSIM, Space.DIFF_PIX}
    for space in out:
        assert out[space].shape == (2, 3) and out[space].dtype == np.float64
    images = (n, f, m)
    for k, (i, j) in enumerate(PAIR_INDEX):                      # column k is the pair PAIRS[k]
        score, pix, _, _ = reference(images[i], images[j])
        assert abs(out[Space.SSIM][0, k] - score) < 1e-9
        assert out[Space.DIFF_PIX][0, k] == pytest.approx(pix, abs=1e-12)
    assert len({round(v, 6) for v in out[Space.SSIM][0]}) == 3   # three different pairs
    swapped = head.triplet_similarities(units_of((n, m, f)))      # feminine <-> masculine
    for space in out:
        np.testing.assert_allclose(swapped[space][0], out[space][0][[1, 0, 2]], rtol=0, atol=1e-12)
    assert PAIRS[2] == ("feminine", "masculine")
    # unit 1: (m, n, n) -> the (feminine, masculine) pair is identical
    assert out[Space.SSIM][1, 2] == 1.0 and out[Space.DIFF_PIX][1, 2] == 0.0


def test_empty_batch_and_bad_input(head):
    out = head.triplet_similarities(torch.zeros((0, 3, 3, 16, 16)))
    assert out[Space.SSIM].shape == (0, 3) and out[Space.DIFF_PIX].shape == (0, 3)
    with pytest.raises(ValueError):
        head.triplet_similarities(torch.zeros((2, 3, 16, 16)))
    with pytest.raises(ValueError, match="smaller"):
        head.triplet_similarities(torch.zeros((1, 3, 3, 6, 40)))
    with pytest.raises(ValueError):
        SsimDisparity(win_size=6)
    assert SsimDisparity.spaces == (Space.SSIM, Space.DIFF_PIX) and SsimDisparity.stage_name == "ssim_disparity"
    assert head.record["ssim"]["K1"] == 0.01 and head.record["ssim"]["data_range"] == 255
