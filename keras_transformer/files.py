"""Every name on disk and in the exported signatures, and how files are written: one home,
importable without TensorFlow (the command's `--help` and a `.tflite` translator need them).

The run directory (what training and the recipe write; `runs` reads it back):

    RUN_DIR/
      config.json             the full Config; model.vocabulary_size is the tokenizer's
      tokenizer/              tokenizer.model + tokenizer.json, trained once, reused
      checkpoints/            step-<update>.weights.h5 (the newest `keep_checkpoints`),
                              best.weights.h5 + best.json (best validation BLEU)
      backup/                 the resumable backup (`training.backup`)
      logs/train, logs/validation   TensorBoard event files
      model.weights.h5        weights when training finished
      averaged.weights.h5     the mean of the last checkpoints (+ averaged.json)
      export/                 what `export` writes (below)
      training_record.json    what training took, once it finished (`recipe`)
      choice.json             weights, beam size and α chosen on validation (`recipe`):
                              export, translate and evaluate use them by default
      recipe.json             everything `recipe` measured
      translations/           the translations `recipe` scored, <split>.<decoder>.<language>
      train.lock              while a process trains here: who (`runs.lock_run_dir`)

The backup directory (`training.backup`; Keras's `BackupAndRestore` names its files):

    latest.weights.h5         the weights, with the training position and random state
    training_metadata.json    the epoch
    (each with a .bkp copy of the backup before)

The export directory (`serving.export`), written whole or not at all, every file
carrying the export's id (`serving.export_folder`):

    saved_model/                      signatures serving_default (greedy), beam_search;
                                      export_id, the id
    translator.tflite                 the same signatures: TFLite builtins + tf-text ops
    translator_dynamic_range.tflite   the same with int8 weights
    tokenizer.model                   the SentencePiece model inside them (token counts)
    ctranslate2/, ctranslate2_int8/   with `--ctranslate2`: CTranslate2 models (float32,
                                      int8), each with tokenizer.model, translator.json
    export_report.json, .md           the export id, versions, config, sizes, op lists
    check_report.json                 the self-check's table (`export --check`)

Every signature maps `sentences: string[B]` to `translations`, `token_ids` and `scores`;
beam_search decodes with the paper's beam size and length penalty unless exported with
others (`PAPER_BEAM_SIZE`, `PAPER_LENGTH_PENALTY`).

Writes that replace a file go through `replace_atomically`, so that an interrupted
process never leaves half a file under a real name (outputs written as they go, such
as `translate -o FILE`'s, are `FILE.partial` until complete); outputs a command will
write are checked before its long work begins (`check_output_file`): a command that
translates for minutes and then cannot write its result loses that work, and one that
writes over a file it reads destroys the user's data.
"""

import gzip
import os
import re

# The run directory.
CONFIG = "config.json"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
LOGS = "logs"
FINAL_WEIGHTS = "model.weights.h5"
AVERAGED_WEIGHTS = "averaged.weights.h5"
CHECKPOINT = "step-{step:08d}.weights.h5"  # in CHECKPOINTS, numbered by weight update
CHECKPOINT_PATTERN = re.compile(r"^step-(\d+)\.weights\.h5$")
BEST_WEIGHTS = "best.weights.h5"  # in CHECKPOINTS
BEST_INFO = "best.json"  # in CHECKPOINTS, beside BEST_WEIGHTS
AVERAGED_RECORD = "averaged.json"  # beside AVERAGED_WEIGHTS: the checkpoints averaged
TRAINING_RECORD = "training_record.json"  # what training took, once it finished
CHOICE = "choice.json"  # what was chosen on validation (`runs.Choice`)
RECIPE_RESULT = "recipe.json"  # everything `recipe.run_recipe` measured
TRANSLATIONS = "translations"  # the translations `recipe.run_recipe` scored
LOCK = "train.lock"  # who trains here: one process at a time (`runs.lock_run_dir`)

# The backup directory: Keras's `BackupAndRestore` names these.
BACKUP_WEIGHTS = "latest.weights.h5"
BACKUP_METADATA = "training_metadata.json"

# The tokenizer directory.
TOKENIZER_MODEL = "tokenizer.model"
TOKENIZER_METADATA = "tokenizer.json"

# The export directory and its artifacts.
EXPORT_DIR = "export"
SAVED_MODEL = "saved_model"
TFLITE = "translator.tflite"
TFLITE_QUANTIZED = "translator_dynamic_range.tflite"
REPORT_JSON = "export_report.json"
REPORT_MARKDOWN = "export_report.md"
CHECK_REPORT = "check_report.json"
CTRANSLATE2 = "ctranslate2"
CTRANSLATE2_INT8 = "ctranslate2_int8"
CTRANSLATE2_MODEL = "model.bin"  # CTranslate2's own name, in each of the two above
CTRANSLATE2_OPTIONS = "translator.json"  # beside it: the exported translator's options
# All an export folder holds: exporting again replaces the folder whole.
EXPORT_MEMBERS = frozenset({TOKENIZER_MODEL, SAVED_MODEL, TFLITE, TFLITE_QUANTIZED,
                            REPORT_JSON, REPORT_MARKDOWN, CHECK_REPORT, CTRANSLATE2,
                            CTRANSLATE2_INT8})

# The exported signatures (outputs in `serving.translator`). Each takes `sentences`;
# the translating ones give `translations`, `token_ids`, `scores`; `n_best` gives those
# per hypothesis; `score`, `prefix` and `sample` take a second input (`SECOND_INPUTS`);
# `align` adds the alignment outputs.
GREEDY_SIGNATURE = "serving_default"
BEAM_SIGNATURE = "beam_search"
N_BEST_SIGNATURE = "n_best"
SCORE_SIGNATURE = "score"
PREFIX_SIGNATURE = "prefix"
SAMPLE_SIGNATURE = "sample"
ALIGN_SIGNATURE = "align"
SIGNATURES = (GREEDY_SIGNATURE, BEAM_SIGNATURE, N_BEST_SIGNATURE, SCORE_SIGNATURE,
              PREFIX_SIGNATURE, SAMPLE_SIGNATURE, ALIGN_SIGNATURE)
TRANSLATING_SIGNATURES = SIGNATURES[:2]  # what exports before n_best and score held
INPUT_NAME = "sentences"
TRANSLATIONS_INPUT = "translations"  # `score`'s second input
PREFIXES_INPUT = "prefixes"
SEEDS_INPUT = "seeds"
# The second input of the signatures that take two: its name and its dtype's name.
SECOND_INPUTS = {SCORE_SIGNATURE: (TRANSLATIONS_INPUT, "string"),
                 PREFIX_SIGNATURE: (PREFIXES_INPUT, "string"),
                 SAMPLE_SIGNATURE: (SEEDS_INPUT, "int32")}
# The reserved ids of every tokenizer (`data.tokenizer`) and of the artifacts' outputs.
PAD_ID = 0
UNK_ID = 1
START_ID = 2
END_ID = 3
# Score of an n-best list's empty fillers (a sentence with fewer hypotheses than the
# list holds) and log-probability of what decoding never chooses. Finite, unlike
# -inf, so that sums and divisions of scores stay finite.
FORBIDDEN_SCORE = -1e9
# §6.1: "beam search with a beam size of 4 and length penalty α = 0.6", the default of
# every beam search here.
PAPER_BEAM_SIZE = 4
PAPER_LENGTH_PENALTY = 0.6
# What the `sample` signature draws from unless exported otherwise: every token
# (fairseq's default), at the model's own temperature.
SAMPLING_TOP_K = 0
SAMPLING_TEMPERATURE = 1.0
# Hypotheses of an n-best list unless asked (at most the beam size).
DEFAULT_N_BEST = 4

# Keras insists that weight files end in ".weights.h5": temporary names get a prefix,
# with the writing process's id (`partial_name`).
PARTIAL_PREFIX = "partial-"


def is_run_dir(path):
    """Whether `path` is a run directory: it has a `config.json` (and is no CTranslate2
    model directory, which has one too)."""
    return (os.path.isfile(os.path.join(path, CONFIG))
            and not is_ctranslate2_dir(path))


def is_ctranslate2_dir(path):
    """Whether `path` is a CTranslate2 model directory written by `export --ctranslate2`."""
    return (os.path.isfile(os.path.join(path, CTRANSLATE2_MODEL))
            and os.path.isfile(os.path.join(path, CTRANSLATE2_OPTIONS)))


def partial_name(name, pid=None):
    """The temporary name under which this process (or process `pid`) writes `name`
    before renaming it.

    It carries the process id, so that two processes writing one file never write
    into each other's temporary file, and keeps the name's ending.
    """
    return f"{PARTIAL_PREFIX}{os.getpid() if pid is None else pid}-{name}"


def is_stale_partial(name):
    """Whether `name` is a temporary name of a process that no longer runs here."""
    match = _PARTIAL_PATTERN.match(name)
    return bool(match) and not process_is_alive(int(match.group(1)))


_PARTIAL_PATTERN = re.compile(rf"^{PARTIAL_PREFIX}(\d+)-")


def process_is_alive(pid):
    """Whether a process with id `pid` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def replace_atomically(path, write):
    """Calls `write(temporary_path)`, then renames the temporary file to `path`.

    The temporary file lies in `path`'s folder (a rename never crosses file systems),
    is this process's own (`partial_name`) and keeps its name's ending, which Keras's
    weight files need.
    """
    directory, name = os.path.split(os.fspath(path))
    temporary = os.path.join(directory, partial_name(name))
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_bytes(path, data):
    """Writes `data` to `path` atomically (see `replace_atomically`)."""
    def write(temporary):
        with open(temporary, "wb") as file:
            file.write(data)
    replace_atomically(path, write)


def write_text(path, text):
    """Writes `text` to `path` as UTF-8, atomically (see `replace_atomically`)."""
    write_bytes(path, text.encode("utf-8"))


def write_lines(path, lines):
    """Writes `lines` to `path`, one per line, as UTF-8 (gzip when it ends in `.gz`)."""
    text = "".join(f"{line}\n" for line in lines).encode("utf-8")
    if os.fspath(path).endswith(".gz"):
        # No file name or time in the header: the same lines give the same bytes.
        text = gzip.compress(text, mtime=0)
    write_bytes(path, text)


def check_output_file(name, path, inputs=None):
    """Raises `ValueError` when `path` cannot be written as a file or names an input.

    Args:
        name: str. What the command calls the output (its option, say), for the message.
        path: str or None (nothing written: nothing to check).
        inputs: dict, what the command calls each file it reads -> its path (or None).
    """
    if not path:
        return
    if os.path.isdir(path):
        raise ValueError(f"{name} {path} is a folder: name a file to write.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{name} {path}: its folder {folder} does not exist; create it or "
                         "name a file in an existing folder.")
    check_not_an_input(name, path, inputs or {})


def check_not_an_input(name, path, inputs):
    """Raises `ValueError` when the file or folder `path` is one of `inputs`.

    Args:
        name: str. What the command calls the output, for the message.
        path: str. The file or folder that would be written.
        inputs: dict, what the command calls each file or folder it reads -> its path
            (or None).
    """
    input_name = input_named(path, inputs)
    if input_name:
        raise ValueError(f"{name} {path} is also the {input_name}: writing it would "
                         f"overwrite the {input_name}. Name another {name}.")


def input_named(path, inputs):
    """Returns what `inputs` (as in `check_not_an_input`) call the existing file or
    folder `path`, else None."""
    for input_name, input_path in inputs.items():
        if (input_path and os.path.exists(path) and os.path.exists(input_path)
                and os.path.samefile(path, input_path)):
            return input_name
    return None


def same_path(first, second):
    """Whether two paths name one file or folder, existing or not."""
    return os.path.realpath(first) == os.path.realpath(second)


def own_export_at(output, run_dirs):
    """Returns `(run_dir, its export folder)` for the first of `run_dirs` whose own
    export folder `output` is (any, when no `output` is given), else `None`: where an
    ensemble of them may not be written, as it would pass for that run's model."""
    for run_dir in run_dirs:
        run_export = os.path.join(run_dir, EXPORT_DIR)
        if not output or same_path(output, run_export):
            return run_dir, run_export
    return None
