"""The installed command: quiet help for every verb, the main job end to end, your own
data, translators loaded from Python, and a failed download explained."""

import json
import logging
import os
import re
import subprocess
import sys

import pytest

import keras_transformer as kt
from keras_transformer import cli, files
from keras_transformer.data import multi30k
from keras_transformer.data.text import read_lines
from keras_transformer.data.tokenizer import PAD_ID
from tests.conftest import REPOSITORY

VERBS = sorted(cli.make_parser()[1])


def run_command(*arguments, timeout=120, **options):
    """Runs `python -m keras_transformer ARGUMENTS` in a fresh process, as a user would."""
    environment = {key: value for key, value in os.environ.items()
                   if key != "TF_CPP_MIN_LOG_LEVEL"}  # what a user's shell has
    return subprocess.run([sys.executable, "-m", "keras_transformer", *arguments],
                          capture_output=True, text=True, timeout=timeout, cwd=REPOSITORY,
                          env=environment, **options)


def test_every_job_has_a_verb():
    assert set(VERBS) == {"train", "average", "export", "check", "translate", "score",
                          "translate-corpus",
                          "evaluate", "serve", "distill", "fuzz", "recipe"}


@pytest.mark.parametrize("verb", [None, *VERBS])
def test_help_prints_only_help(verb, monkeypatch):
    # argparse wraps help to the terminal's width, which COLUMNS sets: the same here and
    # in the command.
    monkeypatch.setenv("COLUMNS", "100")
    result = run_command(*([verb] if verb else []), "--help")
    assert result.returncode == 0
    assert result.stderr == ""
    parser, verb_parsers = cli.make_parser()
    assert result.stdout == (verb_parsers[verb] if verb else parser).format_help()


def test_a_bad_verb_or_option_is_a_usage_error(capsys):
    assert cli.main(["no-such-verb"]) == 2
    assert cli.main(["translate"]) == 2  # its ARTIFACT is missing
    # Refused before the artifact loads, not by bind()'s OverflowError after it.
    capsys.readouterr()
    assert cli.main(["serve", "no-such-artifact", "--port", "80800"]) == 2
    assert "'80800' is not a port (0 to 65535)" in capsys.readouterr().err
    assert cli.main(["recipe", "--time-budget-minutes", "30", "epochs=null"]) == 2
    assert "train.epochs=null: expected an integer" in capsys.readouterr().err


@pytest.mark.parametrize("verb, arguments, earlier, option, field, value", [
    ("check", ["run"], "--sentences", "--input", "input", "in.txt"),
    ("recipe", [], "--minutes", "--time-budget-minutes", "time_budget_minutes", "1.5")])
def test_earlier_option_names_still_work_unlisted(verb, arguments, earlier, option, field,
                                                  value):
    parser = cli.make_parser()[1][verb]
    by_earlier_name = parser.parse_intermixed_args([*arguments, earlier, value])
    assert str(vars(by_earlier_name)[field]) == value
    assert by_earlier_name == parser.parse_intermixed_args([*arguments, option, value])
    assert earlier not in parser.format_help()


@pytest.mark.parametrize("arguments", [[], ["--verbose"]])
def test_no_verb_is_the_usage_and_one_error_line_on_stderr(arguments):
    result = run_command(*arguments)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("usage: keras-transformer")
    assert [line for line in lines if "error:" in line] == [
        "keras-transformer: error: the following arguments are required: VERB"]
    assert lines[-1].endswith("error: the following arguments are required: VERB")


def test_verbose_leaves_tensorflows_logger_as_it_is():
    import tensorflow as tf  # the test's own: cli leaves TensorFlow to its verbs

    logger = tf.get_logger()
    level = logger.level
    try:
        logger.setLevel(logging.INFO)
        cli.console.load_tensorflow(verbose=True)
        assert logger.level == logging.INFO
        cli.console.load_tensorflow(verbose=False)
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(level)


@pytest.mark.parametrize("verb, first_file", [("train", "train.en.gz"),
                                               ("evaluate", "test_2016_flickr.en.gz")])
def test_a_failed_download_is_one_error_line_and_leaves_no_file(tmp_path, verb, first_file):
    cache = tmp_path / "keras"
    run_dir = tmp_path / "run"
    if verb == "train":
        arguments = ["train", "--preset", "tiny", "--run-dir", str(run_dir)]
    else:
        run_dir.mkdir()
        kt.preset_config("tiny").save(str(run_dir / files.CONFIG))
        arguments = ["evaluate", str(run_dir)]
    # Port 9 (discard) of this machine: the connection is refused at once.
    environment = {**os.environ, "KERAS_HOME": str(cache),
                   multi30k.URL_ENVIRONMENT_VARIABLE: "http://127.0.0.1:9/multi30k"}
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", *arguments],
        capture_output=True, text=True, timeout=120, cwd=REPOSITORY, env=environment)
    assert result.returncode == 2
    assert result.stdout == ""  # Keras's "Downloading data from ..." is no result
    url = f"http://127.0.0.1:9/multi30k/{first_file}"
    assert f"Downloading data from {url}" in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.splitlines()[-1] == errors[0]
    assert url in errors[0]
    assert "--data-dir DIR" in errors[0] and multi30k.URL_ENVIRONMENT_VARIABLE in errors[0]
    assert "Traceback" not in result.stderr
    downloads = cache / multi30k.CACHE_SUBDIR
    assert not downloads.exists() or not any(downloads.iterdir())


# The only α the main job may choose: not the paper's, so that a decoder that falls back
# to the paper's beam search is seen.
CHOSEN_ALPHA = 1.5


def test_a_recipe_refuses_a_finished_run_of_another_config(tmp_path):
    # The run directory's name comes from the preset alone: the same recipe with another
    # override lands on the finished run, whose model it must not take for its own.
    from keras_transformer import config as config_lib
    from keras_transformer import recipe

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = config_lib.preset_config("tiny")
    config.save(str(run_dir / files.CONFIG))
    record = {"minutes": 1.0, "epochs": 1, "updates": 10}
    (run_dir / files.TRAINING_RECORD).write_text(json.dumps(record), encoding="utf-8")
    changed = config_lib.override(config, ["token_dropout=0.2"])
    with pytest.raises(ValueError, match=r"different config \(model.token_dropout differ"):
        recipe.train_once(changed, str(run_dir))
    # What a resumed run may change, and the vocabulary its tokenizer settled.
    allowed = config_lib.override(config, ["epochs=3", "vocabulary_size=999"])
    assert recipe.train_once(allowed, str(run_dir)) == record
    # Edited by hand: its numbers as numbers.
    (run_dir / files.TRAINING_RECORD).write_text(json.dumps({**record, "minutes": "1.5"}),
                                                 encoding="utf-8")
    assert recipe.train_once(config, str(run_dir)) == {**record, "minutes": 1.5}
    for damaged in ("[]", "{}", '{"minutes": 1.0, "upd',  # edited by hand, truncated
                    json.dumps({"minutes": 1.0, "updates": 10})):
        (run_dir / files.TRAINING_RECORD).write_text(damaged, encoding="utf-8")
        with pytest.raises(ValueError, match="training_record.json: not a training record"):
            recipe.train_once(config, str(run_dir))


@pytest.fixture(scope="module")
def main_job(tmp_path_factory, fixture_corpus_dir):
    """The main-job verb on the fixture corpus with the tiny preset, run once."""
    run_dir = tmp_path_factory.mktemp("main_job") / "run"
    result = run_command("recipe", "--preset", "tiny", "--data-dir", str(fixture_corpus_dir),
                         "--run-dir", str(run_dir), "--epochs", "2", "--steps-per-epoch",
                         "15", "--length-penalties", str(CHOSEN_ALPHA), "num_layers=1",
                         timeout=900)
    return run_dir, result


@pytest.mark.timeout(960)  # trains, chooses, exports with its self-check, scores: ~4 min
def test_the_main_job_trains_chooses_exports_checks_and_scores_every_test_split(main_job):
    run_dir, result = main_job
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in (files.CONFIG, files.FINAL_WEIGHTS, files.AVERAGED_WEIGHTS,
                 os.path.join(files.EXPORT_DIR, files.SAVED_MODEL, "saved_model.pb"),
                 os.path.join(files.EXPORT_DIR, files.TFLITE),
                 os.path.join(files.EXPORT_DIR, files.CHECK_REPORT)):
        assert (run_dir / name).exists(), name
    table = result.stdout.splitlines()
    for split in multi30k.TEST_SPLITS:
        rows = [line.split() for line in table if line.startswith(split)]
        assert [row[1] for row in rows] == ["beam", "greedy"]
        assert all(float(row[3]) >= 0 for row in rows)  # a BLEU per split and decoder
    assert "Sample translations (validation):" in result.stdout
    assert "Chosen on validation (29 sentences)" in result.stdout
    noise = [line for line in result.stderr.splitlines() if "I0000" in line
             or "absl::InitializeLog" in line or "cuInit" in line]
    assert noise == []


STDERR_GONE = """
import os
from keras_transformer.cli import console
read_end, write_end = os.pipe()
os.dup2(write_end, 2)  # stderr: a pipe that nobody reads any more
os.close(write_end)
os.close(read_end)
with console.native_stderr_filtered():
    for _ in range(64):  # 512 KiB, more than a pipe holds
        os.write(2, b"x" * 8191 + b"\\n")
print("done")
"""


STDERR_SLOW = """
import os, threading, time
from keras_transformer.cli import console
read_end, write_end = os.pipe()
os.set_blocking(write_end, False)  # as a parent may share it
os.dup2(write_end, 2)
os.close(write_end)
received = []

def read_slowly():
    while data := os.read(read_end, 4096):
        received.append(data)
        time.sleep(0.001)

reader = threading.Thread(target=read_slowly)
reader.start()
with console.native_stderr_filtered():
    for number in range(4096):  # 512 KiB
        os.write(2, b"%07d " % number + b"x" * 119 + b"\\n")
os.close(2)
reader.join()
print(len(b"".join(received)))
"""


def test_the_stderr_filter_writes_all_to_a_slow_non_blocking_stderr():
    result = subprocess.run([sys.executable, "-c", STDERR_SLOW], capture_output=True,
                            text=True, timeout=120, cwd=REPOSITORY)
    assert result.stdout == f"{4096 * 128}\n", result.stderr


def test_the_stderr_filter_goes_on_reading_when_stderr_is_gone():
    # `keras-transformer … 2>&1 | head`, a full disk: a filter that stopped reading would
    # block the command at its next message once the pipe between them is full.
    result = subprocess.run([sys.executable, "-c", STDERR_GONE], capture_output=True,
                            text=True, timeout=60, cwd=REPOSITORY)
    assert result.stdout == "done\n"


def test_the_main_jobs_console_shows_each_message_once_in_the_commands_format(main_job):
    # absl's first message (from tf.saved_model.save) used to add a handler to the root
    # logger, after which every message came twice, the second `INFO:logger.name:...`.
    run_dir, result = main_job
    assert result.returncode == 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    repeated = sorted({line for line in lines if lines.count(line) > 1})
    assert repeated == []
    assert [line for line in lines
            if re.match(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:", line)] == []
    # The export and its self-check, in one line each; the choice's progress.
    export = run_dir / files.EXPORT_DIR
    assert any(line.startswith("Exporting ") and "with beam 4, α " in line
               for line in lines), lines
    assert (f"Exported SavedModel, .tflite, int8 .tflite: self-check 35/35 passed "
            f"({export / files.CHECK_REPORT})") in lines
    progress = [re.match(r"Choosing on validation (\d+)/(\d+): BLEU .* \(.* left\)$", line)
                for line in lines if line.startswith("Choosing on validation ")]
    total = int(progress[0].group(2))
    assert [(int(match.group(1)), int(match.group(2))) for match in progress] == [
        (i, total) for i in range(1, total + 1)]


def test_a_failing_self_check_names_itself_and_its_report(main_job, capsys, monkeypatch):
    from keras_transformer.serving import self_check
    run_dir, result = main_job
    assert result.returncode == 0
    model_checks = self_check.model_checks
    monkeypatch.setattr(self_check, "model_checks", lambda *args, **kwargs: [
        *model_checks(*args, **kwargs),
        self_check.Check("planted: SavedModel = nothing", False, "planted")])
    status = cli.main(["check", str(run_dir)])
    output = capsys.readouterr()
    assert status == 1
    report = run_dir / files.EXPORT_DIR / files.CHECK_REPORT
    assert (f"Exported SavedModel, .tflite, int8 .tflite: self-check failed 1 of 36: "
            f"planted: SavedModel = nothing ({report})") in output.out.splitlines()
    errors = [line for line in output.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "planted: SavedModel = nothing" in errors[0]


# Run alone, a test of the main job's run pays for the main_job fixture (up to 900 s).
@pytest.mark.timeout(1200)  # the fixture, then loading and translating five times
def test_translators_of_a_run_its_saved_model_and_its_tflite_file_agree(
        main_job, fixture_corpus_dir):
    run_dir, result = main_job
    assert result.returncode == 0
    sources = read_lines(fixture_corpus_dir / "val.en.gz")[:8]
    export_dir = run_dir / files.EXPORT_DIR
    # Greedy: the run directory's default is its choice, beam search.
    translations = [kt.load_translator(str(run_dir), greedy=True)(sources)] + [
        kt.load_translator(str(path))(sources)
        for path in (export_dir / files.SAVED_MODEL, export_dir / files.TFLITE)]
    assert translations[0] == translations[1] == translations[2]
    assert len(translations[0]) == len(sources)
    beam = [kt.load_translator(str(path), beam_size=4)(sources)
            for path in (run_dir, export_dir / files.SAVED_MODEL)]
    assert beam[0] == beam[1]


@pytest.mark.timeout(1920)  # the fixture, translate (120 s) and evaluate --beam (600 s)
def test_the_translate_and_evaluate_verbs_on_the_main_jobs_run(main_job, tmp_path):
    run_dir, result = main_job
    assert result.returncode == 0
    source = tmp_path / "sentences.en"
    source.write_text("A dog runs.\nTwo men play football.\n", encoding="utf-8")
    translated = run_command("translate", str(run_dir), "--input", str(source))
    assert translated.returncode == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == 2
    assert "I0000" not in translated.stderr and "absl" not in translated.stderr
    evaluated = run_command("evaluate", str(run_dir), "--beam", timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr
    rows = [line.split()[0] for line in evaluated.stdout.splitlines()
            if line.startswith("test_")]
    assert rows == list(multi30k.TEST_SPLITS)
    # Another beam size on the run directory: its model in memory decodes it.
    other = run_command("translate", str(run_dir), "--input", str(source), "--beam-size",
                        "2")
    assert other.returncode == 0, other.stderr
    assert "beam 2" in other.stderr
    # On the artifact, only the exported beam search: it says which one that is.
    refused = run_command("translate", str(run_dir / files.EXPORT_DIR / files.SAVED_MODEL),
                          "--input", str(source), "--beam-size", "2")
    assert refused.returncode == 2
    assert "was exported with beam size" in refused.stderr


@pytest.mark.timeout(1500)  # the fixture, an export (60 s), translating with each artifact
def test_the_runs_choice_is_kept_by_a_re_export_and_used_to_translate_the_run(
        main_job, tmp_path, fixture_corpus_dir):
    from keras_transformer import runs
    from keras_transformer.serving import runners
    from keras_transformer.serving.translator import Translator

    run_dir, result = main_job
    assert result.returncode == 0
    choice = runs.load_choice(run_dir)
    assert (choice.beam_size, choice.length_penalty) == (4, CHOSEN_ALPHA)
    selection = json.loads((run_dir / files.RECIPE_RESULT).read_text())["selection"]
    assert choice.weights == os.path.relpath(selection["weights_path"], run_dir)
    export_dir = run_dir / files.EXPORT_DIR
    first_id = json.loads((export_dir / files.REPORT_JSON).read_text())["export_id"]
    # Exported again without decoding options, as to add an artifact. Greedy and beam
    # search alone: the choice is beam search's; the other signatures add tracing.
    exported = run_command("export", str(run_dir), "--signatures",
                           f"{files.GREEDY_SIGNATURE},{files.BEAM_SIGNATURE}", timeout=600)
    assert exported.returncode == 0, exported.stderr
    assert f"with beam 4, α {CHOSEN_ALPHA:g} (the run's choice, recipe: " in exported.stderr
    report = json.loads((export_dir / files.REPORT_JSON).read_text())
    assert report["export_id"] != first_id
    assert report["translator"]["length_penalty"] == CHOSEN_ALPHA
    assert report["run"]["weights"] == os.path.abspath(run_dir / choice.weights)

    # Every artifact's beam search decodes as the chosen α does, not as the paper's.
    sources = read_lines(fixture_corpus_dir / "val.en.gz")
    _, tokenizer, model = runs.load_run(str(run_dir), choice.weights_path(str(run_dir)))

    def outputs(runner):
        token_ids = runner(sources)["token_ids"]
        return [tuple(int(i) for i in ids if i != PAD_ID) for ids in token_ids]

    in_memory = {alpha: outputs(runners.ModuleRunner(Translator(
        model, tokenizer, beam_size=4, length_penalty=alpha), beam=True))
        for alpha in (CHOSEN_ALPHA, files.PAPER_LENGTH_PENALTY)}
    differ = [i for i, (chosen, paper) in enumerate(zip(*in_memory.values()))
              if chosen != paper]
    assert len(differ) >= 3  # else these sentences cannot tell the two α apart
    for name in (files.SAVED_MODEL, files.TFLITE, files.TFLITE_QUANTIZED):
        found = outputs(runners.open_runner(str(export_dir / name), beam=True))
        as_chosen = sum(found[i] == in_memory[CHOSEN_ALPHA][i] for i in differ)
        as_paper = sum(found[i] == in_memory[files.PAPER_LENGTH_PENALTY][i] for i in differ)
        assert as_chosen > as_paper, name
        if name != files.TFLITE_QUANTIZED:
            # Float weights may turn a near tie, never most of these sentences. int8
            # weights move every score, so on this tiny model they may turn a third of
            # them (13 of 21 kept, as SentencePiece 0.2.2 splits the fixture corpus);
            # that the chosen α is still the one that matches is what tells them apart.
            assert as_chosen >= 0.75 * len(differ), name

    # The run directory translates with its choice by default, and says so.
    source = tmp_path / "validation.en"
    source.write_text("\n".join(sources) + "\n", encoding="utf-8")
    translated = run_command("translate", str(run_dir), "--input", str(source),
                             "--no-progress")
    assert translated.returncode == 0, translated.stderr
    assert (f"beam search (beam 4, length penalty {CHOSEN_ALPHA}; the run's choice, "
            "recipe: ") in translated.stderr
    saved_model = str(export_dir / files.SAVED_MODEL)
    assert translated.stdout.splitlines() == kt.load_translator(
        saved_model, beam_size=4)(sources)
    greedy = run_command("translate", str(run_dir), "--input", str(source), "--greedy",
                         "--no-progress")
    assert greedy.returncode == 0, greedy.stderr
    assert "(greedy)" in greedy.stderr
    assert greedy.stdout.splitlines() == kt.load_translator(saved_model)(sources)


def test_a_broken_choice_is_an_error_naming_its_file_and_the_fix(tmp_path):
    from keras_transformer import runs

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / files.CONFIG).write_text("{}", encoding="utf-8")
    assert runs.load_choice(run_dir) is None  # nothing chosen: the defaults, as before
    weights = run_dir / files.AVERAGED_WEIGHTS
    weights.write_bytes(b"")
    recorded = runs.record_choice(run_dir, weights_path=str(weights), beam_size=3,
                                  length_penalty=0.8, chosen_by="by hand")
    assert runs.load_choice(run_dir) == recorded == runs.Choice(
        files.AVERAGED_WEIGHTS, 3, 0.8, "by hand")
    with pytest.raises(ValueError, match="outside"):
        runs.record_choice(run_dir, weights_path=str(tmp_path / "other.weights.h5"),
                           beam_size=3, length_penalty=0.8, chosen_by="by hand")
    weights.unlink()
    with pytest.raises(runs.ChoiceFileError, match="are gone.*delete the file"):
        runs.load_choice(run_dir)
    (run_dir / files.CHOICE).write_text('{"beam_size": 4}', encoding="utf-8")
    status = cli.main(["translate", str(run_dir), "--input", str(run_dir / files.CONFIG)])
    assert status == 2
    with pytest.raises(runs.ChoiceFileError, match=str(run_dir / files.CHOICE)):
        runs.load_choice(run_dir)


def test_own_files_that_do_not_align_are_named(tmp_path, fixture_corpus_dir, capsys):
    source, target = tmp_path / "a.src", tmp_path / "a.tgt"
    source.write_text("one\ntwo\n", encoding="utf-8")
    target.write_text("eins\n", encoding="utf-8")
    status = cli.main(["train", "--train-files", str(source), str(target),
                       "--validation-files", str(source), str(source), "--run-dir",
                       str(tmp_path / "run"), "--preset", "tiny"])
    assert status == 2
    error = capsys.readouterr().err
    assert f"{source} has 2 lines but {target} has 1" in error
    assert not (tmp_path / "run").exists()


def test_own_data_needs_validation_files_too(tmp_path, capsys):
    assert cli.main(["train", "--train-files", "a", "b"]) == 2
    assert "needs both --train-files and --validation-files" in capsys.readouterr().err


def test_a_latin1_file_to_translate_is_warned_about_by_line(tmp_path, capsys, monkeypatch):
    from keras_transformer.serving import artifacts, runners
    source = tmp_path / "latin1.txt"
    source.write_bytes("Un caf\u00e9.\nDeux.\nTrois \u00e0 la gare.\n".encode("latin-1"))
    monkeypatch.setattr(artifacts, "resolve_artifact", lambda path, **options: path)
    monkeypatch.setattr(runners, "open_runner", lambda artifact, **options: lambda batch: {
        "translations": [bytes(sentence) for sentence in batch]})
    artifact = tmp_path / "model.tflite"
    assert cli.main(["translate", str(artifact), "--input", str(source), "--no-progress"]) == 0
    error = capsys.readouterr().err
    assert f"warning: {source}: line 1 is not UTF-8" in error
    assert "iconv -f latin1 -t utf-8" in error
    assert error.count("warning:") == 1


def test_a_latin1_reference_to_evaluate_is_an_error_naming_its_line(tmp_path, capsys):
    source, reference = tmp_path / "test.en", tmp_path / "test.fr"
    source.write_text("A cafe.\nTwo.\n", encoding="utf-8")
    reference.write_bytes("Un caf\u00e9.\nDeux.\n".encode("latin-1"))
    assert cli.main(["evaluate", "no-artifact", "--source", str(source),
                     "--reference", str(reference)]) == 2
    error = capsys.readouterr().err
    assert f"{reference}: line 1:" in error and "iconv" in error


def test_translating_with_a_tflite_file_never_imports_tensorflow(tmp_path):
    tflite = REPOSITORY / "tests" / "fixtures" / "artifacts_v0_1" / "export" / files.TFLITE
    source = tmp_path / "sentences.en"
    source.write_text("A dog runs.\nTwo men play football.\n", encoding="utf-8")
    code = (
        "import sys\n"
        "import keras_transformer as kt\n"
        "from keras_transformer import cli\n"
        f"translations = kt.load_translator({str(tflite)!r})(['A dog runs.'])\n"
        f"status = cli.main(['translate', {str(tflite)!r}, '-i', {str(source)!r}, '-o', "
        f"{str(tmp_path / 'out.de')!r}])\n"
        "loaded = [m for m in ('tensorflow', 'keras', 'tensorflow_text') if m in sys.modules]\n"
        "print(status, len(translations), loaded)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=REPOSITORY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "0 1 []"
    assert len((tmp_path / "out.de").read_text(encoding="utf-8").splitlines()) == 2
