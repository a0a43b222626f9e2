"""Single-face filter with MediaPipe BlazeFace (paper 002, section 2.2).

An image is kept (``ok``) when the face detector finds exactly one face (a detection scoring at
least ``min_confidence``) whose relative bounding box is at least ``min_relative_size`` of the
image in both height and width. The paper states neither value (``configs/paper002.yaml`` and
docs/method.md mark them as project choices).

Which model. Footnote 6 links the MediaPipe Tasks face detector, whose only released model is
BlazeFace short-range (128 px input, 896 anchors, tuned for faces within about 2 m of a selfie
camera); the Tasks graph is built for exactly that model and refuses full-range. Short-range is
therefore the default (``model_selection=0``); full-range (``model_selection=1``), the legacy
solution's model for faces up to about 5 m, stays an option. Both files ship inside the
``mediapipe`` wheel (``mediapipe/modules/face_detection/``), so nothing is downloaded; the file
and its sha256 are recorded. Both run through the solution graph
(``mp.solutions.face_detection``): given the same short-range file, the Tasks ``FaceDetector``
finds the same faces with the same scores (tested), but it reports integer pixel boxes whose
origin is clamped to the image while the size is not, so the visible box measured below cannot
be recovered from it, and it cannot run full-range.

Short-range finds no face smaller than about 15% of the image's longer side (the image is
letterboxed to 128 px; the astronaut's face is found at 0.15 of the side, lost at 0.13), so
such an image is ``no_face`` rather than ``small_face``, and the 0.1 size rule rarely binds.

Rules where the paper is silent:
- every detection at or above the confidence threshold counts as a face, however small, so a
  large face with a small one in the background is ``many_faces``;
- the box is clipped to the image before it is measured: a face cut by the border counts only
  with its visible part;
- the reported score and box are those of the best-scoring detection (null when there is none).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pyarrow as pa

from operators.base import Resources, with_column
from operators.support.codec import as_rgb, decode_rows
from operators.support.mediapipe_graph import MEDIAPIPE_DIST, MediaPipeGraph, mediapipe_load_error
from operators.support.models import ModelLoadError, file_sha256
from schemas.images import (
    FACE_BOX_HEIGHT,
    FACE_BOX_WIDTH,
    FACE_COLUMNS,
    FACE_COUNT,
    FACE_SCORE,
    FACE_STATUS,
    FaceStatus,
)

STAGE_FACE_FILTER = "face_filter"

# model_selection -> (name, tflite file inside the mediapipe wheel). The file names are those the
# graphs compiled into mediapipe 0.10.14 load (FaceDetectionShortRange / FaceDetectionFullRange).
BLAZEFACE_MODELS = {
    0: ("short-range", "face_detection_short_range.tflite"),
    1: ("full-range", "face_detection_full_range_sparse.tflite"),
}
# The model of the Tasks face detector that paper 002's footnote 6 links (see the module docstring).
DEFAULT_MODEL_SELECTION = 0


def _load_error(model_selection: int, why: str, exc: BaseException | None = None) -> ModelLoadError:
    name, file = BLAZEFACE_MODELS.get(model_selection, ("?", "?"))
    return mediapipe_load_error(
        f"BlazeFace face detector ({name}, {file}, model_selection={model_selection})", why, exc,
        "The model ships inside the mediapipe wheel under mediapipe/modules/face_detection/", "the face filter")


def blazeface_file(model_selection: int) -> Path:
    """Path of the BlazeFace .tflite file inside the installed mediapipe package."""
    if model_selection not in BLAZEFACE_MODELS:
        raise ValueError(f"model_selection must be 0 (short-range) or 1 (full-range), got {model_selection!r}")
    try:
        import mediapipe  # deferred: mediapipe
    except Exception as exc:  # ImportError, or a broken native extension
        raise _load_error(model_selection, "the mediapipe package cannot be imported", exc) from exc
    path = Path(mediapipe.__file__).resolve().parent / "modules" / "face_detection" / BLAZEFACE_MODELS[model_selection][1]
    if not path.is_file():
        raise _load_error(model_selection, f"model file {path} is missing from the installed mediapipe")
    return path


def relative_extent(start: float, length: float) -> float:
    """Length of the interval [start, start + length] clipped to [0, 1] (relative coordinates)."""
    return float(max(0.0, min(1.0, start + length) - max(0.0, start)))


class FaceFilter(MediaPipeGraph):
    """Adds the FACE_COLUMNS: face_status (FaceStatus), face_count, face_score, face_box_width/height.

    Rows whose IMAGE is null never reached this stage (fetch or generation failed upstream) and
    get nulls in every face column. Rows are never dropped.
    """

    graph_attr = "detector"  # released by MediaPipeGraph.close()
    stage_name = STAGE_FACE_FILTER
    resources = Resources(num_cpus=1, batch_size=64, actors=1)

    def __init__(self, model_selection: int = DEFAULT_MODEL_SELECTION, min_confidence: float = 0.5,
                 min_relative_size: float = 0.1):
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence!r}")
        if not 0.0 <= min_relative_size <= 1.0:
            raise ValueError(f"min_relative_size must be in [0, 1], got {min_relative_size!r}")
        self.model_selection = int(model_selection)
        self.min_confidence = float(min_confidence)
        self.min_relative_size = float(min_relative_size)
        self.detector = None
        path = blazeface_file(self.model_selection)
        try:
            import mediapipe as mp  # deferred: mediapipe

            # One graph per instance (so one per Ray actor); it is not shared between threads.
            self.detector = mp.solutions.face_detection.FaceDetection(
                model_selection=self.model_selection, min_detection_confidence=self.min_confidence
            )
        except Exception as exc:
            raise _load_error(self.model_selection, "the face detection graph failed to start", exc) from exc
        name = BLAZEFACE_MODELS[self.model_selection][0]
        self.record = {
            "model": f"mediapipe BlazeFace {name}",
            "package": f"{MEDIAPIPE_DIST}=={importlib.metadata.version(MEDIAPIPE_DIST)}",
            "model_selection": self.model_selection,
            "model_range": name,
            "api": "mediapipe.solutions.face_detection",
            "model_file": str(path),
            "model_sha256": file_sha256(path),
            "min_confidence": self.min_confidence,
            "min_relative_size": self.min_relative_size,
            "box_clipped_to_image": True,
        }

    def evaluate(self, rgb: np.ndarray) -> tuple[str, int, float | None, float | None, float | None]:
        """(status, count, best_score, box_width, box_height) for one image.

        ``rgb`` is an (H, W, 3) uint8 RGB image (grey (H, W) is accepted too). Count is the number
        of detections scoring at least ``min_confidence``; score and box (relative, clipped to the
        image) are those of the best of them, None when there is none.
        """
        if self.detector is None:
            raise RuntimeError("FaceFilter is closed")
        result = self.detector.process(as_rgb(rgb))
        faces = []
        for det in result.detections or []:
            score = float(det.score[0]) if len(det.score) else 0.0
            if score >= self.min_confidence:
                box = det.location_data.relative_bounding_box
                faces.append((score, relative_extent(box.xmin, box.width), relative_extent(box.ymin, box.height)))
        if not faces:
            return FaceStatus.NO_FACE, 0, None, None, None
        score, width, height = max(faces, key=lambda f: f[0])
        if len(faces) > 1:
            status = FaceStatus.MANY_FACES
        elif width >= self.min_relative_size and height >= self.min_relative_size:
            status = FaceStatus.OK
        else:
            status = FaceStatus.SMALL_FACE
        return status, len(faces), score, width, height

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        status: list[str | None] = [None] * n
        count: list[int | None] = [None] * n
        score: list[float | None] = [None] * n
        width: list[float | None] = [None] * n
        height: list[float | None] = [None] * n
        dec = decode_rows(batch)
        for i in dec.failed.tolist():
            status[i] = FaceStatus.DECODE_ERROR
        for i, rgb in zip(dec.rows.tolist(), dec.arrays):
            status[i], count[i], score[i], width[i], height[i] = self.evaluate(rgb)
        values = {FACE_STATUS: status, FACE_COUNT: count, FACE_SCORE: score, FACE_BOX_WIDTH: width,
                  FACE_BOX_HEIGHT: height}
        for field in FACE_COLUMNS:
            batch = with_column(batch, field.name, pa.array(values[field.name], field.type))
        return batch
