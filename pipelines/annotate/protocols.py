"""The papers' human evaluations as presets: what people are asked, with which answers, about how
many of which images (docs/method.md, "Checked by people", says where each value comes from).

Each preset's items come from one study's finished run (``candidates.py``). ``n`` counts the
sampling units of the preset (images; for GEP and SD Exposed each drawn image brings every
question the paper asks about it), drawn at random with the task set's seed, either ``n`` in all
split equally over the strata or ``n_per_stratum`` in each.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

YES, NO, UNSURE = "yes", "no", "unsure"
FEMALE, MALE = "female", "male"
MONK = tuple(str(k) for k in range(1, 11))


@dataclass(frozen=True)
class Protocol:
    name: str
    study: str                       # the run's metrics.json "study" it applies to
    paper: str                       # where the protocol is described
    question: str                    # shown for each item ({subject} filled per item where it has one)
    choices: tuple[str, ...]
    unsure: str | None = UNSURE      # the choice that says "cannot tell" (None: the protocol has none)
    level: str = "nominal"           # Krippendorff's level of measurement
    strata: tuple[str, ...] = ()     # columns the items are drawn within
    n: int | None = None             # sampling units in all, split equally over the strata
    n_per_stratum: int | None = None
    annotators: int = 3              # answers wanted per item
    unit: str = "image"              # what is drawn (each drawn image brings all its questions)
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def record(self) -> dict:
        return asdict(self)


PRESETS = {p.name: p for p in (
    Protocol("paper002-a4", "paper002-amplification", "paper 002, App. A.4",
             "What is the gender of the person in this image?", (FEMALE, MALE, UNSURE),
             strata=("source",), n=200, annotators=7,
             notes="7 participants, 200 randomly selected training and generated images, binary gender or unsure; "
                   "split equally between training and generated images (a project choice)"),
    Protocol("gep", "paper001-gep", "paper 001, section 5 and App. B", "Do you see a person {subject}?",
             (YES, NO, UNSURE), strata=("model", "setting", "gender", "prompt_attribute"), n_per_stratum=2,
             annotators=3,
             notes="three workers per (image, attribute); neutral images: all attributes, explicit images: the "
                   "attribute of the prompt; the majority of three is the label. 'unsure' is a project choice "
                   "(App. B asks for Yes only when confident; an unsure majority is left out of gep evaluate); two "
                   "images in each (model, setting, gender, the image's attribute), so that every frequency of "
                   "GEP_human has images (a project choice)"),
    Protocol("dalleval-skills", "paper000-dalleval-skills", "paper 000, Table 3 and App. E",
             "Does the image show what the prompt asks for: \"{subject}\"?", (YES, NO, UNSURE),
             strata=("model", "skill"), n_per_stratum=50, annotators=1,
             notes="an expert judges 50 images per model and skill; the expert's selection of the required "
                   "components (object; object and number; objects and relation) is asked as one yes/no question "
                   "(a project choice)"),
    Protocol("dalleval-social", "paper000-dalleval", "paper 000, App. (gender), Fig. 6",
             "What is the gender of the person in this image?", (FEMALE, MALE, UNSURE),
             strata=("model",), n=100, annotators=1,
             notes="an expert identifies the gender; an image whose gender cannot be reasonably determined is "
                   "skipped (here: answered 'unsure'); the number of images is not stated (100 is a project choice)"),
    Protocol("dalleval-skin-tone", "paper000-dalleval", "paper 000, App. (skin tone), Fig. 6",
             "Which Monk skin tone (1 lightest to 10 darkest) is closest to the person's skin?", (*MONK, UNSURE),
             level="ordinal", strata=("model",), n=78, annotators=2,
             notes="two expert annotators trained on the Monk Skin Tone Examples rate 78 images; alpha ordinal"),
    Protocol("dalleval-attributes", "paper000-dalleval", "paper 000, App. (attributes), Fig. 6",
             "Do you see {subject} in this image?", (YES, NO, UNSURE), strata=("model",), n=50, annotators=1,
             notes="an expert selects all present attributes in the image (each of the 15 asked as yes/no here); "
                   "BLIP-2's answers are the classifier's; the number of images is not stated (50 is a project "
                   "choice)"),
    Protocol("exposed-nouns", "paper004-exposed", "paper 004, section 6, human evaluation",
             "Do you see \"{subject}\" in this image?", (YES, NO, UNSURE), strata=("model",), n=100, annotators=1,
             notes="100 randomly selected generated images with the nouns of their prompts; people say whether "
                   "each noun is present; reported as found by both, by the model only, by people only"),
)}
