"""What several benchmark scripts share: best-of-N timing, the options of the benchmarks that run
each model in a child process, a fresh Python process's JSON answer, and a random-weight open_clip
model saved as a local directory.

The scripts import it as ``benchmarks.common`` (each puts the repository root on ``sys.path``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    """The shortest of ``repeat`` calls of ``fn`` in seconds, and what the last call returned."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def best_of(fn, repeat: int) -> float:
    """The shortest of ``repeat`` calls of ``fn``, in seconds."""
    return timed(fn, repeat)[0]


def fresh_process_json(code: str, *args: str, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh Python process (``python -c code *args``, as a Ray worker starts) and
    return the JSON object on the last line it prints; a failing child raises with its stderr."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"child process failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def add_child_process_arguments(ap) -> None:
    """--threads and --workdir, for a benchmark that builds models into a directory and runs each
    in a child process."""
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--workdir", help="where the models are saved (default: a temporary directory, removed after)")


def save_open_clip(model, cfg: dict, directory: Path, mean, std, note: str) -> None:
    """Save an open_clip ``model`` built from ``cfg`` as a local-directory model open_clip loads
    (open_clip_model.safetensors, open_clip_config.json with bicubic shortest-side preprocessing
    normalised with ``mean`` / ``std``); ``note`` says what the stand-in is."""
    import safetensors.torch  # deferred: torch

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(directory / "open_clip_model.safetensors"))
    (directory / "open_clip_config.json").write_text(json.dumps({
        "model_cfg": cfg,
        "preprocess_cfg": {"mean": mean, "std": std, "interpolation": "bicubic", "resize_mode": "shortest"},
        "standin": note,
    }, indent=2))
