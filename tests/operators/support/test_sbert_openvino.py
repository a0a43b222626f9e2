"""SBERT through OpenVINO: the same model compiled from its torch module, in f32 (exact:
the same cosines to ~1e-7 and the same nearest neighbours as torch on the bundled sample's matched
captions) or bf16 (an option: close, not exact), chosen per run and refused where it cannot run."""

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import REPO_ROOT
from operators.support.sbert_batches import CPU_TOKEN_BUDGET
from operators.support.sbert_openvino import OpenVinoSbert, _check_pipeline
from operators.text_occupation_matcher import OccupationMatcher
from operators.text_prompt_similarity import PromptSimilarity, sbert_backend
from pipelines.studies.amplification.prompts import prompt_table
from schemas.occupations import Occupation

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEMPLATES = ["A photo of the face of {article} {occupation}", "A portrait photo of {article} {occupation}",
             "A photo of {article} {occupation} smiling", "A photo of {article} {occupation} at work"]
OCCS = [Occupation(n) for n in ("nurse", "engineer", "teacher", "doctor")]


@pytest.fixture(scope="module")
def matched():
    """The bundled sample's captions naming one of OCCS (with their first occupation), 600 of them."""
    text = pq.read_table(REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet").column("TEXT")
    text = text.combine_chunks().filter(pa.array(OccupationMatcher(OCCS).any_match(text.combine_chunks())))
    which = OccupationMatcher(OCCS).which(text)
    first = [names[0] for names in which.to_pylist()]
    return pa.table({"caption": text, "occupation": first}).slice(0, 600)


@pytest.fixture(scope="module")
def similarities(matched):
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the torch tracer's notes while converting
        for backend in ("torch", "openvino", "openvino-bf16"):
            op = PromptSimilarity(MODEL, prompt_table(OCCS, TEMPLATES), device="cpu", backend=backend)
            out[backend] = (np.array(op(matched).column("prompt_similarity").to_pylist()), op)
    return out


def neighbours(sims, occupations, k=25):
    """Per (occupation, prompt): the top-k captions' row indices (section 5.2's NN) and the k-th
    cosine."""
    occ = np.asarray(occupations)
    out = {}
    for o in set(occ):
        rows = np.flatnonzero(occ == o)
        for p in range(sims.shape[1]):
            order = rows[np.lexsort((rows, -sims[rows, p]))]
            out[(o, p)] = (set(order[:k].tolist()), sims[order[min(k, len(order)) - 1], p])
    return out


@pytest.mark.slow   # the OpenVINO backends are options; converting the model twice costs ~20 s of the fast tier
def test_openvino_f32_is_torch_to_1e6_and_its_neighbours_differ_at_most_in_ties(matched, similarities):
    """The bundled sample's captions repeat templates, so neighbours at rank k can be ties to 1e-7:
    a subset may swap such a caption (benchmarks/bench_sbert.py --backends: 1 of 248 top-50 subsets
    on 4,096 captions), never one whose cosine is further than 1e-6 from the k-th."""
    torch_sims, _ = similarities["torch"]
    ov_sims, op = similarities["openvino"]
    assert op.backend == "openvino" and op._ov.precision.endswith("'float32'>")
    assert np.abs(ov_sims - torch_sims).max() < 1e-6
    occ = matched.column("occupation").to_pylist()
    ref, got = neighbours(torch_sims, occ), neighbours(ov_sims, occ)
    swapped = 0
    for key, (members, kth) in ref.items():
        for row in members ^ got[key][0]:
            assert abs(torch_sims[row, key[1]] - kth) < 1e-6, (key, row)
            swapped += 1
    assert swapped <= 2 * len(ref) // 10      # ties are rare


@pytest.mark.slow   # the OpenVINO backends are options; converting the model twice costs ~20 s of the fast tier
def test_cpu_operators_cut_batches_by_tokens_with_the_librarys_results(matched, similarities):
    """On a CPU every backend cuts its batches by tokens (sbert_batches); with the library's batches
    (token_budget 0) the cosines are the same to float rounding."""
    for backend, (sims, op) in similarities.items():
        assert op.token_budget == CPU_TOKEN_BUDGET, backend
        op.token_budget = None
        try:
            library = np.array(op(matched).column("prompt_similarity").to_pylist())
        finally:
            op.token_budget = CPU_TOKEN_BUDGET
        assert np.abs(library - sims).max() < (1e-6 if backend != "openvino-bf16" else 5e-3), backend
    assert PromptSimilarity(MODEL, prompt_table(OCCS, TEMPLATES), device="cpu", token_budget=0).token_budget is None


@pytest.mark.slow   # the OpenVINO backends are options; converting the model twice costs ~20 s of the fast tier
def test_openvino_bf16_is_close_not_exact(similarities):
    torch_sims, _ = similarities["torch"]
    bf16, op = similarities["openvino-bf16"]
    diff = np.abs(bf16 - torch_sims).max()
    assert diff < 5e-3
    if "bfloat16" in op._ov.precision:       # a CPU with AVX512-BF16 / AMX runs it in bf16
        assert diff > 1e-6


@pytest.mark.slow   # converts the model for OpenVINO once more
def test_auto_screens_only_the_rows_of_the_occupations_it_is_given(matched, similarities):
    """Backend "auto": torch for every row, except the rows of ``screen_occupations``,
    which go through the bf16 encoder; with none it loads nothing but torch."""
    torch_sims, _ = similarities["torch"]
    bf16, bf16_op = similarities["openvino-bf16"]
    none = PromptSimilarity(MODEL, prompt_table(OCCS, TEMPLATES), device="cpu", backend="auto")
    assert none._screen_ov is None and none._ov is None
    assert np.abs(np.array(none(matched).column("prompt_similarity").to_pylist()) - torch_sims).max() < 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the torch tracer's notes while converting
        op = PromptSimilarity(MODEL, prompt_table(OCCS, TEMPLATES), device="cpu", backend="auto",
                              screen_occupations=["nurse"])
    got = np.array(op(matched).column("prompt_similarity").to_pylist())
    nurse = np.asarray(matched.column("occupation").to_pylist()) == "nurse"
    assert 0 < nurse.sum() < len(nurse) and 0 < op._screened <= nurse.sum()   # (texts, after folding)
    assert np.abs(got[~nurse] - torch_sims[~nurse]).max() < 1e-6        # torch's, to its float noise
    assert np.abs(got[nurse] - torch_sims[nurse]).max() < 5e-3           # the screen's
    if "bfloat16" in bf16_op._ov.precision:
        assert np.abs(got[nurse] - torch_sims[nurse]).max() > 1e-6
    # a caption that also names an occupation not screened is encoded with torch for both rows
    both = pa.table({"caption": ["a nurse and an engineer"] * 2, "occupation": ["nurse", "engineer"]})
    ref = np.array(none(both).column("prompt_similarity").to_pylist())
    assert np.abs(np.array(op(both).column("prompt_similarity").to_pylist()) - ref).max() < 1e-6


def test_the_backend_is_a_cpu_choice_and_refused_when_unknown():
    assert sbert_backend("openvino", on_gpu=True) == "torch" and sbert_backend("openvino", on_gpu=False) == "openvino"
    with pytest.raises(ValueError, match="SBERT backend must be one of"):
        sbert_backend("onnx-int8", on_gpu=False)


def test_only_mean_pooled_models_are_converted():
    class Transformer:
        pass

    class Pooling:
        def __init__(self, mode):
            self.mode = mode

        def get_config_dict(self):
            return {"pooling_mode": self.mode}

    class Normalize:
        pass

    assert _check_pipeline([Transformer(), Pooling("mean"), Normalize()]) is True
    with pytest.raises(ValueError, match="mean pooling"):
        _check_pipeline([Transformer(), Pooling("cls")])
    with pytest.raises(ValueError, match="supports Transformer"):
        _check_pipeline([Transformer(), Pooling("mean"), Transformer()])
    with pytest.raises(ValueError, match="f32 or bf16"):
        OpenVinoSbert(None, precision="int8")


def test_the_flag_names_another_run_and_is_recorded():
    from pipelines import amplification
    from pipelines.studies.amplification.caption_settings import settings

    parse = lambda *a: settings(amplification.build_parser().parse_args(  # noqa: E731
        ["captions", "--output", "/tmp/unused", "--occupations", "nurse", *a]))
    assert parse().models["sbert_backend"] == "auto"
    assert parse("--sbert-backend", "torch").models["sbert_backend"] == "torch"
    assert parse("--sbert-backend", "openvino").models["sbert_backend"] == "openvino"


def test_converting_reports_nothing_to_openvino_telemetry(monkeypatch, minilm):
    """OpenVINO's conversion reports each use (Google Analytics, a client ID under ~/intel) unless
    the user opted out; the SBERT conversion runs with OpenVINO's own stub in its place (the guard
    restores what was there after it), and a conversion without the guard does report."""
    import importlib
    from types import SimpleNamespace

    import openvino as ov
    import torch
    from openvino.tools.ovc import telemetry_stub

    from operators.support.sbert_openvino import _REPORTING, no_conversion_telemetry

    events = []

    class Recording(telemetry_stub.Telemetry):   # in place of openvino_telemetry.Telemetry: records, sends nothing
        def send_event(self, *a, **k):
            events.append(("send_event", a))

        def start_session(self, *a, **k):
            events.append(("start_session", a))

    fake = SimpleNamespace(Telemetry=Recording)
    modules = [importlib.import_module(m) for m in _REPORTING]
    for m in modules:
        monkeypatch.setattr(m, "tm", fake)
    linear = torch.nn.Linear(2, 2).eval()
    ov.convert_model(linear, example_input=torch.ones(1, 2))
    assert ("start_session", ("ovc",)) in events          # the guard is needed: a conversion reports
    events.clear()
    with no_conversion_telemetry():
        assert all(m.tm is telemetry_stub for m in modules)
        ov.convert_model(linear, example_input=torch.ones(1, 2))
    assert events == [] and all(m.tm is fake for m in modules)

    class Stop(Exception):
        pass

    guarded = []

    def convert(*a, **k):
        guarded.append(all(m.tm is telemetry_stub for m in modules))
        raise Stop

    monkeypatch.setattr(ov, "convert_model", convert)
    with pytest.raises(Stop):
        OpenVinoSbert(minilm)
    assert guarded == [True] and all(m.tm is fake for m in modules)


def test_openvino_imported_here_writes_nothing_under_home_and_binds_its_stub(tmp_path):
    """In a fresh interpreter with an empty home: OpenVINO imported through ``import_openvino`` and
    a model converted leave the home empty (no ~/intel client ID), its conversion modules bound to
    its stub; imported plainly, the same conversion writes ~/intel."""
    import os
    import subprocess
    import sys

    convert = ("import torch; ov.convert_model(torch.nn.Linear(2, 2).eval(), example_input=torch.ones(1, 2)); "
               "import openvino.tools.ovc.telemetry_utils as t; print(t.tm.__name__)")
    guarded = "from operators.support.sbert_openvino import import_openvino; ov = import_openvino()"
    # OpenVINO's conversion reporting declines by itself where one of these says "a CI job"
    # (openvino_telemetry's _run_in_ci); without them both runs meet the reporting a user's shell meets
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    for name, first in (("guarded", guarded), ("plain", "import openvino as ov")):
        home = tmp_path / name
        home.mkdir()
        proc = subprocess.run([sys.executable, "-c", f"{first}; {convert}"], capture_output=True, text=True,
                              env=env | {"HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        stub = proc.stdout.strip().splitlines()[-1] == "openvino.tools.ovc.telemetry_stub"
        if name == "guarded":
            assert stub and list(home.iterdir()) == []
        else:                   # the check can fail: OpenVINO's own reporting, unguarded
            assert not stub and (home / "intel").is_dir()
