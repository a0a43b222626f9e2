"""The intra-prompt preset of paper 004 (section 7, App. E, Table S7): one GCC caption, 1,000 seeds,
SD v2.0, the fewer-than-5-objects rule for the group tests."""

from helpers import REPO_ROOT

from pipelines import exposed
from pipelines.studies.exposed import study


def test_intra_prompt_preset_is_one_caption_on_1000_seeds_with_sd_2_0():
    args = exposed.build_parser().parse_args(["run", "--output", "unused", "--config",
                                              str(REPO_ROOT / "configs" / "exposed_intra_prompt.yaml")])
    st = study.ExposedStudy().settings(args)
    assert st.generation.models == ["stabilityai/stable-diffusion-2-base"]
    assert st.objects.min_group_objects == 5 and not st.professions["enabled"]
    assert [(t["neutral"], t["feminine"], t["masculine"]) for t in st.triplets.to_pylist()] == [
        ("person looks at the falling balloons at the conclusion",
         "woman looks at the falling balloons at the conclusion",
         "man looks at the falling balloons at the conclusion")]
    units = st.units
    assert units.num_rows == 1000 and len(set(units.column("seed").to_pylist())) == 1000
    assert set(units.column("triplet_source").to_pylist()) == {"intra_prompt"}


def test_a_family_without_word_maps_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """Sections 5-7 read word heat maps from the denoiser's attention: a known family without them
    (every family has them today: HiDream's and Kolors's are taken away here) is refused in one line
    when the settings are read, naming the model and its family."""
    from pipelines.studies.exposed import settings

    monkeypatch.setattr(settings, "WORD_MAPS", tuple(f for f in settings.WORD_MAPS if f not in ("hidream", "kolors")))
    argv = ["run", "--output", str(tmp_path), "--standin-models", "--max-triplets", "1", "--steps", "1",
            "--generators", "CompVis/stable-diffusion-v1-4,lodestones/Chroma1-HD,Alpha-VLLM/Lumina-Image-2.0,"
                            "HiDream-ai/HiDream-I1-Full,Kwai-Kolors/Kolors-diffusers"]
    assert exposed.main(argv) == 2
    err = capsys.readouterr().err
    assert "HiDream-ai/HiDream-I1-Full (hidream)" in err and "Kwai-Kolors/Kolors-diffusers (kolors)" in err
    assert "Chroma1-HD" not in err and "Lumina-Image-2.0" not in err      # their word maps are read at the kernel
    assert "word heat maps" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not any(tmp_path.iterdir())                                    # nothing written
