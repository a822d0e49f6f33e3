"""Check that every exported artifact translates exactly like the trained model.

On a set of real sentences: the in-memory model, the SavedModel (through both loaders)
and the TFLite file must produce the same token ids; cached greedy decoding must equal
the uncached reference; a batch must decode like each sentence alone; beam search must
match too, and so must the n-best lists (whose first entries are beam search's) and the
scores of given translations, where exported. The dynamic-range-quantized TFLite file
is compared for information only: int8 weights are expected to change some
translations. CTranslate2 directories, when
exported, must give the SavedModel's greedy ids on 99 % of the sentences.

    keras-transformer export RUN_DIR --check    (or: python -m export.check RUN_DIR)

prints a pass/fail table and exits with status 1 when a check fails.
"""

import json
import logging
import os
import typing

import numpy as np
import sacrebleu
import tensorflow as tf

from keras_transformer import decoding, files, runs
from keras_transformer.data import corpus
from keras_transformer.data.text import read_lines
from keras_transformer.data.tokenizer import END_ID, PAD_ID
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.serving import artifacts, export, export_folder, runners
from keras_transformer.serving import translator as translator_lib
from keras_transformer.serving.translator import Translator

logger = logging.getLogger(__name__)

# How far scores of two runtimes may lie apart (`same_scores`): float32 sums of up to
# a hundred log-probabilities, each rounded apart in other kernels.
SCORE_RTOL = 1e-4
SCORE_ATOL = 1e-3


class SelfCheckFailed(RuntimeError):
    """An exported artifact does not translate like the model; the message names checks."""

    exit_status = 1  # the command line's status for a failure (not a usage error)


class Check(typing.NamedTuple):
    """One line of the table: `passed` is `None` for information-only lines."""

    name: str
    passed: typing.Optional[bool]
    detail: str


def token_sequences(token_ids):
    """Returns one tuple per row: the ids up to the first END, without padding."""
    sequences = []
    for row in np.asarray(token_ids).tolist():
        ids = [token for token in row if token != PAD_ID]
        sequences.append(tuple(ids[:ids.index(END_ID) + 1] if END_ID in ids else ids))
    return sequences


def compare(name, expected, actual):
    """Returns a `Check` passing when both lists of token sequences are identical."""
    same = sum(a == b for a, b in zip(expected, actual))
    first = next((i for i, (a, b) in enumerate(zip(expected, actual)) if a != b), None)
    passed = same == len(expected) == len(actual)
    detail = f"{same}/{len(expected)} sentences identical"
    if first is not None:
        detail += f"; first difference at sentence {first}"
    return Check(name, passed, detail)


def run_in_batches(runner, sentences, batch_size):
    """Returns `token_ids` rows and translations of `sentences`, `batch_size` at a time."""
    sequences, texts = [], []
    for start in range(0, len(sentences), batch_size):
        outputs = runner(sentences[start:start + batch_size])
        sequences += token_sequences(outputs["token_ids"])
        texts += runners.translations(outputs)
    return sequences, texts


def load_saved_model(export_dir):
    """The greedy `runners.SavedModelRunner` of `export_dir`'s SavedModel, for the checks
    below to share (`with_signature`): each load takes seconds, a tenth of a check run."""
    return runners.SavedModelRunner(os.path.join(export_dir, files.SAVED_MODEL))


def artifact_checks(export_dir, sentences, *, batch_size=32, alone=16, saved=None):
    """Checks between the artifacts in `export_dir`; returns `(checks, greedy ids)`.

    `saved`: its `load_saved_model`, when loaded already.
    """
    saved_model = os.path.join(export_dir, files.SAVED_MODEL)
    saved = saved or load_saved_model(export_dir)
    reference, texts = run_in_batches(saved, sentences, batch_size)
    checks = [Check("SavedModel: one translation per sentence",
                    len(texts) == len(sentences), f"{len(texts)}/{len(sentences)}")]
    session = runners.SessionRunner(saved_model)
    checks.append(compare("SavedModel session loader = tf.saved_model.load", reference,
                          run_in_batches(session, sentences, batch_size)[0]))
    session.close()
    checks.append(compare("SavedModel: batch = each sentence alone", reference[:alone],
                          [token_sequences(saved([s])["token_ids"])[0]
                           for s in sentences[:alone]]))
    tflite_path = os.path.join(export_dir, files.TFLITE)
    if os.path.exists(tflite_path):
        tflite = runners.TFLiteRunner(tflite_path)
        ids, tflite_texts = run_in_batches(tflite, sentences, batch_size)
        checks.append(compare("TFLite = SavedModel", reference, ids))
        checks.append(Check("TFLite translations = SavedModel translations",
                            tflite_texts == texts,
                            f"{sum(a == b for a, b in zip(texts, tflite_texts))}"
                            f"/{len(texts)} identical strings"))
        checks.append(compare("TFLite: batch = each sentence alone", ids[:alone],
                              [token_sequences(tflite([s])["token_ids"])[0]
                               for s in sentences[:alone]]))
    quantized_path = os.path.join(export_dir, files.TFLITE_QUANTIZED)
    if os.path.exists(quantized_path):
        checks.append(quantized_agreement(quantized_path, sentences, reference, texts,
                                          batch_size))
    if files.is_ctranslate2_dir(os.path.join(export_dir, files.CTRANSLATE2)):
        checks += ctranslate2_checks(export_dir, sentences, reference, batch_size,
                                     saved=saved)
    return checks, reference


def read_report(export_dir):
    """Returns the export report in `export_dir`.

    Raises:
        ValueError: there is none (the run was not exported), or it is not one.
    """
    report = artifacts.export_report(os.path.join(export_dir, files.SAVED_MODEL))
    if report is None:
        raise ValueError(f"{export_dir} holds no export ({files.REPORT_JSON} is missing): "
                         "export the run there first (keras-transformer export RUN_DIR), "
                         "or name the folder it was exported to (check RUN_DIR "
                         "--export-dir DIR).")
    return report


def _exported_signatures(export_dir):
    return read_report(export_dir)["saved_model"]["signatures"]


def same_scores(name, expected, actual):
    """Returns a `Check` passing when two score arrays agree to float32 rounding
    (kernels of other runtimes sum in other orders)."""
    expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    if expected.shape != actual.shape:
        return Check(name, False, f"shapes {expected.shape} and {actual.shape}")
    furthest = float(np.max(np.abs(expected - actual), initial=0.0))
    passed = bool(np.allclose(expected, actual, rtol=SCORE_RTOL, atol=SCORE_ATOL))
    return Check(name, passed, f"{expected.size} scores, at most {furthest:.2g} apart")


def rich_decoding_checks(export_dir, sources, translator=None, *, saved=None):
    """Checks of the signatures beyond greedy and beam search (where exported) between
    the artifacts and, given `translator`, the in-memory model (`saved`: as in
    `artifact_checks`).

    The n-best lists of `sources` must start with beam search's output; translations
    after prefixes (the first word of each beam translation, or greedy one without
    beam search, at most 12 characters) must start with them; every signature's ids
    must agree in the SavedModel, the TFLite file and in memory, as must its scores,
    and `align`'s attention.
    """
    saved_model = saved or load_saved_model(export_dir)
    tflite_path = os.path.join(export_dir, files.TFLITE)
    signatures = _exported_signatures(export_dir)
    checks = []

    def agreement(signature, second=None, ids=_flat_sequences):
        """The SavedModel's outputs of `signature`, and the checks that the others agree."""
        found = saved_model.with_signature(signature)(sources, second)
        others = []
        if os.path.exists(tflite_path):
            others.append(("TFLite", runners.TFLiteRunner(tflite_path, signature)))
        if translator is not None:
            others.append(("in-memory", runners.ModuleRunner(translator, signature=signature)))
        for name, runner in others:
            outputs = runner(sources, second)
            checks.append(compare(f"{signature}: {name} = SavedModel", ids(found),
                                  ids(outputs)))
            checks.append(same_scores(f"{signature} scores: {name} = SavedModel",
                                      found["scores"], outputs["scores"]))
            if "attention" in found:
                checks.append(same_scores(f"{signature} attention: {name} = SavedModel",
                                          found["attention"], outputs["attention"]))
        return found

    # `export --signatures` may leave beam search out: what needs it is left out too.
    beam_search = (saved_model.with_signature(files.BEAM_SIGNATURE)
                   if files.BEAM_SIGNATURE in signatures else None)
    if files.N_BEST_SIGNATURE in signatures:
        n_best = agreement(files.N_BEST_SIGNATURE)
        if beam_search is not None:
            checks.append(compare("n-best: first = beam search (SavedModel)",
                                  token_sequences(beam_search(sources)["token_ids"]),
                                  token_sequences(n_best["token_ids"][:, 0])))
    if files.SCORE_SIGNATURE in signatures:
        agreement(files.SCORE_SIGNATURE, runners.translations(saved_model(sources)),
                  ids=lambda outputs: token_sequences(outputs["token_ids"]))
    if files.PREFIX_SIGNATURE in signatures:
        texts = runners.translations((beam_search or saved_model)(sources))
        # At most 12 characters: a word cut short is what autocompletion forces, and a
        # random model's endless first word would not fit its length limit.
        prefixes = [" ".join(text.split()[:1])[:12] for text in texts]
        found = agreement(files.PREFIX_SIGNATURE, prefixes)
        checks.append(_starts_with_prefixes(saved_model, signatures, sources, prefixes,
                                            found))
    if files.SAMPLE_SIGNATURE in signatures:
        agreement(files.SAMPLE_SIGNATURE, list(range(len(sources))))
    if files.ALIGN_SIGNATURE in signatures:
        agreement(files.ALIGN_SIGNATURE)
    return checks


def _starts_with_prefixes(saved_model, signatures, sources, prefixes, found):
    """The check that the `prefix` outputs `found` start with their `prefixes`: with
    their pieces (the `score` signature's tokenization) where that signature is
    exported, with their text otherwise. Pieces, as the decoder forces them: a text
    whose characters the vocabulary lacks detokenizes to other text ("⁇")."""
    if files.SCORE_SIGNATURE not in signatures:
        texts = runners.translations(found)
        return Check("prefix: translations start with it (SavedModel)",
                     all(text.startswith(prefix) for text, prefix in zip(texts, prefixes)),
                     f"{len(texts)} translations after their first word")
    pieces = token_sequences(saved_model.with_signature(files.SCORE_SIGNATURE)(
        sources, prefixes)["token_ids"])
    outputs = token_sequences(found["token_ids"])
    return Check("prefix: translations start with it (SavedModel)",
                 all(tuple(ids[:len(forced) - 1]) == forced[:-1]  # without its END
                     for ids, forced in zip(outputs, pieces)),
                 f"{len(outputs)} translations after their first word's pieces")


def _flat_sequences(outputs):
    """The token sequences of every hypothesis of a signature's outputs, row after row
    (one per sentence, or `n_best`'s n)."""
    ids = np.asarray(outputs["token_ids"])
    return token_sequences(ids.reshape([-1, ids.shape[-1]]))


def ctranslate2_checks(export_dir, sentences, reference, batch_size, *,
                       min_identical=0.99, saved=None):
    """Checks of the CTranslate2 directories against the SavedModel.

    Greedy ids must be identical on at least `min_identical` of the sentences: the
    engine computes the same function in other kernels, so a near-tie between two
    tokens may break the other way (the detail names such sentences and how far apart
    the two outputs' scores are). Beam search is compared for information only: its
    length penalty is `length ** α`, not GNMT's. The int8 directory is information too.
    """
    float_dir = os.path.join(export_dir, files.CTRANSLATE2)
    runner = runners.CTranslate2Runner(float_dir)
    saved = saved or load_saved_model(export_dir)
    ids, texts, scores = [], [], []
    for start in range(0, len(sentences), batch_size):
        batch = sentences[start:start + batch_size]
        outputs = runner(batch)
        ids += token_sequences(outputs["token_ids"])
        texts += runners.translations(outputs)
        scores += [abs(a - b) for a, b in zip(outputs["scores"], saved(batch)["scores"])]
    differing = [i for i, (a, b) in enumerate(zip(reference, ids)) if a != b]
    detail = f"{len(ids) - len(differing)}/{len(ids)} sentences identical"
    if differing:
        detail += (f" (differ: sentences {', '.join(map(str, differing[:5]))}"
                   f"{', …' if len(differing) > 5 else ''}; output scores apart by at most "
                   f"{max(scores[i] for i in differing):.3f})")
    checks = [Check("CTranslate2 greedy = SavedModel (≥ 99 %)",
                    len(ids) == len(reference)
                    and len(differing) <= (1 - min_identical) * len(reference), detail)]
    if runners.BEAM_SIGNATURE in _exported_signatures(export_dir):
        saved_beam = saved.with_signature(runners.BEAM_SIGNATURE)
        beam_ids, beam_texts = run_in_batches(saved_beam, sentences, batch_size)
        ctranslate2_ids, ctranslate2_texts = run_in_batches(
            runners.CTranslate2Runner(float_dir, beam=True), sentences, batch_size)
        checks.append(Check(
            "CTranslate2 beam vs SavedModel beam (information)", None,
            f"{sum(a == b for a, b in zip(beam_ids, ctranslate2_ids))}/{len(beam_ids)} "
            f"sentences identical; BLEU against SavedModel beam "
            f"{_bleu(ctranslate2_texts, beam_texts):.1f}"))
    int8_dir = os.path.join(export_dir, files.CTRANSLATE2_INT8)
    if files.is_ctranslate2_dir(int8_dir):
        int8_ids, int8_texts = run_in_batches(runners.CTranslate2Runner(int8_dir),
                                              sentences, batch_size)
        checks.append(Check(
            "CTranslate2 int8 vs float32 (information)", None,
            f"{sum(a == b for a, b in zip(ids, int8_ids))}/{len(ids)} sentences "
            f"identical; BLEU against float translations {_bleu(int8_texts, texts):.1f}"))
    return checks


def _bleu(hypotheses, references):
    return sacrebleu.corpus_bleu(hypotheses, [references]).score if references else 100.0


def quantized_agreement(path, sentences, reference, texts, batch_size):
    """Returns an information-only `Check` of how far quantized translations drift."""
    ids, quantized_texts = run_in_batches(runners.TFLiteRunner(path), sentences,
                                          batch_size)
    same = sum(a == b for a, b in zip(reference, ids))
    bleu = _bleu(quantized_texts, texts)
    return Check("quantized TFLite vs float (information)", None,
                 f"{same}/{len(ids)} sentences identical; BLEU against float "
                 f"translations {bleu:.1f}")


def model_checks(translator, sentences, reference, *, export_dir, alone=16, saved=None):
    """Checks of the in-memory translator against itself and against the SavedModel
    (`saved`: as in `artifact_checks`)."""
    model = translator.model
    batch = tf.constant(runners.encode_sentences(sentences))
    greedy = token_sequences(translator.translate(batch)["token_ids"])
    checks = [compare("in-memory model = SavedModel", greedy, reference)]
    options = dict(max_length=translator.max_output_length,
                   extra_length=translator.extra_length)
    source_ids = translator.source_ids(batch[:alone])
    cached = decoding.decode_function(decoding.greedy_decode, model, **options)
    uncached = decoding.decode_function(decoding.uncached_greedy_decode, model, **options)
    checks.append(compare("cached greedy = uncached greedy",
                          token_sequences(cached(source_ids).ids),
                          token_sequences(uncached(source_ids).ids)))
    if runners.BEAM_SIGNATURE not in _exported_signatures(export_dir):
        return checks  # exported with `--signatures` that leave beam search out
    beam = token_sequences(translator.translate_beam(batch[:alone])["token_ids"])
    saved_beam = (saved or load_saved_model(export_dir)).with_signature(
        runners.BEAM_SIGNATURE)
    checks.append(compare("beam search: in-memory = SavedModel", beam,
                          token_sequences(saved_beam(sentences[:alone])["token_ids"])))
    tflite_path = os.path.join(export_dir, files.TFLITE)
    if os.path.exists(tflite_path):
        tflite_beam = runners.TFLiteRunner(tflite_path, runners.BEAM_SIGNATURE)
        checks.append(compare("beam search: TFLite = in-memory", beam,
                              token_sequences(tflite_beam(sentences[:alone])["token_ids"])))
    return checks


def raise_on_failure(checks):
    """Raises `SelfCheckFailed` naming the checks that failed, if any did."""
    failed = [check.name for check in checks if check.passed is False]
    if failed:
        raise SelfCheckFailed(f"the export's self-check failed: {', '.join(failed)} "
                              "(the table above, or check_report.json beside the export).")


def summary(checks, export_dir):
    """One line on the export in `export_dir` and what its self-check found.

    `Exported SavedModel, .tflite, int8 .tflite: self-check 10/10 passed (…json)`, or
    `…: self-check failed 2 of 10: NAME, NAME (…json)`; informational rows not counted.
    """
    report = read_report(export_dir)
    names = [name for key, name in (("saved_model", "SavedModel"), ("tflite", ".tflite"),
                                    ("tflite_dynamic_range", "int8 .tflite"))
             if key in report]
    if files.CTRANSLATE2 in report.get("ctranslate2", {}):
        names.append("CTranslate2 float32 and int8")
    counted = [check for check in checks if check.passed is not None]
    failed = [check.name for check in counted if not check.passed]
    where = os.path.join(export_dir, files.CHECK_REPORT)
    found = (f"self-check failed {len(failed)} of {len(counted)}: {', '.join(failed)}"
             if failed else f"self-check {len(counted)}/{len(counted)} passed")
    return f"Exported {', '.join(names)}: {found} ({where})"


def format_table(checks):
    """Returns the checks as an aligned text table with a PASS/FAIL/INFO column."""
    width = max(len(check.name) for check in checks)
    rows = [f"{'check'.ljust(width)}  result  detail", "-" * (width + 30)]
    for check in checks:
        result = {True: "PASS", False: "FAIL", None: "INFO"}[check.passed]
        rows.append(f"{check.name.ljust(width)}  {result:6}  {check.detail}")
    return "\n".join(rows)


def translator_options(export_dir):
    """Returns the `Translator` options recorded in the export report."""
    recorded = read_report(export_dir)["translator"]
    # Reports of older exports lack the options added since: `Translator`'s defaults
    # stand in for them.
    return {name: recorded[name] for name in translator_lib.OPTIONS if name in recorded}


def write_check_report(export_dir, checks):
    """Writes `check_report.json` beside the artifacts, with the id of their export."""
    export_id = read_report(export_dir).get("export_id")
    files.write_text(os.path.join(export_dir, files.CHECK_REPORT), json.dumps(
        {"export_id": export_id, "checks": [check._asdict() for check in checks]},
        indent=2) + "\n")


def passed_checks(export_dir):
    """Returns the `Check`s of `check_report.json` if they are of the export in
    `export_dir` and none failed, else `None`."""
    try:
        export_id = read_report(export_dir)["export_id"]
        with open(os.path.join(export_dir, files.CHECK_REPORT), encoding="utf-8") as file:
            report = json.load(file)
        checks = [Check(**check) for check in report["checks"]]
    except (OSError, ValueError, KeyError, TypeError):  # none, broken, or of another form
        return None
    if report.get("export_id") != export_id or any(c.passed is False for c in checks):
        return None
    return checks


def check_sentences(config, sentences_file=None, count=100):
    """Returns the sentences to check: a file's lines, or the run's validation sources."""
    if sentences_file:
        lines = read_lines(sentences_file)
    else:
        lines = corpus.load_split(config.data, "validation", verbose=False).source_lines
    return list(lines[:count])


def check_run(run_dir, *, sentences_file=None, count=100, export_dir=None,
              translator=None):
    """Runs every check on the export of `run_dir`; returns the list of `Check`s.

    The in-memory model is the one the export report names: its weights files (the
    run's, and each ensemble member's) with its options. `translator`: the `Translator`
    the export was just written from (`export_and_check`), whose traced functions
    the in-memory checks reuse; a check row then compares it with the one the report
    names (tracing the latter's functions anew would be most of a check's time).
    """
    config = runs.load_config(run_dir)  # names a mistyped or broken run before its export
    export_dir = export_dir or os.path.join(run_dir, files.EXPORT_DIR)
    recorded = read_report(export_dir).get("run", {})  # names a folder without an export
    export_folder.check_consistent(export_dir)
    named = _load_exported_translator(run_dir, recorded, export_dir)  # traces nothing yet
    translator = named if translator is None else translator
    sentences = check_sentences(config, sentences_file, count)
    saved = load_saved_model(export_dir)
    checks, reference = artifact_checks(export_dir, sentences, saved=saved)
    checks.append(report_check(recorded, named, translator))
    checks += model_checks(translator, sentences, reference, export_dir=export_dir,
                           saved=saved)
    checks += rich_decoding_checks(export_dir, sentences[:16], translator, saved=saved)
    write_check_report(export_dir, checks)
    return checks


def report_check(recorded, named, translator):
    """A `Check` that the export report names `translator`: `named` (the `Translator`
    made from the report, whose `run` is `recorded`) has its options and weights, and
    the run's weights file is still the one exported (its recorded SHA-256)."""
    problems = []
    expected = recorded.get("weights_sha256")
    if expected and runs.weights_sha256(recorded["weights"]) != expected:
        problems.append(f"{recorded['weights']} changed since the export")
    if named.settings() != translator.settings():
        differ = sorted(name for name, value in named.settings().items()
                        if translator.settings().get(name) != value)
        problems.append(f"options differ: {', '.join(differ)}")
    models = _models(named.model), _models(translator.model)
    pairs = list(zip(*models))
    if len(models[0]) != len(models[1]) or any(
            len(mine.weights) != len(theirs.weights) for mine, theirs in pairs):
        problems.append("the models differ in shape")
    elif named is not translator and any(
            not np.array_equal(a.numpy(), b.numpy())
            for mine, theirs in pairs for a, b in zip(mine.weights, theirs.weights)):
        problems.append("weights differ")
    return Check("export report names these weights and options", not problems,
                 "; ".join(problems) or "weights files and options as exported")


def _models(model):
    return list(model.models) if isinstance(model, Ensemble) else [model]


def export_and_check(run_dir, **export_options):
    """Exports the run (`export.export_run`, which `export_options` go to) and runs every
    check on the export with the translator it was written from: its functions are
    traced already, where `check_run` alone traces them anew (most of its time).

    Returns:
        `(output_dir, report, checks)`: as `export_run`'s, and the `Check`s (nothing
        is raised when one fails: `raise_on_failure`).
    """
    exported = []
    output_dir, report = export.export_run(run_dir, on_exported=exported.append,
                                           **export_options)
    # Said first: a check that raises (its sentences unreadable, say) leaves the export
    # in place.
    logger.info("Exported to %s; self-checking it", output_dir)
    checks = check_run(run_dir, export_dir=output_dir, translator=exported[0])
    return output_dir, report, checks


def _load_exported_translator(run_dir, recorded, export_dir):
    """The in-memory `Translator` of what was exported: `recorded` is the export
    report's `run`; the options are the report's too."""
    _, tokenizer, model = runs.load_run(run_dir, recorded.get("weights"))
    if recorded.get("ensemble"):
        # The members as exported, each with the weights file the report names.
        members = [runs.load_run(member["run_dir"], member["weights"])[2]
                   for member in recorded["ensemble"]]
        model = Ensemble([model, *members])
    return Translator(model, tokenizer, **translator_options(export_dir))
