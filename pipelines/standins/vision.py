"""Tiny random-weight vision backbones, saved with ``save_pretrained`` the way the hub checkpoints are.

They are random stand-ins: every weight is drawn from transformers' own initialisation, so their
features and the similarities computed from them are meaningless. They exist so that tests and
the offline embedded run exercise the production loading and preprocessing code
(``operators.image_backbone_disparity.load_backbone``) without downloading the real models.

- ``build_tiny_resnet``: a ``ResNetForImageClassification`` (bottleneck blocks, as ResNet-50) with
  a ``ConvNextImageProcessor`` configured as ``microsoft/resnet-50``'s (ImageNet mean and std,
  bicubic, ``shortest_edge`` with ``crop_pct`` 0.875: resize the short side to 36, center-crop
  32), the processor ``AutoImageProcessor`` gives for that checkpoint.
- ``build_tiny_dino``: a ``ViTModel`` saved without its pooling layer, as the DINO checkpoints
  (``facebook/dino-vits16``, ``facebook/dino-vitb8``) are, with DINO's ViT details (qkv bias,
  layer-norm eps 1e-6) and a ``ViTImageProcessor`` like theirs (resize to the model's image size,
  bilinear, ImageNet mean and std).
"""

from __future__ import annotations

from pipelines.standins.tiny import IMAGENET_MEAN, IMAGENET_STD, output_dir, save_model, seeded, write_note

TINY_RESNET_SIZE = 32
TINY_VIT_SIZE = 64
# Larger-than-default initial weights: with transformers' defaults (0.02) a model this small gives
# nearly the same features whatever the image; with these its (meaningless) features vary.
VIT_INIT_RANGE = 0.2


def build_tiny_resnet(directory, seed: int = 0) -> str:
    """Build a tiny random ResNet image classifier and its image processor in ``directory``
    (created if needed); return the absolute directory path. The same seed writes the same weights."""
    # deferred: transformers
    from transformers import ConvNextImageProcessor, ResNetConfig, ResNetForImageClassification
    from transformers.image_utils import PILImageResampling

    out = output_dir(directory)
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck",
                          hidden_act="relu", num_labels=10)
    with seeded(seed):
        model = ResNetForImageClassification(config)
    save_model(model, out)
    ConvNextImageProcessor(
        size={"shortest_edge": TINY_RESNET_SIZE}, crop_pct=0.875, resample=PILImageResampling.BICUBIC,
        do_resize=True, do_rescale=True, do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD,
    ).save_pretrained(out)
    write_note(out, "ResNet", seed, "features")
    return str(out)


def build_tiny_dino(directory, seed: int = 0, patch_size: int = 16) -> str:
    """Build a tiny random DINO-style ViT (no pooling layer) and its image processor in
    ``directory`` (created if needed); return the absolute directory path. ``patch_size`` 16 stands
    in for DINO ViT-S/16 (a 4 x 4 patch grid), 8 for ViT-B/8 (8 x 8)."""
    # deferred: transformers
    from transformers import ViTConfig, ViTImageProcessor, ViTModel
    from transformers.image_utils import PILImageResampling

    if TINY_VIT_SIZE % patch_size:
        raise ValueError(f"patch_size must divide {TINY_VIT_SIZE}, got {patch_size}")
    out = output_dir(directory)
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       image_size=TINY_VIT_SIZE, patch_size=patch_size, qkv_bias=True, layer_norm_eps=1e-6,
                       hidden_act="gelu", initializer_range=VIT_INIT_RANGE)
    with seeded(seed):
        model = ViTModel(config, add_pooling_layer=False)
    save_model(model, out)
    ViTImageProcessor(
        size={"height": TINY_VIT_SIZE, "width": TINY_VIT_SIZE}, resample=PILImageResampling.BILINEAR,
        do_resize=True, do_rescale=True, do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD,
    ).save_pretrained(out)
    write_note(out, f"DINO ViT (patch {patch_size})", seed, "features")
    return str(out)
