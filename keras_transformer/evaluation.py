"""Evaluation: translate with an exported translator and score with sacreBLEU.

What is served is what is scored: the default is to run the exported SavedModel (or a
`.tflite` file) on the source text and score its output, so tokenization, the decode loop
and detokenization are the ones users get. Scores are sacreBLEU's BLEU and chrF on
detokenized, cased text with its default `13a` tokenization, each with its sacreBLEU
signature so that numbers from different runs can be compared honestly. Where a
reference has the literature's tokenized text beside it (Multi30K's `tok/` files,
`multi30k.tokenized_reference`), BLEU is also scored the way the papers on that corpus
score it (`score_tokenized`): the translations lowercased, punctuation-normalised and
tokenized as those files were, BLEU on the tokens.

    keras-transformer evaluate RUN_DIR                  # every test split, greedy
    keras-transformer evaluate RUN_DIR --beam --split test_2017_mscoco
    keras-transformer evaluate ARTIFACT --source S.en --reference S.de

A run directory stands for its exported SavedModel (exported first if it has none);
its config names the corpus, whose test splits are scored by default (Multi30K's three:
test_2016_flickr, test_2017_flickr and test_2017_mscoco, downloaded and checked like
the training files, or read from `--data-dir`). An artifact's export report names its
run's corpus. The paper's final scores use the average of the last checkpoints and beam
search (beam 4, length penalty α = 0.6, §6.1).
"""

import dataclasses
import importlib.metadata
import json
import os

from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from keras_transformer import config as config_lib
from keras_transformer import files, loading, runs, translate
from keras_transformer.data import corpus, multi30k
from keras_transformer.data.text import read_lines
from keras_transformer.serving import artifacts

# Each metric is a fresh object per call: sacreBLEU objects cache reference statistics.
_METRICS = {"bleu": BLEU, "chrf": CHRF}


def check_line_counts(lines, reference_lines, lines_name, reference_name):
    """Raises `ValueError` naming both files and their counts when the counts differ."""
    if len(lines) != len(reference_lines):
        raise ValueError(
            f"Line counts differ: {lines_name} has {len(lines)} lines but "
            f"{reference_name} has {len(reference_lines)}. The files must be "
            "line-aligned: one translation per reference line.")


def score(hypotheses, references, *, hypotheses_name="hypotheses",
          references_name="references"):
    """Scores detokenized `hypotheses` against one reference each with sacreBLEU.

    Args:
        hypotheses: list of str, one translation per line.
        references: list of str, aligned with `hypotheses`.
        hypotheses_name, references_name: str. What to call them in errors (file names).

    Returns:
        `{"bleu": {...}, "chrf": {...}}`, each `{"name": str, "score": float,
        "signature": str, "text": str}`: `name` and `signature` as sacreBLEU writes them
        (`"BLEU"`, `"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"`), and
        `text` sacreBLEU's own line: name, signature, score and details.

    Raises:
        ValueError: when the line counts differ.
    """
    check_line_counts(hypotheses, references, hypotheses_name, references_name)
    scores = {}
    for name, metric_class in _METRICS.items():
        metric = metric_class()
        result = metric.corpus_score(list(hypotheses), [list(references)])
        # The signature is only complete after scoring (it records e.g. the version).
        signature = str(metric.get_signature())
        scores[name] = {"name": result.name, "score": result.score, "signature": signature,
                        "text": result.format(signature=signature)}
    return scores


def tokenize_as_literature(lines, language):
    """Returns `lines` lowercased, punctuation-normalised and tokenized as Multi30K's
    `tok/` files were made: `lowercase.perl | normalize-punctuation.perl -l L |
    tokenizer.perl -l L` of Moses (scripts/task1-tokenize.sh of the dataset), here
    sacremoses' transcription of those scripts, with Moses' escapes (`&apos;`, `&quot;`).

    Applied to Multi30K's raw references it gives their `tok/` files line for line
    (tests/test_evaluation.py).
    """
    normalizer = MosesPunctNormalizer(lang=language)
    tokenizer = MosesTokenizer(lang=language)
    # normalize-punctuation.perl sees each line with its newline, and its rule that
    # moves a full stop after a closing quote (de, fr, ...) needs a character after the
    # quote: without the newline, a quote that ends the line would keep its stop inside.
    return [tokenizer.tokenize(normalizer.normalize(line.lower() + "\n"), escape=True,
                               return_str=True).strip() for line in lines]


def score_tokenized(hypotheses, tokenized_references, language, *,
                    hypotheses_name="hypotheses", references_name="references"):
    """BLEU as the literature scores Multi30K: on lowercased, Moses-tokenized text.

    Args:
        hypotheses: list of str, detokenized translations.
        tokenized_references: list of str, the references already lowercased and
            tokenized (Multi30K's `tok/` files); used as they are.
        language: str. The target language, for the normaliser and tokenizer.
        hypotheses_name, references_name: str. What to call them in errors.

    Returns:
        `{"name": "BLEU", "score": float, "signature": str, "text": str}`, as a metric
        of `score`; the signature names the tokenization and sacreBLEU's with
        `tok:none` (no further tokenization).
    """
    check_line_counts(hypotheses, tokenized_references, hypotheses_name, references_name)
    metric = BLEU(tokenize="none", force=True)  # force: the input is tokenized on purpose
    result = metric.corpus_score(tokenize_as_literature(hypotheses, language),
                                 [list(tokenized_references)])
    signature = (f"lc.norm.tok:sacremoses-{importlib.metadata.version('sacremoses')}|"
                 f"{metric.get_signature()}")
    return {"name": result.name, "score": result.score, "signature": signature,
            "text": result.format(signature=signature)}


def translate_file_lines(runner, lines, batch_size=64, verbose=True):
    """Returns the translations of `lines` (list of str), in their order.

    Args:
        runner: callable, list of str -> outputs dict (see `serving.runners.open_runner`).
        lines: list of str.
        batch_size: int. Sentences per call of the translator.
        verbose: bool. Show a progress bar (on stderr: stdout carries the scores).
    """
    progress = translate.progress_bar(len(lines)) if verbose and lines else None
    return translate.translate_sentences(runner, lines, batch_size, progress)


def read_pair(source, reference):
    """Returns the lines of a source file and its reference file, checked to align."""
    for name, path in (("source", source), ("reference", reference)):
        if not os.path.isfile(path):  # read_lines would speak of a corpus configuration
            raise FileNotFoundError(f"The {name} {path} is "
                                    f"{'a folder' if os.path.isdir(path) else 'missing'}: "
                                    "name a text file (plain or .gz), one sentence a line.")
    source_lines, reference_lines = read_lines(source), read_lines(reference)
    check_line_counts(source_lines, reference_lines, source, reference)
    if not source_lines:
        raise ValueError(f"{source} and {reference} hold no lines: nothing to score.")
    return source_lines, reference_lines


def score_files(runner, source, reference, *, batch_size=64, output=None, verbose=True):
    """Translates the `source` file with `runner` and scores it against `reference`.

    Returns:
        The dict of `score`, plus `"source"`, `"reference"` and `"sentences"`; and
        `"bleu_tok"` (`score_tokenized`) with `"tokenized_reference"` where the
        reference has the literature's tokenized text beside it.
    """
    source_lines, reference_lines = read_pair(source, reference)
    hypotheses = translate_file_lines(runner, source_lines, batch_size, verbose)
    if output:
        files.write_lines(output, hypotheses)
    hypotheses_name = output or "the translations"
    scores = score(hypotheses, reference_lines, hypotheses_name=hypotheses_name,
                   references_name=reference)
    tokenized = multi30k.tokenized_reference(reference)
    if tokenized is not None:
        scores["bleu_tok"] = score_tokenized(
            hypotheses, read_lines(tokenized), _language(reference),
            hypotheses_name=hypotheses_name, references_name=tokenized)
        scores["tokenized_reference"] = tokenized
    scores.update(source=os.fspath(source), reference=os.fspath(reference),
                  sentences=len(hypotheses))
    return scores


def evaluate(artifact, source, reference, *, batch_size=64, beam=False, beam_size=None,
             length_penalty=None, greedy=False, session=False, output=None, json_path=None,
             export_if_missing=True, verbose=True):
    """Translates the `source` file with `artifact` and scores it against `reference`.

    The `evaluate` verb's path from Python: `loading.load_translator` opens the
    translator (see there for how a run directory and an artifact decode), then
    `evaluate_splits` scores it.

    Args:
        artifact: str. A SavedModel directory, a `.tflite` file or a run directory.
        source: str. Source sentences, one per line (plain text or `.gz`).
        reference: str. Reference translations, line-aligned with `source`.
        batch_size: int. Sentences per call of the translator.
        beam, beam_size, length_penalty, greedy: the decoder, as in
            `loading.load_translator`.
        session: bool. Load the SavedModel with the session-based loader that TF
            Serving uses, instead of `tf.saved_model.load`.
        output: optional str. Where to write the translations, one per line.
        json_path: optional str. Where to write the scores (and what was scored) as JSON.
        export_if_missing: bool. Export a run directory that has no export yet.
        verbose: bool. Show a progress bar.

    Returns:
        The dict of `score`, plus what was scored: `"artifact"` (the path used; `None`
        for a run's model in memory), `"decoder"`, `"source"`, `"reference"`, `"beam"`,
        `"session"` and `"sentences"`.
    """
    # Checked before translating, which can take minutes.
    pairs = {os.path.basename(os.fspath(source)): (source, reference)}
    check_pairs(pairs, output=output, single_output=True, artifact=artifact)
    files.check_output_file("--json", json_path, {"source": source, "reference": reference,
                                                  "artifact": artifact})
    translator = loading.load_translator(
        artifact, beam=beam, beam_size=beam_size, length_penalty=length_penalty,
        greedy=greedy, batch_size=batch_size, session=session,
        export_if_missing=export_if_missing)
    scores, = evaluate_splits(translator, pairs, output=output, single_output=True,
                              verbose=verbose).values()
    scores.update(artifact=translator.artifact, decoder=translator.decoder,
                  beam=translator.beam_size is not None, session=session)
    if json_path:
        files.write_text(json_path, json.dumps(scores, indent=2, ensure_ascii=False) + "\n")
    return scores


def artifact_config(artifact):
    """Returns the `Config` of the run an artifact (or a run directory) was exported from.

    Raises:
        ValueError: nothing says, with the fix (`--source`/`--reference`).
    """
    artifact = os.fspath(artifact)
    if files.is_run_dir(artifact):
        return runs.load_config(artifact)
    recorded = ((artifacts.export_report(artifact) or {}).get("run") or {}).get("config")
    if not isinstance(recorded, dict):
        raise ValueError(
            f"{artifact} has no export report naming its run's corpus: score a pair of "
            "files with --source and --reference, or evaluate the run directory.")
    return config_lib.Config.from_json(json.dumps(recorded), source=artifact)


def split_files(artifact, splits=None, *, data_dir=None):
    """Returns `{split: (source_path, reference_path)}` of the artifact's corpus.

    Args:
        artifact: str. A run directory, or an artifact with an export report.
        splits: list of split names (e.g. `["test_2017_flickr", "validation"]`), or
            `None` for every test split of the corpus.
        data_dir: str. A local copy of the corpus instead of the run's `data_dir`.
    """
    data = artifact_config(artifact).data
    if data_dir is not None:
        data = dataclasses.replace(data, data_dir=data_dir)
    splits = list(splits or corpus.test_splits(data))
    if not splits:
        raise ValueError(f"The corpus of {artifact} has no test split: name one with "
                         "--split, or score files with --source and --reference.")
    return {split: corpus.corpus_files(data, split) for split in splits}


def evaluate_splits(translator, pairs, *, output=None, single_output=False, verbose=True):
    """Scores a `loading.LoadedTranslator` on each `(source, reference)` of `pairs`.

    Args:
        translator: `loading.LoadedTranslator`.
        pairs: dict `{name: (source_path, reference_path)}`.
        output: str. Where to keep the translations: a file when `single_output`, else
            a folder receiving `<name>.<reference's language>` per pair.
        single_output: bool. See `output`.
        verbose: bool. Show a progress bar.

    Returns:
        `{name: scores}` (`score_files`'s dicts).
    """
    check_pairs(pairs, output=output, single_output=single_output,
                artifact=translator.artifact)
    return {name: score_files(translator.runner, source, reference,
                              batch_size=translator.batch_size,
                              output=_output_path(output, name, reference, single_output),
                              verbose=verbose)
            for name, (source, reference) in pairs.items()}


def check_pairs(pairs, *, output=None, single_output=False, artifact=None):
    """Raises an error naming the first source, reference or output that cannot be used.

    Arguments as `evaluate_splits`, and the `artifact` that translates (no output may
    be it); made before any translating, which takes minutes.
    """
    if output and not single_output:
        if os.path.exists(output) and not os.path.isdir(output):
            raise ValueError(f"--output {output} is a file: name a folder for the "
                             "translations of several splits.")
        os.makedirs(output, exist_ok=True)
    for name, (source, reference) in pairs.items():
        files.check_output_file("--output", _output_path(output, name, reference,
                                                         single_output),
                                {"source": source, "reference": reference,
                                 "artifact": artifact})
        read_pair(source, reference)


def _output_path(output, name, reference, single_output):
    if not output or single_output:
        return output
    return os.path.join(output, f"{name}.{_language(reference)}")


def _language(path):
    """The language code of a corpus file name (`test_2016_flickr.de.gz` -> `de`)."""
    parts = os.path.basename(os.fspath(path)).removesuffix(".gz").split(".")
    return parts[-1] if len(parts) > 1 else "txt"


def format_table(results, decoder):
    """Returns `evaluate_splits`'s results as a text table, signatures below."""
    tokenized = any("bleu_tok" in scores for scores in results.values())
    rows = [("split", "sentences", *score_columns(tokenized))]
    rows += [(name, str(scores["sentences"]), *score_cells(scores, tokenized))
             for name, scores in results.items()]
    return "\n".join([f"{decoder}:", *text_table(rows), "",
                      *signatures(results.values())])


def score_columns(tokenized):
    """Column names of `score_cells`: BLEU, chrF and, if `tokenized`, the literature's
    BLEU (`score_tokenized`)."""
    return ("BLEU", "chrF", *(("BLEU lc.tok",) if tokenized else ()))


def score_cells(scores, tokenized):
    """One result's cells under `score_columns(tokenized)`; empty where it has no
    literature's BLEU."""
    cells = [f"{scores['bleu']['score']:.2f}", f"{scores['chrf']['score']:.2f}"]
    if tokenized:
        cells.append(f"{scores['bleu_tok']['score']:.2f}" if "bleu_tok" in scores else "")
    return cells


def signatures(all_scores):
    """The signature of each metric in `all_scores`, once each, in column order."""
    all_scores = list(all_scores)
    found = []
    for name in (*_METRICS, "bleu_tok"):
        for scores in all_scores:
            if name in scores and scores[name]["signature"] not in found:
                found.append(scores[name]["signature"])
    return found


def text_table(rows):
    """Lines of `rows` (tuples of str) in left-aligned columns, a rule under the first."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def format_scores(scores):
    """Returns sacreBLEU's line (signature = score) for each metric of `score`'s result."""
    return "\n".join(scores[name]["text"] for name in (*_METRICS, "bleu_tok")
                     if name in scores)
