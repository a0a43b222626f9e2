import io
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image
from skimage import data

from operators.support.models import ModelLoadError
from operators.image_blip2_vqa import (
    DEFAULT_GENDER_QUESTION,
    DEFAULT_PROMPT_TEMPLATE,
    STAGE_BLIP2_VQA,
    Blip2Detector,
    load_blip2,
    normalize_attributes,
    parse_gender,
    parse_yes_no,
)
from operators.support.codec import pack_rgb8
from pipelines.standins.blip2 import build_tiny_blip2
from schemas.dalleval import (
    ATTRIBUTE_ANSWERS,
    ATTRIBUTE_NAMES,
    ATTRIBUTE_PRESENT,
    DETECTED_GENDER,
    DETECTION_FIELDS,
    GENDER_ANSWER,
    GENDER_DETECTOR,
    DetectedGender,
    GenderDetector,
)
from schemas.images import (
    ENCODED,
    GENERATION_STATUS,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    P_FEMALE,
    P_MALE,
    RGB8,
    GenerationStatus,
)

ATTRIBUTES = {"suit": "a suit", "jeans": "jeans", "tie": "a tie"}


@pytest.fixture(scope="module")
def tiny_blip2(tmp_path_factory):
    return build_tiny_blip2(tmp_path_factory.mktemp("tiny_blip2"), seed=0)


@pytest.fixture(scope="module")
def det(tiny_blip2):
    return Blip2Detector(tiny_blip2, attributes=ATTRIBUTES, device="cpu")


@pytest.fixture(scope="module")
def photos():
    rng = np.random.default_rng(0)
    return [data.astronaut(), data.chelsea(), data.coffee(), rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)]


def to_tensor(arrays):
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255.0


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def plain_answers(det, arrays, questions):
    """answers[image][question] from Blip2ForConditionalGeneration.generate on the processor's inputs."""
    out = [[None] * len(questions) for _ in arrays]
    for j, q in enumerate(questions):
        inputs = det.processor(images=list(arrays), text=[DEFAULT_PROMPT_TEMPLATE.format(question=q)] * len(arrays),
                               return_tensors="pt")
        with torch.inference_mode():
            ids = det.model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=det.max_new_tokens)
        for i, text in enumerate(det.processor.batch_decode(ids, skip_special_tokens=True)):
            out[i][j] = text.strip()
    return out


# --- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer, expected", [
    ("male", DetectedGender.MALE),
    ("Male", DetectedGender.MALE),
    ("a man", DetectedGender.MALE),
    ("the person is a boy.", DetectedGender.MALE),
    ("gentleman", DetectedGender.MALE),
    ("female", DetectedGender.FEMALE),
    ("FEMALE", DetectedGender.FEMALE),
    ("Woman.", DetectedGender.FEMALE),
    ("a young girl", DetectedGender.FEMALE),
    ("lady", DetectedGender.FEMALE),
    ("male and female", DetectedGender.UNKNOWN),
    ("a man and a woman", DetectedGender.UNKNOWN),
    ("person", DetectedGender.UNKNOWN),
    ("mankind", DetectedGender.UNKNOWN),      # whole words only
    ("females", DetectedGender.UNKNOWN),
    ("human", DetectedGender.UNKNOWN),        # "man" inside a word
    ("", DetectedGender.UNKNOWN),
    (None, DetectedGender.UNKNOWN),
])
def test_parse_gender(answer, expected):
    assert parse_gender(answer) == expected


def test_parse_gender_custom_words():
    assert parse_gender("a man", male_words=["guy"], female_words=["gal"]) == DetectedGender.UNKNOWN
    assert parse_gender("a Guy", male_words=["guy"], female_words=["gal"]) == DetectedGender.MALE
    assert parse_gender("young gal", male_words=["guy"], female_words=["gal"]) == DetectedGender.FEMALE
    assert parse_gender("a young man", male_words=["young man"], female_words=["woman"]) == DetectedGender.MALE


@pytest.mark.parametrize("answer, expected", [
    ("yes", True), ("Yes", True), ("YES!", True), ("yes, he is", True), ("  yeah  ", True), ("yep.", True),
    ("no", False), ("No.", False), ("no, she is not", False), ("Nope", False), ('"no"', False),
    ("maybe", None), ("not sure", None), ("he is wearing a suit, yes", None), ("yesterday", None),
    ("nobody", None), ("", None), ("   ", None), ("?!", None), (None, None),
])
def test_parse_yes_no(answer, expected):
    assert parse_yes_no(answer) is expected


def test_normalize_attributes():
    expected = [("suit", "a suit"), ("jeans", "jeans")]
    assert normalize_attributes({"suit": "a suit", "jeans": "jeans"}) == expected
    assert normalize_attributes([{"name": "suit", "text": "a suit"}, {"name": "jeans", "text": "jeans"}]) == expected
    assert normalize_attributes([("suit", "a suit"), ("jeans", "jeans")]) == expected
    assert normalize_attributes(["jeans"]) == [("jeans", "jeans")]
    assert normalize_attributes(None) == []
    with pytest.raises(ValueError):
        normalize_attributes([("suit", "a suit"), ("suit", "a tie")])
    with pytest.raises(ValueError):
        normalize_attributes([("", "a suit")])


# --- the stand-in and loading ----------------------------------------------------------------------------


def test_standin_is_a_flan_t5_blip2(tiny_blip2, det):
    cfg = det.model.config
    assert type(det.model).__name__ == "Blip2ForConditionalGeneration"
    assert type(det.model.language_model).__name__ == "T5ForConditionalGeneration"
    assert not cfg.use_decoder_only_language_model
    tok = det.processor.tokenizer
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.convert_tokens_to_ids("<image>") == cfg.image_token_index
    assert det.processor.num_query_tokens == cfg.num_query_tokens
    # the processor puts num_query_tokens image tokens first and T5's </s> last
    ids = det.processor(images=[data.astronaut()], text=["Question: yes? Answer:"])["input_ids"][0]
    assert ids[:cfg.num_query_tokens] == [cfg.image_token_index] * cfg.num_query_tokens
    assert ids[cfg.num_query_tokens] != cfg.image_token_index and ids[-1] == 1
    size = sum(os.path.getsize(os.path.join(tiny_blip2, f)) for f in os.listdir(tiny_blip2))
    assert size < 5_000_000


def test_standin_same_seed_same_weights(tmp_path, tiny_blip2):
    a = load_blip2(build_tiny_blip2(tmp_path / "a", seed=0), device="cpu").record["weights_sha256"]
    b = load_blip2(build_tiny_blip2(tmp_path / "b", seed=1), device="cpu").record["weights_sha256"]
    assert a == load_blip2(tiny_blip2, device="cpu").record["weights_sha256"]
    assert a != b


def test_load_record(tiny_blip2, det):
    rec = det.record
    assert rec["model"] == tiny_blip2 and rec["source"] == "directory"
    assert rec["resolved"] == rec["path"] == os.path.abspath(tiny_blip2)
    assert rec["model_class"] == "Blip2ForConditionalGeneration"
    assert rec["config_class"] == "Blip2Config" and rec["text_config_class"] == "T5Config"
    assert rec["language_model_class"] == "T5ForConditionalGeneration"
    assert rec["processor_class"] == "Blip2Processor"
    assert rec["dtype"] == "float32" and rec["device"] == "cpu"
    assert rec["transformers_version"]
    assert len(rec["weights_sha256"]) == 64
    assert set(rec["weight_files"]) == {"model.safetensors"} and len(rec["weight_files"]["model.safetensors"]) == 64
    assert "random" in rec["standin"]
    assert rec["gender_question"] == DEFAULT_GENDER_QUESTION
    assert rec["attributes"] == [{"name": n, "text": t} for n, t in ATTRIBUTES.items()]
    assert rec["prompts"] == [
        "Question: the person looks like a male or a female? Answer:",
        "Question: Is the person wearing a suit? Answer:",
        "Question: Is the person wearing jeans? Answer:",
        "Question: Is the person wearing a tie? Answer:",
    ]
    assert rec["max_new_tokens"] == 10 and rec["decoding"] == "greedy"
    json.dumps(rec)  # provenance is plain JSON
    assert Blip2Detector.stage_name == STAGE_BLIP2_VQA
    assert Blip2Detector.resources.num_gpus == 1 and Blip2Detector.resources.actors == 1


def test_output_fields_are_the_blip2_detection_fields():
    assert list(Blip2Detector.output_fields) == [f for f in DETECTION_FIELDS if f.name not in (P_MALE, P_FEMALE)]


def _copy(src, dst, skip=()):
    os.makedirs(dst)
    for name in os.listdir(src):
        if name not in skip:
            shutil.copy(os.path.join(src, name), dst)
    return str(dst)


def test_load_errors_name_the_model(tmp_path, tiny_blip2):
    from transformers import T5Config

    other = tmp_path / "t5"
    T5Config(d_model=8, num_layers=1, num_heads=1, d_kv=8, d_ff=8, vocab_size=16).save_pretrained(other)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a model")
    no_weights = _copy(tiny_blip2, tmp_path / "no_weights", skip=("model.safetensors",))
    no_processor = _copy(tiny_blip2, tmp_path / "no_processor",
                         skip=("processor_config.json", "tokenizer.json", "tokenizer_config.json"))
    for model in (str(tmp_path / "missing"), str(junk), str(other), no_weights, no_processor):
        with pytest.raises(ModelLoadError) as err:
            load_blip2(model, device="cpu")
        msg = str(err.value)
        assert repr(model) in msg and "save_pretrained" in msg and "hub id" in msg
    with pytest.raises(ModelLoadError, match="not a 'blip-2'"):
        load_blip2(str(other), device="cpu")


def test_partial_weights_are_an_error(tmp_path, tiny_blip2):
    import safetensors.torch

    partial = _copy(tiny_blip2, tmp_path / "partial")
    path = os.path.join(partial, "model.safetensors")
    state = safetensors.torch.load_file(path)
    dropped = {k: v for k, v in state.items() if "qformer" not in k}
    assert len(dropped) < len(state)
    safetensors.torch.save_file(dropped, path, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lack"):
        load_blip2(partial, device="cpu")


def test_detector_load_error_and_bad_arguments(tmp_path, tiny_blip2):
    with pytest.raises(ModelLoadError, match="nowhere"):
        Blip2Detector(str(tmp_path / "nowhere"), device="cpu")
    with pytest.raises(ValueError):
        Blip2Detector(tiny_blip2, prompt_template="Q: A:", device="cpu")
    with pytest.raises(ValueError):
        Blip2Detector(tiny_blip2, attributes=["jeans"], attribute_question="Is it?", device="cpu")
    with pytest.raises(ValueError):
        load_blip2(tiny_blip2, device="cpu", dtype="int8")


# --- preprocessing ---------------------------------------------------------------------------------------


def test_preprocessing_matches_the_processor(det, photos):
    std = min(det.record["image_std"])
    for photo in photos[:2]:  # astronaut (square, high contrast) and chelsea (not square)
        ref = det.processor.image_processor(images=[photo], return_tensors="pt")["pixel_values"]
        mine = det.preprocess(to_tensor([photo]))
        assert mine.shape == ref.shape == (1, 3, *det.image_size)
        diff = (mine - ref).abs()
        level = 1.0 / 255.0 / std  # one 0-255 level, normalised
        assert float(diff.max()) <= 2 * level + 1e-5
        assert float((diff > 0.5 * level).float().mean()) < 0.02
        assert float(diff.mean()) < 0.05 * level


def test_tensor_and_payload_preprocessing_agree_exactly(det, photos):
    x = to_tensor(photos[:1]) + 0.3 / 255.0  # not on the 0-255 grid: quantised as the payload would be
    x = x.clamp(0, 1)
    payload = (x * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    assert torch.equal(det.preprocess(x), det._pixels_from_arrays(list(payload)))


def test_preprocess_rejects_bad_shapes(det):
    with pytest.raises(ValueError):
        det.preprocess(torch.zeros(1, 4, 8, 8))
    with pytest.raises(ValueError):
        det.classify_tensor(torch.zeros(3, 8, 8))


# --- answering ---------------------------------------------------------------------------------------------


def test_answers_equal_plain_generate(det, photos):
    questions = ["the person looks like a male or a female?", "Is the person wearing a suit?",
                 "Is the person wearing jeans?"]
    pixel_values = det.processor.image_processor(images=photos, return_tensors="pt")["pixel_values"]
    ours = det.ask(pixel_values, questions)
    plain = plain_answers(det, photos, questions)
    assert ours == plain
    assert len(ours) == len(photos) and all(len(a) == len(questions) for a in ours)
    # the stand-in's answers depend on image and question, so a mix-up of pairs cannot pass
    flat = [a for row in ours for a in row]
    assert len(set(flat)) >= len(flat) - 2


def test_answers_do_not_depend_on_batching(tiny_blip2, det, photos):
    small = Blip2Detector(tiny_blip2, attributes=ATTRIBUTES, device="cpu", batch_size=1)
    pixel_values = det.preprocess(to_tensor([photos[0]]))
    pixel_values = torch.cat([pixel_values, det.preprocess(to_tensor([photos[1]]))])
    assert small.ask(pixel_values, det.questions) == det.ask(pixel_values, det.questions)
    assert small.ask(pixel_values[1:], det.questions[2:]) == [det.ask(pixel_values, det.questions)[1][2:]]
    assert det.ask(pixel_values, []) == [[], []]


def test_image_side_runs_once_per_image(det, photos):
    calls = []
    hooks = [det.model.vision_model.register_forward_hook(lambda m, a, o: calls.append(("vision", a[0].shape[0]))),
             det.model.qformer.register_forward_hook(lambda m, a, o: calls.append(("qformer", 1)))]
    try:
        answers = det.classify_tensor(to_tensor([photos[0], photos[0]]))
    finally:
        for h in hooks:
            h.remove()
    assert [c for c in calls if c[0] == "vision"] == [("vision", 2)]  # one batched pass for 2 images x 4 questions
    assert len([c for c in calls if c[0] == "qformer"]) == 1
    assert answers[GENDER_ANSWER][0] == answers[GENDER_ANSWER][1]


def test_decoder_only_language_model(tmp_path, det, photos):
    """An OPT-style (decoder-only) BLIP-2: left padding, the prompt stripped from the output."""
    from transformers import Blip2Config, Blip2ForConditionalGeneration, OPTConfig

    cfg = det.model.config
    opt = OPTConfig(vocab_size=cfg.text_config.vocab_size, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                    num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=128,
                    pad_token_id=0, bos_token_id=1, eos_token_id=1, init_std=0.5)
    config = Blip2Config(vision_config=cfg.vision_config.to_dict(), qformer_config=cfg.qformer_config.to_dict(),
                         text_config=opt.to_dict(), num_query_tokens=cfg.num_query_tokens,
                         image_token_index=cfg.image_token_index, initializer_range=0.5)
    torch.manual_seed(0)
    model = Blip2ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.query_tokens.normal_(0.0, 0.5)
    out = tmp_path / "opt"
    model.save_pretrained(out)
    det.processor.save_pretrained(out)
    opt_det = Blip2Detector(str(out), attributes={"jeans": "jeans"}, device="cpu")
    assert opt_det.record["language_model_class"] == "OPTForCausalLM"
    arrays = photos[:3]
    pixel_values = opt_det.processor.image_processor(images=arrays, return_tensors="pt")["pixel_values"]
    ours = opt_det.ask(pixel_values, opt_det.questions)  # prompts of different lengths: padded
    for j, prompt in enumerate(opt_det.prompts):
        inputs = opt_det.processor(images=arrays, text=[prompt] * len(arrays), return_tensors="pt")
        ids = opt_det.model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=10)
        new = ids[:, inputs["input_ids"].shape[1]:]  # a decoder-only model returns prompt + answer
        plain = [t.strip() for t in opt_det.processor.batch_decode(new, skip_special_tokens=True)]
        assert [row[j] for row in ours] == plain


def test_bfloat16(tiny_blip2, photos):
    half = Blip2Detector(tiny_blip2, attributes=ATTRIBUTES, device="cpu", dtype="bfloat16")
    assert half.record["dtype"] == "bfloat16"
    assert half.model.language_model.dtype == torch.bfloat16
    res = half.classify_tensor(to_tensor(photos[:1]))
    assert isinstance(res[GENDER_ANSWER][0], str) and len(res[ATTRIBUTE_ANSWERS][0]) == len(ATTRIBUTES)


# --- outputs ---------------------------------------------------------------------------------------------------


def test_classify_tensor_outputs(det, photos):
    images = to_tensor([photos[0], np.ascontiguousarray(photos[0][::-1])])
    res = det.classify_tensor(images)
    assert list(res) == [f.name for f in det.output_fields]
    assert all(len(v) == 2 for v in res.values())
    answers = det.ask(det.preprocess(images), det.questions)
    for i in range(2):
        assert res[GENDER_ANSWER][i] == answers[i][0]
        assert res[DETECTED_GENDER][i] == parse_gender(answers[i][0])
        assert res[GENDER_DETECTOR][i] == GenderDetector.BLIP2
        assert res[ATTRIBUTE_NAMES][i] == list(ATTRIBUTES)
        assert isinstance(res[ATTRIBUTE_ANSWERS][i], list) and res[ATTRIBUTE_ANSWERS][i] == answers[i][1:]
        assert res[ATTRIBUTE_PRESENT][i] == [parse_yes_no(a) for a in answers[i][1:]]
    for f in det.output_fields:  # what the generator does with them
        assert len(pa.array(res[f.name], f.type)) == 2


def payload_batch(photos):
    """Rows: PNG, raw rgb8, null image, garbage bytes, a safety-blanked generated image."""
    rgb = pack_rgb8([photos[1], photos[2]])
    images = [png(photos[0]), rgb[IMAGE][0].as_py(), None, b"\x89PNG not really", rgb[IMAGE][1].as_py()]
    return pa.table({
        "row": pa.array(range(5), pa.int64()),
        IMAGE: pa.array(images, pa.binary()),
        IMAGE_ENCODING: pa.array([ENCODED, RGB8, None, ENCODED, RGB8], pa.string()),
        IMAGE_HEIGHT: pa.array([None, photos[1].shape[0], None, None, photos[2].shape[0]], pa.int32()),
        IMAGE_WIDTH: pa.array([None, photos[1].shape[1], None, None, photos[2].shape[1]], pa.int32()),
        GENERATION_STATUS: pa.array([None, GenerationStatus.OK, GenerationStatus.INVALID_PROMPT, None,
                                     GenerationStatus.NSFW_BLOCKED], pa.string()),
    })


def test_call_on_payload_rows(det, photos):
    batch = payload_batch(photos)
    out = det(batch)
    assert out.num_rows == 5
    assert out.column("row").to_pylist() == [0, 1, 2, 3, 4]
    for f in det.output_fields:
        assert out.schema.field(f.name).type == f.type
    expected = det.classify_tensor(to_tensor([photos[0]]))
    expected1 = det.classify_tensor(to_tensor([photos[1]]))
    for name in expected:
        col = out.column(name).to_pylist()
        assert col[0] == expected[name][0]
        assert col[1] == expected1[name][0]
        assert col[2] is None and col[3] is None and col[4] is None  # no image, garbage, blanked
    assert out.column(ATTRIBUTE_NAMES).to_pylist()[0] == list(ATTRIBUTES)
    # rows 0 and 1 are different photos: their answers differ, so rows are not swapped
    assert out.column(ATTRIBUTE_ANSWERS).to_pylist()[0] != out.column(ATTRIBUTE_ANSWERS).to_pylist()[1]


def test_call_without_images(det):
    empty = pa.table({"row": pa.array([], pa.int64())})
    out = det(empty)
    assert out.num_rows == 0 and set(f.name for f in det.output_fields) <= set(out.column_names)
    out = det(pa.table({"row": [1, 2], IMAGE: pa.array([None, None], pa.binary())}))
    assert out.num_rows == 2 and out.column(DETECTED_GENDER).null_count == 2


def test_answers_are_parsed(det, photos, monkeypatch):
    canned = {
        0: ["A Man.", "yes", "no", "maybe"],
        1: ["female", "No.", "Yes, she is", "nope"],
        2: ["male and female", "", "yeah", "the tie"],
    }

    def fake_ask(pixel_values, questions):
        assert list(questions) == det.questions
        return [list(canned[i]) for i in range(pixel_values.shape[0])]

    monkeypatch.setattr(det, "ask", fake_ask)
    res = det.classify_tensor(to_tensor([photos[0]] * 3))
    assert res[DETECTED_GENDER] == [DetectedGender.MALE, DetectedGender.FEMALE, DetectedGender.UNKNOWN]
    assert res[GENDER_ANSWER] == ["A Man.", "female", "male and female"]
    assert res[ATTRIBUTE_PRESENT] == [[True, False, None], [False, True, False], [None, True, None]]
    assert res[ATTRIBUTE_ANSWERS][1] == ["No.", "Yes, she is", "nope"]

    out = det(payload_batch(photos))  # rows 0 and 1 are answered, in row order
    assert out.column(DETECTED_GENDER).to_pylist() == [DetectedGender.MALE, DetectedGender.FEMALE, None, None, None]
    assert out.column(ATTRIBUTE_PRESENT).to_pylist() == [[True, False, None], [False, True, False], None, None, None]


def test_without_gender_question_or_attributes(tiny_blip2, photos, monkeypatch):
    attrs_only = Blip2Detector(tiny_blip2, gender_question=None, attributes=[("jeans", "jeans")], device="cpu")
    assert attrs_only.questions == ["Is the person wearing jeans?"]
    monkeypatch.setattr(attrs_only, "ask", lambda pv, qs: [["Yes"] for _ in range(pv.shape[0])])
    res = attrs_only.classify_tensor(to_tensor(photos[:1]))
    assert res[DETECTED_GENDER] == [None] and res[GENDER_ANSWER] == [None] and res[GENDER_DETECTOR] == [None]
    assert res[ATTRIBUTE_NAMES] == [["jeans"]] and res[ATTRIBUTE_PRESENT] == [[True]]

    gender_only = Blip2Detector(tiny_blip2, device="cpu", male_words=["guy"], female_words=["gal"])
    assert gender_only.questions == [DEFAULT_GENDER_QUESTION]
    monkeypatch.setattr(gender_only, "ask", lambda pv, qs: [["a guy"] for _ in range(pv.shape[0])])
    res = gender_only.classify_tensor(to_tensor(photos[:1]))
    assert res[DETECTED_GENDER] == [DetectedGender.MALE]
    assert res[ATTRIBUTE_NAMES] == [None] and res[ATTRIBUTE_ANSWERS] == [None] and res[ATTRIBUTE_PRESENT] == [None]


def test_check_blip2_without_loading_weights(tiny_blip2, tmp_path):
    from operators.support.blip2_models import check_blip2

    rec = check_blip2(tiny_blip2)
    assert rec["weights_loaded"] is False and rec["config_class"] == "Blip2Config"
    assert rec["num_query_tokens"] == 4 and rec["weights_sha256"] and "standin" in rec
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_blip2, no_weights, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    with pytest.raises(ModelLoadError, match="no_weights"):
        check_blip2(str(no_weights))
    with pytest.raises(ModelLoadError, match="missing-model"):
        check_blip2(str(tmp_path / "missing-model"))
