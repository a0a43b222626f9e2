import pyarrow as pa

from operators.text_caption_validator import CaptionValidator


def statuses(col, url=None):
    t = pa.table({"TEXT": col} | ({"URL": url} if url is not None else {}))
    out = CaptionValidator("TEXT", "URL" if url is not None else None)(t)
    return out.column("caption_status").to_pylist(), out


def test_string_captions():
    s, out = statuses(pa.array(["a nurse", None, "", "  \t ", "ok"]), pa.array(["u1", "u2", "u3", "u4", None]))
    assert s == ["kept", "null_caption", "empty_caption", "empty_caption", "kept"]
    assert out.column("caption").to_pylist()[0] == "a nurse"
    assert out.column("url").to_pylist() == ["u1", "u2", "u3", "u4", None]
    assert "TEXT" not in out.column_names


def test_non_text_column_types():
    s, _ = statuses(pa.array([1, None, 3], pa.int64()))
    assert s == ["non_text_caption", "null_caption", "non_text_caption"]
    s, _ = statuses(pa.array([["a"], None], pa.list_(pa.string())))
    assert s == ["non_text_caption", "null_caption"]


def test_binary_captions_must_be_utf8():
    s, out = statuses(pa.array([b"a nurse", b"\xff\xfe broken", None, b""], pa.binary()))
    assert s == ["kept", "non_text_caption", "null_caption", "empty_caption"]
    assert out.column("caption").to_pylist()[0] == "a nurse"


def test_large_and_dictionary_strings():
    s, _ = statuses(pa.array(["a", None], pa.large_string()))
    assert s == ["kept", "null_caption"]
    s, _ = statuses(pa.array(["a", "", "a"]).dictionary_encode())
    assert s == ["kept", "empty_caption", "kept"]


def test_no_url_column_gives_null_urls():
    _, out = statuses(pa.array(["a"]))
    assert out.column("url").to_pylist() == [None]
