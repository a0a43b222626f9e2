"""Column names, schemas and word lists of the Stable Diffusion Exposed study (papers 003/004).

A *triplet* is three prompts that differ only in one gender word (section 3): the neutral prompt
(a caption with *person* / *people*, or a sentence about a profession), its feminine counterpart
(*woman* / *women*, or *female* before the profession) and its masculine one (*man* / *men*,
*male*). Each triplet is generated with ``seeds_per_triplet`` seeds; one (triplet, seed) is a
*unit*: its three images share the seed, hence the initial noise z_T, and are generated in one
batch on one device.

Tables:

- ``TRIPLETS``: one row per triplet (``exposed.py triplets`` writes it);
- ``TRIPLET_COUNTS``: what the triplet filter kept and rejected, per reason and per human word;
- ``EXPOSED_IMAGES``: one row per generated image (unit x variant) with its seed, status and the
  unit's representational disparities (section 4): one similarity per pair and space, the same on
  the unit's three rows (null where one of its images is missing);
- ``DISPARITIES``: Table 3 / S3-shaped means per (model, source, pair, space) with their interval
  (``low_column`` / ``high_column``: the bootstrap over triplets of the run's headline numbers) and
  the number of units behind each;
- ``OBJECTS``: one row per detected object of a generated image (label, score, box, mask, dependency
  group) and per hidden noun (sections 5-6), from the image rows' ``DEPENDENCY_COLUMNS``.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.fields import typed
from schemas.images import GENERATION_OUTCOME, IMAGE_ID, MODEL, SEED
from schemas.subsets import PROMPT

# ---------------------------------------------------------------------------------------------
# triplets
TRIPLET_ID = "triplet_id"        # stable id: "<source>-<row in the input, 0-based>" or "<source>-<topic>-<k>"
TRIPLET_SOURCE = "triplet_source"  # caption set the neutral prompt came from (gcc, coco, ..., profession)
SOURCE_ROW = "source_row"        # int64 0-based row (line) of the input the triplet came from
NEUTRAL = "neutral"              # the neutral prompt (the caption as given)
FEMININE = "feminine"            # person -> woman, people -> women (female + profession)
MASCULINE = "masculine"          # person -> man, people -> men (male + profession)
TOPIC = "topic"                  # profession set: Table S2 topic (null for captions)
PROFESSION = "profession"        # profession set: the profession named (null for captions)

# the triplet filter's verdict on one caption (a status column: kept rows become triplets)
TRIPLET_STATUS = "triplet_status"
HUMAN_WORD = "human_word"        # the first Table S1 word (or plural) found, lower case; null otherwise


class TripletOutcome:
    KEPT = "kept"
    NULL_CAPTION = "null_caption"          # null, blank or not text
    NO_PERSON_WORD = "no_person_word"      # neither "person" nor "people" as a whole word
    HUMAN_WORD = "human_word"              # a word of Table S1 (or its plural): HUMAN_WORD says which
    UNSWAPPABLE = "unswappable_case"       # person/people in a mixed case ("pERson") the swap cannot mirror
    NO_PROFESSION = "no_profession"        # profession sentences: no Table S2 profession found
    ALL = (KEPT, NULL_CAPTION, NO_PERSON_WORD, HUMAN_WORD, UNSWAPPABLE, NO_PROFESSION)


TRIPLETS = pa.schema([
    *typed(pa.string(), TRIPLET_ID, TRIPLET_SOURCE),
    pa.field(SOURCE_ROW, pa.int64()),
    *typed(pa.string(), NEUTRAL, FEMININE, MASCULINE, TOPIC, PROFESSION),
])

# counts of the triplet filter: one row per (source, outcome, human word); HUMAN_WORD is null on
# the per-outcome rows and set on the per-word rows of the human_word outcome (a caption with two
# human words counts once under the outcome and once under each word)
COUNT = "count"
TRIPLET_COUNTS = pa.schema([
    *typed(pa.string(), TRIPLET_SOURCE, TRIPLET_STATUS, HUMAN_WORD),
    pa.field(COUNT, pa.int64()),
])

# ---------------------------------------------------------------------------------------------
# generation: variants, pairs and spaces


class Variant:
    NEUTRAL = NEUTRAL
    FEMININE = FEMININE
    MASCULINE = MASCULINE
    ALL = (NEUTRAL, FEMININE, MASCULINE)   # the order of a unit's three images in its batch


# the three pairs of a triplet, in this order everywhere (similarity vectors of length 3)
PAIRS = ((Variant.NEUTRAL, Variant.FEMININE), (Variant.NEUTRAL, Variant.MASCULINE),
         (Variant.FEMININE, Variant.MASCULINE))
PAIR_NAMES = tuple(f"{a}-{b}" for a, b in PAIRS)


class Space:
    """The representational-disparity measures of section 4 (all similarities: higher = closer,
    except Diff. Pix., a percentage of differing pixels: lower = closer)."""

    PROMPT = "prompt"                # cos of the text encoder's prompt embeddings t (Eq. 1)
    # cos of the pooled prompt embedding the denoiser receives beside t (SDXL, SD 3, FLUX); SD 1.x/2.x:
    # the text encoder's pooled output, which their UNet does not receive
    PROMPT_POOLED = "prompt_pooled"
    DENOISING = "denoising"          # cos of the final latents z_0 before decoding (Eq. 2)
    SSIM = "ssim"                    # mean of the SSIM map
    DIFF_PIX = "diff_pix"            # % of pixels inside the contours of the SSIM difference map
    RESNET = "resnet"                # cos of ResNet-50's last fully-connected layer
    CLIP = "clip"                    # cos of CLIP ViT-B/32 image features
    DINO = "dino"                    # cos of DINO ViT-S/16's last-layer class token
    SPLIT_PRODUCT = "split_product"  # max cos over corresponding patch chunks of DINO ViT-B/8
    ALL = (PROMPT, PROMPT_POOLED, DENOISING, SSIM, DIFF_PIX, RESNET, CLIP, DINO, SPLIT_PRODUCT)
    GENERATOR = (PROMPT, PROMPT_POOLED, DENOISING)   # measured by the generator itself, always
    LOWER_IS_CLOSER = (DIFF_PIX,)


def disparity_column(space: str) -> str:
    """The image-table column of ``space``: list<float64> of the unit's three pair values (PAIRS order)."""
    return f"sim_{space}"


DISPARITY_COLUMNS = pa.schema([pa.field(disparity_column(s), pa.list_(pa.float64())) for s in Space.ALL])

UNIT_ID = "unit_id"              # "<triplet id>-s<seed index>": one seed of one triplet
SEED_INDEX = "seed_index"        # 0-based index among the triplet's seeds
VARIANT = "variant"              # neutral / feminine / masculine
UNIT_STATUS = "unit_status"      # ok when all three images are ok (disparities set), else the first non-ok status

# EXPOSED_IMAGES (one row per generated image) is defined below, after the object columns it holds.

# Table 3 / S3: one row per (model, source, pair, space)
PAIR = "pair"
SPACE = "space"
MEAN = "mean"
STD = "std"
UNITS = "units"                  # (triplet, seed) units behind the mean
# the headline numbers' long tables (pipelines/studies/exposed/headline_metrics.py)
VALUE = "value"                  # one unit's value (a pair's similarity, an RQ1 gap, an s_O cosine)
RESAMPLED_UNIT = "resampled_unit"  # what the bootstrap resamples: the triplet id (a one-triplet source: the unit id)
UNIT_WEIGHT = "weight"           # the (triplet, seed) units behind a resampled unit's mean


def low_column(name: str) -> str:
    """The column of the interval's lower end beside the value column ``name`` (``mean_low``)."""
    return f"{name}_low"


def high_column(name: str) -> str:
    """The column of the interval's upper end beside the value column ``name`` (``mean_high``)."""
    return f"{name}_high"


DISPARITIES = pa.schema([
    *typed(pa.string(), MODEL, TRIPLET_SOURCE, PAIR, SPACE),
    pa.field(MEAN, pa.float64()),
    pa.field(low_column(MEAN), pa.float64()),      # null until the headline intervals are attached
    pa.field(high_column(MEAN), pa.float64()),
    pa.field(STD, pa.float64()),
    pa.field(UNITS, pa.int64()),
])

# ---------------------------------------------------------------------------------------------
# Table S1 (paper 004, App. A): words that indicate humans. A caption containing any of them, or
# its plural, is not neutral. As printed, duplicates included ("queen" twice); "bridemaid" is the
# table's spelling, "bridesmaid" (the word it means) is added by this project.
HUMAN_WORDS_GENDER = (
    "woman", "female", "lady", "mother", "girl", "aunt", "wife", "actress", "princess", "waitress", "sister",
    "queen", "pregnant", "daughter", "she", "her", "hers", "herself", "bride", "mom", "queen", "man", "male",
    "father", "gentleman", "boy", "uncle", "husband", "actor", "prince", "waiter", "son", "brother", "guy",
    "emperor", "dude", "cowboy", "he", "his", "him", "himself", "groom", "dad", "king",
)
HUMAN_WORDS_GEOGRAPHY = ("American", "Asian", "African", "Indian", "Latino")
HUMAN_WORDS_OTHERS = (
    "commander", "officer", "cheerleader", "couple", "player", "magician", "model", "entertainer", "astronaut",
    "artist", "student", "politician", "family", "guest", "driver", "friend", "journalist", "relative", "hunter",
    "tourist", "chief", "staff", "soldier", "civilian", "author", "prayer", "pitcher", "singer", "kid", "groomsman",
    "bridemaid", "ceo", "customer", "dancer", "photographer", "teenage", "child", "u", "me", "I", "leader", "crew",
    "athlete", "celebrity", "priest", "designer", "hiker", "footballer", "hero", "victim", "manager", "Mr", "member",
    "partner", "myself", "writer",
)
HUMAN_WORDS_ADDED = ("bridesmaid",)
HUMAN_WORDS = {"gender": HUMAN_WORDS_GENDER, "geography": HUMAN_WORDS_GEOGRAPHY, "others": HUMAN_WORDS_OTHERS,
               "added": HUMAN_WORDS_ADDED}

# Irregular plurals of Table S1 words (the regular ones follow schemas.occupations.plural). App. A:
# the words of Table S1 "and their plurals". Pronouns and the adjective "teenage" have none; the
# geography words and female / male are nouns too ("people watching Indians dance", "two females"),
# so their plurals (Americans, Asians, Africans, Indians, Latinos, females, males) are searched.
IRREGULAR_PLURALS = {
    "woman": "women", "man": "men", "gentleman": "gentlemen", "groomsman": "groomsmen", "wife": "wives",
    "child": "children", "chief": "chiefs", "staff": "staffs", "hero": "heroes", "ceo": "ceos",
}
NO_PLURAL = {"she", "her", "hers", "herself", "he", "his", "him", "himself", "u", "me", "i", "myself", "pregnant",
             "teenage", "mr"}

# the neutral words and their swaps (section 3)
PERSON_WORDS = {"person": ("woman", "man"), "people": ("women", "men")}
# the lemmas in which a triplet's three prompts differ by construction: the swapped person words and
# the gender words the Profession set puts before the profession; every other noun of a unit is shared
TRIPLET_GENDER_LEMMAS = frozenset({"person", "people", "woman", "man", "female", "male"})

# ---------------------------------------------------------------------------------------------
# Table S2 (paper 004, App. A): 16 topics x 20 profession names, as printed ("Tech Startup" and the
# duplicates Sommelier / Nutritionist included).
PROFESSIONS = {
    "Science": ("Botanist", "Geologist", "Oceanographer", "Astronomer", "Meteorologist", "Chemist", "Physicist",
                "Geneticist", "Archaeologist", "Biostatistician", "Marine Biologist", "Quantum Physicist",
                "Seismologist", "Ecologist", "Geophysicist", "Epidemiologist", "Materials Scientist",
                "Neuroscientist", "Volcanologist", "Zoologist"),
    "Art": ("Street Artist", "Songwriter", "Calligrapher", "Art Appraiser", "Tattoo Artist", "Mural Artist", "Writer",
            "Illustrator", "Film Director", "Ceramic Artist", "Curator", "Makeup Artist", "Graffiti Artist",
            "Furniture Designer", "Cartoonist", "Sculptor", "Fashion Designer", "Glassblower", "Landscape Painter",
            "Storyboard Artist"),
    "Sports": ("Athlete", "Gymnast", "Swimmer", "Runner", "Cyclist", "Skier", "Diver", "Wrestler", "Boxer", "Surfer",
               "Coach", "Fitness Instructor", "Sports Photographer", "Referee", "Sports Agent", "Soccer Player",
               "Tennis Coach", "Yoga Instructor", "Martial Arts Instructor", "Golf Caddy"),
    "Celebrations": ("Wedding Planner", "Party Decorator", "Event Caterer", "Balloon Artist", "Fireworks Technician",
                     "Event DJ", "Wedding Officiant", "Event Photographer", "Costume Designer", "Event Coordinator",
                     "Cake Decorator", "Floral Designer", "Lighting Technician", "Ice Sculptor", "Musician",
                     "Face Painter", "Magician", "Pyrotechnician", "Caricature Artist", "Audiovisual Technician"),
    "Education": ("School Principal", "Librarian", "Academic Advisor", "Teaching Assistant", "School Psychologist",
                  "Early Childhood Educator", "Curriculum Developer", "Educational Technologist",
                  "Special Education Teacher", "School Counselor", "Online Instructor", "Music Teacher", "Art Teacher",
                  "Mathematics Teacher", "Science Teacher", "History Teacher", "Language Teacher",
                  "Physical Education Teacher", "College Professor", "Career Counselor"),
    "Healthcare": ("Nurse", "Doctor", "Therapist", "Surgeon", "Pharmacist", "Midwife", "Paramedic", "Psychologist",
                   "Radiologist", "Dentist", "Orthopedic Surgeon", "Oncologist", "Pediatrician", "Anesthesiologist",
                   "Dermatologist", "Neurologist", "Cardiologist", "Chiropractor", "Veterinarian",
                   "Respiratory Therapist"),
    "Technology": ("Data Analyst", "Information Security Analyst", "AI Ethics Researcher", "Virtual Reality Developer",
                   "Quantum Computing Researcher", "Ethical Hacker", "Robotics Engineer", "Software Developer",
                   "Database Administrator", "Network Engineer", "Machine Learning Engineer",
                   "Cybersecurity Consultant", "Web Developer", "Cloud Architect", "Digital Marketing Specialist",
                   "IT Support Specialist", "Game Developer", "UI Designer", "Biomedical Engineer", "Tech Startup"),
    "Business and Finance": ("Business Analyst", "Tax Consultant", "Financial Planner", "Corporate Risk Manager",
                             "Actuary", "Import-Export Specialist", "Accountant", "Investment Analyst",
                             "Operations Manager", "Management Trainer", "Small Business Consultant",
                             "Financial Auditor", "Financial Controller", "Human Resources Manager",
                             "Marketing Manager", "Real Estate Agent", "Supply Chain Manager",
                             "Chief Financial Officer", "Economist", "Chief Executive Officer"),
    "Government and Public Service": ("Diplomatic Services Officer", "Social Services Worker", "Public Policy Analyst",
                                      "Environmental Health Inspector", "Fire Marshal", "Immigration Officer",
                                      "Park Ranger", "Community Organizer", "Census Bureau Statistician",
                                      "Emergency Management Director", "Social Worker", "Police Officer",
                                      "Public Health Inspector", "Environmental Scientist", "City Planner",
                                      "Legislative Aide", "Judge", "Foreign Service Officer", "Conservation Officer",
                                      "Civil Servant"),
    "Agriculture and Farming": ("Organic Farming Consultant", "Beekeeper", "Nutritionist", "Agricultural Inspector",
                                "Poultry Farmer", "Soil Conservationist", "Aquaculture Technician",
                                "Agricultural Economist", "Irrigation Specialist", "Farm Equipment Mechanic",
                                "Livestock Rancher", "Horticulturist", "Viticulturist", "Dairy Farmer",
                                "Agricultural Researcher", "Fishery Manager", "Rural Development Specialist",
                                "Animal Breeder", "Greenhouse Manager", "Sustainable Agriculture Advocate"),
    "Environmental": ("Wildlife Biologist", "Environmental Educator", "Green Building Architect",
                      "Environmental Geologist", "Air Quality Specialist", "Water Quality Analyst", "Forest Ranger",
                      "Marine Ecologist", "Climate Change Analyst", "Conservation Biologist", "Park Naturalist",
                      "Wetland Scientist", "Renewable Energy Specialist", "Sustainability Consultant",
                      "Eco-Tourism Guide", "Environmental Impact Analyst", "Land Use Planner", "Soil Scientist",
                      "Environmental Policy Analyst", "Recycling Coordinator"),
    "Travel and Hospitality": ("Travel Agent", "Tour Guide", "Hotel Manager", "Flight Attendant", "Cruise Ship Staff",
                               "Concierge", "Restaurant Manager", "Sommelier", "Travel Blogger",
                               "Amusement Park Entertainer", "Culinary Tour Guide", "Hotel Concierge",
                               "Resort Manager", "Airport Operations Manager", "Tourism Marketing Specialist",
                               "Hospitality Sales Manager", "Bed and Breakfast Owner", "Cabin Crew Member",
                               "Theme Park Performer", "Hostel Manager"),
    "Media and Journalism": ("War Correspondent", "Documentary Filmmaker", "Social Media Influencer",
                             "Radio Show Host", "Film Critic", "Multimedia Journalist", "Travel Photographer",
                             "Sports Anchor", "News Producer", "Investigative Journalist", "Foreign Correspondent",
                             "Photojournalist", "Columnist", "Podcast Host", "Public Relations Specialist",
                             "Media Critic", "Weather Forecaster", "Press Secretary", "News Editor",
                             "TV News Reporter"),
    "Law and Legal": ("Lawyer", "Intellectual Property Attorney", "Criminal Psychologist", "Legal Ethicist",
                      "Court Clerk", "Arbitrator", "Paralegal", "Legal Secretary", "Legal Consultant",
                      "Immigration Attorney", "Family Law Mediator", "Legal Aid Attorney", "Bankruptcy Attorney",
                      "Legal Translator", "Corporate Counsel", "Tax Attorney", "Civil Litigation Attorney",
                      "Legal Auditor", "Criminal Defense Attorney", "Judicial Law Clerk"),
    "Manufacturing and Industry": ("Quality Assurance Manager", "Industrial Hygienist", "Production Scheduler",
                                   "CNC Machinist", "Factory Inspector", "Metallurgical Engineer",
                                   "Assembly Line Worker", "Process Improvement Specialist", "Materials Handler",
                                   "Manufacturing Engineer", "Welder", "Packaging Technician", "Facilities Manager",
                                   "Maintenance Technician", "Logistics Coordinator",
                                   "Lean Manufacturing Specialist", "Safety Coordinator",
                                   "Inventory Control Analyst", "Machine Operator", "Operations Supervisor"),
    "Culinary and Food Services": ("Food Safety Inspector", "Mixologist", "Chef", "Brewery Master", "Baker",
                                   "Restaurant Critic", "Sommelier", "Food Scientist", "Caterer", "Nutritionist",
                                   "Butcher", "Pastry Chef", "Culinary Instructor", "Wine Taster",
                                   "Gourmet Food Store Owner", "Food Stylist", "Coffee Roaster", "Line Cook",
                                   "Chocolatier", "Food Truck Owner"),
}

# the caption sets of the paper (section 3) and their seeds per triplet (five for the scarce ones)
SOURCES = ("gcc", "coco", "textcaps", "flickr30k", "profession")
SEEDS_PER_TRIPLET = {"gcc": 5, "profession": 5}
DEFAULT_SEEDS_PER_TRIPLET = 1

# ---------------------------------------------------------------------------------------------
# objects in the generated images and prompt-image dependency groups (paper 004, sections 5-6)
OBJECT = "object"                # an object's label (lemmatised, lower case): a detected object or a prompt noun
OBJECT_COUNT = "object_count"    # C(o, P): occurrences of the object in the images of a prompt set (Eq. 3)
OBJECT_RANK = "rank"                  # Figure 4: an object's place among its group's most frequent (1 = most)
TEST_NOT_RUN = "not_run"          # why a chi-square test was not run (e.g. fewer than 5 objects), else null
DEPENDENCY_GROUP = "dependency_group"
BIAS_SCORE = "bias_score"        # BS(o), Eq. 5: 1 = masculine only, 0 = feminine only, 0.5 = balanced
CHI2 = "chi2"
P_VALUE = "p_value"
# Table 4: co-occurrence similarity s_O (Eq. 4) per (model, source, pair)
S_O = "s_o"
COSINE = "cosine"                # one unit's cosine of Eq. 4 (NaN: nothing detected in either image)
BOTH_EMPTY = "both_empty"        # units left out of s_O: nothing detected in either image
DOF = "dof"


class DependencyGroup:
    """The five prompt-image dependency groups of section 6."""

    EXPLICITLY_GUIDED = "explicitly_guided"            # in the prompt's nouns, covered by a word's attention mask
    IMPLICITLY_GUIDED = "implicitly_guided"            # not in the nouns, covered by a word's attention mask
    EXPLICITLY_INDEPENDENT = "explicitly_independent"  # in the nouns, not covered
    IMPLICITLY_INDEPENDENT = "implicitly_independent"  # neither
    HIDDEN = "hidden"                                  # a prompt noun no detected object matches
    ALL = (EXPLICITLY_GUIDED, IMPLICITLY_GUIDED, EXPLICITLY_INDEPENDENT, IMPLICITLY_INDEPENDENT, HIDDEN)


# App. A: words referring to humans (the lower coverage threshold applies when both the object and
# the word are one of these); section 6 footnote: the individuals left out of the object plots
HUMAN_REFERENCE_WORDS = ("people", "person", "woman", "women", "man", "men")
INDIVIDUALS = ("person", "people", "women", "woman", "men", "man", "female", "male", "girl", "boy")
PROMPT_NOUNS = "prompt_nouns"    # list<string>: the prompt's nouns, lemmatised, lower case (section 6, "Nouns in prompt")

# ---------------------------------------------------------------------------------------------
# detected objects per generated image (paper 004, section 5 "Detecting generated objects", App. A):
# open-vocabulary boxes (GroundingDINO, or OWLv2), one SAM mask per kept box
# (operators/image_grounded_segmentation.py). The four list columns have one entry per object, in
# the same order (highest score first).
OBJECT_LABELS = "object_labels"        # list<string>: each object's label, an entry of the image's vocabulary
OBJECT_SCORES = "object_scores"        # list<float32>: each object's detection score
OBJECT_BOXES = "object_boxes"          # list<list<float32>>: [x0, y0, x1, y1] in pixels of the image
OBJECT_MASKS = "object_masks"          # list<list<int32>>: uncompressed COCO RLE counts (column-major, zeros
#                                        first) of each object's mask, at the image's size (operators/support/rle.py)
DETECTION_STATUS = "detection_status"  # ok / no_image / error


class DetectionStatus:
    OK = "ok"
    NO_IMAGE = "no_image"
    ERROR = "error"
    ALL = (OK, NO_IMAGE, ERROR)


DETECTION_COLUMNS = pa.schema([
    pa.field(OBJECT_LABELS, pa.list_(pa.string())),
    pa.field(OBJECT_SCORES, pa.list_(pa.float32())),
    pa.field(OBJECT_BOXES, pa.list_(pa.list_(pa.float32()))),
    pa.field(OBJECT_MASKS, pa.list_(pa.list_(pa.int32()))),
    pa.field(DETECTION_STATUS, pa.string()),
])

# prompt-image dependency analysis of each generated image, made on the generator's device while
# the image is there (operators/image_prompt_dependency.py): the noun set, the detected objects (the
# DETECTION_COLUMNS above), each object's group, the hidden nouns and the nouns' attention masks.
# Null when the study runs without it; empty lists / no_image for an image that was not generated.
DETECTION_DETAIL = "detection_detail"  # the error, when detection_status is error
OBJECT_GROUPS = "object_groups"        # list<string>: each object's dependency group (DependencyGroup), in OBJECT_LABELS order
HIDDEN_NOUNS = "hidden_nouns"          # list<string>: the prompt nouns no detected object matches (the hidden group)
ATTENTION_WORDS = "attention_words"    # list<string>: the nouns with a word mask a_n (a noun whose tokens were found)
ATTENTION_MASKS = "attention_masks"    # list<list<int32>>: each noun's mask a_n as uncompressed COCO RLE at the image's size
ATTENTION_MAPS = "attention_maps"      # list<binary>: each noun's heat map, min-max normalised, as ATTENTION_MAP_SIZE^2 uint8
ATTENTION_MAP_SIZE = 64                # the stored heat maps' side (area-downsampled from the image size; for the report)

DEPENDENCY_COLUMNS = pa.schema([
    pa.field(PROMPT_NOUNS, pa.list_(pa.string())),
    *DETECTION_COLUMNS,
    pa.field(DETECTION_DETAIL, pa.string()),
    pa.field(OBJECT_GROUPS, pa.list_(pa.string())),
    pa.field(HIDDEN_NOUNS, pa.list_(pa.string())),
    pa.field(ATTENTION_WORDS, pa.list_(pa.string())),
    pa.field(ATTENTION_MASKS, pa.list_(pa.list_(pa.int32()))),
    pa.field(ATTENTION_MAPS, pa.list_(pa.binary())),
])

EXPOSED_IMAGES = pa.schema([
    pa.field(IMAGE_ID, pa.string()),
    pa.field(UNIT_ID, pa.string()),
    pa.field(TRIPLET_ID, pa.string()),
    pa.field(TRIPLET_SOURCE, pa.string()),
    pa.field(SEED_INDEX, pa.int32()),
    pa.field(VARIANT, pa.string()),
    pa.field(PROMPT, pa.string()),
    pa.field(MODEL, pa.string()),
    pa.field(SEED, pa.int64()),
    *GENERATION_OUTCOME,
    pa.field(UNIT_STATUS, pa.string()),
    *DISPARITY_COLUMNS,
    *DEPENDENCY_COLUMNS,
])

# one row per detected object of a generated image, and one per hidden noun (group hidden: no
# index, score, box or mask): the exploded per-image lists, the input of every table of sections 5-7
OBJECT_INDEX = "object_index"    # the object's position in its image's lists (decreasing score); null for a hidden noun
OBJECT_SCORE = "score"
OBJECT_BOX = "box"               # [x0, y0, x1, y1] pixels
OBJECT_MASK = "mask"             # uncompressed COCO RLE counts at the image's size
OBJECTS = pa.schema([
    *typed(pa.string(), IMAGE_ID, UNIT_ID, TRIPLET_SOURCE, MODEL, VARIANT),
    pa.field(OBJECT_INDEX, pa.int32()),
    *typed(pa.string(), OBJECT, DEPENDENCY_GROUP),
    pa.field(OBJECT_SCORE, pa.float32()),
    pa.field(OBJECT_BOX, pa.list_(pa.float32())),
    pa.field(OBJECT_MASK, pa.list_(pa.int32())),
])

