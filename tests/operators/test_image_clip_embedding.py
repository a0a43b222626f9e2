"""L2-normalised CLIP image embeddings (paper 001, section 4): a tiny random open_clip saved to a temp
dir and loaded through the production path; the generator's tensor path and the payload path agree."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.image_clip_embedding import (
    ClipImageEmbedder,
    embedding_array,
    embeddings_of,
    normalise,
)
from operators.support.codec import pack_rgb8
from pipelines.standins.clip import build_tiny_open_clip
from schemas.gep import EMBEDDING


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    torch.set_num_threads(1)
    return ClipImageEmbedder(build_tiny_open_clip(tmp_path_factory.mktemp("clip")), None, device="cpu")


def images(n=3, size=48, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def test_embeddings_are_unit_vectors_and_tensor_and_payload_paths_agree(embedder):
    arr = images()
    tensor = torch.from_numpy(arr).permute(0, 3, 1, 2).float() / 255.0
    from_tensor = embedder.embed_tensor(tensor)
    assert from_tensor.shape == (3, 32) and from_tensor.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(from_tensor, axis=1), 1.0, atol=1e-5)
    batch = pa.table(pack_rgb8(list(arr)))
    out = embedder(batch)
    vectors, valid = embeddings_of(out.column(EMBEDDING))
    assert valid.all()
    np.testing.assert_allclose(vectors, from_tensor, atol=1e-5)
    # different images, different embeddings
    assert np.abs(from_tensor[0] - from_tensor[1]).max() > 1e-3
    assert embedder.classify_tensor(tensor)[EMBEDDING].shape == (3, 32)


def test_texts_are_embedded_in_the_same_space(embedder):
    t = embedder.embed_texts(["a dress", "a tie", "an object"])
    assert t.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(t[0], t[1])


def test_broken_bytes_and_missing_images_get_null_embeddings(embedder):
    arr = images(2)
    good = pack_rgb8(list(arr))
    batch = pa.table({"image": pa.array([good["image"][0].as_py(), b"not an image", None], pa.binary()),
                      "image_encoding": pa.array(["rgb8", "encoded", None]),
                      "image_height": pa.array([48, None, None], pa.int32()),
                      "image_width": pa.array([48, None, None], pa.int32())})
    out = embedder(batch)
    vectors, valid = embeddings_of(out.column(EMBEDDING))
    assert valid.tolist() == [True, False, False]
    np.testing.assert_allclose(np.linalg.norm(vectors[0]), 1.0, atol=1e-5)


def test_embedding_column_round_trip_and_normalise():
    v = normalise(np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]]))
    np.testing.assert_allclose(v, [[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]])
    col = embedding_array(v, np.array([True, False, True]))
    assert col.null_count == 1 and col.type == pa.list_(pa.float32())
    back, valid = embeddings_of(pa.chunked_array([col]))
    assert valid.tolist() == [True, False, True]
    np.testing.assert_allclose(back[[0, 2]], v[[0, 2]])
    with pytest.raises(ValueError, match="different lengths"):
        embeddings_of(pa.array([[1.0, 2.0], [1.0]], pa.list_(pa.float32())))
