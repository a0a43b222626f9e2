"""Ray glue: connect or start Ray, and turn operators into ``map_batches`` stages."""

from __future__ import annotations

import logging
import os

import pyarrow as pa

from operators.base import Resources, StreamStage

log = logging.getLogger(__name__)


def init_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool = True, actor_cpus: float = 0):
    """Connect to a running cluster (``--ray-address``, ``RAY_ADDRESS``, or the one ``ray submit``
    / ``ray job submit`` started this driver in), else start a local Ray instance.

    A local instance gets at least ``actor_cpus + 2`` logical CPUs: actor pools hold their CPUs
    for the whole run, and the scan tasks need CPUs of their own, so on a 2-core laptop two
    1-CPU actor pools would otherwise leave no CPU for reading and the run would never start.
    """
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=not quiet)
    else:
        try:  # a cluster started on this node: `ray up` / `ray start`, where `ray submit` runs us
            ray.init(address="auto", log_to_driver=not quiet)
        except ConnectionError:
            if num_cpus is None:
                num_cpus = max(os.cpu_count() or 1, int(actor_cpus + 0.999) + 2)
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=not quiet)
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = not quiet
    ctx.print_on_execution_start = not quiet
    return ray


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
    if res.actors:
        from ray.data import ActorPoolStrategy

        return ds.map_batches(
            StreamStage,
            fn_constructor_args=(factory, kwargs, schema),
            compute=ActorPoolStrategy(size=res.actors),
            **common,
        )
    return ds.map_batches(_run_in_task, fn_args=(factory, kwargs, schema), **common)


def _run_in_task(batch: pa.Table, factory, kwargs: dict, schema: pa.Schema) -> pa.Table:
    return StreamStage(factory, kwargs, schema)(batch)


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
    if res.actors:
        from ray.data import ActorPoolStrategy

        return ds.map_batches(factory, fn_constructor_kwargs=kwargs, compute=ActorPoolStrategy(size=res.actors), **common)
    return ds.map_batches(_apply_in_task, fn_args=(factory, kwargs), **common)


def _apply_in_task(batch: pa.Table, factory, kwargs: dict) -> pa.Table:
    return factory(**kwargs)(batch)


def from_table(ray, table: pa.Table, rows_per_block: int):
    """A Ray dataset over ``table`` in blocks of ``rows_per_block`` rows, so stages run in parallel."""
    step = max(1, rows_per_block)
    parts = [table.slice(i, step) for i in range(0, table.num_rows, step)] or [table]
    return ray.data.from_arrow(parts)
