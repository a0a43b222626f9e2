"""Face filter with the real BlazeFace models (shipped in the mediapipe wheel; short-range by default,
as in the MediaPipe Tasks detector paper 002 links, full-range as an option) on the photos bundled
with scikit-image. Nothing is downloaded."""

import hashlib
import io
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image
from skimage import data

from operators.support.models import ModelLoadError
from operators.support.codec import pack_rgb8
from operators.image_face_filter import BLAZEFACE_MODELS, FaceFilter, blazeface_file, relative_extent
from operators.support.codec import as_rgb
from pipelines.engine.cli.config import load_config
from pipelines.studies.amplification.sample_server import photo_arrays
from schemas.images import (
    ENCODED,
    FACE_BOX_HEIGHT,
    FACE_BOX_WIDTH,
    FACE_COLUMNS,
    FACE_COUNT,
    FACE_SCORE,
    FACE_STATUS,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_INDEX,
    IMAGE_WIDTH,
    RGB8,
    FaceStatus,
)


@pytest.fixture(scope="module")
def op():
    f = FaceFilter()
    yield f
    f.close()


@pytest.fixture(scope="module")
def full_range():
    f = FaceFilter(model_selection=1)
    yield f
    f.close()


@pytest.fixture(scope="module")
def photos():
    astronaut = data.astronaut()
    camera = data.camera()  # 2-D grey
    # Two faces: the montage the local image server serves, the astronaut's head and shoulders
    # beside its mirror image (cropped because short-range misses faces under ~15% of the longer
    # side, which each face of two whole photos side by side is).
    two = photo_arrays()["montage"]
    head = np.ascontiguousarray(two[:, : two.shape[1] // 2])
    # One small face: the astronaut shrunk to 40% in the corner of a white 512 px canvas.
    shrunk = np.asarray(Image.fromarray(astronaut).resize((205, 205), Image.BICUBIC))
    small = np.full_like(astronaut, 255)
    small[:205, :205] = shrunk
    return {"astronaut": astronaut, "camera": camera, "coffee": data.coffee(), "chelsea": data.chelsea(),
            "two": two, "head": head, "small": small}


def jpeg(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=92)
    return buf.getvalue()


def png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def payload_table(rows) -> pa.Table:
    """rows: (bytes | None, encoding, height, width) tuples."""
    return pa.table({
        IMAGE_INDEX: pa.array(range(len(rows)), pa.int32()),
        IMAGE: pa.array([r[0] for r in rows], pa.binary()),
        IMAGE_ENCODING: pa.array([r[1] for r in rows], pa.string()),
        IMAGE_HEIGHT: pa.array([r[2] for r in rows], pa.int32()),
        IMAGE_WIDTH: pa.array([r[3] for r in rows], pa.int32()),
    })


def raw(a: np.ndarray):
    p = pack_rgb8([as_rgb(a)])
    return p[IMAGE][0].as_py(), RGB8, p[IMAGE_HEIGHT][0].as_py(), p[IMAGE_WIDTH][0].as_py()


def enc(b: bytes):
    return b, ENCODED, None, None


@pytest.mark.parametrize("name", ["astronaut", "camera"])
def test_one_real_face_is_kept_with_a_plausible_box(op, photos, name):
    status, count, score, w, h = op.evaluate(photos[name])
    assert (status, count) == (FaceStatus.OK, 1)
    assert 0.5 <= score <= 1.0
    assert 0.1 < w < 0.5 and 0.1 < h < 0.5


@pytest.mark.parametrize("name", ["coffee", "chelsea"])
def test_no_human_face(op, photos, name):
    assert op.evaluate(photos[name]) == (FaceStatus.NO_FACE, 0, None, None, None)


def test_two_faces_are_many_faces(op, photos):
    status, count, _, w, h = op.evaluate(photos["two"])
    assert (status, count) == (FaceStatus.MANY_FACES, 2)
    # Each face keeps its pixel size, the montage is twice as wide: the width halves, height stays.
    assert op.evaluate(photos["head"])[:2] == (FaceStatus.OK, 1)
    _, _, _, w1, h1 = op.evaluate(photos["head"])
    # (The 128 px model input sees the montage at half the single crop's scale, so the box moves
    # by a few percent.)
    assert w == pytest.approx(w1 / 2, rel=0.1) and h == pytest.approx(h1, rel=0.1)


def test_small_face_is_beyond_short_range_and_too_small_for_full_range(op, full_range, photos):
    # Short-range (the default) does not find a face 7.5% of the image wide at all ...
    assert op.evaluate(photos["small"]) == (FaceStatus.NO_FACE, 0, None, None, None)
    # ... full-range finds it, and the size rule rejects it ...
    status, count, score, w, h = full_range.evaluate(photos["small"])
    assert (status, count) == (FaceStatus.SMALL_FACE, 1)
    assert score >= 0.5
    assert 0.03 < w < 0.1 and 0.03 < h < 0.1
    # ... until the size threshold is lowered below the measured box.
    with FaceFilter(model_selection=1, min_relative_size=0.05) as lenient:
        assert lenient.evaluate(photos["small"])[0] == FaceStatus.OK


def test_full_range_option_on_the_photos(full_range, photos):
    for name, expect in (("astronaut", (FaceStatus.OK, 1)), ("camera", (FaceStatus.OK, 1)),
                         ("coffee", (FaceStatus.NO_FACE, 0)), ("chelsea", (FaceStatus.NO_FACE, 0)),
                         ("two", (FaceStatus.MANY_FACES, 2))):
        assert full_range.evaluate(photos[name])[:2] == expect, name


def test_thresholds_matter(photos):
    with FaceFilter(min_relative_size=0.5) as strict_size:
        status, count, _, w, _ = strict_size.evaluate(photos["astronaut"])
        assert (status, count) == (FaceStatus.SMALL_FACE, 1) and w < 0.5
    with FaceFilter(min_confidence=0.97) as strict_score:
        assert strict_score.evaluate(photos["astronaut"])[:2] == (FaceStatus.NO_FACE, 0)


def test_box_is_clipped_to_the_image(op, photos):
    # A tight crop around the face: the detector's box sticks out above the top edge.
    crop = np.ascontiguousarray(photos["astronaut"][100:250, 150:300])
    status, count, _, w, h = op.evaluate(crop)
    assert count == 1 and status == FaceStatus.OK
    assert 0 < h <= 1 and 0 < w <= 1
    assert h < w - 0.1  # the square face box lost its part outside the (square) crop


def test_relative_extent():
    assert relative_extent(0.2, 0.3) == pytest.approx(0.3)
    assert relative_extent(-0.3, 0.8) == pytest.approx(0.5)
    assert relative_extent(0.9, 0.4) == pytest.approx(0.1)
    assert relative_extent(-0.1, 1.5) == pytest.approx(1.0)
    assert relative_extent(1.2, 0.3) == 0.0


def test_batch_statuses_nulls_and_schema(op, photos):
    rows = [
        enc(jpeg(photos["astronaut"])),
        (None, None, None, None),               # never fetched / generated upstream
        enc(b"\xff\xd8\xff not really a jpeg"),
        raw(photos["coffee"]),
        enc(png(photos["camera"])),             # grey PNG
        raw(photos["two"]),
        (b"\x00" * 10, RGB8, 4, 4),             # raw payload of the wrong length
        raw(photos["small"]),
    ]
    t = payload_table(rows)
    out = op(t)
    assert out.num_rows == t.num_rows
    assert out.column(IMAGE_INDEX).to_pylist() == list(range(len(rows)))
    assert out.schema.names == t.schema.names + FACE_COLUMNS.names
    for field in FACE_COLUMNS:
        assert out.schema.field(field.name).type == field.type
    assert out.column(FACE_STATUS).to_pylist() == [
        FaceStatus.OK, None, FaceStatus.DECODE_ERROR, FaceStatus.NO_FACE, FaceStatus.OK,
        FaceStatus.MANY_FACES, FaceStatus.DECODE_ERROR, FaceStatus.NO_FACE,
    ]
    assert out.column(FACE_COUNT).to_pylist() == [1, None, None, 0, 1, 2, None, 0]
    for name in (FACE_SCORE, FACE_BOX_WIDTH, FACE_BOX_HEIGHT):
        col = out.column(name).to_pylist()
        assert [v is None for v in col] == [False, True, True, True, False, False, True, True]


def test_encoded_and_raw_payloads_agree(op, photos):
    names = ["astronaut", "camera", "head", "two", "chelsea"]
    t = payload_table([enc(jpeg(as_rgb(photos[n]))) for n in names] + [raw(photos[n]) for n in names])
    out = op(t)
    status = out.column(FACE_STATUS).to_pylist()
    assert status[: len(names)] == status[len(names):]
    w = out.column(FACE_BOX_WIDTH).to_pylist()
    for a, b in zip(w[: len(names)], w[len(names):]):
        assert a is b is None or a == pytest.approx(b, abs=0.02)
    # The raw rows give exactly what evaluate gives on the same pixels.
    assert out.column(FACE_SCORE)[len(names)].as_py() == pytest.approx(op.evaluate(photos["astronaut"])[2], rel=1e-6)


def test_batch_without_image_column_is_all_null(op):
    t = pa.table({IMAGE_INDEX: pa.array([1, 2], pa.int32())})
    out = op(t)
    assert out.num_rows == 2
    assert out.column(FACE_STATUS).null_count == 2 and out.column(FACE_COUNT).null_count == 2


def test_grey_and_alpha_inputs(op, photos):
    grey = photos["camera"]
    assert as_rgb(grey).shape == grey.shape + (3,)
    assert op.evaluate(grey) == op.evaluate(np.stack([grey] * 3, axis=-1))
    rgba = np.dstack([photos["astronaut"], np.full(grey.shape, 255, np.uint8)])
    assert op.evaluate(rgba) == op.evaluate(photos["astronaut"])
    with pytest.raises(ValueError):
        as_rgb(photos["astronaut"].astype(np.float32))


def test_provenance_record(op, full_range):
    r = op.record
    assert r["model_range"] == "short-range" and r["model_selection"] == 0
    path = Path(r["model_file"])
    assert path.name == "face_detection_short_range.tflite"
    assert "mediapipe" in path.parts and path.is_file()
    assert r["model_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert r["package"].startswith("mediapipe==")
    assert (r["min_confidence"], r["min_relative_size"]) == (0.5, 0.1)
    full = full_range.record
    assert full["model_range"] == "full-range" and full["model_selection"] == 1
    assert Path(full["model_file"]).name == "face_detection_full_range_sparse.tflite"
    assert full["model_sha256"] == hashlib.sha256(Path(full["model_file"]).read_bytes()).hexdigest()
    assert full["model_sha256"] != r["model_sha256"]


def test_default_is_the_model_of_the_tasks_detector_the_paper_links(op, photos):
    """Footnote 6 links the MediaPipe Tasks face detector. Its graph runs the wheel's short-range
    file (and refuses full-range); the default filter finds what it finds, with the same scores."""
    from mediapipe import Image as MpImage, ImageFormat
    from mediapipe.tasks.python import BaseOptions
    from mediapipe.tasks.python.vision import FaceDetector, FaceDetectorOptions

    options = FaceDetectorOptions(base_options=BaseOptions(model_asset_path=str(blazeface_file(0))),
                                  min_detection_confidence=op.min_confidence)
    with FaceDetector.create_from_options(options) as tasks:
        for name in ("astronaut", "camera", "coffee", "chelsea", "two", "head", "small"):
            rgb = as_rgb(photos[name])
            found = tasks.detect(MpImage(image_format=ImageFormat.SRGB, data=rgb)).detections
            scores = [d.categories[0].score for d in found]
            status, count, score, w, _ = op.evaluate(rgb)
            assert count == len(scores), name
            if scores:
                assert score == pytest.approx(max(scores), abs=1e-4), name
                best = found[scores.index(max(scores))].bounding_box
                assert w == pytest.approx(best.width / rgb.shape[1], abs=2 / rgb.shape[1]), name


def test_paper_config_uses_the_default_model():
    face = load_config()["face_filter"]
    assert face["model_selection"] == 0 and BLAZEFACE_MODELS[face["model_selection"]][0] == "short-range"
    with FaceFilter(**face) as f:
        assert f.record["model_range"] == "short-range"


def test_missing_mediapipe_raises_model_load_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mediapipe", None)
    with pytest.raises(ModelLoadError, match="BlazeFace.*short-range.*mediapipe"):
        FaceFilter()


def test_bad_arguments():
    with pytest.raises(ValueError):
        FaceFilter(model_selection=2)
    with pytest.raises(ValueError):
        FaceFilter(min_confidence=1.5)


def test_close_is_idempotent(photos):
    f = FaceFilter()
    f.close()
    f.close()
    with pytest.raises(RuntimeError):
        f.evaluate(photos["astronaut"])
