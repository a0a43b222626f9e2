"""Steps every tiny random-weight transformers stand-in shares: the output directory, a seeded
initialisation that leaves the caller's random state as it was, saving the model for inference,
the ``STANDIN.txt`` note beside the weights, and ImageNet's normalisation (the image processors of
the real checkpoints use it).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def output_dir(directory) -> Path:
    """``directory`` as an absolute path, created if needed."""
    out = Path(directory).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextmanager
def seeded(seed: int):
    """Torch's random state seeded with ``seed`` inside the block (models built there get the same
    weights for the same seed); the caller's random state is restored after it."""
    import torch  # deferred: torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def save_model(model, out: Path) -> None:
    """``model`` in inference mode, saved with ``save_pretrained`` into ``out``."""
    model.eval()
    model.save_pretrained(out)


def write_note(out: Path, what: str, seed: int, outputs: str) -> None:
    """``STANDIN.txt`` in ``out``: what the stand-in is, its seed, and that its ``outputs`` mean
    nothing."""
    (out / "STANDIN.txt").write_text(f"Tiny {what} stand-in: random weights (seed {seed}); its {outputs} are meaningless.\n")
