"""Ray glue: connect or start Ray, and turn operators into ``map_batches`` stages."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings

import pyarrow as pa

from operators.base import Resources, StreamStage, build_operator, gc_paused, settle_heap
from pipelines.engine.run.gpus import NODE_TIERS

log = logging.getLogger(__name__)


def local_large_gpus() -> dict:
    """``resources={"large_gpu": n, "xlarge_gpu": m}`` for a local Ray instance on a machine whose n
    GPUs each hold a model too large for the cluster's ordinary GPU node (gpus.NODE_TIERS: the
    large tier's card or more, an 80 GB workstation runs FLUX.1 locally) and m of them one for the
    80 GB tier (Qwen-Image, HiDream-I1); {} otherwise."""
    try:
        import torch  # deferred: torch

        if not torch.cuda.is_available():
            return {}
        memory = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
        out = {t.resource: float(sum(m >= 0.9 * t.memory for m in memory)) for t in NODE_TIERS if t.resource}
        out = {k: v for k, v in out.items() if v}
        return {"resources": out} if out else {}
    except Exception:  # noqa: BLE001 -- no usable CUDA: no large GPU
        return {}


def init_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool = True, actor_cpus: float = 0,
             progress: bool = True):
    """Connect to a running cluster (``--ray-address``, ``RAY_ADDRESS``, or the one ``ray submit``
    / ``ray job submit`` started this driver in), else start a local Ray instance. The address
    ``local`` always starts a new local instance.

    A local instance gets at least ``actor_cpus + 2`` logical CPUs: actor pools hold their CPUs
    for the whole run, and the scan tasks need CPUs of their own, so on a 2-core laptop two
    1-CPU actor pools would otherwise leave no CPU for reading and the run would never start.
    """
    import ray  # deferred: ray

    if quiet:
        quiet_ray_logs()
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address and address != "local":
            ray.init(address=address, log_to_driver=not quiet)
            print(f"connected to the Ray cluster at {address}")
        else:
            try:  # the cluster `ray start` (run by `ray up`) recorded on this node, where `ray submit` runs us
                if address == "local" or not _node_cluster_address():
                    raise ConnectionError
                ray.init(address="auto", log_to_driver=not quiet)
                print("connected to the Ray cluster running on this node")
            except ConnectionError:
                if num_cpus is None:
                    num_cpus = max(os.cpu_count() or 1, int(actor_cpus + 0.999) + 2)
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=not quiet,
                         **local_large_gpus())
    from ray.data import DataContext  # deferred: ray

    if quiet:   # again: Ray Data sets up its own log handlers when it is imported
        quiet_ray_logs()
    ctx = DataContext.get_current()
    # Ray Data's progress bars on a terminal; off one (a log file, CI) its logged progress is a
    # block of lines per operator, so the study's own line per phase every 10 s stands in (drain)
    ctx.enable_progress_bars = progress and on_terminal()
    ctx.print_on_execution_start = not quiet
    return ray


def on_terminal() -> bool:
    """Whether progress goes to a terminal (stderr is a tty), where progress bars draw."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress_echo(no_progress: bool):
    """Where a study's own progress lines go: nowhere with --no-progress or on a terminal (Ray
    Data's progress bars are there), else print (one line per phase every few seconds)."""
    return (lambda *a, **k: None) if no_progress or on_terminal() else print


# Ray's log lines a study's console leaves out unless --verbose: informational lines that read like
# warnings (a local instance's token note, "progress bars disabled" under --no-progress), the
# per-dataset "execution finished" lines (the study prints its own phase lines and run summary) and
# "Started a local Ray instance" (the study's next line says where its model actors run)
QUIET_MESSAGES = ("Token authentication is enabled", "Progress bars disabled", "execution finished in",
                  "Started a local Ray instance")


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(m in message for m in QUIET_MESSAGES)


def quiet_ray_logs() -> None:
    """Drop ``QUIET_MESSAGES`` from Ray's Python loggers (their handlers, so records passed on from
    child loggers are filtered too). Warnings and errors of any other kind still show."""
    quiet = _QuietFilter()
    for name in ("ray", "ray.data", "ray.data._internal.execution.streaming_executor"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietFilter) for f in logger.filters):
            logger.addFilter(quiet)
        for handler in logger.handlers:
            if not any(isinstance(f, _QuietFilter) for f in handler.filters):
                handler.addFilter(quiet)


# Lines the Ray driver's C++ core worker writes straight to the process's stderr that a study's
# console leaves out unless --verbose. Ray Data always hands an actor pool's map function to its
# actors as an object-store reference (ActorPoolMapOperator._map_transformer_ref) and makes those
# actors restartable (max_restarts=-1); Ray then logs, at error level, that a restarted actor could
# lose its constructor arguments (ray-project/ray#53727). Ray Data holds the reference for the
# pool's lifetime, so a restart finds it; giving up restarts to silence the line would cost the
# fault tolerance a cluster run needs. Nothing else is filtered.
NATIVE_QUIET_MESSAGES = ("has constructor arguments in the object store and max_restarts > 0",)


@contextlib.contextmanager
def native_stderr_filtered(messages: tuple[str, ...] = NATIVE_QUIET_MESSAGES):
    """Inside the block, lines written to file descriptor 2 (by Python or native code) that contain
    one of ``messages`` are dropped; all others pass through unchanged. Enter it after Ray has
    started its processes (they keep the real stderr). A no-op where stderr has no descriptor."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):
        yield
        return
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    needles = [m.encode() for m in messages]

    def pump() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            pending = b""
            while True:
                try:
                    chunk = pipe.read(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                out = b"".join(line + b"\n" for line in lines if not any(n in line for n in needles))
                if out:
                    os.write(saved, out)
            if pending and not any(n in pending for n in needles):
                os.write(saved, pending)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)        # the pipe's last writer is gone: the pump reads to its end and stops
        thread.join(timeout=5)
        os.close(saved)


def is_local_instance() -> bool:
    """Whether the Ray instance this driver is connected to was started by this process (a local
    instance: no autoscaler, so the resources it has are all it will ever have), as opposed to a
    cluster it connected to."""
    try:
        from ray._private import worker  # deferred: ray

        node = worker._global_node
        return bool(node is not None and node.head and not getattr(node, "_connect_only", False))
    except Exception:  # a Ray without these internals: assume a cluster (do not refuse)
        return False


def _node_cluster_address() -> str | None:
    """The address of the cluster ``ray start`` recorded on this node (its address file), or None.
    Unlike ``ray.init(address="auto")`` alone, this does not attach to some other Ray instance
    that merely runs on the machine (another user's job, a test session)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address  # deferred: ray

        return canonicalize_bootstrap_address(None)
    except Exception:  # a Ray without this helper: fall back to auto-detection
        return "auto"


MAX_RETRIES = 3  # set per run by configure(); the default of the execution config


def configure(max_retries: int) -> None:
    """Fault tolerance of every stage built afterwards: a task whose worker dies is retried, and a
    crashed actor is restarted (its in-flight batch retried), at most ``max_retries`` times.
    Exceptions raised by the stage code itself are not retried: they are bugs or bad input, and
    fail the job with their message."""
    global MAX_RETRIES
    if max_retries < 0:
        raise ValueError("--max-retries must be >= 0")
    MAX_RETRIES = int(max_retries)
    from ray.data import DataContext  # deferred: ray

    ctx = DataContext.get_current()
    if hasattr(ctx, "max_consecutive_actor_init_deaths"):  # actors dying while loading their model
        ctx.max_consecutive_actor_init_deaths = MAX_RETRIES


def task_retries(max_retries: int | None = None) -> dict:
    return {"max_retries": MAX_RETRIES if max_retries is None else int(max_retries)}


def actor_retries(max_retries: int | None = None) -> dict:
    n = MAX_RETRIES if max_retries is None else int(max_retries)
    return {"max_restarts": n, "max_task_retries": n}


def map_batches(ds, fn, retries: dict, **kwargs):
    """``ds.map_batches`` with bounded retries. Ray 2.60 takes retry limits only through its
    (deprecated, still working) generic remote-arguments path; its deprecation warning is
    silenced here, once, rather than at every stage."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return ds.map_batches(fn, **kwargs, **retries)


def stage(ds, factory, kwargs: dict, schema: pa.Schema, resources: Resources | None = None):
    """Apply operator ``factory(**kwargs)`` to every batch of ``ds`` as one streaming stage.

    Tally rows pass around the operator (``StreamStage``). Stages with ``resources.actors`` run
    in an actor pool that loads the operator (and its model) once per actor; the others run as
    tasks that build it per task, which is cheap for vectorised CPU stages.
    """
    res = resources or getattr(factory, "resources", Resources())
    common = dict(
        batch_format="pyarrow",
        batch_size=res.batch_size,
        num_cpus=res.num_cpus,
        zero_copy_batch=True,
    )
    if res.num_gpus:
        common["num_gpus"] = res.num_gpus
    if res.resources:   # custom Ray resources, e.g. {"large_gpu": 1} (pipelines/engine/run/gpus.py)
        common["resources"] = dict(res.resources)
    if res.actors:
        return map_batches(ds, built_with_gc_paused(StreamStage), actor_retries(),
                           fn_constructor_args=(factory, kwargs, schema),
                           compute=actor_pool(res.actors), **common)
    return map_batches(ds, _run_in_task, task_retries(), fn_args=(factory, kwargs, schema), **common)


def pool_max(actors: int | tuple[int, int]) -> int:
    """The most actors a pool (``Resources.actors``) holds."""
    return int(actors[1]) if isinstance(actors, (tuple, list)) else int(actors)


def local_cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not Linux
        return max(1, os.cpu_count() or 1)


def actor_pool(actors: int | tuple[int, int]):
    """Ray Data's actor pool for ``Resources.actors``: n actors, or (min, max), a pool that grows
    from min to max actors while inputs queue (an autoscaling cluster adds the nodes)."""
    from ray.data import ActorPoolStrategy  # deferred: ray

    if isinstance(actors, (tuple, list)):
        return ActorPoolStrategy(min_size=int(actors[0]), max_size=int(actors[1]))
    return ActorPoolStrategy(size=int(actors))


def _run_in_task(batch: pa.Table, factory, kwargs: dict, schema: pa.Schema) -> pa.Table:
    out = StreamStage(factory, kwargs, schema)(batch)
    settle_task_worker()
    return out


_worker_settled = [False]


def settle_task_worker() -> None:
    """After the first task a worker process runs: its operator's libraries are imported by then
    (under ``gc_paused``), and the operator is let go; settle the heap once (``settle_heap``), so
    that the libraries are walked once, not three times once the collector is back on, and never
    again. Later tasks build their operators as before; what each leaves is young and cheap."""
    if not _worker_settled[0]:
        _worker_settled[0] = True
        settle_heap()


def map_stage(ds, factory, kwargs: dict, resources: Resources | None = None):
    """Apply operator ``factory(**kwargs)`` to every batch of ``ds``: for image stages, which never
    drop rows (they write status columns), so no tally rows travel with them.

    Stages with ``resources.actors`` run in an actor pool (model loaded once per actor), the
    others as tasks.
    """
    res = resources or getattr(factory, "resources", Resources())
    common = dict(batch_format="pyarrow", batch_size=res.batch_size, num_cpus=res.num_cpus, zero_copy_batch=True)
    if res.num_gpus:
        common["num_gpus"] = res.num_gpus
    if res.resources:   # custom Ray resources, e.g. {"large_gpu": 1} (pipelines/engine/run/gpus.py)
        common["resources"] = dict(res.resources)
    if res.actors:
        return map_batches(ds, built_with_gc_paused(factory), actor_retries(), fn_constructor_kwargs=kwargs,
                           compute=actor_pool(res.actors), **common)
    return map_batches(ds, _apply_in_task, task_retries(), fn_args=(factory, kwargs), **common)


def built_with_gc_paused(cls: type) -> type:
    """``cls`` as Ray Data constructs it in each actor: built under ``operators.base.gc_paused``
    (its libraries' imports and its model's loading without the collector's full passes), then
    the heap settled (``operators.base.settle_heap``: an actor keeps its operator for its whole
    life), under the same name, which is the stage's name in Ray Data's progress bars and
    statistics."""
    def __init__(self, *args, **kwargs):
        with gc_paused():
            cls.__init__(self, *args, **kwargs)
        settle_heap()

    return type(cls.__name__, (cls,), {"__init__": __init__, "__doc__": cls.__doc__})


def _apply_in_task(batch: pa.Table, factory, kwargs: dict) -> pa.Table:
    out = build_operator(factory, kwargs)(batch)
    settle_task_worker()
    return out


def from_table(ray, table: pa.Table, rows_per_block: int):
    """A Ray dataset over ``table`` in blocks of ``rows_per_block`` rows, so stages run in parallel."""
    return from_tables(ray, [table], rows_per_block)


def from_tables(ray, tables: list[pa.Table], rows_per_block: int):
    """A Ray dataset over ``tables`` one after the other, each in blocks of ``rows_per_block`` rows
    (a block never holds rows of two tables)."""
    step = max(1, rows_per_block)
    parts = [t.slice(i, step) for t in tables for i in range(0, t.num_rows, step)] or list(tables[:1])
    return ray.data.from_arrow(parts)
