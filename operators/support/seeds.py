"""Stable 63-bit hashes: caption ids (paper 002) and per-image generator seeds (every study).

blake2b of the UTF-8 text, so a value never depends on the process, the platform or Python's
hash randomisation.
"""

from __future__ import annotations

import hashlib

import numpy as np

MASK63 = (1 << 63) - 1


def hash64(text: str) -> int:
    """64-bit BLAKE2b of a string, as an unsigned int."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def image_seeds(base_seed: int, prompts, indices) -> np.ndarray:
    """Per-image generator seeds: a deterministic 63-bit hash of (base seed, prompt text, index).

    The seed does not depend on the model, the batch or the worker, so every image can be
    regenerated alone, and two models see the same initial noise for the same prompt and index.
    """
    return np.array([hash64(f"{int(base_seed)}\x1f{p}\x1f{int(k)}") & MASK63 for p, k in zip(prompts, indices)],
                    np.int64)
