"""The README's model table: every generator family of operators/support/families.py has a row,
found from the row's example hub ids, and the node each row names is the one
pipelines/engine/run/gpus.py routes its examples to, with and without CPU offload."""

from __future__ import annotations

import re

from helpers import REPO_ROOT

from operators.support import families as F
from pipelines.engine.generation import GeneratorSpec
from pipelines.engine.run import gpus


def rows():
    text = (REPO_ROOT / "README.md").read_text()
    table = text[text.index("| family | examples |"):].split("\n\n", 1)[0].splitlines()[2:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table]


def _spec(model):
    d = F.defaults(model)
    return GeneratorSpec(model=model, family=d["family"], cuda_dtype=d["cuda_dtype"])


def _node(model, offload):
    tier = gpus.node_tier(_spec(model), offload)
    if tier is None:
        return "gpu_worker"                   # a size unknown here is not routed
    if gpus.memory_needed(_spec(model), offload) > gpus.NODE_TIERS[-1].memory:
        return None                           # no card holds it
    return tier.node_type


def test_every_family_has_a_row():
    found = set()
    for family, examples, *_ in rows():
        for model in re.findall(r"`([\w.-]+/[\w.-]+)`", examples):
            found.add(F.detect(model)[0].name)
    assert set(F.FAMILIES) <= found, sorted(set(F.FAMILIES) - found)


def test_each_row_names_the_node_its_first_example_is_routed_to():
    """The first hub id of each row: the node cell's first node is its node whole (or "none whole"
    where no card holds it), the one in parentheses its node with CPU offload ("same": unchanged)."""
    checked = 0
    for family, examples, defaults, node, studies in rows():
        model = re.findall(r"`([\w.-]+/[\w.-]+)`", examples)[0]
        # a card that offloads says so in the defaults cell (its spec's cpu_offload)
        assert ("CPU offload" in defaults) == bool(F.defaults(model)["cpu_offload"]), (family, defaults)
        if gpus.pipeline_size(_spec(model))[0] is None:
            assert node == "`gpu_worker`", (family, node)          # not routed: the ordinary node
            continue
        whole, offloaded = _node(model, False), _node(model, True)
        first = node.split(";")[0]
        if whole is None:
            assert "none whole" in first, (family, node)
        else:
            assert f"`{whole}`" in first.split("(")[0], (family, whole, node)
        if "(" in first:
            inner = first[first.index("(") + 1:first.index(")")]
            assert inner == "same" and offloaded == whole or inner == f"`{offloaded}`", (family, offloaded, node)
        else:
            assert offloaded == whole, (family, offloaded, node)
        checked += 1
    assert checked >= 10
