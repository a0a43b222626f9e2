"""The settings of `amplification.py run`: the caption side's and the image side's (face filter, CLIP, fetching, training shards, generators), built once from preset, file and flags, and the error budgets of the image phases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


from pipelines.engine.generation import generation_settings
from pipelines.engine.run.models import (
    ModelSpec,
    clip_record,
    clip_revision,
    native_stderr_silenced,
    standin_hint,
)
from pipelines.studies.amplification import captions, paraphrases, training_shards
from pipelines.studies.amplification.images import ImageSettings
from pipelines.engine.stream.progress import ErrorBudget
from schemas import images as I
from operators.image_face_filter import FaceFilter


def image_settings(args, cfg: dict) -> tuple[ImageSettings, dict]:
    """Operator settings from the config file with command-line overrides; and what to record."""
    face, clip, fetch = (dict(cfg[k]) for k in ("face_filter", "gender_classifier", "fetch"))
    gen = generation_settings(cfg["generation"], args)
    clip = clip_revision(clip, args)
    for key, value in (("model", args.clip_model), ("pretrained", args.clip_pretrained),
                       ("threshold", args.gender_threshold)):
        if value is not None:
            clip[key] = value
    if args.clip_model and args.clip_pretrained is None and (args.clip_model.startswith(("local-dir:", "hf-hub:"))
                                                             or Path(args.clip_model).is_dir()):
        clip["pretrained"] = None
    for key, value in (("min_confidence", args.face_min_confidence), ("min_relative_size", args.face_min_size)):
        if value is not None:
            face[key] = value
    for key, value in (("image_size", args.image_size), ("resize_mode", args.resize_mode),
                       ("timeout", args.fetch_timeout), ("retries", args.fetch_retries),
                       ("threads", args.fetch_threads), ("max_bytes", args.max_image_bytes)):
        if value is not None:
            fetch[key] = value
    fetch["allow_local"] = bool(args.allow_local_urls)
    rewrite = []
    for spec in args.url_rewrite:
        if "=" not in spec:
            raise ValueError(f"--url-rewrite {spec!r}: expected FROM=TO")
        a, b = spec.split("=", 1)
        rewrite.append((a, b))
    if args.fetch_missing and not args.training_images:
        raise ValueError("--fetch-missing needs --training-images (without it every image is fetched live)")
    if getattr(args, "shard_key", None) and not args.training_images:
        raise ValueError("--shard-key needs --training-images (it joins the captions to img2dataset's metadata)")
    shards = training_shards.discover(args.training_images, getattr(args, "shard_key", None)) \
        if args.training_images else None
    settings = ImageSettings(
        fetch=fetch,
        face={"model_selection": face["model_selection"], "min_confidence": face["min_confidence"],
              "min_relative_size": face["min_relative_size"]},
        clip=ModelSpec(clip["model"], clip["revision"], options={
            "pretrained": clip["pretrained"], "prompts": tuple(clip["prompts"]), "threshold": clip["threshold"],
            # section 5.2: the CLIP image embeddings, for the training-generated image similarity
            "embeddings": True}),
        generators=list(gen.generators), images_per_prompt=gen.images_per_prompt,
        caption_images=gen.caption_images, seed=gen.seed, url_rewrite=rewrite,
        face_actors=args.face_actors, clip_actors=args.clip_actors, execution=dict(cfg["execution"]),
        safety=gen.safety, shards=shards, fetch_missing=bool(args.fetch_missing),
        local_image_server=not args.no_local_image_server,
    )
    recorded = {"generation": gen.job(), "face_filter": face, "gender_classifier": clip, "fetch": fetch}
    if shards is not None:
        recorded["training_images"] = shards.record() | {"fetch_missing": bool(args.fetch_missing)}
    return settings, recorded


def load_image_models(st: ImageSettings, standin: bool) -> list[dict]:
    """Load the face detector and CLIP once on the driver, before any data is read (the engine
    loads the generators): an unloadable model fails the run now, naming it. Returns the
    provenance records."""

    with standin_hint(standin):
        with native_stderr_silenced():   # MediaPipe's TF Lite / absl lines, which read like errors
            face = FaceFilter(**st.face)
            face.close()
        records = [{"role": "face detector", "model": f"MediaPipe BlazeFace ({face.record.get('model_range')})",
                    "standin": False, "detail": face.record}]
        return records + [clip_record(st.clip, standin, "gender classifier (CLIP)")]


def image_budgets(ex: dict) -> tuple[list, list]:
    """Error budgets of the training-image phase and of a generation phase."""
    n = int(ex["error_budget_min_rows"])
    decode = {I.FACE_STATUS: (I.FaceStatus.DECODE_ERROR,), I.GENDER: (I.Gender.DECODE_ERROR,)}
    training = [ErrorBudget("fetch (training images)", {I.FETCH_STATUS: I.FetchStatus.FAILURES},
                            float(ex["max_fetch_failures"]), n, flag="--max-fetch-failures"),
                ErrorBudget("decode (training images)", decode, float(ex["max_error_rate"]), n)]
    generation = [ErrorBudget("generation", {I.GENERATION_STATUS: I.GenerationStatus.FAILURES, **decode},
                              float(ex["max_error_rate"]), n)]
    return training, generation


@dataclass(frozen=True)
class AmplificationSettings(captions.CaptionSettings):
    """The caption side's settings and the image side's (``image``: operator settings, built once;
    ``image_recorded``: what metrics.json records of them)."""

    not_in_run_id = captions.CaptionSettings.not_in_run_id + (
        "image_recorded",   # metrics.json's record of ``image``, derived from it (in the run id)
    )

    image: ImageSettings | None = None
    image_recorded: dict | None = None
    paraphrase: paraphrases.ParaphraseSettings | None = None   # App. A.6 (--paraphrases)
