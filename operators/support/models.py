"""What every model-loading stage shares: the load error, the device and dtype rules, and what a
loader records about the weights it read (hub commit, sha256 of each weight file, package versions).

One copy of each, imported by the stages (operators/image_*.py, text_*.py) and by the engine's
model checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
from pathlib import Path
from typing import Callable

DTYPES = ("float32", "float16", "bfloat16")


class ModelLoadError(RuntimeError):
    """A configured model could not be loaded; the message names it and how to provide it."""


HUB_ADVICE = ("reachable from every node: already in the Hugging Face cache (pre-fill HF_HOME / HF_HUB_CACHE; "
              "HF_HUB_OFFLINE=1 then loads it from there) or with network access to the hub (pin a revision).")


def hub_load_error(what: str, model: str, revision: str | None, exc: BaseException, provide: str,
                   standin: str = "", one_line: bool = False) -> ModelLoadError:
    """The error of a model, given as a local directory or a Hugging Face hub id, that did not load:
    "cannot load ``what`` ``model`` (its revision): the cause. ``provide`` reachable from every
    node ..." then ``standin`` (how to build a stand-in, when there is one). ``provide`` ends with
    "as a hub id" (what to provide, as a directory or as a hub id). ``one_line``: the message's
    white space (the cause's newlines included) collapsed to single spaces."""
    text = (f"cannot load {what} {model!r} (revision {revision!r}): {type(exc).__name__}: "
            f"{str(exc).rstrip('. ')}. {provide} {HUB_ADVICE}{f' {standin}' if standin else ''}")
    return ModelLoadError(" ".join(text.split()) if one_line else text)


GPU_HINT = ("To get a GPU: run on a node with one (on a cluster, each model actor asks for --gpus-per-actor GPUs, "
            "default 1 from the study's execution settings, and the autoscaler starts cluster.yaml's gpu_worker "
            "nodes for them; `ray status` shows them); to run the models on the CPU on purpose, pass --device cpu.")


def pick_device(device: str = "auto") -> str:
    """``auto``: cuda when torch sees a GPU, else cpu. ``cuda`` (a real model on a GPU actor) must
    be there: a GPU node whose torch cannot see its GPU fails here rather than computing on the CPU."""
    if device == "auto":
        import torch  # deferred: torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda"):
        import torch  # deferred: torch

        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device!r} asked for, but torch {torch.__version__} (CUDA build "
                f"{torch.version.cuda or 'none'}) sees no GPU here (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}). {GPU_HINT}")
    return device


def resolve_dtype(dtype: str, device: str, cuda_auto: str = "float16"):
    """The torch dtype for a model: ``dtype`` by name, or for "auto" ``cuda_auto`` on CUDA and
    float32 elsewhere."""
    import torch  # deferred: torch

    if dtype == "auto":
        return getattr(torch, cuda_auto) if str(device).startswith("cuda") else torch.float32
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {DTYPES}")
    return getattr(torch, name)


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None when it is not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def dtype_kwarg(torch_dtype) -> dict:
    """``dtype=`` for transformers >= 4.56 (it deprecates ``torch_dtype``), else ``torch_dtype=``."""
    parts = (package_version("transformers") or "0.0").split(".")
    try:
        new = (int(parts[0]), int(parts[1])) >= (4, 56)
    except ValueError:
        new = True
    return {"dtype": torch_dtype} if new else {"torch_dtype": torch_dtype}


# --- what a model loader records about the weights it loaded ------------------------------------------

# A Hugging Face cache keeps each revision as .../models--org--name/snapshots/<commit>/<files>
# (the files link into blobs/); the commit is read from that path, never from a resolved link.
_SNAPSHOT = re.compile(r"(?:^|/)snapshots/([0-9a-f]{40})(?:/|$)")
# The weight file a transformers / diffusers / sentence-transformers loader reads from one model
# directory when no variant is asked for, in their order of preference (safetensors before
# pickles; transformers tries a single file before a sharded index, diffusers the index first).
# An index stands for the shards it names.
LOADED_WEIGHT_NAMES = (
    "model.safetensors", "model.safetensors.index.json",
    "diffusion_pytorch_model.safetensors.index.json", "diffusion_pytorch_model.safetensors",
    "pytorch_model.bin", "pytorch_model.bin.index.json",
    "diffusion_pytorch_model.bin.index.json", "diffusion_pytorch_model.bin",
)
_sha256_seen: dict[tuple, str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (remembered per path, size and mtime: a worker that loads the same
    multi-GB weights twice hashes them once)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns)
    if key not in _sha256_seen:
        h = hashlib.sha256()
        with open(real, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        _sha256_seen[key] = h.hexdigest()
    return _sha256_seen[key]


def hub_commit(path: str | os.PathLike | None) -> str | None:
    """The commit of a file or directory inside a Hugging Face cache snapshot, else None."""
    if not path:
        return None
    m = _SNAPSHOT.search(Path(os.path.abspath(path)).as_posix())
    return m.group(1) if m else None


def hub_snapshot(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """The cached snapshot directory holding ``filename`` of hub repo ``repo_id`` at ``revision``
    (a commit, branch or tag; None: main), without network access; None when it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache  # deferred: huggingface_hub

        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except Exception:  # noqa: BLE001 -- not a valid repo id, no cache: nothing to record
        return None
    return Path(found).parent if isinstance(found, str) else None


def loaded_weight_files(directory: str | os.PathLike) -> list[Path]:
    """The weight files a transformers / diffusers model loads from ``directory`` (see
    LOADED_WEIGHT_NAMES); empty when it holds none."""
    d = Path(directory)
    for name in LOADED_WEIGHT_NAMES:
        p = d / name
        if not p.is_file():
            continue
        if name.endswith(".index.json"):
            shards = sorted(set(json.loads(p.read_text()).get("weight_map", {}).values()))
            return [d / s for s in shards]
        return [p]
    return []


def weights_provenance(files, root: str | os.PathLike) -> dict:
    """What a loader records about the weights it read: the hub commit of ``root`` (None off the
    hub), the sha256 of each file by its path under ``root``, and one sha256 over those pairs."""
    root = Path(os.path.abspath(root))
    shas = {Path(os.path.abspath(f)).relative_to(root).as_posix(): file_sha256(f) for f in files}
    listing = "".join(f"{name}\0{sha}\n" for name, sha in sorted(shas.items()))
    return {"commit": hub_commit(root), "weight_files": shas,
            "weights_sha256": hashlib.sha256(listing.encode()).hexdigest() if shas else None}


def weights_fingerprint(path: str) -> str | None:
    """One sha256 over every weight file (.safetensors, .bin) under a local model directory (None
    for anything else)."""
    if not path or not os.path.isdir(path):
        return None
    files = [p for p in Path(path).rglob("*") if p.suffix in {".safetensors", ".bin"} and p.is_file()]
    return weights_provenance(files, path)["weights_sha256"]


def resolved_dir(model: str, revision: str | None) -> str | None:
    """The local directory a transformers model was read from: itself, or its snapshot in the hub
    cache (found through ``config.json``; None when neither is there)."""
    if os.path.isdir(model):
        return str(Path(model).resolve())
    try:
        from transformers.utils import cached_file  # deferred: transformers

        path = cached_file(model, "config.json", revision=revision)
        return str(Path(path).parent) if path else None
    except Exception:  # noqa: BLE001 -- provenance only
        return None


def weights_record(model: str, resolved: str | None, config) -> dict:
    """The hub commit a transformers model resolved to and the sha256 of the weight files
    transformers reads from its directory (a local one, or the hub snapshot; ``resolved_dir``):
    ``weights_provenance``, with the config's commit hash where the path has none."""
    if resolved is None or not os.path.isdir(resolved):
        return {"commit": getattr(config, "_commit_hash", None), "weight_files": None, "weights_sha256": None}
    record = weights_provenance(loaded_weight_files(resolved), resolved)
    record["commit"] = record["commit"] or getattr(config, "_commit_hash", None)
    if not record["weight_files"]:
        record["weight_files"] = None
    return record


@contextlib.contextmanager
def loading(error: Callable[[BaseException], ModelLoadError]):
    """Load a model inside this block: any failure (OSError, ValueError, HTTP and CUDA errors, a
    check of the loader's own) becomes ``error(exc)``, the loader's one message naming the model
    and how to provide it; a ModelLoadError raised inside passes unchanged."""
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 -- every cause, one message
        raise error(exc) from exc


def source_record(model: str, revision: str | None, resolved: str | None) -> dict:
    """The head of a transformers model's provenance record: what was asked for, whether it is a
    local directory or a hub id, and the directory it resolved to (``resolved_dir``)."""
    return {"model": model, "revision": revision, "source": "directory" if os.path.isdir(model) else "hub",
            "resolved": resolved if resolved is not None else model}


def local_record(model: str) -> dict:
    """For a model given as a local directory: its absolute path and, for a tiny random stand-in,
    the note its STANDIN.txt carries; nothing for a hub id."""
    if not os.path.isdir(model):
        return {}
    root = Path(model).resolve()
    out = {"path": str(root)}
    note = root / "STANDIN.txt"
    if note.is_file():
        out["standin"] = note.read_text().strip()
    return out


def loaded_record(model: str, revision: str | None, net, config, torch_dtype, device: str, fields: dict,
                  lead: dict | None = None, packages: tuple[str, ...] = ("transformers", "torch")) -> dict:
    """The provenance record of a loaded transformers model, in this key order: ``source_record``,
    ``lead``, the model and config classes, the loader's own ``fields``, dtype and device, the
    ``<package>_version`` of each of ``packages``, and ``weights_record``."""
    resolved = resolved_dir(model, revision)
    return {
        **source_record(model, revision, resolved),
        **(lead or {}),
        "model_class": type(net).__name__,
        "config_class": type(config).__name__,
        **fields,
        "dtype": str(torch_dtype).replace("torch.", ""),
        "device": device,
        **{f"{name}_version": package_version(name) for name in packages},
        **weights_record(model, resolved, config),
    }


def check_loading_info(info: dict, ignore=lambda key: False) -> list[str]:
    """A transformers ``output_loading_info`` with missing, unexpected or shape-mismatched weights
    (or loading errors) raises ValueError: a config/weights mismatch is an error, never a warning.
    Unexpected keys for which ``ignore(key)`` is true are allowed and returned (e.g. a ViT
    checkpoint's pooler, which a feature extractor does not use)."""
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    mismatched = sorted(str(k) for k in (info.get("mismatched_keys") or []))
    ignored = [k for k in unexpected if ignore(k)]
    unexpected = [k for k in unexpected if k not in ignored]
    problems = []
    if missing:
        problems.append(f"the weights lack {len(missing)} parameters of the model (e.g. {missing[:3]})")
    if unexpected:
        problems.append(f"{len(unexpected)} checkpoint weights are not used by the model (e.g. {unexpected[:3]})")
    if mismatched:
        problems.append(f"{len(mismatched)} weights have another shape than the model's (e.g. {mismatched[:3]})")
    if info.get("error_msgs"):
        problems.append(f"loading errors: {list(info['error_msgs'])[:3]}")
    if problems:
        raise ValueError("config and weights do not match: " + "; ".join(problems))
    return ignored
