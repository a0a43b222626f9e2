"""Image payloads shared by the image operators: decode to RGB, pack raw pixels.

Fetched images travel as encoded bytes (``encoded``: whatever img2dataset's resizer wrote);
generated images travel as raw RGB8 pixels (``rgb8``), so they are never compressed and
decompressed between the generator and the face filter.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image

from schemas.images import (
    GENERATION_STATUS,
    ENCODED,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    RGB8,
    GenerationStatus,
)


def decode_rgb(data: bytes | None, encoding: str | None = ENCODED, height: int | None = None,
               width: int | None = None) -> np.ndarray | None:
    """``data`` as an (H, W, 3) uint8 RGB array, or None when it is not a readable image.

    Grey, palette, CMYK and alpha images are converted to RGB (alpha dropped). Decompression
    bombs (more pixels than PIL's limit) are treated as unreadable.
    """
    if data is None:
        return None
    if encoding == RGB8:
        if not height or not width or len(data) != height * width * 3:
            return None
        return np.frombuffer(data, np.uint8).reshape(height, width, 3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                if im.mode != "RGB":
                    im = im.convert("RGB")
                return np.asarray(im)
    except Exception:  # noqa: BLE001 -- any decoder failure means "not an image"
        return None


def pack_rgb8(images: list[np.ndarray]) -> dict[str, pa.Array]:
    """Payload columns (IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH) for raw RGB8 images."""
    return {
        IMAGE: pa.array([np.ascontiguousarray(a, np.uint8).tobytes() for a in images], pa.binary()),
        IMAGE_ENCODING: pa.array([RGB8] * len(images), pa.string()),
        IMAGE_HEIGHT: pa.array([a.shape[0] for a in images], pa.int32()),
        IMAGE_WIDTH: pa.array([a.shape[1] for a in images], pa.int32()),
    }


def batch_images(batch: pa.Table, rows=None) -> list[np.ndarray | None]:
    """Decode the payload of ``rows`` (all rows by default) of ``batch``; None where unreadable or absent."""
    n = batch.num_rows
    rows = range(n) if rows is None else rows
    data = batch.column(IMAGE).to_pylist() if IMAGE in batch.column_names else [None] * n
    enc = batch.column(IMAGE_ENCODING).to_pylist() if IMAGE_ENCODING in batch.column_names else [ENCODED] * n
    h = batch.column(IMAGE_HEIGHT).to_pylist() if IMAGE_HEIGHT in batch.column_names else [None] * n
    w = batch.column(IMAGE_WIDTH).to_pylist() if IMAGE_WIDTH in batch.column_names else [None] * n
    return [decode_rgb(data[i], enc[i] or ENCODED, h[i], w[i]) for i in rows]


@dataclass
class Decoded:
    """The images of a batch's payload rows: ``rows`` (row indices, int64) whose payload decoded,
    their ``arrays`` (H, W, 3) uint8 in the same order, and ``failed``: rows whose payload did not."""

    rows: np.ndarray
    arrays: list
    failed: np.ndarray

    def by_size(self) -> dict[tuple[int, int], tuple[list[int], list[np.ndarray]]]:
        """{(height, width): (rows, arrays)}: one model batch per image size, none padded for another."""
        groups: dict[tuple[int, int], tuple[list[int], list[np.ndarray]]] = {}
        for r, a in zip(self.rows.tolist(), self.arrays):
            rows, arrays = groups.setdefault(tuple(a.shape[:2]), ([], []))
            rows.append(r)
            arrays.append(a)
        return groups


def payload_rows(batch: pa.Table) -> np.ndarray:
    """Indices of the rows of ``batch`` with an image payload (none without an IMAGE column)."""
    if IMAGE not in batch.column_names or not batch.num_rows:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.asarray(pc.is_valid(batch.column(IMAGE)).to_numpy(zero_copy_only=False)))


def decode_rows(batch: pa.Table, rows=None) -> Decoded:
    """Decode the payload of ``rows`` (default: every row with a payload, ``payload_rows``): the
    rows that decoded with their arrays, and those that did not (the loop every image stage shares)."""
    rows = payload_rows(batch) if rows is None else np.asarray(rows, np.int64).reshape(-1)
    decoded = batch_images(batch, rows.tolist()) if len(rows) else []
    ok = np.array([a is not None for a in decoded], bool)
    return Decoded(rows[ok] if len(rows) else rows, [a for a in decoded if a is not None],
                   rows[~ok] if len(rows) else rows)


def as_rgb(image: np.ndarray) -> np.ndarray:
    """``image`` as a contiguous (H, W, 3) uint8 array: grey (H, W) or (H, W, 1) is replicated,
    an alpha channel is dropped."""
    a = np.asarray(image)
    if a.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {a.dtype}")
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4):
        raise ValueError(f"expected an (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image, got shape {a.shape}")
    if a.shape[2] == 1:
        a = np.repeat(a, 3, axis=2)
    elif a.shape[2] == 4:
        a = a[:, :, :3]
    return np.ascontiguousarray(a)


def generated_image_rows(batch: pa.Table) -> np.ndarray:
    """Indices of the rows with an image payload whose GENERATION_STATUS (when the column is there)
    is ok; a null status means the image did not come from a generator (nothing to exclude)."""
    if IMAGE not in batch.column_names:
        return np.zeros(0, dtype=np.int64)
    mask = pc.is_valid(batch.column(IMAGE))
    if GENERATION_STATUS in batch.column_names:
        status = batch.column(GENERATION_STATUS)
        if pa.types.is_dictionary(status.type):
            status = status.cast(pa.string())
        mask = pc.and_(mask, pc.fill_null(pc.equal(status, GenerationStatus.OK), True))
    return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


def rgb_levels(images):
    """(..., 3, H, W) floats in [0, 1] -> float levels 0-255, quantised as the generator's RGB8
    payload is (``round(x * 255)`` clamped): a tensor and its payload are then processed alike."""
    return images.detach().float().mul(255.0).round_().clamp_(0.0, 255.0)
