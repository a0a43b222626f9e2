"""T over k counted images (paper 002, section 4): walk each occupation's captions in order until
k of their images are counted.

Section 4 samples "500 training examples" per occupation and classifies their images; every
Training value of Tables 6 and 7 is a multiple of 1/500, so the paper's T is the share of 500
counted images (exactly one face, CLIP p >= 0.9). Which captions' images count is known only
after fetching and classifying them, so the walk goes in rounds:

1. fetch and classify the first k rows of every group of the pool (``selection.pool``), or the
   first ``first_round`` x k rows of every walked group (an option: fewer rounds where the yield
   is known to be low; each round starts the image side's actors and loads their models again);
2. for each walked group, count its counted images; a group short of k extends its prefix by the
   shortfall over the yield observed so far (plus a 10% margin, a project choice; twice as far
   when nothing counted yet), up to the end of its pool;
3. when a group's pool ends short, the pool is re-selected from the annotated captions at least
   twice as large (a larger bottom-k extends a smaller one, so earlier rows and results stay
   valid), up to ``max_walk_factor`` x k captions per group;
4. stop when every walked group has k counted images or can go no further; ``selection.walk``
   then takes each group's rows up to and including its k-th counted image.

The result depends only on the captions' order and each URL's result (checkpointed per URL), so
it is the same under any batching, any number of rounds and after a kill and resume: a resumed
run walks again over results it does not fetch again.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engine.stream.progress import Phase
from pipelines.studies.amplification import images as image_side
from pipelines.studies.amplification.selection import SelectionConfig, walk
from schemas import images as I
from schemas.captions import OCCUPATION, URL
from schemas.subsets import PROMPT_ID, RANK, SUBSET, TRAINING_SUBSETS

MARGIN = 1.1   # project choice: each round fetches 10% more captions than the observed yield predicts


@dataclass
class Walk:
    """What the walk produced: the subsets, every fetched URL's result, the phase, the budgets of
    the last round (they saw every URL once) and the per-group walk record."""

    subsets: pa.Table
    url_results: pa.Table
    phase: Phase
    budgets: list
    groups: pa.Table
    rounds: int
    pool_factor: float
    reselections: list = field(default_factory=list)


_SEP = "\x1f"


def _group_key(table: pa.Table) -> pa.Array:
    """One string per row naming its group (occupation, subset, prompt_id), vectorised."""
    pid = pc.cast(pc.fill_null(table.column(PROMPT_ID), 0), pa.string())
    return pc.binary_join_element_wise(table.column(OCCUPATION), table.column(SUBSET), pid, _SEP).combine_chunks() \
        if table.num_rows else pa.array([], pa.string())


def _key_tuple(key: str) -> tuple:
    occ, subset, pid = key.split(_SEP)
    return occ, subset, int(pid)


def _keys(table: pa.Table) -> list[tuple]:
    """The distinct groups of ``table``, in order."""
    return [_key_tuple(k) for k in pc.unique(_group_key(table)).to_pylist()]


def url_counted(url_results: pa.Table) -> pa.Table:
    """URL -> whether its image is counted (fetched, exactly one face, CLIP decided)."""
    return pa.table({URL: url_results.column(URL), I.COUNTED: pa.array(image_side._all_ok(url_results, I.FETCH_STATUS))})


def counted_of(rows: pa.Table, counted_urls: pa.Table) -> np.ndarray:
    """One boolean per row of ``rows``: its URL's image is counted (False without a URL or result)."""
    idx = pc.index_in(rows.column(URL), value_set=counted_urls.column(URL))
    hit = pc.take(counted_urls.column(I.COUNTED), pc.fill_null(idx, 0)) if counted_urls.num_rows else None
    if hit is None:
        return np.zeros(rows.num_rows, bool)
    return np.asarray(pc.and_(pc.is_valid(idx), pc.fill_null(hit, False)).to_numpy(zero_copy_only=False))


def walk_training(ray, rd, pool: pa.Table, cfg: SelectionConfig, st, budgets: list, reselect,
                  max_walk_factor: float = 20.0, echo=print, say=print, fetch=None,
                  first_round: float = 1.0) -> Walk:
    """Walk ``pool`` (``selection.pool`` at ``cfg.pool_factor``) to k counted images per walked
    group, fetching and classifying in rounds. ``reselect(factor)`` returns the pool at a larger
    factor; ``budgets`` are the training-image error budgets (a fresh copy per round). The first
    round fetches ``first_round`` x k captions of each walked group (k of the others).
    ``fetch(rows, budgets)`` -> (one result row per distinct URL of ``rows``, Phase) is the image
    side (default: ``images.training_images`` on Ray, checkpointed in ``rd``); the walk depends
    on nothing else, which is what makes it the same under any batching and after a resume."""
    if fetch is None:
        def fetch(rows, round_budgets):
            return image_side.training_images(ray, rows, st, run=rd, budgets=round_budgets, echo=echo)
    if not max_walk_factor >= 1:
        raise ValueError(f"max_walk_factor must be >= 1 (k x max_walk_factor captions at most), not {max_walk_factor!r}")
    if not 1 <= first_round <= max_walk_factor:
        raise ValueError(f"the walk's first round must fetch 1 to max_walk_factor ({max_walk_factor:g}) x k captions, "
                         f"not {first_round!r} x k")
    factor = cfg.pool_factor
    pool = _sorted(pool)
    walked = {key: cfg.walked(key[1]) for key in _keys(pool)}
    k_of = {key: cfg.k(key[1]) for key in walked}
    cap = {key: math.ceil(k_of[key] * max_walk_factor) for key in walked}
    lengths = _lengths(pool)                    # rows of each group's pool (again after a re-selection)
    # rows of each group fetched so far (by rank): a first round past k stops at the end of the pool
    position = {key: max(k, min(math.ceil(k * first_round), cap[key], lengths.get(key, 0))) if walked[key] else k
                for key, k in k_of.items()}
    total = Phase("training images", "URLs", 0)
    stats, reselections, rounds = [], [], 0
    while True:
        rounds += 1
        prefix = _prefix(pool, position)
        round_budgets = [copy.deepcopy(b) for b in budgets]
        url_results, phase = fetch(prefix, round_budgets)
        total.total, total.processed = phase.total, total.processed + phase.processed
        total.seconds += phase.seconds
        if phase.ray_stats:
            stats.append(phase.ray_stats)
        counted = counted_of(prefix, url_counted(url_results))
        got = _counted_per_group(prefix, counted)
        grow, short_pool = {}, {}
        for key, is_walked in walked.items():
            if not is_walked:
                continue
            k, pos, c = k_of[key], position[key], got.get(key, 0)
            if c >= k or pos >= cap[key]:
                continue
            # the shortfall over the yield so far, with a margin; nothing counted yet: twice as far
            step = pos if c == 0 else math.ceil((k - c) * pos / c * MARGIN)
            want = min(pos + max(step, 1), cap[key])
            length = lengths.get(key, 0)
            if want > length and length >= math.ceil(k * factor):
                short_pool[key] = want          # the pool ends before, the annotated captions may not
            else:
                grow[key] = min(want, length)
        if short_pool and factor < max_walk_factor:
            factor = min(max_walk_factor, max(factor * 2, max(w / k_of[key] for key, w in short_pool.items())))
            say(f"training walk, round {rounds}: {len(short_pool)} group(s) short of counted images at the end "
                f"of the pool; re-selecting a pool of {factor:g} x k candidates")
            pool = _sorted(reselect(factor))
            reselections.append({"round": rounds, "pool_factor": factor, "groups": len(short_pool)})
            lengths = _lengths(pool)
        for key, want in short_pool.items():
            grow[key] = min(want, lengths.get(key, 0))
        grow = {key: p for key, p in grow.items() if p > position[key]}
        if not grow:
            break
        say(f"training walk, round {rounds}: {len(grow)} group(s) short of k counted images; fetching "
            f"{sum(p - position[key] for key, p in grow.items()):,} more captions' images")
        position.update(grow)
    subsets, groups = walk(prefix, cfg, counted)
    total.reused = total.total - total.processed
    total.ray_stats = "\n\n".join(stats)
    return Walk(subsets, url_results, total, round_budgets, groups, rounds, factor, reselections)


def _sorted(pool: pa.Table) -> pa.Table:
    return pool.sort_by([(OCCUPATION, "ascending"), (SUBSET, "ascending"), (PROMPT_ID, "ascending"),
                         (RANK, "ascending")])


def _counts(keys: pa.Array) -> dict:
    """group -> rows, from ``_group_key`` strings."""
    if not len(keys):
        return {}
    vc = pc.value_counts(keys)
    return {_key_tuple(k): int(c) for k, c in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist())}


def _lengths(pool: pa.Table) -> dict:
    return _counts(_group_key(pool))


def _counted_per_group(rows: pa.Table, counted: np.ndarray) -> dict:
    return _counts(_group_key(rows).filter(pa.array(np.asarray(counted, bool))))


def _prefix(pool: pa.Table, position: dict) -> pa.Table:
    """The pool's rows with rank <= their group's position (groups not positioned: none)."""
    keys = _group_key(pool)
    names = pa.array([_SEP.join([o, s, str(p)]) for o, s, p in position], pa.string())
    limits = pa.array([position[k] for k in position], pa.int64())
    limit = pc.fill_null(pc.take(limits, pc.index_in(keys, value_set=names)), 0)
    return pool.filter(pc.less_equal(pc.cast(pool.column(RANK), pa.int64()), limit)).cast(TRAINING_SUBSETS)
