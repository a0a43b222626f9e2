"""A stand-in VAE decoder that draws a face: the one fitted part of the tiny stand-in generators.

RANDOM STAND-IN, OUTPUTS MEANINGLESS. A tiny random Stable Diffusion pipeline paints noise, and a
face detector finds a face in few of its images; then every branch of a study that starts from
"a face was found" (the face filter's kept images, CLIP's counted "woman"/"man" images, DALL-Eval's
skin tone) stays empty in the demo and in the end-to-end tests. So the stand-in pipelines of the
studies (``build_tiny_stable_diffusion(..., faces=True)``) keep the random UNet and text encoder
but replace the VAE decoder's weights with ones fitted here, once, to decode any latent into a
64x64 face:

- which face is set by the latent's channel-2 mean m: ``a = sigmoid(m / GENDER_SCALE)`` blends
  scikit-image's astronaut photo (a woman's face, weight a) with its camera-man photo (a man's face,
  weight 1 - a). The UNet's final latents have m spread on both sides of 0 (about half each for
  the two stand-in generators), so both faces come out; which one an image gets is still decided by
  random weights, i.e. meaningless;
- how light is set by the channel-1 mean: the face is darkened by up to ``TINT`` (tanh of the
  mean over ``TINT_SCALE``), so the skin-tone step sees more than one tone.

The fit is a few minutes of Adam on a CPU, too long to repeat in every run, so its result ships
beside this module (``sd_face_decoder.safetensors``, 160 KB: ``post_quant_conv`` and ``decoder``
of the stand-in ``AutoencoderKL``); ``python -m pipelines.standins.face_decoder`` refits it
(``--steps``/``--batch``/``--seed``). ``load_face_decoder`` checks the file's keys and shapes
against the stand-in VAE it is loaded into; ``build_tiny_vae`` builds that VAE (for the SD 1.x
stand-in of ``pipelines.standins.diffusion`` and the 4-channel ones of ``families``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

FACE_DECODER_FILE = Path(__file__).with_name("sd_face_decoder.safetensors")
IMAGE_SIZE = 64
GENDER_CHANNEL, GENDER_SCALE = 2, 1.0
TINT_CHANNEL, TINT_SCALE, TINT = 1, 3.0, 0.35
# the decoder's input (latents / scaling_factor) from the stand-in UNet after a few steps: per-image
# channel means spread with a standard deviation of about 3, pixels of about 30 around them
LATENT_MEAN_STD, LATENT_PIXEL_STD = 3.5, 30.0
# face crops (rows, cols) of scikit-image's photos: the astronaut (Eileen Collins) and the camera man
FACE_CROPS = {"astronaut": (slice(0, 240), slice(130, 370)), "camera": (slice(30, 210), slice(160, 340))}


def face_templates():
    """The two target faces as float tensors (3, 64, 64) in [-1, 1]: (woman, man)."""
    # deferred: cv2, skimage, torch
    import cv2
    import skimage.data
    import torch

    out = []
    for name in ("astronaut", "camera"):
        img = getattr(skimage.data, name)()
        if img.ndim == 2:
            img = np.stack([img] * 3, axis=-1)
        rows, cols = FACE_CROPS[name]
        img = cv2.resize(img[rows, cols], (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_AREA)
        out.append(torch.tensor(img).permute(2, 0, 1).float() / 127.5 - 1)
    return tuple(out)


def target_images(z, woman, man):
    """What the fitted decoder should return for decoder inputs ``z`` (n, 4, h, w)."""
    import torch  # deferred: torch

    a = torch.sigmoid(z[:, GENDER_CHANNEL].mean(dim=(1, 2)) / GENDER_SCALE)[:, None, None, None]
    dark = torch.tanh(z[:, TINT_CHANNEL].mean(dim=(1, 2)) / TINT_SCALE).abs()[:, None, None, None] * TINT
    x = a * woman + (1 - a) * man
    return ((x + 1) * (1 - dark) - 1).clamp(-1, 1)


def build_tiny_vae(seed: int = 0):
    """The stand-in's ``AutoencoderKL``: SD's 8x down-scaling, 4 latent channels, tiny widths."""
    # deferred: torch, diffusers
    import torch
    from diffusers import AutoencoderKL

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(8, 8, 16, 16),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=8,
            sample_size=64,
        )


def _decoder_state(vae) -> dict:
    return {k: v for k, v in vae.state_dict().items() if k.startswith(("decoder.", "post_quant_conv."))}


def fit(vae, steps: int = 3000, batch: int = 16, seed: int = 0, lr: float = 3e-3, log=print) -> float:
    """Fit ``vae``'s decoder (and post_quant_conv) in place; return the last batch's loss."""
    import torch  # deferred: torch

    woman, man = face_templates()
    gen = torch.Generator().manual_seed(seed)
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    t0, loss = time.time(), float("nan")
    latent = IMAGE_SIZE // 8
    for step in range(steps):
        z = (torch.randn(batch, 4, 1, 1, generator=gen) * LATENT_MEAN_STD
             + torch.randn(batch, 4, latent, latent, generator=gen) * LATENT_PIXEL_STD)
        out = vae.decode(z).sample
        loss_t = torch.nn.functional.mse_loss(out, target_images(z, woman, man))
        opt.zero_grad()
        loss_t.backward()
        opt.step()
        sched.step()
        loss = float(loss_t.detach())
        if log and (step % 250 == 0 or step == steps - 1):
            log(f"step {step + 1}/{steps}: loss {loss:.4f} ({time.time() - t0:.0f} s)")
    return loss


def load_face_decoder(vae, path: str | Path = FACE_DECODER_FILE) -> None:
    """Load the fitted decoder weights into the stand-in ``vae``; the keys and shapes must match."""
    from safetensors.torch import load_file  # deferred: safetensors (torch)

    state = load_file(str(path))
    want = _decoder_state(vae)
    if set(state) != set(want) or any(state[k].shape != want[k].shape for k in want):
        raise RuntimeError(f"{path} does not fit this stand-in VAE (refit it: python -m pipelines.standins.face_decoder)")
    vae.load_state_dict(state, strict=False)


def main(argv=None) -> int:
    # deferred: torch, safetensors
    import torch
    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description="Refit the stand-in generators' face decoder (" + FACE_DECODER_FILE.name + ").")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(FACE_DECODER_FILE))
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    vae = build_tiny_vae(seed=args.seed)
    loss = fit(vae, steps=args.steps, batch=args.batch, seed=args.seed)
    save_file({k: v.contiguous() for k, v in _decoder_state(vae).items()}, args.output,
              metadata={"steps": str(args.steps), "batch": str(args.batch), "seed": str(args.seed), "loss": f"{loss:.5f}"})
    print(f"wrote {args.output} (final loss {loss:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
