"""Skin tone (landmarks -> skin region -> ITA -> Monk Skin Tone) with the real MediaPipe Face Mesh
shipped in the mediapipe wheel, on the photos bundled with scikit-image. Nothing is downloaded."""

import hashlib
import io
import sys
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image
from skimage import data

from operators.support.models import ModelLoadError
from operators.support.codec import pack_rgb8
from operators.support.codec import as_rgb
from operators.image_skin_tone import (
    MST_HEX,
    STAGE_SKIN_TONE,
    SkinToneDetector,
    ita_degrees,
    mst_reference_itas,
    mst_reference_rgb,
    nearest_mst,
    region_ita,
    rgb_to_lab,
    skin_region_mask,
)
from schemas.dalleval import (
    MST_TONES,
    SKIN_B,
    SKIN_FACES,
    SKIN_FIELDS,
    SKIN_ITA,
    SKIN_L,
    SKIN_PIXELS,
    SKIN_STATUS,
    SKIN_TONE,
    SkinStatus,
)
from schemas.images import (
    ENCODED,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_INDEX,
    IMAGE_WIDTH,
    RGB8,
)

# Landmark indices of the mesh's features (MediaPipe FACEMESH_* connection sets), written out here
# so that the mask is checked against an independent list.
LEFT_EYE = [249, 263, 362, 373, 374, 380, 381, 382, 384, 385, 386, 387, 388, 390, 398, 466]
RIGHT_EYE = [7, 33, 133, 144, 145, 153, 154, 155, 157, 158, 159, 160, 161, 163, 173, 246]
LEFT_BROW = [276, 282, 283, 285, 293, 295, 296, 300, 334, 336]
RIGHT_BROW = [46, 52, 53, 55, 63, 65, 66, 70, 105, 107]
FACE_OVAL = [10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400, 377, 152,
             148, 176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109]  # in order
LIPS = [0, 13, 14, 17, 37, 39, 40, 61, 78, 80, 81, 82, 84, 87, 88, 91, 95, 146, 178, 181, 185, 191, 267,
        269, 270, 291, 308, 310, 311, 312, 314, 317, 318, 321, 324, 375, 402, 405, 409, 415]
INNER_LIPS = [13, 14, 78, 80, 81, 82, 87, 88, 95, 178, 191, 308, 310, 311, 312, 317, 318, 324, 402, 415]
CHEEKS_AND_NOSE = [50, 280, 1, 4, 151]  # right cheek, left cheek, nose tip, nose, mid-forehead


# --- an independent sRGB -> CIE L*a*b* (D65, 2 degree) for cross-checks -------------------------------

def reference_lab(rgb255) -> np.ndarray:
    c = np.asarray(rgb255, np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124564, 0.3575761, 0.1804375],
                  [0.2126729, 0.7151522, 0.0721750],
                  [0.0193339, 0.1191920, 0.9503041]])
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883])
    d = 6 / 29
    f = np.where(xyz > d ** 3, np.cbrt(xyz), xyz / (3 * d * d) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


@pytest.fixture(scope="module")
def op():
    d = SkinToneDetector()
    yield d
    d.close()


@pytest.fixture(scope="module")
def photos():
    return {"astronaut": data.astronaut(), "camera": data.camera(), "coffee": data.coffee()}


@pytest.fixture(scope="module")
def astronaut_landmarks(op, photos):
    faces = op.landmarks(photos["astronaut"])
    assert len(faces) == 1
    return faces[0]


def png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def patch(rgb, size=64) -> np.ndarray:
    return np.tile(np.asarray(rgb, np.uint8), (size, size, 1))


# --- colour --------------------------------------------------------------------------------------------

def test_rgb_to_lab_known_values():
    np.testing.assert_allclose(rgb_to_lab(np.array([255, 255, 255], np.uint8)), [100, 0, 0], atol=0.01)
    np.testing.assert_allclose(rgb_to_lab(np.array([0, 0, 0], np.uint8)), [0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(rgb_to_lab(np.array([255, 0, 0], np.uint8)), [53.24, 80.09, 67.20], atol=0.01)
    np.testing.assert_allclose(rgb_to_lab(np.array([0, 0, 255], np.uint8)), [32.30, 79.19, -107.86], atol=0.01)
    # Float input in [0, 1] is the same colour; shape (..., 3) is kept; output is float64.
    np.testing.assert_allclose(rgb_to_lab(np.array([1.0, 0.0, 0.0])), [53.24, 80.09, 67.20], atol=0.01)
    out = rgb_to_lab(np.zeros((2, 5, 3), np.uint8))
    assert out.shape == (2, 5, 3) and out.dtype == np.float64
    # Grey is neutral: a* = b* = 0.
    np.testing.assert_allclose(rgb_to_lab(np.array([128, 128, 128], np.uint8))[1:], [0, 0], atol=0.01)


def test_rgb_to_lab_matches_an_independent_formula_and_float_opencv():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (500, 3)).astype(np.uint8)
    lab = rgb_to_lab(rgb)
    np.testing.assert_allclose(lab, reference_lab(rgb), atol=0.02)
    cv = cv2.cvtColor(rgb[None].astype(np.float32) / 255, cv2.COLOR_RGB2Lab)[0]
    np.testing.assert_allclose(lab, cv, atol=0.5)  # OpenCV's float path (with its own rounding)
    # OpenCV's 8-bit Lab is scaled (L*255/100, a+128, b+128): not what rgb_to_lab returns.
    cv8 = cv2.cvtColor(np.array([[[255, 0, 0]]], np.uint8), cv2.COLOR_RGB2Lab)[0, 0]
    assert abs(float(cv8[0]) - 53.24) > 50


def test_channel_order_matters_and_the_api_takes_rgb():
    skin = np.array([0xA0, 0x7E, 0x56], np.uint8)  # MST 6, in RGB order
    lab_rgb = rgb_to_lab(skin)
    lab_bgr = rgb_to_lab(skin[::-1].copy())
    assert abs(lab_rgb[2] - lab_bgr[2]) > 20  # b*: yellowish vs bluish
    assert lab_rgb[2] > 0 > lab_bgr[2]
    np.testing.assert_allclose(lab_rgb, reference_lab(skin), atol=0.02)  # RGB is what it takes
    # Pure red in RGB order is red (a* > 0, b* > 0); read as BGR it would be blue (b* < 0).
    assert rgb_to_lab(np.array([255, 0, 0], np.uint8))[2] > 60


def test_rgb_to_lab_rejects_other_dtypes_and_shapes():
    with pytest.raises(ValueError):
        rgb_to_lab(np.zeros((2, 3), np.int16))
    with pytest.raises(ValueError):
        rgb_to_lab(np.zeros((2, 4), np.uint8))


def test_ita_known_values():
    np.testing.assert_allclose(ita_degrees(50, 10), 0.0, atol=1e-12)
    np.testing.assert_allclose(ita_degrees(100, 50), 45.0)
    np.testing.assert_allclose(ita_degrees(0, 50), -45.0)
    np.testing.assert_allclose(ita_degrees(30, 20), -45.0)
    L = np.array([[70.0, 40.0], [55.0, 20.0]])
    b = np.array([[15.0, 12.0], [30.0, 5.0]])
    got = ita_degrees(L, b)
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got, np.arctan((L - 50) / b) * 180 / np.pi)  # classic formula, b > 0
    assert got[0, 1] < 0 and got[1, 1] < -70  # darker than L* 50: negative angles
    # b* < 0 (bluish): arctan2 stays continuous across b* = 0 instead of jumping by 180 degrees.
    assert 90 < ita_degrees(80, -1) < 92 and -92 < ita_degrees(20, -1) < -90


# --- the Monk Skin Tone scale -------------------------------------------------------------------------

def test_mst_reference_colours():
    assert len(MST_HEX) == MST_TONES == 10
    assert MST_HEX[0] == "f6ede4" and MST_HEX[-1] == "292420"
    rgb = mst_reference_rgb()
    assert rgb.shape == (10, 3) and rgb.dtype == np.uint8
    assert tuple(rgb[5]) == (0xA0, 0x7E, 0x56)


def test_mst_reference_itas_fall_strictly_from_tone_1_to_10():
    itas = mst_reference_itas()
    assert itas.shape == (10,)
    assert np.all(np.diff(itas) < 0)
    lab = reference_lab(mst_reference_rgb())
    np.testing.assert_allclose(itas, np.degrees(np.arctan((lab[:, 0] - 50) / lab[:, 2])), atol=0.05)
    np.testing.assert_allclose(itas[[0, 4, 5, 9]], [82.99, 50.32, 10.88, -84.31], atol=0.05)


def test_nearest_mst():
    itas = mst_reference_itas()
    assert nearest_mst(itas).tolist() == list(range(1, 11))
    mid = (itas[:-1] + itas[1:]) / 2
    assert nearest_mst(mid + 0.01).tolist() == list(range(1, 10))
    assert nearest_mst(mid - 0.01).tolist() == list(range(2, 11))
    assert nearest_mst(mid).tolist() == list(range(1, 10))  # a tie goes to the lighter tone
    assert nearest_mst(170.0) == 1 and nearest_mst(-170.0) == 10  # beyond the ends, no wrap-around
    assert nearest_mst(np.zeros((3, 2))).shape == (3, 2)
    x = np.random.default_rng(3).uniform(-180, 180, 10000)
    brute = np.abs(x[:, None] - itas).argmin(axis=1) + 1
    assert (nearest_mst(x) == brute).all()
    with pytest.raises(ValueError):
        nearest_mst(np.nan)


@pytest.mark.parametrize("tone", range(1, 11))
def test_uniform_patch_of_each_reference_colour_is_its_own_tone(tone):
    count, L, b, ita = region_ita(patch(mst_reference_rgb()[tone - 1]).reshape(-1, 3))
    assert count == 64 * 64
    assert ita == pytest.approx(mst_reference_itas()[tone - 1], abs=1e-9)
    assert nearest_mst(ita) == tone
    np.testing.assert_allclose([L, b], reference_lab(mst_reference_rgb()[tone - 1])[[0, 2]], atol=0.02)


def test_patch_between_two_tones_goes_to_the_nearer():
    ref = mst_reference_rgb().astype(np.float64)
    itas = mst_reference_itas()
    for w, expected in ((0.8, 5), (0.2, 6)):
        colour = np.round(w * ref[4] + (1 - w) * ref[5]).astype(np.uint8)
        _, _, _, ita = region_ita(patch(colour).reshape(-1, 3))
        assert itas[5] < ita < itas[4]  # genuinely between tones 5 and 6
        assert nearest_mst(ita) == expected


def test_region_ita_drops_clipped_pixels_and_trims():
    tone5 = mst_reference_rgb()[4]
    pixels = np.concatenate([np.tile(tone5, (90, 1)), np.tile([60, 40, 30], (10, 1)).astype(np.uint8)])
    n, _, _, plain = region_ita(pixels)
    assert n == 100 and plain < mst_reference_itas()[4] - 5  # the dark pixels pull the mean down
    n, _, _, trimmed = region_ita(pixels, trim=0.1)
    assert n == 80 and trimmed == pytest.approx(mst_reference_itas()[4])
    # Clipped white and black carry no colour: left out.
    clipped = np.concatenate([np.tile(tone5, (5, 1)), np.full((7, 3), 255, np.uint8), np.zeros((3, 3), np.uint8)])
    n, _, _, ita = region_ita(clipped)
    assert n == 5 and ita == pytest.approx(mst_reference_itas()[4])
    assert region_ita(np.full((4, 3), 255, np.uint8)) == (0, None, None, None)
    with pytest.raises(ValueError):
        region_ita(pixels, trim=0.5)


# --- landmarks and the skin region on real photos ----------------------------------------------------

def _inside_box(mask, lm):
    ys, xs = np.nonzero(mask)
    (x0, y0), (x1, y1) = lm.min(0), lm.max(0)
    return xs.min() >= np.floor(x0) and xs.max() <= np.ceil(x1) and ys.min() >= np.floor(y0) and ys.max() <= np.ceil(y1)


def _at(mask, points):
    q = np.round(points).astype(int)
    return mask[q[:, 1], q[:, 0]]


def test_astronaut_one_face_and_its_skin_mask(op, photos, astronaut_landmarks):
    a = photos["astronaut"]
    lm = astronaut_landmarks
    assert lm.shape == (468, 2)
    mask = skin_region_mask(a.shape, lm)
    assert mask.shape == a.shape[:2] and mask.dtype == bool
    assert _inside_box(mask, lm)
    (x0, y0), (x1, y1) = lm.min(0), lm.max(0)
    assert 2000 < mask.sum() < 0.9 * (x1 - x0) * (y1 - y0)
    for feature in (LEFT_EYE, RIGHT_EYE, LEFT_BROW, RIGHT_BROW, INNER_LIPS):
        assert not _at(mask, lm[feature]).any()
        assert not _at(mask, lm[feature].mean(0, keepdims=True)).any()
    assert _at(mask, lm[CHEEKS_AND_NOSE]).all()


def test_mask_is_the_oval_minus_the_feature_hulls(photos, astronaut_landmarks):
    # Every pixel is checked against polygons built here from the landmark lists above.
    lm = astronaut_landmarks
    mask = skin_region_mask(photos["astronaut"].shape, lm)
    (x0, y0), (x1, y1) = np.floor(lm.min(0)).astype(int), np.ceil(lm.max(0)).astype(int)
    assert not mask[:y0].any() and not mask[y1 + 1:].any() and not mask[:, :x0].any() and not mask[:, x1 + 1:].any()
    sub = mask[y0:y1 + 1, x0:x1 + 1]
    local = lm - [x0, y0]
    pixels = [(float(x), float(y)) for y in range(sub.shape[0]) for x in range(sub.shape[1])]

    def signed_distance(polygon):  # > 0 inside, < 0 outside, in pixels
        poly = np.asarray(polygon, np.float32).reshape(-1, 1, 2)
        return np.array([cv2.pointPolygonTest(poly, p, True) for p in pixels]).reshape(sub.shape)

    oval = signed_distance(local[FACE_OVAL])
    hulls = [signed_distance(cv2.convexHull(local[f].astype(np.float32)).reshape(-1, 2))
             for f in (LEFT_EYE, RIGHT_EYE, LEFT_BROW, RIGHT_BROW, LIPS)]
    in_feature = np.any([h > 1.0 for h in hulls], axis=0)
    clearly_skin = (oval > 1.0) & np.all([h < -1.0 for h in hulls], axis=0)
    assert not (sub & (oval < -1.0)).any()   # nothing outside the oval
    assert not (sub & in_feature).any()      # nothing inside an eye, eyebrow or the lips
    assert sub[clearly_skin].all()           # everything else inside the oval
    with pytest.raises(ValueError):
        skin_region_mask((10, 10), np.zeros((5, 2)))


def test_astronaut_skin_tone_is_plausible(op, photos):
    m = op.measure(photos["astronaut"])
    assert m[SKIN_STATUS] == SkinStatus.OK and m[SKIN_FACES] == 1
    assert m[SKIN_PIXELS] > 2000
    # Eileen Collins is a light-skinned woman, photographed in studio light. Raw pixels move with the
    # light, so the bounds are loose: skin is yellow-red (b* > 0), of middle lightness, and lighter
    # than Chardon's "brown" ITA category (ITA > 10) -- i.e. MST tone 6 or lighter, 3 or darker.
    assert 40 < m[SKIN_L] < 90 and 5 < m[SKIN_B] < 40
    assert 10 < m[SKIN_ITA] < 75
    assert 3 <= m[SKIN_TONE] <= 6
    assert m[SKIN_TONE] == nearest_mst(m[SKIN_ITA])
    # Consistent with the pixels of its own mask.
    lm = op.landmarks(photos["astronaut"])[0]
    lab = rgb_to_lab(photos["astronaut"][skin_region_mask(photos["astronaut"].shape, lm)])
    assert m[SKIN_PIXELS] == len(lab)
    assert m[SKIN_ITA] == pytest.approx(ita_degrees(lab[:, 0], lab[:, 2]).mean())
    assert m[SKIN_L] == pytest.approx(lab[:, 0].mean()) and m[SKIN_B] == pytest.approx(lab[:, 2].mean())


def test_raw_pixels_follow_the_light(op, photos):
    # The documented deviation from the paper (no albedo): dimming the photo darkens the measured tone.
    a = photos["astronaut"]
    dim = (a.astype(np.float64) * 0.6).round().astype(np.uint8)
    m, d = op.measure(a), op.measure(dim)
    assert d[SKIN_STATUS] == SkinStatus.OK
    assert d[SKIN_ITA] < m[SKIN_ITA] - 15 and d[SKIN_TONE] > m[SKIN_TONE]


def test_camera_grey_photo(op, photos):
    grey = photos["camera"]
    assert grey.ndim == 2
    faces = op.landmarks(grey)
    assert len(faces) == 1  # the mesh does find the cameraman's (turned) face in the grey photo
    lm = faces[0]
    mask = skin_region_mask(grey.shape, lm)
    assert _inside_box(mask, lm) and mask.sum() > 500
    m = op.measure(grey)
    assert m == op.measure(np.stack([grey] * 3, axis=-1))
    assert m[SKIN_STATUS] == SkinStatus.OK and m[SKIN_FACES] == 1
    assert -180 < m[SKIN_ITA] <= 180 and 1 <= m[SKIN_TONE] <= 10
    # Grey has no chroma (b* ~ 0), so each pixel's ITA is about +90 or -90 by whether L* > 50: on a
    # grey image the "tone" only says how much of the region is brighter than mid-grey.
    assert abs(m[SKIN_B]) < 0.5
    L = rgb_to_lab(as_rgb(grey)[mask])[:, 0]
    assert m[SKIN_ITA] == pytest.approx(90 * (np.mean(L > 50) - np.mean(L < 50)), abs=1.0)


@pytest.mark.parametrize("image", ["uniform", "noise", "coffee", "tiny"])
def test_face_free_images_are_no_face(op, photos, image):
    rng = np.random.default_rng(2)
    a = {"uniform": patch(mst_reference_rgb()[4], 256),
         "noise": rng.integers(0, 256, (256, 256, 3)).astype(np.uint8),
         "coffee": photos["coffee"],
         "tiny": np.zeros((1, 1, 3), np.uint8)}[image]
    assert op.measure(a) == {SKIN_STATUS: SkinStatus.NO_FACE, SKIN_FACES: 0, SKIN_PIXELS: None, SKIN_L: None,
                             SKIN_B: None, SKIN_ITA: None, SKIN_TONE: None}


def test_two_real_faces_the_larger_is_measured(op, photos):
    # The astronaut's head twice, side by side: a 75% copy on the left, full size on the right.
    crop = photos["astronaut"][30:290, 110:340]
    small = np.asarray(Image.fromarray(crop).resize((172, 195), Image.BICUBIC))
    img = np.ascontiguousarray(np.concatenate([np.pad(small, ((0, 65), (0, 58), (0, 0))), crop], axis=1))
    faces = op.landmarks(img)
    assert len(faces) == 2
    areas = [np.ptp(f[:, 0]) * np.ptp(f[:, 1]) for f in faces]
    big = faces[int(np.argmax(areas))]
    assert big[:, 0].min() > 230 and min(areas) < 0.75 * max(areas)  # the larger face is the right one
    m = op.measure(img)
    assert m[SKIN_STATUS] == SkinStatus.OK and m[SKIN_FACES] == 2
    assert m[SKIN_PIXELS] == skin_region_mask(img.shape, big).sum()
    with SkinToneDetector(max_faces=1) as one:
        assert one.measure(img)[SKIN_FACES] == 1


def test_largest_face_is_measured(op, photos, astronaut_landmarks, monkeypatch):
    a = photos["astronaut"]
    big = astronaut_landmarks
    small = (big - big.mean(0)) * 0.5 + [100, 400]  # a half-size copy of the mesh, elsewhere
    monkeypatch.setattr(op, "landmarks", lambda rgb: [small, big])
    m = op.measure(a)
    assert m[SKIN_FACES] == 2
    assert m[SKIN_PIXELS] == skin_region_mask(a.shape, big).sum()
    monkeypatch.setattr(op, "landmarks", lambda rgb: [big, small])
    assert op.measure(a)[SKIN_PIXELS] == m[SKIN_PIXELS]


def test_too_few_pixels(photos):
    with SkinToneDetector(min_skin_pixels=10**7) as strict:
        m = strict.measure(photos["astronaut"])
    assert m[SKIN_STATUS] == SkinStatus.TOO_FEW_PIXELS and m[SKIN_FACES] == 1
    assert m[SKIN_PIXELS] > 2000
    assert m[SKIN_L] is None and m[SKIN_ITA] is None and m[SKIN_TONE] is None


def test_trim_parameter(photos):
    with SkinToneDetector(trim=0.1) as trimmed:
        t = trimmed.measure(photos["astronaut"])
        assert trimmed.record["trim"] == 0.1
    with SkinToneDetector() as plain:
        p = plain.measure(photos["astronaut"])
    assert t[SKIN_STATUS] == SkinStatus.OK
    assert t[SKIN_PIXELS] == p[SKIN_PIXELS] - 2 * int(0.1 * p[SKIN_PIXELS])
    assert t[SKIN_ITA] != p[SKIN_ITA]


# --- the albedo hook ----------------------------------------------------------------------------------

def test_albedo_hook_replaces_the_pixels(photos):
    calls = []
    tone3 = mst_reference_rgb()[2].astype(np.float64) / 255

    def uniform_mst3(rgb, landmarks):
        calls.append((rgb.shape, landmarks.shape))
        return np.broadcast_to(tone3, rgb.shape).copy()

    with SkinToneDetector(albedo=uniform_mst3) as op:
        m = op.measure(photos["astronaut"])
        assert "uniform_mst3" in op.record["albedo"]
    assert calls == [((512, 512, 3), (468, 2))]
    assert m[SKIN_STATUS] == SkinStatus.OK and m[SKIN_TONE] == 3
    assert m[SKIN_ITA] == pytest.approx(mst_reference_itas()[2], abs=0.01)

    with SkinToneDetector(albedo=lambda rgb, lm: np.ones(rgb.shape)) as white:  # all clipped
        m = white.measure(photos["astronaut"])
    assert m[SKIN_STATUS] == SkinStatus.TOO_FEW_PIXELS and m[SKIN_PIXELS] == 0

    with SkinToneDetector(albedo=lambda rgb, lm: np.ones((4, 4, 3))) as wrong:
        with pytest.raises(ValueError, match="albedo"):
            wrong.measure(photos["astronaut"])
    # Not called when there is no face.
    calls.clear()
    with SkinToneDetector(albedo=uniform_mst3) as op:
        assert op.measure(photos["coffee"])[SKIN_STATUS] == SkinStatus.NO_FACE
    assert calls == []


def test_default_is_raw_pixels(op):
    assert op.record["albedo"] == "none (raw pixels)"


# --- batches --------------------------------------------------------------------------------------------

def test_batch_statuses_and_schema(op, photos):
    a = photos["astronaut"]
    packed = pack_rgb8([a, photos["coffee"]])

    def raw(i):
        return packed[IMAGE][i].as_py(), RGB8, packed[IMAGE_HEIGHT][i].as_py(), packed[IMAGE_WIDTH][i].as_py()

    rows = [
        (png(a), ENCODED, None, None),
        raw(0),
        (None, None, None, None),
        (b"\x89PNG garbage, not an image", ENCODED, None, None),
        (png(photos["camera"]), ENCODED, None, None),  # grey PNG
        raw(1),                                        # coffee: no face
        (b"\x00" * 10, RGB8, 4, 4),                    # raw payload of the wrong length
    ]
    t = pa.table({
        IMAGE_INDEX: pa.array(range(len(rows)), pa.int32()),
        IMAGE: pa.array([r[0] for r in rows], pa.binary()),
        IMAGE_ENCODING: pa.array([r[1] for r in rows], pa.string()),
        IMAGE_HEIGHT: pa.array([r[2] for r in rows], pa.int32()),
        IMAGE_WIDTH: pa.array([r[3] for r in rows], pa.int32()),
    })
    out = op(t)
    assert out.num_rows == t.num_rows
    assert out.column(IMAGE_INDEX).to_pylist() == list(range(len(rows)))
    assert out.schema.names == t.schema.names + [f.name for f in SKIN_FIELDS]
    for field in SKIN_FIELDS:
        assert out.schema.field(field.name).type == field.type
    assert out.column(SKIN_STATUS).to_pylist() == [
        SkinStatus.OK, SkinStatus.OK, SkinStatus.NO_IMAGE, SkinStatus.DECODE_ERROR, SkinStatus.OK,
        SkinStatus.NO_FACE, SkinStatus.DECODE_ERROR,
    ]
    assert out.column(SKIN_FACES).to_pylist() == [1, 1, None, None, 1, 0, None]
    tone = out.column(SKIN_TONE).to_pylist()
    assert [v is None for v in tone] == [False, False, True, True, False, True, True]
    # PNG is lossless: the encoded and the raw astronaut are the same pixels, the same measurement.
    rows_out = out.to_pylist()
    expected = op.measure(a)
    for r in rows_out[:2]:
        assert {k: r[k] for k in expected} == expected
    assert {k: rows_out[4][k] for k in expected} == op.measure(photos["camera"])


def test_batch_without_image_column(op):
    out = op(pa.table({IMAGE_INDEX: pa.array([1, 2], pa.int32())}))
    assert out.num_rows == 2
    assert out.column(SKIN_STATUS).to_pylist() == [SkinStatus.NO_IMAGE] * 2
    assert out.column(SKIN_TONE).null_count == 2


# --- the stage ------------------------------------------------------------------------------------------

def test_stage_declaration_and_provenance(op):
    assert SkinToneDetector.stage_name == STAGE_SKIN_TONE == "skin_tone"
    assert SkinToneDetector.output_fields == SKIN_FIELDS
    r = SkinToneDetector.resources
    assert (r.num_cpus, r.num_gpus, r.batch_size, r.actors) == (1, 0, 32, 1)
    rec = op.record
    assert rec["package"] == "mediapipe==0.10.14"
    for key, name in (("landmark_model", "face_landmark.tflite"), ("detector_model", "face_detection_short_range.tflite")):
        path = Path(rec[f"{key}_file"])
        assert path.name == name and "mediapipe" in path.parts and path.is_file()
        assert rec[f"{key}_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (rec["min_detection_confidence"], rec["max_faces"], rec["min_skin_pixels"]) == (0.5, 5, 50)
    assert rec["mst_hex"] == list(MST_HEX) and len(rec["mst_reference_ita"]) == 10
    assert "oval" in rec["region"] and "largest" in rec["face_choice"]


def test_missing_mediapipe_raises_model_load_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mediapipe", None)
    with pytest.raises(ModelLoadError, match="Face Mesh.*mediapipe"):
        SkinToneDetector()


@pytest.mark.parametrize("kwargs", [{"min_detection_confidence": 1.5}, {"max_faces": 0}, {"min_skin_pixels": 0},
                                    {"trim": 0.5}, {"albedo": "trust"}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        SkinToneDetector(**kwargs)


def test_close_is_idempotent(photos):
    d = SkinToneDetector()
    d.close()
    d.close()
    with pytest.raises(RuntimeError):
        d.measure(photos["astronaut"])
