"""Sequence-level knowledge distillation (Kim and Rush, 2016): a corpus for a student.

    keras-transformer distill TEACHER_RUN OUTPUT_DIR
    keras-transformer train --config TEACHER_RUN/config.json --data-dir OUTPUT_DIR \
        --run-dir STUDENT_RUN --epochs 64

A trained run, the teacher, translates the source side of its own training split
(greedy decoding, or beam search with `beam=True`), through its exported SavedModel
(exported first if it has none), or through
another artifact exported from it (`--artifact`: an ensemble of runs, say,
`keras-transformer export TEACHER_RUN --ensemble OTHER_RUNS... --output DIR`). OUTPUT_DIR
receives a Multi30K-layout corpus: the training split holds the original pairs followed
by the same sources with the teacher's translations, so each pass sees every sentence
twice; the validation and test splits are the original ones, so scores stay comparable.
Half the teacher's epochs then give a student about the teacher's number of updates.

The teacher's translations are written to OUTPUT_DIR/teacher.train.LANG as each chunk
finishes; a run that is interrupted carries on from there when started again with the
same teacher (its SavedModel's SHA-256 and the decoder are recorded beside the file).
"""

import dataclasses
import hashlib
import json
import logging
import math
import os

from keras_transformer import files, runs, translate
from keras_transformer.data import corpus
from keras_transformer.data.text import read_lines
from keras_transformer.serving import artifacts, runners

logger = logging.getLogger(__name__)

TEACHER_FILE = "teacher.train.{language}"


def distill(teacher_run, output_dir, *, artifact=None, data_dir=None, beam=False,
            batch_size=64, verbose=True):
    """Writes the distilled corpus of `teacher_run` into `output_dir`.

    Args:
        teacher_run: str. A run directory trained on Multi30K.
        output_dir: str. Where the corpus goes (created if missing).
        artifact: str. The SavedModel or `.tflite` file that translates, exported from
            `teacher_run` (alone or with others as an ensemble); default: the run's own
            SavedModel. The run names the corpus and its languages either way.
        data_dir: str. A local copy of Multi30K; defaults to the teacher's `data_dir`
            (`None` there: downloaded as training does).
        beam: bool. Translate with beam search (the teacher's exported settings) rather
            than greedy decoding, which is faster and taught as well in our runs.
        batch_size: int. Sentences per call.
        verbose: bool. Show a progress bar and say what was written.

    Returns:
        The number of training pairs the teacher translated.

    Raises:
        ValueError: when the teacher was not trained on Multi30K, or when the export
            report beside `artifact` names another language pair than the run's.
    """
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"The output folder {output_dir} is a file: name a folder.")
    config = runs.load_config(teacher_run)
    data = config.data
    if data.corpus != "multi30k":
        raise ValueError(
            f"{teacher_run} was trained on corpus {data.corpus!r}; distillation writes "
            "Multi30K's layout and reads only a run trained on corpus='multi30k'.")
    if data_dir is not None:
        data = dataclasses.replace(data, data_dir=data_dir)
    splits = {split: corpus.load_split(data, split, filter_pairs=False, verbose=False)
              for split in ("train", "validation", *corpus.test_splits(data))}
    sources = list(splits["train"].source_lines)
    # The corpus is written under the original's file names: never into its folder.
    original_folder = os.path.dirname(corpus.corpus_files(data, "train")[0])
    files.check_not_an_input("output folder", output_dir,
                                    {"folder of the original corpus": original_folder})
    os.makedirs(output_dir, exist_ok=True)
    teacher_path = os.path.join(output_dir,
                                TEACHER_FILE.format(language=data.target_language))
    if artifact is None:
        artifact = artifacts.resolve_artifact(teacher_run, export_if_missing=True,
                                             verbose=verbose)
    else:
        artifact = artifacts.resolve_artifact(artifact)
        _check_language_pair(artifact, data, teacher_run)
    translations = _translate_resumably(artifact, sources, teacher_path, beam, batch_size,
                                        verbose)
    for split, text in splits.items():
        source_lines, target_lines = list(text.source_lines), list(text.target_lines)
        if split == "train":  # the original pairs, then the teacher's
            source_lines, target_lines = sources + sources, target_lines + translations
        stem = corpus.MULTI30K_SPLITS[split]
        files.write_lines(os.path.join(output_dir, f"{stem}.{data.source_language}.gz"),
                          source_lines)
        files.write_lines(os.path.join(output_dir, f"{stem}.{data.target_language}.gz"),
                          target_lines)
    if verbose:
        logger.info(
            "%s: %d training pairs and as many translated by the teacher, with the original "
            "validation and test splits. Train a student with the teacher's settings and "
            "about its number of updates: keras-transformer train --config %s --data-dir "
            "%s --run-dir STUDENT_RUN --epochs %d", output_dir, len(sources),
            runs.config_path(teacher_run), output_dir,
            math.ceil(config.train.epochs / 2))
    return len(sources)


def _check_language_pair(artifact, data, teacher_run):
    """Refuses an artifact whose export report names another language pair than the run.

    The run's languages name the corpus files, so an artifact of another pair would fill
    the student's corpus with the wrong language, unnoticed until the student is scored.
    `export` writes the report beside the SavedModel and TFLite files; an artifact
    copied without it is taken as it is.
    """
    report_path = os.path.join(os.path.dirname(os.path.normpath(artifact)),
                               files.REPORT_JSON)
    if not os.path.isfile(report_path):
        return
    report = _read_json_object(report_path, "Export the artifact again with `keras-transformer "
                               "export`, or delete the report to take the artifact as is.")
    exported_data = report
    for key in ("run", "config", "data"):
        exported_data = exported_data.get(key) if isinstance(exported_data, dict) else None
    if not isinstance(exported_data, dict):
        return  # the report names no language pair
    exported_pair = (exported_data.get("source_language"),
                     exported_data.get("target_language"))
    run_pair = (data.source_language, data.target_language)
    if None not in exported_pair and exported_pair != run_pair:
        raise ValueError(
            f"{artifact} translates {'→'.join(map(str, exported_pair))} (its "
            f"{report_path}), but {teacher_run} was trained {'→'.join(run_pair)}: pass an "
            f"artifact exported from {teacher_run}, alone or with runs of the same "
            "language pair.")


def _read_json_object(path, fix):
    """Returns the JSON object in `path`, or raises a ValueError naming it and `fix`."""
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: line {error.lineno}: not valid JSON ({error.msg}). "
                         f"{fix}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text. {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}. "
                         f"{fix}")
    return value


def _translate_resumably(artifact, sources, path, beam, batch_size, verbose):
    """Returns the translations of `sources` by `artifact`, continuing the file at `path`.

    `path.teacher.json` records which artifact and decoder wrote the file, of which
    sources, so that a file from another teacher or corpus (of as many lines, say) is
    refused rather than continued.
    """
    teacher = {"artifact_sha256": _tree_sha256(artifact), "beam": beam,
               "sources_sha256": hashlib.sha256("\n".join(sources).encode(
                   "utf-8", "surrogatepass")).hexdigest()}
    record = f"{path}.teacher.json"
    done = _whole_lines(path)
    if done:
        written_by = None
        if os.path.exists(record):
            written_by = _read_json_object(
                record, f"Delete it and {path} to translate from the start.")
            # Records written before the sources' digest name the teacher alone.
            written_by = {"sources_sha256": teacher["sources_sha256"], **written_by}
        if written_by != teacher or len(done) > len(sources):
            raise ValueError(
                f"{path} holds {len(done)} translations of another teacher, decoder or "
                f"corpus than {artifact} (beam={beam}, {len(sources)} sentences): "
                "delete it to translate from the start, or choose another OUTPUT_DIR.")
    else:
        files.write_text(record, json.dumps(teacher))
    remaining = sources[len(done):]
    if remaining:
        if verbose and done:
            logger.info("%s holds %d translations: translating the other %d.", path,
                        len(done), len(remaining))
        runner = runners.open_runner(artifact, beam=beam)
        progress = None
        if verbose:
            update, already = translate.progress_bar(len(sources)), len(done)
            progress = lambda count: update(already + count)  # noqa: E731
        with open(path, "ab") as file:
            for chunk in translate.translation_windows(runner, remaining, batch_size,
                                                      progress):
                file.write("".join(f"{line}\n" for line in chunk).encode("utf-8"))
                file.flush()
                done.extend(chunk)
    return done


def _tree_sha256(path):
    """Returns the SHA-256 of every file under `path` (or of the file `path`), in order."""
    paths = [path] if os.path.isfile(path) else sorted(
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    digest = hashlib.sha256()
    for file_path in paths:
        digest.update(os.path.relpath(file_path, path).encode())
        with open(file_path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _whole_lines(path):
    """Returns the lines of `path` (none if it is missing), cutting off a partial last one."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as file:
        data = file.read()
    if data and not data.endswith(b"\n"):  # a write cut short: keep the whole lines
        # Atomically: a kill while rewriting in place would lose every line translated.
        files.write_bytes(path, data[:data.rfind(b"\n") + 1])
    return read_lines(path)
