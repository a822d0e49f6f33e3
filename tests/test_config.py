import dataclasses
import json
import pathlib

import pytest

from keras_transformer import Transformer
from keras_transformer import config as config_lib


def test_json_round_trip(tmp_path):
    config = config_lib.preset_config("multi30k")
    config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, train_files=("a.en", "a.de")))
    config.save(tmp_path / "config.json")
    assert config_lib.Config.load(tmp_path / "config.json") == config


def test_model_fields_are_the_constructor_arguments_and_config_keys():
    model_config = config_lib.preset_config("tiny").model
    model = Transformer(**dataclasses.asdict(model_config))
    config = model.get_config()
    assert {k: config[k] for k in dataclasses.asdict(model_config)} == dataclasses.asdict(
        model_config)


def test_paper_presets_follow_table_3():
    base, big = (config_lib.preset_config(name) for name in ("paper_base", "paper_big"))
    assert (base.model.num_layers, base.model.hidden_dim, base.model.intermediate_dim,
            base.model.num_heads, base.model.dropout) == (6, 512, 2048, 8, 0.1)
    assert (big.model.num_layers, big.model.hidden_dim, big.model.intermediate_dim,
            big.model.num_heads, big.model.dropout) == (6, 1024, 4096, 16, 0.3)
    assert base.train.label_smoothing == 0.1 and base.train.warmup_steps == 4000


def measured_config(result_file):
    """Returns the config recorded by a quality run (benchmarks/results/RESULT_FILE).

    Read as a run's saved config is read: fields added since the run take their
    defaults, which keep what the code did before they existed.
    """
    record = pathlib.Path(__file__).parents[1] / "benchmarks" / "results" / result_file
    recorded = json.loads(record.read_text(encoding="utf-8"))["config"]
    return json.loads(config_lib.Config.from_json(json.dumps(recorded)).to_json())


def assert_same_recipe(preset, measured):
    assert preset["model"] == measured["model"]
    assert preset["train"] == measured["train"]
    assert {key: value for key, value in preset["data"].items() if key != "data_dir"} == {
        key: value for key, value in measured["data"].items() if key != "data_dir"}


def in_float32(measured):
    """A measured recipe with the precision it leaves to the hardware (float32)."""
    return {**measured, "train": {**measured["train"], "mixed_precision": None}}


def test_the_default_preset_is_the_recipe_of_its_measured_row():
    """`multi30k` trains what row q9 of BENCHMARKS.md's quality table trained.

    Less `mixed_precision=bfloat16`: a choice for CPUs with AVX-512 bf16 or AMX, which
    the preset leaves to its user.
    """
    preset = json.loads(config_lib.preset_config("multi30k").to_json())
    assert_same_recipe(preset, in_float32(measured_config("quality-20261207T182013Z.json")))


def test_the_hour_preset_is_the_recipe_of_its_measured_row():
    """`multi30k_hour` trains what row q4 trained, as above less bfloat16."""
    assert_same_recipe(json.loads(config_lib.preset_config("multi30k_hour").to_json()),
                       in_float32(measured_config("quality-20261206T155826Z.json")))


def test_overrides_by_section_or_unique_field_name():
    config = config_lib.override(config_lib.preset_config("tiny"), [
        "model.dropout=0.2", "target_language=fr", "tie_embeddings=false", "data_dir=null"])
    assert config.model.dropout == 0.2
    assert config.data.target_language == "fr"
    assert config.model.tie_embeddings is False
    assert config.data.data_dir is None


@pytest.mark.parametrize("assignment, message", [
    ("hiden_dim=3", "names no single config field"),
    ("seed=3", "names no single config field"),  # in data and train: ambiguous
    ("dropout", "field=value"),
])
def test_bad_overrides_are_explained(assignment, message):
    with pytest.raises(ValueError, match=message):
        config_lib.override(config_lib.preset_config("tiny"), [assignment])


def test_corrupt_or_unknown_config_files_name_the_file_and_problem(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model": {"hidden_dim": 8,')
    with pytest.raises(ValueError, match="config.json: line 1"):
        config_lib.Config.load(path)
    path.write_text(json.dumps({"model": {"hidden_size": 8}}))
    with pytest.raises(ValueError, match="hidden_size"):
        config_lib.Config.load(path)
    path.write_text(json.dumps({"trian": {"epochs": 50}}))  # a misspelt section
    with pytest.raises(ValueError, match=r"unknown section\(s\) \['trian'\]"):
        config_lib.Config.load(path)
    raw = json.loads(config_lib.preset_config("tiny").to_json())
    raw["model"]["dropout"] = "0.1"  # edited by hand: a string
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"config.json: model.dropout=\"0.1\": expected"):
        config_lib.Config.load(path)


def test_an_override_may_fix_a_config_files_value_of_another_type(tmp_path):
    from keras_transformer import cli

    path = tmp_path / "c.json"
    raw = json.loads(config_lib.preset_config("tiny").to_json())
    raw["train"]["epochs"] = "3"  # edited by hand: a string
    path.write_text(json.dumps(raw), encoding="utf-8")
    parser = cli.make_parser()[1]["train"]
    config, _ = cli.make_config(parser.parse_intermixed_args(
        ["--config", str(path), "epochs=3"]))
    assert config.train.epochs == 3
    for fixed_by in ([], ["dropout=0.2"]):  # unfixed, it is named with its file
        with pytest.raises(ValueError, match=r'c.json: train.epochs="3": expected'):
            cli.make_config(parser.parse_intermixed_args(["--config", str(path),
                                                          *fixed_by]))


def test_config_files_with_retired_fields_still_load(tmp_path):
    path = tmp_path / "config.json"
    raw = json.loads(config_lib.preset_config("tiny").to_json())
    raw["data"]["shuffle_buffer"] = 1000  # written by earlier versions
    path.write_text(json.dumps(raw), encoding="utf-8")
    assert config_lib.Config.load(str(path)) == config_lib.preset_config("tiny")
