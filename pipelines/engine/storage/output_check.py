"""Checking, before a run starts, that its output location can take the results."""

from __future__ import annotations

import posixpath
import uuid

import pyarrow.fs as pafs

from pipelines.engine.storage import io
from pipelines.engine.storage.io import InputError, plain


def check_output(uri: str, flag: str = "--output") -> None:
    """Fail now, with one line, when ``uri`` cannot take the results: an existing file, a path
    under a file, or a place this process cannot create or write files in. Checked by writing
    and deleting a small probe file (permission bits alone say nothing for root or object stores),
    before any model loads or data is read."""
    try:
        fs, path = io.output_fs(uri)
    except Exception as exc:  # unknown protocol, missing driver, bad URI
        raise InputError(f"{flag} {uri}: {type(exc).__name__}: {exc}") from None
    try:
        _probe_output(fs, path, uri, flag)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a store's own error: no credentials, offline, unreachable
        raise InputError(output_error(uri, exc, flag)) from None


def output_error(uri: str, exc: BaseException, flag: str = "--output") -> str:
    """One line for a failure to reach the output ``uri`` that is not an OSError: botocore's
    NoCredentialsError, huggingface_hub's OfflineModeIsEnabled, a connection error."""
    first = (plain(str(exc)).strip().splitlines() or [""])[0]
    name = type(exc).__name__
    hint = ""
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        hint = (" (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance "
                "role gives credentials)")
    elif uri.startswith("hf://"):
        hint = (" (writing to the Hugging Face Hub needs the network and a token with write access in HF_TOKEN; "
                "or write locally and upload the run directory)")
    return f"{flag} {uri} cannot be reached: {name}: {first}{hint}"


def _probe_output(fs: pafs.FileSystem, path: str, uri: str, flag: str) -> None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        raise InputError(f"{flag} {uri} is an existing file; it must be a directory (it is created if missing)")
    probe = f"{path}/.t2i-write-probe-{uuid.uuid4().hex[:12]}"
    created, parent = [], path  # directories this check makes, removed again: it leaves nothing behind
    while parent and fs.get_file_info(parent).type == pafs.FileType.NotFound:
        created.append(parent)
        up = posixpath.dirname(parent)
        parent = up if up != parent else ""
    try:
        if parent and fs.get_file_info(parent).type == pafs.FileType.File:
            raise NotADirectoryError(f"{parent} is a file")
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(probe) as fh:
            fh.write(b"")
        fs.delete_file(probe)
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{flag} {uri} is not a writable directory ({reason})") from None
    for d in created:  # best effort: on object stores the "directory" went with the probe
        try:
            if fs.get_file_info(d).type == pafs.FileType.Directory:
                fs.delete_dir(d)
        except (OSError, ValueError):
            pass
