"""The caption stream's resources. SBERT's actor pool when --embed-actors is not given: the
cores of a local instance, a growing pool on a cluster, one actor with a GPU; a flag or the configuration
file wins. A small input is scanned in several fragments."""

import dataclasses
import types

import pytest

from operators.base import Resources
from operators.text_prompt_similarity import PromptSimilarity
from pipelines import amplification
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.stream import runtime, stages
from pipelines.studies.amplification import caption_settings, caption_stages, captions


def parsed(*flags):
    args = amplification.build_parser().parse_args(["captions", "--output", "/tmp/unused", *flags])
    return args, caption_settings.settings(args)


class FakeCluster:
    def cluster_resources(self):
        return {"CPU": 96.0, "GPU": 8.0}


def test_flag_wins():
    args, st = parsed("--embed-actors", "3")
    opts = RunOptions.from_args(args)
    assert caption_stages.embed_actors(opts, st) == 3
    assert caption_stages.embed_actors(opts, st, FakeCluster()) == 3


def test_local_instance_uses_its_cores(monkeypatch):
    monkeypatch.setattr(runtime, "local_cores", lambda: 6)
    monkeypatch.setattr(runtime, "is_local_instance", lambda: True)
    args, st = parsed()
    opts = RunOptions.from_args(args)
    assert args.embed_actors is None
    assert caption_stages.embed_actors(opts, st) == 6              # before Ray starts: sizes the local instance
    assert caption_stages.embed_actors(opts, st, FakeCluster()) == 6
    small = types.SimpleNamespace(cluster_resources=lambda: {"CPU": 4.0})   # e.g. --num-cpus 4 on a 6-core machine
    assert caption_stages.embed_actors(opts, st, small) == 4 - args.ner_actors - 1   # a CPU stays free for the tasks
    tiny = types.SimpleNamespace(cluster_resources=lambda: {"CPU": 2.0})
    assert caption_stages.embed_actors(opts, st, tiny) == 1
    assert captions.CaptionStudy().actor_cpus(opts, st) == 6 + args.ner_actors


def test_cluster_pool_grows_to_its_cpus(monkeypatch):
    monkeypatch.setattr(runtime, "is_local_instance", lambda: False)
    args, st = parsed()
    opts = RunOptions.from_args(args)
    assert caption_stages.embed_actors(opts, st, FakeCluster()) == (1, 96 - args.ner_actors - 1)
    no_names, st2 = parsed("--no-names")
    assert caption_stages.embed_actors(RunOptions.from_args(no_names), st2, FakeCluster()) == (1, 95)


def test_gpu_actor_is_one():
    args, st = parsed("--embed-gpus", "1")
    opts = RunOptions.from_args(args)
    assert caption_stages.embed_actors(opts, st) == 1


def test_configuration_file_wins_over_auto(monkeypatch):
    monkeypatch.setattr(runtime, "is_local_instance", lambda: False)
    args, st = parsed()
    opts = RunOptions.from_args(args)
    st = dataclasses.replace(st, execution=dict(st.execution, stages={PromptSimilarity.stage_name: {"actors": [2, 5]}}))
    assert caption_stages.embed_actors(opts, st, FakeCluster()) == (2, 5)


def test_pool_sizes_and_strategies():
    assert stages.pool_size(0) == 1 and stages.pool_size([0, 3]) == (1, 3) and stages.pool_size((4, 2)) == (4, 4)
    with pytest.raises(ValueError, match="min, max"):
        stages.pool_size([1, 2, 3])
    fixed, growing = runtime.actor_pool(4), runtime.actor_pool((1, 8))
    assert (fixed.min_size, fixed.max_size) == (4, 4)
    assert (growing.min_size, growing.max_size) == (1, 8)
    assert runtime.pool_max((1, 8)) == 8 and runtime.pool_max(3) == 3


def test_configure_keeps_a_growing_pool():
    from operators.base import Stage

    class Op:
        stage_name = "op"
        resources = Resources(actors=1)

        def __call__(self, batch):
            return batch

    (s,) = stages.configure([Stage(Op, {})], {"op": {"actors": [1, 4]}})
    assert s.declared().actors == (1, 4)


def test_small_input_is_scanned_in_several_fragments():
    from helpers import REPO_ROOT

    from pipelines.engine.storage.inputs import resolve_parquet_inputs
    from pipelines.engine.stream import scan

    args, st = parsed()
    configured = st.execution["scan_fragment_rows"]
    assert caption_stages.fragment_rows(st, 30_000, 2) == 7_500
    assert caption_stages.fragment_rows(st, 2_322_161_808, 512) == configured
    inp = resolve_parquet_inputs([str(REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet")])
    assert len(scan.fragments(inp, caption_stages.fragment_rows(st, inp.num_rows, 2))) == 4   # its 4 row groups
    assert len(scan.fragments(inp, configured)) == 1


def test_no_more_actors_than_the_input_can_use(monkeypatch):
    monkeypatch.setattr(runtime, "local_cores", lambda: 6)
    args, st = parsed()
    opts = RunOptions.from_args(args)

    def with_rows(n):
        return dataclasses.replace(st, input=(types.SimpleNamespace(num_rows=n), {}, []))

    per = caption_stages.ROWS_PER_EMBED_ACTOR
    monkeypatch.setattr(runtime, "is_local_instance", lambda: True)
    assert caption_stages.embed_actors(opts, with_rows(2_000), FakeCluster()) == 1      # a test-sized input
    assert caption_stages.embed_actors(opts, with_rows(2 * per + 1), FakeCluster()) == 3
    assert caption_stages.embed_actors(opts, with_rows(2 * per + 1)) == 3                # sizing the local instance
    assert caption_stages.embed_actors(opts, with_rows(10 ** 9), FakeCluster()) == 6
    monkeypatch.setattr(runtime, "is_local_instance", lambda: False)
    assert caption_stages.embed_actors(opts, with_rows(2_000), FakeCluster()) == (1, 1)
    assert caption_stages.embed_actors(opts, with_rows(2_322_161_808), FakeCluster()) == (1, 96 - args.ner_actors - 1)
