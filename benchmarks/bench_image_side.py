"""Image-side throughput on this machine, each next to its baseline.

  fetch        ImageFetcher with 32 threads vs 1 thread, from the local image server (127.0.0.1)
  face_filter  BlazeFace on raw RGB8 payloads (how generated images travel) vs JPEG bytes (decode first)
  clip         CLIP classification from the image tensor vs a PNG encode/decode round trip first

  python benchmarks/bench_image_side.py [--images 256] [--clip tiny|ViT-L-14] [--device cpu|cuda]

`--clip ViT-L-14` uses the real architecture with random weights (no download); `tiny` the
offline stand-in. Timing depends on the machine; nothing here is a test.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.support.codec import pack_rgb8  # noqa: E402
from schemas import images as I  # noqa: E402
from schemas.captions import URL  # noqa: E402


def rate(n: int, fn) -> float:
    fn()  # warm-up (model load, thread pools)
    t = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t)


def bench_fetch(n: int, latency: float) -> None:
    from operators.image_fetch import ImageFetcher
    from pipelines.studies.amplification.sample_server import LocalImageServer

    # /slow.jpg answers after `latency` seconds: a stand-in for the round trip to a remote host
    with LocalImageServer(slow_seconds=latency) as server:
        urls = pa.table({URL: [server.url("/slow.jpg") + f"?i={i}" for i in range(n)]})
        fast = ImageFetcher(allow_local=True, threads=32)
        slow = ImageFetcher(allow_local=True, threads=1)
        a, b = rate(n, lambda: fast(urls)), rate(n, lambda: slow(urls))
    print(f"fetch        {a:8.1f} images/s with 32 threads   vs {b:8.1f} images/s with 1 thread   ({a / b:.1f}x), "
          f"{latency * 1000:.0f} ms server latency, one process")


def photos(n: int) -> list[np.ndarray]:
    from skimage import data  # deferred: skimage

    coffee = np.pad(data.coffee(), ((0, 112), (0, 0), (0, 0)))[:512, :512]  # 512 x 512 like the others
    base = [data.astronaut(), np.repeat(data.camera()[:, :, None], 3, 2), coffee]
    return [np.ascontiguousarray(base[i % len(base)]) for i in range(n)]


def bench_face(n: int) -> None:
    from PIL import Image  # deferred: PIL

    from operators.image_face_filter import FaceFilter

    imgs = photos(n)
    raw = pa.table(pack_rgb8(imgs))
    jpegs = []
    for a in imgs:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "JPEG", quality=95)
        jpegs.append(buf.getvalue())
    enc = pa.table({I.IMAGE: pa.array(jpegs, pa.binary()), I.IMAGE_ENCODING: pa.array([I.ENCODED] * n)})
    f = FaceFilter()
    a, b = rate(n, lambda: f(raw)), rate(n, lambda: f(enc))
    print(f"face_filter  {a:8.1f} images/s from RGB8       vs {b:8.1f} images/s from JPEG       ({a / b:.2f}x), one core")


def bench_clip(n: int, arch: str, device: str) -> None:
    import torch  # deferred: torch
    from PIL import Image  # deferred: PIL

    from operators.image_clip_gender import ClipGenderClassifier

    with tempfile.TemporaryDirectory() as tmp:
        if arch == "tiny":
            from pipelines.standins.clip import build_tiny_open_clip

            spec, pretrained = build_tiny_open_clip(tmp), None
        else:  # the real architecture, random weights, saved as a checkpoint file (no download)
            import open_clip  # deferred: open_clip

            model = open_clip.create_model(arch, pretrained=None)
            ckpt = str(Path(tmp) / "random.pt")
            torch.save(model.state_dict(), ckpt)
            spec, pretrained = arch, ckpt
        clf = ClipGenderClassifier(model=spec, pretrained=pretrained, device=device, only_face_ok=False)
        imgs = photos(n)
        tensor = torch.stack([torch.from_numpy(a).permute(2, 0, 1) for a in imgs]).float().div(255).to(device)

        def round_trip():
            out = []
            for t in tensor:
                buf = io.BytesIO()
                Image.fromarray((t.permute(1, 2, 0).cpu().numpy() * 255).round().astype(np.uint8)).save(buf, "PNG")
                out.append(buf.getvalue())
            return clf(pa.table({I.IMAGE: pa.array(out, pa.binary()), I.IMAGE_ENCODING: pa.array([I.ENCODED] * n)}))

        a, b = rate(n, lambda: clf.classify_tensor(tensor)), rate(n, round_trip)
    print(f"clip ({arch}, {device}) {a:8.1f} images/s from the tensor  vs {b:8.1f} images/s via PNG files ({a / b:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--clip", default="tiny", help="tiny, or an open_clip architecture such as ViT-L-14")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", choices=["fetch", "face", "clip"])
    ap.add_argument("--latency", type=float, default=0.05, help="simulated server latency for fetch (s)")
    args = ap.parse_args()
    import torch  # deferred: torch

    print(f"{args.images} images, torch threads {torch.get_num_threads()}")
    if args.only in (None, "fetch"):
        bench_fetch(args.images, args.latency)
    if args.only in (None, "face"):
        bench_face(args.images)
    if args.only in (None, "clip"):
        bench_clip(args.images, args.clip, args.device)


if __name__ == "__main__":
    main()
