"""Objects and dependency groups made on the generator's device (paper 004, sections 5-6): through
the production loaders of a tiny SD 1.x pipeline, GroundingDINO and SAM (random weights), the
images are unchanged by the analysis, every image gets its noun set, objects, groups, hidden nouns
and word masks; blocked images and failures are recorded, not dropped."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.image_prompt_dependency import PromptDependency
from operators.image_triplet_generation import TripletGenerator
from operators.support import rle
from operators.support.codec import batch_images
from pipelines.standins.diffusion import build_tiny_stable_diffusion
from pipelines.standins.grounding import build_tiny_grounding_dino, build_tiny_sam
from schemas.exposed import (
    ATTENTION_MAP_SIZE,
    ATTENTION_MAPS,
    ATTENTION_MASKS,
    ATTENTION_WORDS,
    DEPENDENCY_COLUMNS,
    DETECTION_DETAIL,
    DETECTION_STATUS,
    FEMININE,
    HIDDEN_NOUNS,
    MASCULINE,
    NEUTRAL,
    OBJECT_BOXES,
    PROFESSION,
    OBJECT_GROUPS,
    OBJECT_LABELS,
    OBJECT_MASKS,
    OBJECT_SCORES,
    PROMPT_NOUNS,
    UNIT_ID,
    DependencyGroup,
    DetectionStatus,
)
from schemas.images import SEED

STEPS = 2
TRIPLETS = [("A person walks a dog in the park.", "A woman walks a dog in the park.", "A man walks a dog in the park."),
            ("People eat cake at a table.", "Women eat cake at a table.", "Men eat cake at a table.")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dep")
    return {"sd": build_tiny_stable_diffusion(root / "sd", seed=0), "gdino": build_tiny_grounding_dino(root / "gd"),
            "sam": build_tiny_sam(root / "sam")}


def units(triplets, seeds) -> pa.Table:
    return pa.table({UNIT_ID: [f"u{i}" for i in range(len(triplets))], NEUTRAL: [t[0] for t in triplets],
                     FEMININE: [t[1] for t in triplets], MASCULINE: [t[2] for t in triplets],
                     SEED: pa.array(seeds, pa.int64())})


VOCABULARY = ["hat", "tree", "grass", "women", "dogs"]
LEMMAS = {"hat", "tree", "grass", "woman", "dog"}


def dependency(models, **kw):
    return PromptDependency(models["gdino"], models["sam"], device="cpu", vocabulary=VOCABULARY,
                            box_threshold=0.0, text_threshold=0.0, **kw)


def test_analysis_leaves_the_images_unchanged_and_fills_every_column(models):
    batch = units(TRIPLETS, [3, 4])
    plain = TripletGenerator(models["sd"], steps=STEPS, device="cpu")(batch)
    gen = TripletGenerator(models["sd"], steps=STEPS, device="cpu", dependency=dependency(models))
    out = gen(batch)
    assert [a.tobytes() for a in batch_images(out)] == [a.tobytes() for a in batch_images(plain)]
    assert out.column(DETECTION_STATUS).to_pylist() == [DetectionStatus.OK] * 6
    assert out.column(PROMPT_NOUNS).to_pylist()[:3] == [["person", "dog", "park"], ["woman", "dog", "park"],
                                                        ["man", "dog", "park"]]
    assert out.column(PROMPT_NOUNS).to_pylist()[4] == ["woman", "cake", "table"]   # lemmatised: women -> woman
    rows = out.to_pylist()
    for k, r in enumerate(rows):
        n = len(r[OBJECT_LABELS])
        assert n > 0, "zero thresholds: the stand-in detector keeps boxes"
        assert len(r[OBJECT_SCORES]) == len(r[OBJECT_BOXES]) == len(r[OBJECT_MASKS]) == len(r[OBJECT_GROUPS]) == n
        unit_nouns = {w for q in rows[3 * (k // 3): 3 * (k // 3) + 3] for w in q[PROMPT_NOUNS]}
        assert set(r[OBJECT_LABELS]) <= unit_nouns | LEMMAS      # the unit's vocabulary, lemmatised as the nouns are
        assert set(r[OBJECT_GROUPS]) <= set(DependencyGroup.ALL) - {DependencyGroup.HIDDEN}
        # explicit exactly when the label is a prompt noun
        for label, group in zip(r[OBJECT_LABELS], r[OBJECT_GROUPS]):
            assert group.startswith("explicitly") == (label in r[PROMPT_NOUNS])
        assert r[HIDDEN_NOUNS] == [w for w in r[PROMPT_NOUNS] if w not in r[OBJECT_LABELS]]
        assert r[ATTENTION_WORDS] == r[PROMPT_NOUNS]          # every noun's tokens are in the prompt
        assert len(r[ATTENTION_MASKS]) == len(r[ATTENTION_MAPS]) == len(r[ATTENTION_WORDS])
        assert all(len(m) == ATTENTION_MAP_SIZE ** 2 for m in r[ATTENTION_MAPS])
        assert all(rle.decode(m, 64, 64).shape == (64, 64) for m in r[ATTENTION_MASKS] + r[OBJECT_MASKS])
        assert r[DETECTION_DETAIL] is None
    assert gen.record["dependency"]["groups"]["sigma"] == 0.7


def test_the_three_images_of_a_unit_reach_the_detector_with_identical_text(models, monkeypatch):
    """The neutral, feminine and masculine images of a unit are queried with the
    same vocabulary (the unit's nouns, then the tags) in the same order, while what is explicit is
    still decided by each image's own nouns."""
    from operators.image_grounded_segmentation import GroundedSegmenter
    from operators.support.grounding import image_vocabulary

    dep = dependency(models)
    seen = []
    real = GroundedSegmenter.detect_u8

    def spy(self, images, nouns_per_image):
        seen.extend(image_vocabulary(n, self.vocabulary) for n in nouns_per_image)
        return real(self, images, nouns_per_image)

    monkeypatch.setattr(GroundedSegmenter, "detect_u8", spy)
    triplets = TRIPLETS + [("A person reads a book in a library.", "A woman reads a book in a library.",
                            "A man reads a book in a library.")]
    out = TripletGenerator(models["sd"], steps=STEPS, device="cpu", dependency=dep)(units(triplets, [3, 4, 5]))
    assert len(seen) == 9
    nouns = out.column(PROMPT_NOUNS).to_pylist()
    for u in range(3):
        a, b, c = seen[3 * u: 3 * u + 3]
        assert a == b == c, f"unit {u}: the detector's text differs across the triplet"
        assert all(w in a for n in nouns[3 * u: 3 * u + 3] for w in n)   # every variant's nouns are asked for
        assert a[-len(VOCABULARY):] == VOCABULARY                        # then the tags, in their order
    assert seen[0][:4] == ["person", "dog", "park", "woman"]            # first appearance over N, F, M
    for r in out.to_pylist():   # explicit: the image's own nouns ("woman" is not explicit in the neutral image)
        for label, group in zip(r[OBJECT_LABELS], r[OBJECT_GROUPS]):
            assert group.startswith("explicitly") == (label in r[PROMPT_NOUNS])
    with pytest.raises(ValueError, match="whole units"):
        dep.analyse(torch.zeros(2, 3, 8, 8), ["a", "b"], None, None, (1, 1))


def test_a_unit_shares_one_noun_set_apart_from_its_gender_words():
    """spaCy tags "botanist" an adjective in "A botanist studies ..." and a noun in
    "A female botanist studies ...": the unit's three prompts still get the same nouns, apart from
    the words they differ in by construction."""
    triplet = ["A botanist studies samples in a bright laboratory",
               "A female botanist studies samples in a bright laboratory",
               "A male botanist studies samples in a bright laboratory"]
    own = [dict(f) for f in PromptDependency.nouns(_Tagger(), triplet)]
    assert "botanist" not in own[0] and "botanist" in own[1]        # the tagger's inconsistency
    shared = PromptDependency.shared_noun_forms(triplet, own)
    assert [list(f) for f in shared] == [list(shared[1])] * 3
    assert list(shared[0])[0] == "botanist" and shared[0]["botanist"] == ["botanist"]
    people = ["People eat cake at a table.", "Women eat cake at a table.", "Men eat cake at a table."]
    shared = PromptDependency.shared_noun_forms(people, [dict(f) for f in PromptDependency.nouns(_Tagger(), people)])
    assert [list(f) for f in shared] == [["people", "cake", "table"], ["woman", "cake", "table"], ["man", "cake", "table"]]
    assert shared[1]["woman"] == ["women"]                           # each prompt's own surface forms


class _Tagger:
    """PromptDependency's noun sets without building the detector: the default spaCy tagger."""

    profession_noun_forms = PromptDependency.profession_noun_forms
    unit_forms = PromptDependency.unit_forms
    shared_noun_forms = staticmethod(PromptDependency.shared_noun_forms)

    def __init__(self):
        from operators.text_prompt_nouns import load_tagger

        self.nlp = load_tagger()


def test_a_profession_unit_reads_its_nouns_with_the_profession_out_of_the_taggers_way():
    """With the profession known, the profession is a noun of all three prompts
    and the template's verb is not (spaCy alone tags "studies" a noun in every variant)."""
    tagger = _Tagger()
    triplet = ["A botanist studies samples in a bright laboratory",
               "A female botanist studies samples in a bright laboratory",
               "A male botanist studies samples in a bright laboratory"]
    own = [dict(f) for f in PromptDependency.nouns(tagger, triplet)]
    assert all("study" in f for f in own)                                # the tagger's verb-as-noun
    forms = tagger.unit_forms(triplet, own, "botanist")
    assert [list(f) for f in forms] == [["botanist", "sample", "laboratory"]] * 3
    # without the profession (a caption unit) the unit still shares one set, verb included
    assert [list(f) for f in tagger.unit_forms(triplet, own, None)] == [["botanist", "study", "sample",
                                                                          "laboratory"]] * 3
    two = ["A software developer writes code in a quiet office", "A female software developer writes code in a "
           "quiet office", "A male software developer writes code in a quiet office"]
    forms = tagger.unit_forms(two, [dict(f) for f in PromptDependency.nouns(tagger, two)], "software developer")
    assert all("developer" in f and "write" not in f and "code" in f and "office" in f for f in forms)
    assert tagger.profession_noun_forms("A person sings", "botanist") is None   # a prompt without it: own tagging
    # a gender noun of a variant stays that variant's own
    people = ["A person who is a nurse reads", "A woman who is a nurse reads", "A man who is a nurse reads"]
    forms = tagger.unit_forms(people, [dict(f) for f in PromptDependency.nouns(tagger, people)], "nurse")
    assert [("person" in f, "woman" in f, "man" in f) for f in forms] == [(True, False, False), (False, True, False),
                                                                          (False, False, True)]
    assert all("nurse" in f for f in forms)


def test_the_generator_passes_each_units_profession_to_the_analysis(models, monkeypatch):
    dep = dependency(models)
    seen = []
    real = PromptDependency.analyse

    def spy(self, *a, **kw):
        seen.append(kw.get("professions"))
        return real(self, *a, **kw)

    monkeypatch.setattr(PromptDependency, "analyse", spy)
    batch = units(TRIPLETS, [1, 2]).append_column(PROFESSION, pa.array(["dog walker", None], pa.string()))
    out = TripletGenerator(models["sd"], steps=STEPS, device="cpu", dependency=dep, micro_batch=2)(batch)
    assert seen == [["dog walker"] * 3 + [None] * 3]
    assert out.num_rows == 6


def test_groups_follow_the_recorded_masks(models):
    """Recompute each image's groups from its stored object and word masks with the numpy rules."""
    from operators.support.dependency import dependency_groups

    out = TripletGenerator(models["sd"], steps=STEPS, device="cpu", dependency=dependency(models))(
        units(TRIPLETS[:1], [9]))
    for r in out.to_pylist():
        objects = [rle.decode(m, 64, 64) for m in r[OBJECT_MASKS]]
        words = {w: rle.decode(m, 64, 64) for w, m in zip(r[ATTENTION_WORDS], r[ATTENTION_MASKS])}
        groups, hidden = dependency_groups(r[OBJECT_LABELS], objects, r[PROMPT_NOUNS], words)
        assert groups == r[OBJECT_GROUPS] and hidden == r[HIDDEN_NOUNS]


def test_word_masks_are_the_binarised_heat_maps(models):
    dep = dependency(models)
    gen = TripletGenerator(models["sd"], steps=STEPS, device="cpu")
    capture = dep.capture(gen.pipe, True)
    from operators.image_triplet_generation import generate_units

    images, _, latents, _, _ = generate_units(gen.pipe, [TRIPLETS[0]], [1], STEPS, 7.5, attention=capture)
    flat = images.reshape(3, *images.shape[2:])
    sums = {k: v.clone() for k, v in capture.sums.items()}
    out = dep.analyse(flat, list(TRIPLETS[0]), capture, gen.pipe.tokenizer, tuple(latents.shape[-2:]))
    assert not capture.sums                                  # released after the analysis
    capture.sums.update(sums)
    maps = capture.heat_maps(tuple(latents.shape[-2:]), (64, 64))
    from operators.support.cross_attention import CrossAttentionCapture
    from operators.support.dependency import attention_mask

    words = CrossAttentionCapture.word_heat_maps(gen.pipe.tokenizer, TRIPLETS[0][1], maps[1], ["woman", "dog"])
    stored = dict(zip(out[ATTENTION_WORDS][1], out[ATTENTION_MASKS][1]))
    for w in ("woman", "dog"):
        assert (rle.decode(stored[w], 64, 64) == attention_mask(words[w], 0.35)).all()


def test_labels_are_lemmatised_like_the_nouns(models):
    dep = dependency(models)
    assert dep.lemma("women") == "woman" and dep.lemma("glasses") == "glass" and dep.lemma("bow tie") == "bow tie"
    assert dep.lemmas["women"] == "woman" and dep.lemmas["dogs"] == "dog"


def test_blocked_images_and_failures_are_recorded(models):
    dep = dependency(models)
    gen = TripletGenerator(models["sd"], steps=STEPS, device="cpu", dependency=dep)
    capture = dep.capture(gen.pipe, True)
    from operators.image_triplet_generation import generate_units
    from operators.support.cross_attention import CrossAttentionCapture
    from operators.support.dependency import attention_mask

    images, _, latents, _, _ = generate_units(gen.pipe, [TRIPLETS[0]], [1], STEPS, 7.5, attention=capture)
    flat = images.reshape(3, *images.shape[2:])
    sums = {k: v.clone() for k, v in capture.sums.items()}
    out = dep.analyse(flat, list(TRIPLETS[0]), capture, gen.pipe.tokenizer, tuple(latents.shape[-2:]),
                      skip=[False, True, False])
    assert out[DETECTION_STATUS] == [DetectionStatus.OK, DetectionStatus.NO_IMAGE, DetectionStatus.OK]
    assert out[OBJECT_LABELS][1] == [] and out[OBJECT_GROUPS][1] is None
    assert out[PROMPT_NOUNS][1] == ["woman", "dog", "park"]
    # image 2's masks come from image 2's maps, though image 1 was skipped
    capture.sums.update(sums)
    maps = capture.heat_maps(tuple(latents.shape[-2:]), (64, 64))
    words = CrossAttentionCapture.word_heat_maps(gen.pipe.tokenizer, TRIPLETS[0][2], maps[2], ["man", "park"])
    stored = dict(zip(out[ATTENTION_WORDS][2], out[ATTENTION_MASKS][2]))
    for w in ("man", "park"):
        assert (rle.decode(stored[w], 64, 64) == attention_mask(words[w], 0.35)).all()

    def out_of_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    dep.segmenter.detect_u8 = out_of_memory      # the generator's halving path must see it
    generate_units(gen.pipe, [TRIPLETS[0]], [1], STEPS, 7.5, attention=capture)
    with pytest.raises(torch.OutOfMemoryError):
        dep.analyse(flat, list(TRIPLETS[0]), capture, gen.pipe.tokenizer, tuple(latents.shape[-2:]))
    assert not capture.sums

    def broken(*a, **k):
        raise RuntimeError("detector exploded")

    dep.segmenter.detect_u8 = broken
    batch = gen(units(TRIPLETS, [1, 2]))
    assert batch.column(DETECTION_STATUS).to_pylist() == [DetectionStatus.ERROR] * 6
    assert set(batch.column(DETECTION_DETAIL).to_pylist()) == {"RuntimeError: detector exploded"}
    assert batch.column(OBJECT_LABELS).null_count == 6
    assert batch.column(PROMPT_NOUNS).null_count == 0          # the nouns do not depend on the image
    assert batch.schema.field(OBJECT_LABELS).type == DEPENDENCY_COLUMNS.field(OBJECT_LABELS).type


def test_heat_maps_of_the_first_tokens_only(models):
    gen = TripletGenerator(models["sd"], steps=STEPS, device="cpu")
    from operators.image_triplet_generation import generate_units
    from operators.support.cross_attention import CrossAttentionCapture

    cap = CrossAttentionCapture(gen.pipe.unet)
    _, _, latents, _, _ = generate_units(gen.pipe, [TRIPLETS[0]], [1], STEPS, 7.5, attention=cap)
    sums = {k: v.clone() for k, v in cap.sums.items()}
    few = cap.heat_maps(tuple(latents.shape[-2:]), (64, 64), tokens=5)
    cap.sums.update(sums)
    every = cap.heat_maps(tuple(latents.shape[-2:]), (64, 64))
    assert few.shape == (3, 5, 64, 64) and every.shape == (3, 76, 64, 64)
    assert torch.allclose(few, every[:, :5], atol=1e-6)
    assert np.isfinite(few.numpy()).all()


def test_nouns_past_the_encoders_tokens_get_no_mask(models):
    """A prompt longer than the text encoder's 77 tokens: its last noun was never seen by the UNet."""
    dep = dependency(models)
    gen = TripletGenerator(models["sd"], steps=STEPS, device="cpu")
    from operators.image_triplet_generation import generate_units

    long = "A person walks a dog " + "and then slowly " * 30 + "near a tree."
    triplet = (long, long.replace("A person", "A woman"), long.replace("A person", "A man"))
    assert len(gen.pipe.tokenizer(long, add_special_tokens=False).input_ids) > 77
    capture = dep.capture(gen.pipe, True)
    images, _, latents, _, _ = generate_units(gen.pipe, [triplet], [2], STEPS, 7.5, attention=capture)
    out = dep.analyse(images.reshape(3, *images.shape[2:]), list(triplet), capture, gen.pipe.tokenizer,
                      tuple(latents.shape[-2:]))
    assert out[PROMPT_NOUNS][0] == ["person", "dog", "tree"]
    assert out[ATTENTION_WORDS][0] == ["person", "dog"]          # "tree" lies past token 75
    assert out[DETECTION_STATUS] == [DetectionStatus.OK] * 3
