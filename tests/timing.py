"""Where the test suite's time goes: a pytest plugin, off unless asked for.

    python -m pytest -p tests.timing --timing-json timing.json

For every test it records the wall time of its setup, call and teardown phases, and inside them
the time spent in

- ``ray``: starting (or connecting to) Ray: ``ray.init`` and ``ray.shutdown``;
- ``subprocess``: child processes the test waits for (each Python child pays the interpreter
  start and the imports of torch / transformers / diffusers / ray before any work);
- ``standins``: building and saving the tiny random-weight stand-in models
  (``pipelines.standins.*.build_*``);

the rest is the work itself. ``docs/testing.md`` has the table it produced and how to read it.
Nesting is handled: a stand-in built inside a subprocess is not seen here (it is subprocess time),
and time inside ``ray.init`` is never also counted as stand-in time.
"""
from __future__ import annotations

import functools
import glob
import importlib
import json
import os
import subprocess
import time
from collections import defaultdict

import pytest

CATEGORIES = ("ray", "subprocess", "standins")
_STANDIN_MODULES = ("blip2", "clip", "detection", "diffusion", "fid", "grounding", "vision")

_current: list[str | None] = [None]
_depth = defaultdict(int)   # per category: time is counted only at the outermost call
_per_test: dict[str, dict] = defaultdict(lambda: {"setup": 0.0, "call": 0.0, "teardown": 0.0,
                                                 "ray": 0.0, "subprocess": 0.0, "standins": 0.0,
                                                 "ray_inits": 0, "subprocesses": 0, "standin_builds": 0})


def _timed(category: str, counter: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = _depth[category] == 0
        _depth[category] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _depth[category] -= 1
            if outer and _current[0] is not None:
                rec = _per_test[_current[0]]
                rec[category] += time.perf_counter() - t0
                if counter:
                    rec[counter] += 1
    wrapper.__wrapped_timing__ = True
    return wrapper


def _patch(owner, name: str, category: str, counter: str):
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "__wrapped_timing__", False):
        return
    setattr(owner, name, _timed(category, counter, fn))


def _install() -> None:
    import ray

    _patch(ray, "init", "ray", "ray_inits")
    _patch(ray, "shutdown", "ray", "")
    # every subprocess.run / check_output / call ends in Popen.wait or Popen.communicate
    _patch(subprocess.Popen, "communicate", "subprocess", "")
    _patch(subprocess.Popen, "wait", "subprocess", "")
    original_init = subprocess.Popen.__init__
    if not getattr(original_init, "__wrapped_timing__", False):
        @functools.wraps(original_init)
        def popen_init(self, *args, **kwargs):
            if _current[0] is not None and _depth["ray"] == 0:   # not Ray's own daemons
                _per_test[_current[0]]["subprocesses"] += 1
            return original_init(self, *args, **kwargs)
        popen_init.__wrapped_timing__ = True
        subprocess.Popen.__init__ = popen_init
    for short in _STANDIN_MODULES:
        module = importlib.import_module(f"pipelines.standins.{short}")
        for name in dir(module):
            if name.startswith("build_tiny") or name.startswith("build_random"):
                _patch(module, name, "standins", "standin_builds")


def pytest_addoption(parser):
    parser.addoption("--timing-json", default=None, help="write per-test timing (tests/timing.py) to this file")


if __name__ != "__main__":   # as a plugin (``-p tests.timing``): before any test module imports a builder by name
    _install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item.nodeid
    rec = _per_test[item.nodeid]
    rec["start"] = time.time()   # wall clock: which process ran what when (the report's per-process table)
    yield
    rec["end"] = time.time()
    _current[0] = None


def pytest_runtest_logreport(report):
    _per_test[report.nodeid][report.when] += report.duration


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--timing-json")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:   # an xdist worker: its own file, merged by the controller below
        slow = {item.nodeid for item in session.items if item.get_closest_marker("slow") is not None}
        out = {nodeid: {**rec, "slow": nodeid in slow, "worker": worker} for nodeid, rec in _per_test.items()}
        with open(f"{path}.{worker}", "w") as f:
            json.dump(out, f)
        return
    out = {}
    for part in sorted(glob.glob(f"{glob.escape(path)}.gw*")):   # the workers' files (none with -n 0)
        with open(part) as f:
            out.update(json.load(f))
        os.remove(part)
    if not out:
        slow = {item.nodeid for item in session.items if item.get_closest_marker("slow") is not None}
        out = {nodeid: {**rec, "slow": nodeid in slow} for nodeid, rec in _per_test.items()}
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


# ------------------------------------------------------------------------------------ the report
def _total(rec: dict) -> float:
    return rec["setup"] + rec["call"] + rec["teardown"]


def report(path: str, top: int = 20) -> str:
    """Markdown tables of a ``--timing-json`` file: totals by category and tier, per file, and the
    ``top`` tests by time (``python tests/timing.py timing.json``)."""
    with open(path) as f:
        data = json.load(f)
    lines = []
    total = sum(_total(r) for r in data.values())
    cats = {c: sum(r[c] for r in data.values()) for c in CATEGORIES}
    work = total - sum(cats.values())
    lines += ["| where | seconds | share |", "| --- | ---: | ---: |"]
    labels = {"ray": f"Ray start-up and shut-down in the test process ({sum(r['ray_inits'] for r in data.values())} "
                     "`ray.init`)",
              "subprocess": f"subprocesses waited for ({sum(r['subprocesses'] for r in data.values())} started)",
              "standins": f"building and saving stand-in models ({sum(r['standin_builds'] for r in data.values())} "
                          "builds)"}
    for c in CATEGORIES:
        lines.append(f"| {labels[c]} | {cats[c]:.0f} | {100 * cats[c] / total:.0f}% |")
    lines.append(f"| the work itself (incl. Ray workers' start-up and imports inside runs) | {work:.0f} | "
                 f"{100 * work / total:.0f}% |")
    lines.append(f"| **sum of test times** ({len(data)} tests) | **{total:.0f}** | |")
    for tier, flag in (("slow", True), ("fast", False)):
        part = [r for r in data.values() if r["slow"] == flag]
        lines.append(f"| of which {tier} tier ({len(part)} tests) | {sum(map(_total, part)):.0f} | |")
    files: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for nodeid, r in data.items():
        f = files[nodeid.split("::")[0]]
        f[0] += 1
        f[1] += _total(r)
        f[2] += r["ray"]
        f[3] += r["subprocess"]
        f[4] += r["standins"]
    spans: dict[str, list] = defaultdict(list)
    for r in data.values():
        if "start" in r:
            spans[r.get("worker", "main")].append(r)
    if spans:   # how evenly the processes (xdist workers) were loaded, and when each ran out of work
        t0 = min(r["start"] for rs in spans.values() for r in rs)
        lines += ["", "| process | tests | sum of test times | last test ended (s after the first began) |",
                  "| --- | ---: | ---: | ---: |"]
        for w, rs in sorted(spans.items()):
            lines.append(f"| {w} | {len(rs)} | {sum(map(_total, rs)):.0f} | {max(r['end'] for r in rs) - t0:.0f} |")
    lines += ["", "| file | tests | seconds | Ray | subprocess | stand-ins |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, (n, t, ray, sub, st) in sorted(files.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"| `{name}` | {n} | {t:.1f} | {ray:.1f} | {sub:.1f} | {st:.1f} |")
    lines += ["", "| test | seconds | setup | call | teardown | subprocess | stand-ins |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for nodeid, r in sorted(data.items(), key=lambda kv: -_total(kv[1]))[:top]:
        lines.append(f"| `{nodeid}` | {_total(r):.1f} | {r['setup']:.1f} | {r['call']:.1f} | {r['teardown']:.1f} | "
                     f"{r['subprocess']:.1f} | {r['standins']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20))
