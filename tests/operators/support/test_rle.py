"""Uncompressed COCO RLE of binary masks (operators/support/rle.py): column-major order, first
count = zeros, round trips on random, empty and full masks, against a plain loop."""

import numpy as np
import pytest

from operators.support import rle


def loop_rle(mask: np.ndarray) -> list[int]:
    """COCO's rleEncode, written as its C loop: column-major pixels, the first run is of zeros."""
    flat = [bool(v) for v in np.asarray(mask, bool).T.ravel()]
    counts, prev, run = [], False, 0
    for v in flat:
        if v != prev:
            counts.append(run)
            run, prev = 0, v
        run += 1
    counts.append(run)
    return counts


def test_coco_convention_by_hand():
    # column-major: the first column (top, bottom), then the second
    m = np.array([[0, 1],
                  [1, 1]], bool)
    assert rle.encode(m) == [1, 3]          # pixels 0,1,1,1 (column 0 is 0 then 1)
    m = np.array([[1, 0],
                  [0, 0]], bool)
    assert rle.encode(m) == [0, 1, 3]       # starts with a set pixel: an empty zeros run first
    m = np.array([[0, 0, 1],
                  [0, 0, 1]], bool)
    assert rle.encode(m) == [4, 2]          # row-major would give [2, 1, 2, 1]
    m = np.array([[1, 0, 0]], bool)
    assert rle.encode(m) == [0, 1, 2]


def test_empty_full_and_sizeless_masks():
    assert rle.encode(np.zeros((3, 5), bool)) == [15]
    assert rle.encode(np.ones((3, 5), bool)) == [0, 15]
    assert rle.encode(np.zeros((0, 4), bool)) == [0]
    assert not rle.decode([15], 3, 5).any()
    assert rle.decode([0, 15], 3, 5).all()
    assert rle.decode([0], 0, 4).shape == (0, 4)
    assert rle.area([0, 15]) == 15 and rle.area([15]) == 0


@pytest.mark.parametrize("shape,p", [((1, 1), 0.5), ((7, 3), 0.5), ((32, 45), 0.1), ((64, 64), 0.9), ((5, 200), 0.5)])
def test_round_trip_random(shape, p):
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        m = rng.random(shape) < p
        counts = rle.encode(m)
        assert counts == loop_rle(m)
        assert sum(counts) == m.size
        assert all(isinstance(c, int) for c in counts)
        assert all(c > 0 for c in counts[1:])           # only the first run may be empty
        back = rle.decode(counts, *shape)
        assert back.dtype == bool and back.shape == shape
        np.testing.assert_array_equal(back, m)
        assert rle.area(counts) == int(m.sum())


def test_round_trip_blobs():
    yy, xx = np.mgrid[0:40, 0:60]
    m = (yy - 20) ** 2 + (xx - 30) ** 2 < 100
    np.testing.assert_array_equal(rle.decode(rle.encode(m), 40, 60), m)
    assert rle.encode(m) == loop_rle(m)


def test_encode_many_matches_encode():
    rng = np.random.default_rng(3)
    ms = rng.random((6, 9, 11)) < 0.4
    ms[0] = False
    ms[1] = True
    ms[2, 0, 0] = True
    ms[3, 0, 0] = False
    ms[4, -1, -1] = True
    got = rle.encode_many(ms)
    assert got == [rle.encode(m) for m in ms] == [loop_rle(m) for m in ms]
    assert got[0] == [99] and got[1] == [0, 99]
    assert rle.encode_many(np.zeros((0, 4, 4), bool)) == []
    assert rle.encode_many(np.zeros((2, 0, 4), bool)) == [[0], [0]]


def test_decode_rejects_wrong_sizes():
    with pytest.raises(ValueError):
        rle.decode([3, 2], 2, 2)
    with pytest.raises(ValueError):
        rle.decode([-1, 5], 2, 2)
    with pytest.raises(ValueError):
        rle.encode(np.zeros((2, 2, 2), bool))
