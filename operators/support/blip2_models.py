"""Loading BLIP-2 for the visual-question-answering stage (``operators.image_blip2_vqa``): the model
and its processor, checked against each other, with the image processor's fixed-size resize
settings the stage reproduces in torch ops and a provenance record; and the driver's check of a
configured model before a run, without loading its weights.

transformers and torch are imported inside the functions that need them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from operators.support.models import (ModelLoadError, dtype_kwarg, hub_load_error, loaded_record, loading, local_record,
                                      package_version, pick_device, resolve_dtype, resolved_dir, weights_record)

DEFAULT_MODEL = "Salesforce/blip2-flan-t5-xl"


@dataclass
class Blip2Bundle:
    """A loaded BLIP-2: the model (eval mode, on ``device``), its processor and provenance."""

    model: Any        # Blip2ForConditionalGeneration
    processor: Any    # Blip2Processor (image_processor + tokenizer)
    device: str
    dtype: Any        # torch dtype the model was loaded in
    record: dict = field(default_factory=dict)


def _load_error(model: str, revision: str | None, exc: BaseException) -> ModelLoadError:
    return hub_load_error(
        "BLIP-2 model", model, revision, exc,
        f"Provide it as a local directory holding a Blip2ForConditionalGeneration and its Blip2Processor, "
        f"both written with save_pretrained() (config.json with model_type blip-2, the weights, "
        f"processor_config.json and the tokenizer files), or as a hub id (e.g. {DEFAULT_MODEL})")


def _image_settings(image_processor) -> dict:
    size = image_processor.size
    get = (lambda k: getattr(size, k, None)) if not isinstance(size, Mapping) else size.get
    height, width = get("height"), get("width")
    if not height or not width:
        raise ValueError(f"image processor size {size!r} has no (height, width); only fixed-size resizing is supported")
    if getattr(image_processor, "do_center_crop", None) or getattr(image_processor, "do_pad", None):
        raise ValueError("image processors that center-crop or pad are not supported")
    resample = getattr(image_processor, "resample", None)
    if resample is None:
        interpolation = "bilinear"  # what the torchvision backend does without one
    elif isinstance(getattr(resample, "value", None), str):  # a torchvision InterpolationMode
        interpolation = resample.value
    else:  # a PIL resampling code
        interpolation = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(int(resample), str(resample))
    if interpolation not in ("nearest", "bilinear", "bicubic"):
        raise ValueError(f"image processor resample {resample!r} is not supported (nearest, bilinear, bicubic)")
    mean = image_processor.image_mean
    std = image_processor.image_std
    mean = [float(mean)] * 3 if isinstance(mean, (int, float)) else [float(m) for m in mean]
    std = [float(std)] * 3 if isinstance(std, (int, float)) else [float(s) for s in std]
    return {
        "image_size": [int(height), int(width)],
        "interpolation": interpolation,
        "do_resize": bool(getattr(image_processor, "do_resize", True)),
        "do_rescale": bool(getattr(image_processor, "do_rescale", True)),
        "rescale_factor": float(getattr(image_processor, "rescale_factor", 1 / 255)),
        "do_normalize": bool(getattr(image_processor, "do_normalize", True)),
        "image_mean": mean,
        "image_std": std,
    }


def load_blip2(model: str, revision: str | None = None, device: str = "auto", dtype: str = "auto") -> Blip2Bundle:
    """Load a BLIP-2 (``Blip2ForConditionalGeneration`` + its processor) for inference, or raise
    ModelLoadError naming the model and saying how to provide it.

    ``model`` is a local directory written by ``save_pretrained`` or a hub id (pinned to
    ``revision``). ``device="auto"``: cuda when available, else cpu; ``dtype="auto"``: bfloat16 on
    CUDA, float32 on the CPU. A directory whose config is not a BLIP-2, or whose weights do not
    cover the model, is an error, never a silently random model.
    """
    from transformers import AutoConfig, AutoProcessor, Blip2ForConditionalGeneration  # deferred: transformers

    dev = pick_device(device)
    torch_dtype = resolve_dtype(dtype, dev, cuda_auto="bfloat16")  # Flan-T5 overflows in float16
    with loading(lambda exc: _load_error(model, revision, exc)):
        config = AutoConfig.from_pretrained(model, revision=revision)
        if getattr(config, "model_type", None) != "blip-2":
            raise ValueError(f"its config is a {getattr(config, 'model_type', None)!r} model, not a 'blip-2' one")
        net, info = Blip2ForConditionalGeneration.from_pretrained(
            model, revision=revision, output_loading_info=True, **dtype_kwarg(torch_dtype)
        )
        missing = list(info.get("missing_keys") or [])
        if missing:
            raise ValueError(f"the weights lack {len(missing)} parameters of the model (e.g. {missing[:3]})")
        processor = AutoProcessor.from_pretrained(model, revision=revision)
        if not hasattr(processor, "image_processor") or not hasattr(processor, "tokenizer"):
            raise ValueError(f"its processor is a {type(processor).__name__}, without an image processor and a tokenizer")
        settings = _image_settings(processor.image_processor)
        if config.image_token_index is None:
            raise ValueError("config.image_token_index is not set (a checkpoint saved before transformers 4.47); "
                             "re-save it with a current transformers")
        n_query = getattr(processor, "num_query_tokens", None)
        if n_query is not None and int(n_query) != int(config.num_query_tokens):
            raise ValueError(f"processor num_query_tokens {n_query} != config num_query_tokens {config.num_query_tokens}")
        net = net.to(dev).eval()

    record = loaded_record(model, revision, net, config, torch_dtype, dev, fields={
        "vision_config_class": type(config.vision_config).__name__,
        "qformer_config_class": type(config.qformer_config).__name__,
        "text_config_class": type(config.text_config).__name__,
        "language_model_class": type(net.language_model).__name__,
        "processor_class": type(processor).__name__,
        "image_processor_class": type(processor.image_processor).__name__,
        "tokenizer_class": type(processor.tokenizer).__name__,
        "num_query_tokens": int(config.num_query_tokens),
        "image_token_index": int(config.image_token_index),
        **settings,
    })
    record.update(local_record(model))
    return Blip2Bundle(model=net, processor=processor, device=dev, dtype=torch_dtype, record=record)


def check_blip2(model: str, revision: str | None = None) -> dict:
    """What a driver checks before a run, without loading the (large) weights: the config is a
    BLIP-2 with image tokens, the processor matches it, and a local directory has weight files.
    Returns a provenance record; raises ModelLoadError naming the model otherwise."""
    from transformers import AutoConfig, AutoProcessor  # deferred: transformers

    try:
        config = AutoConfig.from_pretrained(model, revision=revision)
        if getattr(config, "model_type", None) != "blip-2":
            raise ValueError(f"its config is a {getattr(config, 'model_type', None)!r} model, not a 'blip-2' one")
        if config.image_token_index is None:
            raise ValueError("config.image_token_index is not set (a checkpoint saved before transformers 4.47); "
                             "re-save it with a current transformers")
        processor = AutoProcessor.from_pretrained(model, revision=revision)
        if not hasattr(processor, "image_processor") or not hasattr(processor, "tokenizer"):
            raise ValueError(f"its processor is a {type(processor).__name__}, without an image processor and a tokenizer")
        n_query = getattr(processor, "num_query_tokens", None)
        if n_query is not None and int(n_query) != int(config.num_query_tokens):
            raise ValueError(f"processor num_query_tokens {n_query} != config num_query_tokens {config.num_query_tokens}")
        local = os.path.isdir(model)
        if local and not any(p.suffix in {".safetensors", ".bin"} for p in Path(model).rglob("*")):
            raise ValueError("the directory has no weight files (.safetensors / .bin)")
    except Exception as exc:  # OSError, ValueError, HTTP errors
        raise _load_error(model, revision, exc) from exc
    record = {"model": model, "revision": revision, "source": "directory" if local else "hub",
              "config_class": type(config).__name__,
              "text_config_class": type(config.text_config).__name__, "processor_class": type(processor).__name__,
              "num_query_tokens": int(config.num_query_tokens), "transformers_version": package_version("transformers"),
              "weights_loaded": False,
              # the files the actors will load, where they are here already (a local or pre-filled cache)
              **weights_record(model, resolved_dir(model, revision), config)}
    record.update(local_record(model))
    return record
