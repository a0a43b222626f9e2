"""Binary masks as uncompressed COCO run-length encodings (RLE).

The convention is COCO's (``pycocotools.mask``'s uncompressed ``counts``): the (H, W) mask is read
column by column (Fortran / column-major order, ``mask.ravel(order="F")``), and ``counts`` are the
lengths of its alternating runs, the first run being of zeros (so a mask whose first pixel is set
starts with a 0 count). The counts add up to H * W; the size itself is not stored (the detection
columns take it from the image, ``schemas.exposed.OBJECT_MASKS``). An empty mask is ``[H * W]``, a
full one ``[0, H * W]`` and a mask without pixels ``[0]``, as pycocotools writes them.

Everything is vectorised with numpy: no Python loop over pixels or runs.
"""

from __future__ import annotations

import numpy as np


def _check_mask(mask) -> np.ndarray:
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ValueError(f"a mask must be (H, W), got shape {m.shape}")
    return m.astype(bool, copy=False)


def _counts_of_flat(flat: np.ndarray) -> list[int]:
    """Run lengths of a 1-D bool array, the first run counted as zeros."""
    n = flat.shape[0]
    if n == 0:
        return [0]
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    edges = np.concatenate(([0], changes, [n]))
    counts = np.diff(edges)
    if flat[0]:
        counts = np.concatenate(([0], counts))
    return counts.astype(np.int64).tolist()


def encode(mask: np.ndarray) -> list[int]:
    """The uncompressed COCO RLE counts of a (H, W) bool mask (column-major, zeros first)."""
    m = _check_mask(mask)
    return _counts_of_flat(m.ravel(order="F"))


def encode_many(masks: np.ndarray) -> list[list[int]]:
    """``[encode(m) for m in masks]`` for an (N, H, W) stack, with one numpy pass over all of them."""
    ms = np.asarray(masks)
    if ms.ndim != 3:
        raise ValueError(f"masks must be (N, H, W), got shape {ms.shape}")
    n, h, w = ms.shape
    if n == 0:
        return []
    if h * w == 0:
        return [[0] for _ in range(n)]
    # column-major pixels of each mask, with a 0 in front so every mask starts with a zero run
    # (possibly empty) and a sentinel at the end: runs end where the value changes or the mask ends
    flat = np.zeros((n, h * w + 1), dtype=np.int8)
    flat[:, 1:] = ms.astype(bool).transpose(0, 2, 1).reshape(n, h * w)
    change = flat[:, 1:] != flat[:, :-1]          # (n, hw): a run starts at this pixel (besides pixel 0)
    change[:, 0] = True                           # pixel 0 always starts the first run ...
    rows, cols = np.nonzero(change)
    starts_nonzero_first = flat[:, 1] == 1        # ... which is a ones run: the zero run before it is empty
    ends = np.empty_like(cols)
    ends[:-1] = cols[1:]
    last = np.r_[rows[1:] != rows[:-1], True]    # the last run of each mask ends at h * w
    ends[last] = h * w
    lengths = ends - cols
    split = np.flatnonzero(last)[:-1] + 1
    out = []
    for i, runs in enumerate(np.split(lengths, split)):  # one entry per mask, not per pixel
        counts = runs.tolist()
        out.append([0] + counts if starts_nonzero_first[i] else counts)
    return out


def decode(counts, height: int, width: int) -> np.ndarray:
    """The (height, width) bool mask of uncompressed COCO RLE ``counts``."""
    c = np.asarray(list(counts), dtype=np.int64)
    total = int(height) * int(width)
    if c.ndim != 1 or (c < 0).any():
        raise ValueError("RLE counts must be a flat list of non-negative integers")
    if int(c.sum()) != total:
        raise ValueError(f"RLE counts add up to {int(c.sum())}, not {height} x {width} = {total}")
    values = (np.arange(c.shape[0]) % 2).astype(bool)   # zeros, ones, zeros, ...
    flat = np.repeat(values, c)
    return flat.reshape((int(height), int(width)), order="F")


def area(counts) -> int:
    """Number of set pixels of an RLE mask (the sum of its ones runs)."""
    c = np.asarray(list(counts), dtype=np.int64)
    return int(c[1::2].sum())
