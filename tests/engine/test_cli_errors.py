"""Errors of the study command lines as one line: what a Ray task raised, out of Ray's
wrappers, with its exit code; an output that cannot be reached; malformed YAML; config values of
the wrong type; a full disk while stand-ins are saved. Exit codes: pipelines/engine/cli/cli.py."""

import errno
import pickle
import traceback

import pytest

from pipelines import amplification
from pipelines.engine.cli import cli
from pipelines.engine.storage import io

RESUME = "the same command resumes"


def one_error_line(err: str, ray_logs: bool = False) -> str:
    """The ``error:`` line of stderr: exactly one, and no traceback. ``ray_logs``: a real Ray
    instance's own log records are on stderr too (Ray Data logs an actor's failed start with its
    stack); they are not the command's."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and (ray_logs or "Traceback" not in err), err
    return lines[0]


def ray_data_task_error(raised: BaseException, task: str = "MapBatches(write_part_task)"):
    """What the driver gets when a Ray Data task's function raises ``raised``, built the way Ray
    builds it: a RayTaskError whose text is the task's traceback, and whose ``cause`` is Ray Data's
    UserCodeException, which loses its ``__cause__`` (the original) on its way to the driver."""
    from ray.exceptions import RayTaskError, UserCodeException

    try:
        try:
            raise raised
        except BaseException as exc:
            raise UserCodeException("UDF failed to process a data block.\nFailed to apply UDF transform "
                                    "after 1/1 attempts (total backoff 0.0s).") from exc
    except UserCodeException as wrapper:
        text = traceback.format_exc()
        cause = pickle.loads(pickle.dumps(wrapper))
    assert cause.__cause__ is None  # as in Ray: only the text names the original
    return RayTaskError(task, text, cause, proctitle=f"ray::{task}", pid=4242, ip="10.0.0.1").as_instanceof_cause()


class TaskBroke(Exception):
    pass


def _raise(exc):
    def work():
        raise exc
    return work


# ------------------------------------------------------------------ fast: constructed Ray errors
@pytest.mark.parametrize("raised,code,says", [
    (OSError(errno.ENOSPC, "No space left on device", "/runs/r/annotated_captions/part-7.parquet"), 5,
     "error: No space left on device while writing /runs/r/annotated_captions/part-7.parquet; free space there"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/runs/r/part-8.parquet"), 5,
     "error: Disk quota exceeded while writing /runs/r/part-8.parquet"),
    (ValueError("invalid literal for int() with base 10: 'one'\nsecond line"), 2,
     "error: ValueError: invalid literal for int() with base 10: 'one' (in the Ray task MapBatches(write_part_task))"),
    (io.InputError("cannot read parquet file /d/x.parquet: ArrowInvalid: bad page"), 2,
     "error: InputError: cannot read parquet file /d/x.parquet: ArrowInvalid: bad page"),
    (TaskBroke("the shard reader broke"), 4,
     "error: a Ray task failed: TaskBroke: the shard reader broke (in the Ray task MapBatches(write_part_task))"),
], ids=["enospc", "edquot", "value-error", "input-error", "custom"])
def test_what_a_ray_data_task_raised_is_reported_with_its_own_exit_code(capsys, raised, code, says):
    exc = ray_data_task_error(raised)
    assert type(exc).__name__ == "RayTaskError(UserCodeException)"
    assert cli.exit_code(_raise(exc), output="/runs") == code
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(says), line
    assert "RayTaskError" not in line and "UserCodeException" not in line and "second line" not in line
    assert (RESUME in line or "it resumes from the finished work" in line) == (code in (4, 5))


def test_a_plain_ray_task_keeps_the_original_as_its_cause(capsys):
    """``ray.get`` of a plain task raises RayTaskError(OSError): an OSError without an errno of its
    own; the original is its ``cause``."""
    from ray.exceptions import RayTaskError

    cause = OSError(errno.ENOSPC, "No space left on device", "/runs/r/images/part-1.parquet")
    exc = RayTaskError("write", "Traceback (most recent call last):\nOSError: ...", cause, proctitle="ray::write",
                       pid=1, ip="10.0.0.1").as_instanceof_cause()
    assert isinstance(exc, OSError) and exc.errno is None
    assert cli.exit_code(_raise(exc)) == 5
    assert "No space left on device while writing /runs/r/images/part-1.parquet" in one_error_line(
        capsys.readouterr().err)


def test_a_crashed_worker_is_exit_4_on_one_line(capsys):
    from ray.exceptions import OutOfMemoryError, WorkerCrashedError

    assert cli.exit_code(_raise(WorkerCrashedError()), output="/runs") == 4
    err = capsys.readouterr().err
    line = one_error_line(err)
    assert len(err.strip().splitlines()) == 1
    assert "retries are exhausted (--max-retries): WorkerCrashedError: " in line and RESUME in line
    # Ray's own message, with no task traceback in it, is not read as one ("Suggestions: ...")
    oom = OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node (IP: "
                           "10.0.0.1) was 7.5GB / 8GB.\nSuggestions: reduce the batch size")
    assert cli.exit_code(_raise(oom), output="/runs") == 4
    line = one_error_line(capsys.readouterr().err)
    assert "(--max-retries): OutOfMemoryError: Task was killed due to the node running low on memory." in line


def test_unwrapping_reads_the_nearest_cause_and_names_the_file():
    """A task that re-raised (``raise OSError(...) from exc``, as ``io.write_bytes`` names the file
    pyarrow's error leaves out): the exception nearest to Ray's wrapper is the one reported."""
    try:
        try:
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        except OSError as inner:
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/r/part-2.parquet") from inner
    except OSError as outer:
        raised = outer
    te = cli.task_error(ray_data_task_error(raised))
    assert (te.type_name, te.errno, te.filename, te.task) == ("OSError", errno.ENOSPC, "/runs/r/part-2.parquet",
                                                              "MapBatches(write_part_task)")
    te = cli.task_error(ray_data_task_error(io.InputError("x")))
    assert te.cls is io.InputError and te.message == "x"


def full_disk():
    """A local filesystem whose writes fail as pyarrow's do on a full disk (naming no file), its
    classes built where it is called (in a Ray worker too: fsspec classes do not pickle by value)."""
    import io as pyio

    import fsspec.implementations.local as local
    import pyarrow.fs as pafs

    class Full(pyio.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    class FullDisk(local.LocalFileSystem):
        def open(self, path, mode="rb", **kwargs):
            return Full() if "w" in mode else super().open(path, mode, **kwargs)

    return pafs.PyFileSystem(pafs.FSSpecHandler(FullDisk()))


def test_write_bytes_names_the_file_on_a_full_disk(tmp_path):
    """pyarrow's error for a full disk names no file; ``io.write_bytes`` raises one that does."""
    path = str(tmp_path / "part-1.parquet")
    with pytest.raises(OSError) as err:
        io.write_bytes(full_disk(), path, b"data")
    assert err.value.errno == errno.ENOSPC and err.value.filename == path
    assert cli.report(err.value, "/out") == (5, f"No space left on device while writing {path}; free space there "
                                                "and run the same command again: it resumes from the finished work")


def test_a_full_disk_while_stand_ins_are_saved_is_exit_5_naming_their_directory(capsys, tmp_path):
    """safetensors' SafetensorError says "No space left on device (os error 28)" and names no file:
    exit 5, naming the directory the stand-ins were being written to; its other errors stay bugs."""
    import safetensors.torch
    import torch
    from safetensors import SafetensorError

    def save_standins():
        with io.naming_disk_full(str(tmp_path / "standin_models")):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    assert cli.exit_code(save_standins, output=str(tmp_path)) == 5
    line = one_error_line(capsys.readouterr().err)
    assert f"No space left on device while writing {tmp_path / 'standin_models'};" in line
    assert "it resumes from the finished work" in line
    # without the directory (raised elsewhere): the --output is named
    assert cli.exit_code(_raise(SafetensorError("Error while serializing: I/O error: No space left on device "
                                                "(os error 28)")), output="/runs") == 5
    assert "while writing /runs;" in one_error_line(capsys.readouterr().err)
    with pytest.raises(SafetensorError):   # a real one that is not a full disk keeps its traceback
        cli.exit_code(lambda: safetensors.torch.save_file({"w": torch.zeros(2)}, str(tmp_path / "no" / "dir" / "w")))


# ------------------------------------------------------- fast: outputs, YAML and config values
def test_s3_output_without_credentials_is_one_line_before_any_work(monkeypatch, tmp_path, capsys):
    import s3fs

    from pipelines.engine.stream import runtime

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(runtime, "init_ray", lambda *a, **k: pytest.fail("Ray started before --output was checked"))
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        assert amplification.main(["captions", "--output", "s3://nobucket/x"]) == 2
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --output s3://nobucket/x cannot be reached: NoCredentialsError: ")
    assert "AWS_ACCESS_KEY_ID" in line


def test_hf_output_while_offline_is_one_line_before_any_work(monkeypatch, capsys):
    import huggingface_hub.constants

    from pipelines.engine.stream import runtime

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(runtime, "init_ray", lambda *a, **k: pytest.fail("Ray started before --output was checked"))
    assert amplification.main(["captions", "--output", "hf://datasets/someone/results/out"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --output hf://datasets/someone/results/out cannot be reached: OfflineModeIsEnabled")


@pytest.mark.parametrize("flag,text,says", [
    ("--config", "selection:\n  seed: [1, 2\nmodels: {a: b\n",
     "is not valid YAML: expected ',' or ']', but got ':' at line 3, column 7"),
    ("--occupations-file", "- nurse\n- {name: ceo\n", "is not valid YAML: expected ',' or '}'"),
], ids=["config", "occupations-file"])
def test_malformed_yaml_is_one_line_naming_the_file_and_line(monkeypatch, tmp_path, capsys, flag, text, says):
    from pipelines.engine.stream import runtime

    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    monkeypatch.setattr(runtime, "init_ray", lambda *a, **k: pytest.fail("Ray started before the YAML was read"))
    assert amplification.main(["captions", "--output", str(tmp_path / "out"), flag, str(bad)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(bad) in line and says in line, line
    assert not (tmp_path / "out").exists()


def test_a_config_value_of_the_wrong_type_fails_before_any_work(monkeypatch, tmp_path, capsys):
    """``selection: {seed: one}`` once failed inside a Ray task (exit 4); it is named at once."""
    from pipelines.engine.stream import runtime

    cfg = tmp_path / "c.yaml"
    cfg.write_text("selection:\n  seed: one\n")
    monkeypatch.setattr(runtime, "init_ray", lambda *a, **k: pytest.fail("Ray started before the config was checked"))
    assert amplification.main(["captions", "--output", str(tmp_path / "out"), "--config", str(cfg)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: {cfg}: selection.seed must be a number like the preset's 0, got 'one'"
    assert not (tmp_path / "out").exists()


def test_config_types_are_checked_against_the_preset(tmp_path):
    from pipelines.engine.cli.config import load_config

    def load(text):
        (tmp_path / "c.yaml").write_text(text)
        return load_config(tmp_path / "c.yaml")

    # numbers for numbers (an int for a float and back), null anywhere, lists and mappings the study's
    cfg = load("selection: {sample_size: 20, seed: null}\nexecution: {gpus_per_model_actor: 0.5, "
               "max_error_rate: 1, stages: {names: {actors: 2}}}\nprompts: ['{occupation}']\n"
               "models: {sbert_revision: 0123abc, sbert_precision: 16}\n")
    assert cfg["selection"]["sample_size"] == 20 and cfg["execution"]["gpus_per_model_actor"] == 0.5
    assert cfg["models"]["sbert_precision"] == 16   # text may be given as a number (gep's tol: 0.01); the study checks it
    for text, says in [
        ("selection: {sample_size: '500'}", "selection.sample_size must be a number like the preset's 500, got '500'"),
        ("gender_indicators: {ner_prefilter: 1}", "gender_indicators.ner_prefilter must be true or false"),
        ("fetch: {resize_mode: no}", "fetch.resize_mode must be text like the preset's 'keep_ratio', got False "
                                     "(quote it: YAML reads an unquoted no, yes, off or on as false or true)"),
        ("generation: {nsfw_check: {exclude: maybe}}", "generation.nsfw_check.exclude must be true or false"),
    ]:
        with pytest.raises(ValueError, match="c.yaml: ") as err:
            load(text)
        assert says in str(err.value), str(err.value)


# ------------------------------------------------------------- slow: a real local Ray instance
def test_errors_raised_inside_ray_data_tasks_reach_the_console_as_raised(ray_local, capsys, tmp_path):
    """Ray Data tasks and an actor raising, on a real local Ray instance: the console names what
    they raised, with its exit code (a full disk 5, a ValueError 2, anything else 4)."""
    from operators.support.models import ModelLoadError

    ray = ray_local
    part = str(tmp_path / "parts" / "part-3.parquet")

    class TaskBroke(Exception):   # defined here: Ray pickles it by value into the worker
        pass

    def task(kind):
        def fn(batch):
            if kind == "enospc":
                raise OSError(errno.ENOSPC, "No space left on device", "/runs/r/annotated_captions/part-1.parquet")
            if kind == "write":
                io.write_bytes(full_disk(), part, b"parquet bytes")
            if kind == "value":
                raise ValueError("invalid literal for int() with base 10: 'one'")
            raise TaskBroke("the shard reader broke")
        return fn

    class Model:
        def __init__(self):
            raise ModelLoadError("cannot load the model xx/missing: not in the cache")

        def __call__(self, batch):
            return batch

    def run(kind):
        if kind == "actor":
            return lambda: ray.data.range(4).map_batches(Model, concurrency=1).materialize()
        return lambda: ray.data.range(4).map_batches(task(kind)).materialize()

    for kind, code, says in [
        ("enospc", 5, "error: No space left on device while writing /runs/r/annotated_captions/part-1.parquet; "),
        ("write", 5, f"error: No space left on device while writing {part}; "),
        ("value", 2, "error: ValueError: invalid literal for int() with base 10: 'one' (in the Ray task "),
        ("custom", 4, "error: a Ray task failed: TaskBroke: the shard reader broke (in the Ray task "),
        ("actor", 2, "error: ModelLoadError: cannot load the model xx/missing: not in the cache (in the Ray task "),
    ]:
        assert cli.exit_code(run(kind), output=str(tmp_path)) == code, kind
        line = one_error_line(capsys.readouterr().err, ray_logs=True)
        assert line.startswith(says), (kind, line)
        assert "RayTaskError" not in line and "UserCodeException" not in line and "SystemException" not in line
        assert (RESUME in line or "it resumes from the finished work" in line) == (code in (4, 5)), line


def test_a_full_disk_while_stand_ins_are_built_is_exit_5(ray_local, monkeypatch, tmp_path, capsys):
    """The first stand-in's weights hit a full disk (safetensors' own error, naming no file): exit 5
    on one line naming the run's stand-in directory, not a traceback."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "out"
    assert amplification.main(["run", "--standin-models", "--output", str(out), "--run-id", "r",
                               "--occupations", "nurse", "--sample-size", "2", "--nn-k", "2",
                               "--images-per-prompt", "1", "--caption-images", "0", "--steps", "2"]) == 5
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: No space left on device while writing {out / 'r' / 'standin_models'}; ")
