"""Skin tone of the person in an image: facial landmarks -> skin region -> ITA -> Monk Skin Tone.

DALL-Eval (paper 000, section 4.2.3 and App. C.2, Table 18) detects facial landmarks, takes the
skin of the face, computes the Individual Typology Angle (ITA) from CIE L*a*b*,

    ITA = arctan((L* - 50) / b*) * 180 / pi,

averages it over the skin pixels ("average ITA", Table 18) and reports the nearest of the 10 Monk
Skin Tone (MST) colours. This stage does the same with what can run offline:

- Landmarks: MediaPipe Face Mesh (468 landmarks; the legacy ``mediapipe.solutions.face_mesh``
  graph with ``static_image_mode=True``) instead of FAN. Its two models ship inside the
  mediapipe wheel (``modules/face_detection/face_detection_short_range.tflite`` finds faces,
  ``modules/face_landmark/face_landmark.tflite`` places the mesh); nothing is downloaded. The
  short-range detector is the one the Face Mesh graph is built with: it is meant for faces that
  fill a good part of the frame, as in portrait-like generated images. Smaller faces are missed
  (``no_face``): on scikit-image's astronaut pasted on a 512 px canvas, a face 12 % of the image
  wide is found and one 9 % wide is not.
- Skin region: the face-oval polygon of the mesh minus the convex hulls of the eyes, the
  eyebrows and the lips (the ``FACEMESH_*`` connection sets); see ``skin_region_mask``. Hair
  over the forehead, beards, glasses and nostrils are not removed.
- Colour: **raw pixels, not albedo.** The paper estimates the face albedo with TRUST
  (BalancedAlb checkpoint) so that the scene's lighting does not count as skin tone; TRUST is not
  available offline, so by default the ITA is taken from the image's own sRGB values. Raw-pixel
  ITA moves with the illumination (a dim or warm light reads as a darker or more yellow skin), and
  the paper's Table 18 shows that the landmark crop with average *albedo* ITA agrees with human
  annotators clearly better (precision within 1 tone 25.4 %, mean distance 2.25) than average raw
  RGB on the same crop (8.5 %, 2.93). The design keeps that step open: ``albedo`` is a callable
  ``(rgb_image, landmarks) -> float RGB image in [0, 1]`` of the image's shape (for TRUST: its
  albedo rendered back into image space) which, when given, replaces the pixels before the Lab
  conversion. The provenance record says which was used.
- ITA is computed as ``degrees(arctan2(L* - 50, b*))``: equal to the classic formula wherever
  b* > 0 (all skin colours and all 10 MST references), and continuous where b* crosses 0 (the
  classic formula jumps by 180 degrees there), so a near-neutral highlight or shadow pixel does
  not flip to the opposite end of the scale.
- Lab is CIE L*a*b* under D65 / 2 degree observer from sRGB (``skimage.color.rgb2lab``), L* in
  0..100 and a*, b* unscaled (not OpenCV's 8-bit encoding).
- MST reference colours are the published hex values of the scale (skintone.google); the tone
  of an image is the one whose reference colour's ITA is nearest to the image's mean ITA (their
  ITAs fall strictly from tone 1 to tone 10, see ``mst_reference_itas``).

Rules where the paper is silent:
- several faces: the largest one (by the area of its landmark bounding box, unclipped) is
  measured; ``skin_faces`` reports how many were found (at most ``max_faces``);
- pixels whose L* is 0 or 100 (clipped black or white: no colour information) are left out;
- ``trim`` (default 0, the paper's plain average) drops that fraction of the region's pixels at
  each end of the ITA distribution (specular highlights, shadows, stray hair) before averaging;
- fewer than ``min_skin_pixels`` usable pixels (before trimming): ``too_few_pixels``;
- ``skin_l`` and ``skin_b`` are the means of L* and b* over the pixels that entered the ITA;
  ``skin_ita`` is the mean of the per-pixel ITAs (not the ITA of the mean colour);
- an ITA exactly halfway between two reference ITAs goes to the lighter tone;
- grey images are measured like any other, but have no chroma (b* ~ 0), so each pixel's ITA is
  about +90 or -90 by whether L* > 50 and the tone says little;
- an ``albedo`` hook that fails or returns the wrong shape raises (a configuration error, not a
  property of the row).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import pyarrow as pa

from operators.base import Resources, with_column
from operators.support.codec import as_rgb, decode_rows
from operators.support.mediapipe_graph import MEDIAPIPE_DIST, MediaPipeGraph, mediapipe_load_error
from operators.support.models import ModelLoadError, file_sha256
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

STAGE_SKIN_TONE = "skin_tone"

# The Monk Skin Tone scale's reference colours, tone 1 (lightest) to tone 10, as published with the
# scale (skintone.google).
MST_HEX = ("f6ede4", "f3e7db", "f7ead0", "eadaba", "d7bd96", "a07e56", "825c43", "604134", "3a312a", "292420")
assert len(MST_HEX) == MST_TONES

FACE_MESH_LANDMARKS = 468
# The files the Face Mesh graph of mediapipe 0.10.14 opens (refine_landmarks=False), relative to
# the mediapipe package directory.
FACE_MESH_FILES = {
    "detector": ("modules", "face_detection", "face_detection_short_range.tflite"),
    "landmarks": ("modules", "face_landmark", "face_landmark.tflite"),
}
REGION_RULE = "face oval (FACEMESH_FACE_OVAL polygon) minus convex hulls of eyes, eyebrows and lips"
LAB_RULE = "CIE L*a*b*, D65, 2 deg observer, from sRGB (skimage.color.rgb2lab)"
ITA_RULE = "degrees(arctan2(L* - 50, b*)), per pixel, averaged"

AlbedoHook = Callable[[np.ndarray, np.ndarray], np.ndarray]


# --- colour ------------------------------------------------------------------------------------------

def rgb_to_lab(rgb) -> np.ndarray:
    """CIE L*a*b* (D65, 2 degree observer) of sRGB colours, as float64 (..., 3).

    ``rgb`` is (..., 3) in RGB channel order: uint8 (0..255) or float in [0, 1] (values outside
    are clipped). L* is in 0..100, a* and b* are unscaled (white -> (100, 0, 0)).
    """
    from skimage.color import rgb2lab  # deferred: skimage

    a = np.asarray(rgb)
    if a.ndim == 0 or a.shape[-1] != 3:
        raise ValueError(f"expected (..., 3) RGB values, got shape {a.shape}")
    if a.dtype == np.uint8:
        f = a.astype(np.float64) / 255.0
    elif np.issubdtype(a.dtype, np.floating):
        f = np.clip(a.astype(np.float64), 0.0, 1.0)
    else:
        raise ValueError(f"expected uint8 or float RGB, got {a.dtype}")
    if f.size == 0:
        return np.zeros(a.shape, np.float64)
    return np.asarray(rgb2lab(f, illuminant="D65", observer="2", channel_axis=-1), np.float64)


def ita_degrees(L, b) -> np.ndarray:
    """Individual Typology Angle in degrees, elementwise: ``degrees(arctan2(L - 50, b))``.

    Equal to the classic ``arctan((L - 50) / b) * 180 / pi`` where b > 0; continuous across b = 0
    (L > 50 gives angles above 90, L < 50 below -90 when b < 0). Range (-180, 180].
    """
    return np.degrees(np.arctan2(np.asarray(L, np.float64) - 50.0, np.asarray(b, np.float64)))


def mst_reference_rgb() -> np.ndarray:
    """(10, 3) uint8 RGB of the MST reference colours, tone 1 first."""
    return np.array([[int(h[i:i + 2], 16) for i in (0, 2, 4)] for h in MST_HEX], np.uint8)


def mst_reference_itas() -> np.ndarray:
    """(10,) ITA in degrees of each MST reference colour, tone 1 first (strictly decreasing)."""
    lab = rgb_to_lab(mst_reference_rgb())
    return ita_degrees(lab[:, 0], lab[:, 2])


_MST_ITAS = mst_reference_itas()
# The reference ITAs fall strictly from tone 1 to tone 10, so "nearest reference" is "between the
# midpoints": tone k covers the ITAs from the midpoint with tone k+1 up to the one with tone k-1.
if not np.all(np.diff(_MST_ITAS) < 0):
    raise AssertionError(f"MST reference ITAs do not fall strictly from tone 1 to 10: {_MST_ITAS}")
_MST_MIDPOINTS = (_MST_ITAS[:-1] + _MST_ITAS[1:]) / 2
_L_EPS = 1e-6  # L* within this of 0 or 100 counts as clipped


def nearest_mst(ita) -> np.ndarray:
    """MST tone (int 1..10) whose reference ITA is nearest to ``ita`` (degrees), elementwise.

    Distance is |ita - reference| on the line, not around the circle: an ITA above tone 1's is
    tone 1, one below tone 10's is tone 10. An ITA exactly on the midpoint of two reference ITAs
    goes to the lighter tone. NaN raises ValueError.
    """
    x = np.asarray(ita, np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("ITA must be finite")
    return 1 + (x[..., None] < _MST_MIDPOINTS).sum(axis=-1).astype(np.int64)


def region_ita(pixels, trim: float = 0.0) -> tuple[int, float | None, float | None, float | None]:
    """(count, mean L*, mean b*, mean ITA) of (N, 3) RGB pixels (uint8, or float in [0, 1]).

    Pixels with L* = 0 or L* = 100 (clipped black or white) are left out; then ``trim`` (in
    [0, 0.5)) drops that fraction of the remaining pixels at each end of the ITA distribution.
    ``count`` is the number of pixels averaged; the means are None when it is 0.
    """
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim!r}")
    lab = rgb_to_lab(np.asarray(pixels).reshape(-1, 3))
    L, b = lab[:, 0], lab[:, 2]
    usable = (L > _L_EPS) & (L < 100.0 - _L_EPS)
    L, b = L[usable], b[usable]
    ita = ita_degrees(L, b)
    k = int(np.floor(trim * ita.size))
    if k:
        keep = np.argsort(ita, kind="stable")[k:ita.size - k]
        L, b, ita = L[keep], b[keep], ita[keep]
    if not ita.size:
        return 0, None, None, None
    return int(ita.size), float(L.mean()), float(b.mean()), float(ita.mean())


# --- skin region -------------------------------------------------------------------------------------

def _connection_ring(connections) -> list[int]:
    """The landmark indices of a connection set that forms one closed loop, in order along it."""
    nbrs: dict[int, list[int]] = {}
    for a, b in connections:
        nbrs.setdefault(a, []).append(b)
        nbrs.setdefault(b, []).append(a)
    if any(len(v) != 2 for v in nbrs.values()):
        raise ValueError("connection set is not a single closed loop")
    start = min(nbrs)
    ring, prev, cur = [start], None, start
    while True:
        nxt = nbrs[cur][0] if nbrs[cur][0] != prev else nbrs[cur][1]
        if nxt == start:
            break
        ring.append(nxt)
        prev, cur = cur, nxt
    if len(ring) != len(nbrs):
        raise ValueError("connection set is not a single closed loop")
    return ring


def _connection_points(connections) -> list[int]:
    return sorted({i for edge in connections for i in edge})


def _region_indices() -> tuple[list[int], list[list[int]]]:
    from mediapipe.python.solutions import face_mesh_connections as fmc  # deferred: mediapipe

    oval = _connection_ring(fmc.FACEMESH_FACE_OVAL)
    features = [_connection_points(c) for c in (fmc.FACEMESH_LEFT_EYE, fmc.FACEMESH_RIGHT_EYE,
                                                fmc.FACEMESH_LEFT_EYEBROW, fmc.FACEMESH_RIGHT_EYEBROW,
                                                fmc.FACEMESH_LIPS)]
    return oval, features


_REGION: tuple[list[int], list[list[int]]] | None = None
_SHIFT = 4  # sub-pixel bits for cv2.fillPoly


def _fixed(points: np.ndarray) -> np.ndarray:
    return np.round(points * (1 << _SHIFT)).astype(np.int32).reshape(-1, 1, 2)


def skin_region_mask(shape, landmarks_px) -> np.ndarray:
    """Boolean (H, W) mask of the face's skin: inside the face-oval polygon, outside the convex
    hulls of the eyes, the eyebrows and the lips.

    ``shape`` is the image's (H, W[, C]); ``landmarks_px`` the (468, 2) Face Mesh landmarks in
    pixels as (x, y) (they may lie outside the image; the mask is clipped to it).
    """
    global _REGION
    if _REGION is None:
        _REGION = _region_indices()
    oval, features = _REGION
    h, w = int(shape[0]), int(shape[1])
    p = np.asarray(landmarks_px, np.float64)
    if p.ndim != 2 or p.shape[0] < FACE_MESH_LANDMARKS or p.shape[1] != 2:
        raise ValueError(f"expected ({FACE_MESH_LANDMARKS}, 2) landmarks, got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError("landmarks must be finite")
    # Keep the fixed-point coordinates well inside int32 even for absurd landmarks.
    p = np.clip(p, -4 * max(h, w), 5 * max(h, w))
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [_fixed(p[oval])], 1, lineType=cv2.LINE_8, shift=_SHIFT)
    for idx in features:
        hull = cv2.convexHull(p[idx].astype(np.float32)).reshape(-1, 2).astype(np.float64)
        cv2.fillPoly(mask, [_fixed(hull)], 0, lineType=cv2.LINE_8, shift=_SHIFT)
    return mask.astype(bool)


# --- the model ---------------------------------------------------------------------------------------

def _load_error(why: str, exc: BaseException | None = None) -> ModelLoadError:
    files = ", ".join("/".join(f) for f in FACE_MESH_FILES.values())
    return mediapipe_load_error(f"Face Mesh ({files})", why, exc, "The models ship inside the mediapipe wheel",
                                "the skin-tone stage")


def face_mesh_files() -> dict[str, Path]:
    """Paths of the Face Mesh .tflite files inside the installed mediapipe package."""
    try:
        import mediapipe  # deferred: mediapipe
    except Exception as exc:  # ImportError, or a broken native extension
        raise _load_error("the mediapipe package cannot be imported", exc) from exc
    root = Path(mediapipe.__file__).resolve().parent
    paths = {k: root.joinpath(*v) for k, v in FACE_MESH_FILES.items()}
    for path in paths.values():
        if not path.is_file():
            raise _load_error(f"model file {path} is missing from the installed mediapipe")
    return paths


def _hook_name(albedo) -> str:
    if albedo is None:
        return "none (raw pixels)"
    return getattr(albedo, "__qualname__", None) or getattr(type(albedo), "__qualname__", repr(albedo))


class SkinToneDetector(MediaPipeGraph):
    """Adds the SKIN_FIELDS: skin_status (SkinStatus), skin_faces, skin_pixels, skin_l, skin_b,
    skin_ita, skin_tone (MST 1..10).

    A null IMAGE gives ``no_image`` and an undecodable one ``decode_error`` (nulls elsewhere).
    Rows are never dropped.
    """

    graph_attr = "mesh"  # released by MediaPipeGraph.close()
    stage_name = STAGE_SKIN_TONE
    resources = Resources(num_cpus=1, batch_size=32, actors=1)
    output_fields = SKIN_FIELDS

    def __init__(self, min_detection_confidence: float = 0.5, max_faces: int = 5, min_skin_pixels: int = 50,
                 albedo: AlbedoHook | None = None, trim: float = 0.0, min_presence_confidence: float = 0.5):
        if not 0.0 <= min_detection_confidence <= 1.0:
            raise ValueError(f"min_detection_confidence must be in [0, 1], got {min_detection_confidence!r}")
        if not 0.0 <= min_presence_confidence <= 1.0:
            raise ValueError(f"min_presence_confidence must be in [0, 1], got {min_presence_confidence!r}")
        if int(max_faces) < 1:
            raise ValueError(f"max_faces must be at least 1, got {max_faces!r}")
        if int(min_skin_pixels) < 1:
            raise ValueError(f"min_skin_pixels must be at least 1, got {min_skin_pixels!r}")
        if not 0.0 <= trim < 0.5:
            raise ValueError(f"trim must be in [0, 0.5), got {trim!r}")
        if albedo is not None and not callable(albedo):
            raise ValueError("albedo must be a callable (rgb, landmarks) -> float RGB image, or None")
        self.min_detection_confidence = float(min_detection_confidence)
        self.min_presence_confidence = float(min_presence_confidence)
        self.max_faces = int(max_faces)
        self.min_skin_pixels = int(min_skin_pixels)
        self.trim = float(trim)
        self.albedo = albedo
        self.mesh = None
        paths = face_mesh_files()
        try:
            import mediapipe as mp  # deferred: mediapipe

            # One graph per instance (so one per Ray actor); it is not shared between threads.
            self.mesh = mp.solutions.face_mesh.FaceMesh(
                static_image_mode=True,
                max_num_faces=self.max_faces,
                refine_landmarks=False,
                min_detection_confidence=self.min_detection_confidence,
                min_tracking_confidence=self.min_presence_confidence,
            )
        except Exception as exc:
            raise _load_error("the face mesh graph failed to start", exc) from exc
        self.record = {
            "model": "mediapipe Face Mesh (468 landmarks, static image mode)",
            "package": f"{MEDIAPIPE_DIST}=={importlib.metadata.version(MEDIAPIPE_DIST)}",
            "landmark_model_file": str(paths["landmarks"]),
            "landmark_model_sha256": file_sha256(paths["landmarks"]),
            "detector_model_file": str(paths["detector"]),
            "detector_model_sha256": file_sha256(paths["detector"]),
            "min_detection_confidence": self.min_detection_confidence,
            "min_presence_confidence": self.min_presence_confidence,
            "max_faces": self.max_faces,
            "face_choice": "largest landmark bounding box",
            "region": REGION_RULE,
            "min_skin_pixels": self.min_skin_pixels,
            "excluded_pixels": "L* = 0 or L* = 100 (clipped)",
            "trim": self.trim,
            "albedo": _hook_name(albedo),
            "lab": LAB_RULE,
            "ita": ITA_RULE,
            "mst_hex": list(MST_HEX),
            "mst_reference_ita": [round(float(x), 4) for x in _MST_ITAS],
        }

    def landmarks(self, rgb) -> list[np.ndarray]:
        """Face Mesh landmarks of each face found in ``rgb``, as (468, 2) float arrays of (x, y) pixels."""
        if self.mesh is None:
            raise RuntimeError("SkinToneDetector is closed")
        img = as_rgb(rgb)
        h, w = img.shape[:2]
        result = self.mesh.process(img)
        faces = []
        for face in result.multi_face_landmarks or []:
            xy = np.array([(lm.x, lm.y) for lm in face.landmark], np.float64)[:FACE_MESH_LANDMARKS]
            faces.append(xy * np.array([w, h], np.float64))
        return faces

    def _pixels(self, rgb: np.ndarray, landmarks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.albedo is None:
            return rgb[mask]
        albedo = np.asarray(self.albedo(rgb, landmarks))
        if albedo.shape != rgb.shape:
            raise ValueError(f"albedo hook returned shape {albedo.shape}, expected {rgb.shape}")
        return albedo[mask]

    def measure(self, rgb) -> dict:
        """Values of the SKIN_FIELDS for one image (RGB uint8 (H, W, 3); grey (H, W) accepted)."""
        img = as_rgb(rgb)
        out = {SKIN_STATUS: SkinStatus.NO_FACE, SKIN_FACES: 0, SKIN_PIXELS: None, SKIN_L: None, SKIN_B: None,
               SKIN_ITA: None, SKIN_TONE: None}
        faces = self.landmarks(img)
        out[SKIN_FACES] = len(faces)
        if not faces:
            return out
        face = max(faces, key=lambda p: float(np.ptp(p[:, 0]) * np.ptp(p[:, 1])))
        mask = skin_region_mask(img.shape, face)
        pixels = self._pixels(img, face, mask)
        count, mean_l, mean_b, mean_ita = region_ita(pixels, trim=0.0)
        out[SKIN_PIXELS] = count
        if count < self.min_skin_pixels:
            out[SKIN_STATUS] = SkinStatus.TOO_FEW_PIXELS
            return out
        if self.trim:
            count, mean_l, mean_b, mean_ita = region_ita(pixels, trim=self.trim)
        out.update({
            SKIN_STATUS: SkinStatus.OK,
            SKIN_PIXELS: count,
            SKIN_L: mean_l,
            SKIN_B: mean_b,
            SKIN_ITA: mean_ita,
            SKIN_TONE: int(nearest_mst(mean_ita)),
        })
        return out

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        values: dict[str, list] = {f.name: [None] * n for f in SKIN_FIELDS}
        values[SKIN_STATUS] = [SkinStatus.NO_IMAGE] * n
        dec = decode_rows(batch)
        for i in dec.failed.tolist():
            values[SKIN_STATUS][i] = SkinStatus.DECODE_ERROR
        for i, rgb in zip(dec.rows.tolist(), dec.arrays):
            for name, value in self.measure(rgb).items():
                values[name][i] = value
        for field in SKIN_FIELDS:
            batch = with_column(batch, field.name, pa.array(values[field.name], field.type))
        return batch
