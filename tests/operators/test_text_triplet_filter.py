"""The triplet filter of paper 004 (section 3, App. A "Prompts", Table S1): neutral captions have
*person* / *people* and no word of Table S1 nor its plural; their feminine / masculine prompts
swap person / people for woman / man and women / men, and nothing else."""

import random
import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators.base import filter_with_tally, split_tallies
from operators.text_triplet_filter import (
    OUTCOMES,
    TripletFilter,
    python_loop_filter,
    swap,
)
from schemas.captions import TALLY_COUNT, TALLY_FIELDS, TALLY_OUTCOME
from schemas.exposed import (
    FEMININE,
    HUMAN_WORD,
    HUMAN_WORDS,
    IRREGULAR_PLURALS,
    MASCULINE,
    NEUTRAL,
    NO_PLURAL,
    TRIPLET_SOURCE,
    TRIPLET_STATUS,
    TripletOutcome,
)
from schemas.occupations import plural

KEPT, NULL, NO_PERSON, HUMAN, UNSWAPPABLE = (TripletOutcome.KEPT, TripletOutcome.NULL_CAPTION,
                                             TripletOutcome.NO_PERSON_WORD, TripletOutcome.HUMAN_WORD,
                                             TripletOutcome.UNSWAPPABLE)


@pytest.fixture(scope="module")
def op():
    return TripletFilter(text_column="TEXT", source="coco")


def run(op, captions, column="TEXT"):
    out = op(pa.table({column: pa.array(captions, pa.string())}))
    return [(r[TRIPLET_STATUS], r[HUMAN_WORD], r[NEUTRAL], r[FEMININE], r[MASCULINE]) for r in out.to_pylist()]


def status(op, caption):
    return run(op, [caption])[0][0]


def table_s1():
    """(type, word) for every word of Table S1 as printed (and the added "bridesmaid")."""
    return [(kind, w) for kind, words in HUMAN_WORDS.items() for w in words]


def expected_plural(word):
    w = word.lower()
    if w in NO_PLURAL:
        return None
    return IRREGULAR_PLURALS.get(w, plural(w))


# --------------------------------------------------------------------------------------------
# Table S1


@pytest.mark.parametrize("kind,word", table_s1())
def test_every_table_s1_word_rejects_and_is_named(op, kind, word):
    caption = f"A person next to the {word} in the park"
    assert run(op, [caption])[0][:2] == (HUMAN, word.lower())
    # any case: the comparison is case-insensitive
    assert run(op, [caption.replace(word, word.upper())])[0][:2] == (HUMAN, word.lower())


@pytest.mark.parametrize("kind,word", [(k, w) for k, w in table_s1() if expected_plural(w)])
def test_the_plural_of_every_table_s1_word_rejects(op, kind, word):
    p = expected_plural(word)
    assert run(op, [f"Two people and some {p} on a bench"])[0][:2] == (HUMAN, p)


@pytest.mark.parametrize(
    "caption,word",
    [
        ("Two kids and a person", "kids"),
        ("A person with two ladies", "ladies"),
        ("people and their wives", "wives"),
        ("People with children in a garden", "children"),
        ("People and women on a boat", "women"),
        ("A person among the gentlemen", "gentlemen"),
        ("Two actresses and a person", "actresses"),
        ("people, princesses and a castle", "princesses"),
        ("people dressed as heroes", "heroes"),
        ("Bridesmaids and people at a wedding", "bridesmaids"),
        ("People with the groomsmen", "groomsmen"),
        ("Several families of people", "families"),
        ("People and celebrities", "celebrities"),
        # App. A: Table S1's words "and their plurals", the geography words and female / male included
        ("people watching Indians dance", "indians"),
        ("People and Americans at a parade", "americans"),
        ("Asians and people in a market", "asians"),
        ("people greeting Africans", "africans"),
        ("Latinos and people dancing", "latinos"),
        ("Two females and a person", "females"),
        ("people and males in a line", "males"),
    ],
)
def test_plurals_written_out(op, caption, word):
    assert run(op, [caption])[0][:2] == (HUMAN, word)


def test_words_without_a_plural_are_not_pluralised(op):
    # "his" has no plural: "hiss" is not a human word; "hers" is a word of its own
    assert status(op, "A person and a snake's hiss") == KEPT
    assert status(op, "A person's bag and hers") == HUMAN


def test_the_first_human_word_is_named(op):
    assert run(op, ["The actor and his dog near a person"])[0][:2] == (HUMAN, "actor")
    assert run(op, ["His dog and the actor near a person"])[0][:2] == (HUMAN, "his")
    assert run(op, ["PEOPLE watching a Footballer, a coach and a KING"])[0][:2] == (HUMAN, "footballer")


@pytest.mark.parametrize(
    "caption,word",
    [
        ("Spider-Man and a person", "man"),  # the hyphen separates words
        ("a person's mother-in-law", "mother"),
        ("I saw a person", "i"),
        ("a person u know", "u"),
        ("a person next to me", "me"),
        ("people with Mr. Bean", "mr"),
        ("the ceo's people", "ceo"),
        ("A person at the Asian market", "asian"),
        ("people in a cafe, she said", "she"),
        ("a couple of people", "couple"),
        ("person_id 3 of the crew", "crew"),
    ],
)
def test_human_words_at_word_boundaries(op, caption, word):
    assert run(op, [caption])[0][:2] == (HUMAN, word)


@pytest.mark.parametrize(
    "caption",
    [
        "A person with a womanly look",  # "woman" inside a word
        "A person in a manner of speaking",
        "A human and a person",  # "human" is not in Table S1
        "people at the command post",  # not "commander"
        "a person with a kidney stone",  # not "kid"
        "people on the shell beach",  # not "she"
        "this person",  # not "his"
        "people at the Asiana counter",  # not "asian"
        "people using Uber",  # not "u"
        "some people, mostly",  # not "mostly" -> "most"
        "Iñigo and a person",  # a non-ASCII letter continues the word: not "i"
        "Ümit and people",  # not "mit", not "u"
        "a person in the heroine costume",  # not "hero"
        "people in a kingdom",  # not "king"
        "a person by a man_made statue",  # the underscore joins words: "man_made" is one word
    ],
)
def test_words_that_do_not_count(op, caption):
    assert status(op, caption) == KEPT


# --------------------------------------------------------------------------------------------
# person / people


@pytest.mark.parametrize(
    "caption",
    ["A personal computer on a desk", "Peoples of the world", "Two persons on a bench", "A salesperson",
     "The personnel office", "a peopled valley", "a dog", "PERSONS", "person_id", "Personhood"],
)
def test_no_person_word(op, caption):
    assert status(op, caption) == NO_PERSON


@pytest.mark.parametrize(
    "caption,feminine,masculine",
    [
        ("People take part in a race.", "Women take part in a race.", "Men take part in a race."),
        ("A person and two people", "A woman and two women", "A man and two men"),
        ("PERSON ON A BIKE", "WOMAN ON A BIKE", "MAN ON A BIKE"),
        ("A PERSON and a Person and a person", "A WOMAN and a Woman and a woman", "A MAN and a Man and a man"),
        ("person person person", "woman woman woman", "man man man"),
        ("people-watching in the square", "women-watching in the square", "men-watching in the square"),
        ("a person's umbrella", "a woman's umbrella", "a man's umbrella"),
        ("a person’s umbrella", "a woman’s umbrella", "a man’s umbrella"),
        ("a person-shaped balloon", "a woman-shaped balloon", "a man-shaped balloon"),
        ("A personal item of a person", "A personal item of a woman", "A personal item of a man"),
        ("café, people, crème brûlée", "café, women, crème brûlée", "café, men, crème brûlée"),
        ("«people» in quotes", "«women» in quotes", "«men» in quotes"),
        ("People\tin\na\r\nline", "Women\tin\na\r\nline", "Men\tin\na\r\nline"),
        ("  people  ", "  women  ", "  men  "),
        ("東京 person 駅", "東京 woman 駅", "東京 man 駅"),
        ("people🙂 smiling", "women🙂 smiling", "men🙂 smiling"),
    ],
)
def test_swap(op, caption, feminine, masculine):
    assert run(op, [caption])[0] == (KEPT, None, caption, feminine, masculine)
    assert swap(caption) == (feminine, masculine)


@pytest.mark.parametrize("caption", ["pEople in a park", "A Person and a pERSON", "PeoPle", "a PERSOn",
                                     "People and peoPLE"])
def test_a_case_the_swap_cannot_mirror_is_unswappable(op, caption):
    assert status(op, caption) == UNSWAPPABLE
    assert swap(caption) is None


def test_precedence(op):
    # null first, then Table S1 (even without person / people), then person / people, then case
    assert [r[0] for r in run(op, [None, "A woman in the park", "a pERSON and a man", "a dog", "pErson"])] == \
        [NULL, HUMAN, HUMAN, NO_PERSON, UNSWAPPABLE]


def test_only_kept_rows_carry_the_triplet(op):
    caps = ["a man", "People walk", None, "a dog", "pEople", "Two people"]
    out = op(pa.table({"TEXT": caps}))
    kept = pc.equal(out[TRIPLET_STATUS], KEPT).to_pylist()
    for col in (NEUTRAL, FEMININE, MASCULINE):
        assert [v is not None for v in out[col].to_pylist()] == kept
    assert [v is not None for v in out[HUMAN_WORD].to_pylist()] == [s == HUMAN for s in out[TRIPLET_STATUS].to_pylist()]
    assert out[NEUTRAL].to_pylist()[1] == "People walk"  # the caption itself
    assert set(out[TRIPLET_SOURCE].to_pylist()) == {"coco"}
    assert out.column("TEXT").to_pylist() == caps  # the input column is untouched


# --------------------------------------------------------------------------------------------
# input


@pytest.mark.parametrize("caption", [None, "", " ", "   \t\n", "\u00a0\u2003"])
def test_null_and_blank_captions(op, caption):
    assert run(op, [caption]) == [(NULL, None, None, None, None)]


def test_non_string_column_is_a_clear_error(op):
    with pytest.raises(ValueError, match=r"'TEXT' has type int64"):
        op(pa.table({"TEXT": pa.array([1, 2])}))


def test_missing_column_lists_the_columns(op):
    with pytest.raises(ValueError, match=r"'TEXT' not found.*\['caption', 'url'\]"):
        op(pa.table({"caption": ["a person"], "url": ["x"]}))


def test_all_null_large_dictionary_and_chunked_columns(op):
    assert op(pa.table({"TEXT": pa.nulls(3)}))[TRIPLET_STATUS].to_pylist() == [NULL] * 3
    large = op(pa.table({"TEXT": pa.array(["People walk", "a man"], pa.large_string())}))
    assert large[FEMININE].to_pylist() == ["Women walk", None]
    dic = op(pa.table({"TEXT": pa.array(["People walk", "a man", "People walk"]).dictionary_encode()}))
    assert dic[MASCULINE].to_pylist() == ["Men walk", None, "Men walk"]
    chunked = pa.Table.from_batches([pa.record_batch({"TEXT": ["a person"]}), pa.record_batch({"TEXT": ["a man", "people"]})])
    out = op(chunked)
    assert out[FEMININE].to_pylist() == ["a woman", None, "women"]
    assert op(pa.table({"TEXT": pa.array([], pa.string())})).num_rows == 0


def test_sliced_input_keeps_rows_aligned(op):
    caps = pa.array(["x"] * 5 + ["People walk", "a man", "a person"])
    assert op(pa.table({"TEXT": caps.slice(5)}))[FEMININE].to_pylist() == ["Women walk", None, "a woman"]


def test_custom_human_words():
    op = TripletFilter(text_column="caption", human_words=["Dog", "wife"])
    assert run(op, ["a person and a dog", "people with dogs", "a man and a person", "people and wives"],
               column="caption") == [
        (HUMAN, "dog", None, None, None), (HUMAN, "dogs", None, None, None),
        (KEPT, None, "a man and a person", "a man and a woman", "a man and a man"),  # "man" is not listed here
        (HUMAN, "wives", None, None, None),  # the irregular plurals apply to custom lists too
    ]
    with pytest.raises(ValueError, match="single word"):
        TripletFilter(human_words=["ice skater"])
    with pytest.raises(ValueError, match="neutral word"):
        TripletFilter(human_words=["person"])


# --------------------------------------------------------------------------------------------
# stage contract and counts


def test_stage_contract_and_tallies(op):
    assert op.stage_name == "triplets" and op.status_column == TRIPLET_STATUS
    assert op.resources.batch_size == 16384 and op.resources.num_cpus == 1
    assert tuple(op.outcomes) == OUTCOMES == (KEPT, NULL, NO_PERSON, HUMAN, UNSWAPPABLE)
    caps = ["a man", "People walk", None, "a dog", "pEople", "Two people", "her people"]
    out = op(pa.table({"TEXT": caps}))
    schema = pa.schema([pa.field("TEXT", pa.string()), pa.field(FEMININE, pa.string()), *TALLY_FIELDS])
    data, tallies = split_tallies(filter_with_tally(out, op.stage_name, out[TRIPLET_STATUS], schema, op.outcomes))
    assert data[FEMININE].to_pylist() == ["Women walk", "Two women"]
    counts = dict(zip(tallies[TALLY_OUTCOME].to_pylist(), tallies[TALLY_COUNT].to_pylist()))
    assert counts == {KEPT: 2, NULL: 1, NO_PERSON: 1, HUMAN: 2, UNSWAPPABLE: 1}
    assert sum(counts.values()) == len(caps)


def test_human_word_counts(op):
    caps = pa.array(["Two kids and a kid, kids", "A man, his dog and his cat", "the MAN", None, "a dog"])
    # a caption counts once under every word it names
    assert op.human_word_counts(caps) == {"kids": 1, "kid": 1, "man": 2, "his": 1}
    assert op.human_word_counts(pa.array([], pa.string())) == {}


# --------------------------------------------------------------------------------------------
# the vectorised operator against the one-caption-at-a-time reference

_PIECES = (
    ["a", "the", "dog", "on", "bench", "park", "red", "bus", "near", "two", "with", "of", "in", "café", "Iñigo",
     "東京", "Ümit", "straße", "personal", "persons", "peoples", "salesperson", "womanly", "manner", "human",
     "kingdom", "shell", "this", "heroine", "kidney", "123", "person_id", "x2", "Asiana", "uber"]
    + ["man", "men", "woman", "women", "his", "her", "she", "kid", "kids", "lady", "ladies", "wife", "wives",
       "child", "children", "I", "u", "me", "Mr", "ceo", "ceos", "actor", "family", "families", "crew"]
)
_SEPARATORS = [" "] * 12 + ["-", "'", "’", ", ", ". ", "_", "/", "—", "\u00a0", "\t", "«", "»", "(", ")", "🙂", ""]


def _cased(word, rng):
    r = rng.random()
    if r < 0.5:
        return word
    if r < 0.65:
        return word.upper()
    if r < 0.8:
        return word.capitalize()
    return "".join(c.upper() if rng.random() < 0.5 else c for c in word)


def generated_captions(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.02:
            out.append(rng.choice([None, "", "  ", "\n"]))
            continue
        words = [rng.choice(_PIECES) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.6:  # most captions have person / people, some of them several times
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                words.insert(rng.randint(0, len(words)), rng.choice(["person", "people"]))
        words = [_cased(w, rng) for w in words]
        text = words[0]
        for w in words[1:]:
            text += rng.choice(_SEPARATORS) + w
        out.append(rng.choice(["", " ", "«"]) + text + rng.choice(["", ".", "!", " ", "’s"]))
    return out


def test_vectorised_filter_agrees_with_the_python_loop(op):
    caps = generated_captions(2000)
    ours = run(op, caps)
    reference = [tuple(v) for v in python_loop_filter(caps)]
    assert ours == reference
    # the generated captions exercise every outcome
    seen = {r[0] for r in reference}
    assert seen == set(OUTCOMES)
    assert sum(r[0] == KEPT for r in reference) > 100


def test_the_reference_follows_the_paper_rule():
    """python_loop_filter itself, checked against the rule written out independently."""
    caps = generated_captions(500, seed=1)
    forms = {w.lower() for ws in HUMAN_WORDS.values() for w in ws}
    forms |= {expected_plural(w) for w in forms if expected_plural(w)}
    for c, v in zip(caps, python_loop_filter(caps)):
        if c is None or not c.strip():
            assert v.status == NULL
            continue
        words = re.findall(r"\w+", c)
        human = [w.lower() for w in words if w.lower() in forms]
        person = [w for w in words if w.lower() in ("person", "people")]
        if human:
            assert (v.status, v.human_word) == (HUMAN, human[0])
        elif not person:
            assert v.status == NO_PERSON
        elif any(w not in ("person", "Person", "PERSON", "people", "People", "PEOPLE") for w in person):
            assert v.status == UNSWAPPABLE
        else:
            assert v.status == KEPT
            # the three prompts differ only in the swapped words
            f_words, m_words = re.findall(r"\w+", v.feminine), re.findall(r"\w+", v.masculine)
            assert len(f_words) == len(m_words) == len(words)
            for w, f, m in zip(words, f_words, m_words):
                if w.lower() in ("person", "people"):
                    assert f.lower() == {"person": "woman", "people": "women"}[w.lower()]
                    assert m.lower() == {"person": "man", "people": "men"}[w.lower()]
                else:
                    assert f == m == w
            assert re.sub(r"\w+", "", v.feminine) == re.sub(r"\w+", "", c)
