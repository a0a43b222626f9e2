"""Column names and schemas of DALL-Eval's visual-reasoning skills (paper 000, section 3, section
4.1, App. B: PaintSkills).

One row per generated image (``SKILL_IMAGES``): the skill prompt it came from (object recognition
"a photo of <obj>", object counting "a photo of <N> <obj>", spatial relation understanding
"a <objB> is <rel> a <objA>"), its seed and generation status, what the object detector found
(every detection above the recording floor: COCO label, score, box), and the verdicts of section
4.1's rules at the scoring threshold (recomputed from the detections on the driver, so another
threshold needs no new detection run).
"""

from __future__ import annotations

import pyarrow as pa

from schemas.fields import typed
from schemas.images import IMAGE_ID, generated_images, prompt_index_seed


class Skill:
    OBJECT = "object"      # object recognition: the target class is detected
    COUNT = "count"        # object counting: exactly N detections, all of the target class
    SPATIAL = "spatial"    # spatial relation: both classes detected, the relation from the box centres
    ALL = (OBJECT, COUNT, SPATIAL)


class Relation:
    ABOVE = "above"
    BELOW = "below"
    LEFT = "left"
    RIGHT = "right"
    ALL = (ABOVE, BELOW, LEFT, RIGHT)
    HORIZONTAL = (LEFT, RIGHT)
    VERTICAL = (ABOVE, BELOW)


# --- the skill prompt (section 3.2, Table 1, Table 10) ---------------------------------------------
SKILL = "skill"                  # Skill.*
PROMPT_ID = "prompt_id"          # "<skill>-<index>", stable for a seed and configuration
OBJECT_A = "object_a"            # COCO class name: the object (object, count) or <objA> (spatial)
OBJECT_B = "object_b"            # spatial: <objB> ("a <objB> is <rel> a <objA>"); null otherwise
COUNT = "count"                  # count: N (1-4); null otherwise
RELATION = "relation"            # spatial: Relation.*; null otherwise
TEMPLATE = "template"            # the template the prompt was written with

# --- detections (operators/image_object_detection.py) ---------------------------------------------
DET_LABELS = "det_labels"        # list<string>: the detector's class names (COCO: "person", "dog", ...)
DET_SCORES = "det_scores"        # list<float32>: their confidences, descending
DET_BOXES = "det_boxes"          # list<list<float32>>: (x0, y0, x1, y1) in [0, 1] of the image, y down
DETECTOR = "detector"            # the detector model (id or directory)

# --- verdicts at the scoring threshold (pipelines/studies/dalleval/skills.py) ----------------------
PREDICTED_COUNT = "predicted_count"        # detections above the threshold (any class)
TOP_LABEL = "top_label"                    # class of the highest-scoring detection above it (null: none)
CORRECT = "correct"                        # the skill's rule holds (null: no image to judge)
NUMBER_CORRECT = "number_correct"          # count: right number of detections (Fig. 5b "1)")
OBJECTS_CORRECT = "objects_correct"        # spatial: both classes detected (Fig. 5b "1)")
PREDICTED_RELATION = "predicted_relation"  # spatial: the relation of the two boxes (null: objects missing)

# --- accuracy tables ---------------------------------------------------------------------------------
SPLIT = "split"                  # the breakdown a row is about: "all", "count=3", "relation=left", "object=dog"
TASK = "task"                    # per-task rows (Fig. 5b)
ACCURACY = "accuracy"            # % of judged images
JUDGED = "n"                     # images behind the accuracy (generated and judged)

SKILL_REQUESTS = pa.schema([
    *typed(pa.string(), IMAGE_ID, PROMPT_ID, SKILL, OBJECT_A, OBJECT_B),
    pa.field(COUNT, pa.int8()),
    *typed(pa.string(), RELATION, TEMPLATE),
    *prompt_index_seed(),
])

DETECTION_COLUMNS = pa.schema([
    pa.field(DET_LABELS, pa.list_(pa.string())),
    pa.field(DET_SCORES, pa.list_(pa.float32())),
    pa.field(DET_BOXES, pa.list_(pa.list_(pa.float32()))),
    pa.field(DETECTOR, pa.string()),
])

VERDICT_COLUMNS = pa.schema([
    pa.field(PREDICTED_COUNT, pa.int32()),
    pa.field(TOP_LABEL, pa.string()),
    *typed(pa.bool_(), CORRECT, NUMBER_CORRECT, OBJECTS_CORRECT),
    pa.field(PREDICTED_RELATION, pa.string()),
])

SKILL_IMAGES = generated_images(SKILL_REQUESTS, *DETECTION_COLUMNS)
