"""Configuration: frozen dataclasses, presets, and their JSON form.

Field names equal the constructor arguments of the objects they configure (and their
`get_config` keys), so `Transformer(**dataclasses.asdict(config.model))` just works.

One module of about 400 lines on purpose: a field, its presets' values and the bounds
`check_config` holds it to are read together, and the command line imports this module
alone (no TensorFlow) to parse and check a config before any work starts.
"""

import dataclasses
import json
import types
import typing

from keras_transformer import files


class ConfigError(ValueError):
    """A config file, override or value cannot be used; the message names it and the fix."""


# `TrainConfig.mixed_precision` -> Keras dtype policy.
PRECISION_POLICIES = {None: "float32", "float32": "float32",
                      "bfloat16": "mixed_bfloat16", "mixed_bfloat16": "mixed_bfloat16",
                      "float16": "mixed_float16", "mixed_float16": "mixed_float16"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of the Transformer (Vaswani et al., 2017, Table 3 symbols in brackets).

    Every field is an argument of `keras_transformer.Transformer`; see its docstring.
    """

    vocabulary_size: int = 8000
    num_layers: int = 6  # N
    hidden_dim: int = 512  # d_model
    intermediate_dim: int = 2048  # d_ff
    num_heads: int = 8  # h
    dropout: float = 0.1  # P_drop
    attention_dropout: float = 0.0
    # Whole source and target tokens dropped from the embeddings in training (word
    # dropout, `TokenEmbedding`); 0.0, as the paper.
    token_dropout: float = 0.0
    max_length: int = 256
    pad_id: int = 0
    tie_embeddings: bool = True
    normalize_first: bool = False
    layer_norm_epsilon: float = 1e-6
    use_fused_attention: bool = False


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the parallel text comes from and how it is cut into batches.

    `corpus="multi30k"` reads Multi30K Task 1 (downloaded, or from `data_dir`);
    any other corpus names its files: `train_files`, `validation_files`, `test_files`
    are `(source_path, target_path)` pairs.
    """

    corpus: str = "multi30k"
    source_language: str = "en"
    target_language: str = "de"
    data_dir: str | None = None
    train_files: tuple[str, str] | None = None
    validation_files: tuple[str, str] | None = None
    test_files: tuple[str, str] | None = None
    batch_tokens: int = 4096  # per side, as the paper's ≈25k source + 25k target
    seed: int = 0
    # Subword sampling (Kudo, 2018): each training pass draws every sentence's
    # segmentation among its `subword_nbest` most likely ones, with probability
    # ∝ P^`subword_alpha`. 1: always the most likely one, as the paper trains. On
    # Multi30K, 64 and 0.1 (Kudo's setting) cost the `multi30k` preset 1.5 BLEU
    # (BENCHMARKS.md, the quality table's twentieth row).
    subword_nbest: int = 1
    subword_alpha: float = 0.1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation (Vaswani et al., 2017, §5.3–§5.4) and run bookkeeping."""

    label_smoothing: float = 0.1  # ε_ls
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    beta_1: float = 0.9
    beta_2: float = 0.98
    epsilon: float = 1e-9
    epochs: int = 10
    steps_per_epoch: int | None = None
    # Micro-batches per weight update. The update is that of one batch of their union:
    # each micro-batch's loss is weighted by its share of the target tokens
    # (`batching.weigh_micro_batches`); schedule and cooldown count updates.
    gradient_accumulation_steps: int = 1
    # None: float32, except bfloat16 on the JAX backend with a GPU (`distribution`).
    mixed_precision: str | None = None
    jit_compile: bool = False  # XLA on TensorFlow; the JAX backend always compiles
    checkpoint_every_steps: int = 500  # also how often the resumable backup is written
    keep_checkpoints: int = 5
    log_every_steps: int = 100  # TensorBoard step-level summaries
    devices: tuple[str, ...] | None = None  # None: every visible GPU, else the CPU
    # Validation sentences translated (greedy) and scored with sacreBLEU every epoch, or
    # every `bleu_every_steps` updates; the best-BLEU weights are kept. 0 turns it off.
    bleu_sentences: int = 0
    bleu_every_steps: int | None = None
    bleu_patience: int | None = None  # stop after this many scores without a gain
    # Validation sentences whose translations (and the first one's cross-attention
    # maps) are written to TensorBoard every epoch. 0 turns it off.
    monitor_sentences: int = 0
    # Wall-clock minutes after which training stops (at the end of the current epoch's
    # validation, with the usual final checkpoint and weights); None: no limit.
    time_budget_minutes: float | None = None
    # Share of the run, at its end, over which the learning rate falls linearly to 0
    # (by time with a budget, else by steps); 0: the schedule as written to the end.
    cooldown_fraction: float = 0.0
    # R-Drop (Liang et al., 2021): every training batch goes through the model twice,
    # each pass with its own dropout, and the loss adds the two passes' symmetric KL
    # divergence, times this α (`Transformer.compute_loss`). 0: off, as the paper
    # trains. Each step then costs two forward and backward passes.
    rdrop_alpha: float = 0.0
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a run needs; saved as `config.json` in the run directory."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text, source="<string>"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{source}: line {error.lineno}: not valid JSON ({error.msg}). "
                "Fix the file or write it again with `Config.save`."
            ) from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}.")
        sections = [section.name for section in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(sections))
        if unknown:  # else a misspelt section's values would be dropped without a word
            raise ConfigError(f"{source}: unknown section(s) {unknown}; known sections "
                              f"are {sorted(sections)}.")
        return cls(**{
            section.name: _section_from_dict(section.type, raw.get(section.name, {}), source)
            for section in dataclasses.fields(cls)
        })

    def save(self, path):
        files.write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path, *, check=True):
        """Returns the config in the file `path`; raises `ConfigError`, naming the file,
        for one that is not JSON, holds unknown sections or fields, or (`check`) a value
        of another type (`check_types`: a file edited by hand, before any model is built
        from it; without `check`, the caller checks after its overrides, which may fix
        it). The other rules (`check_config`) are training's to check, after overrides
        and without refusing runs made before a rule was added."""
        with open(path, encoding="utf-8") as file:
            config = cls.from_json(file.read(), source=path)
        if check:
            check_file_types(config, path)
        return config


# Fields that earlier versions wrote and that no longer mean anything: skipped on load,
# so that their config files still load. Every pass over the training data is now a
# full permutation (`data.batch_pairs`), which left `shuffle_buffer` without effect.
_RETIRED_FIELDS = {"DataConfig": {"shuffle_buffer"}}


def _section_from_dict(section_type, values, source):
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: section of {section_type.__name__} must be an object.")
    retired = _RETIRED_FIELDS.get(section_type.__name__, set())
    values = {key: value for key, value in values.items() if key not in retired}
    known = {field.name: field for field in dataclasses.fields(section_type)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"{source}: unknown {section_type.__name__} field(s) {unknown}; "
            f"known fields are {sorted(known)}."
        )
    # JSON has no tuples: file pairs come back as lists.
    values = {key: tuple(value) if isinstance(value, list) else value
              for key, value in values.items()}
    return section_type(**values)


# The Multi30K model and optimiser, shared by the presets that train it for a number of
# epochs and for a time budget. Pre-LN (`normalize_first`), unlike the paper: at this
# peak learning rate the post-LN model ignores the source (BENCHMARKS.md, "Why the
# Multi30K presets are pre-LN"). Word dropout (`token_dropout`) raised val BLEU in both
# presets at 0.99× the cost of an update (BENCHMARKS.md, rows q4 and q9).
_MULTI30K_MODEL = dict(vocabulary_size=8000, num_layers=4, hidden_dim=128,
                       intermediate_dim=256, num_heads=4, dropout=0.3,
                       normalize_first=True, token_dropout=0.1)
_MULTI30K_TRAIN = dict(label_smoothing=0.1, warmup_steps=2000, epochs=127,
                       learning_rate_scale=2.53, cooldown_fraction=0.2,
                       checkpoint_every_steps=150, bleu_sentences=200, monitor_sentences=4)

# Presets as data. Each names the fields it sets; everything else keeps its default.
PRESETS = {
    # Table 3 of the paper, "base": 65 M parameters at a 37k shared vocabulary.
    "paper_base": {
        "model": dict(vocabulary_size=37000, num_layers=6, hidden_dim=512,
                      intermediate_dim=2048, num_heads=8, dropout=0.1),
        "train": dict(label_smoothing=0.1, warmup_steps=4000),
        "data": dict(batch_tokens=25000),
    },
    # Table 3 of the paper, "big".
    "paper_big": {
        "model": dict(vocabulary_size=37000, num_layers=6, hidden_dim=1024,
                      intermediate_dim=4096, num_heads=16, dropout=0.3),
        "train": dict(label_smoothing=0.1, warmup_steps=4000),
        "data": dict(batch_tokens=25000),
    },
    # Multi30K (≈29k pairs): 4+4 pre-LN layers of width 128, dropout 0.3, word dropout
    # 0.1, 8,192-token updates, a peak learning rate of 0.005 after 2,000 warmup steps,
    # then a linear cooldown to 0 over the last 20 % of the updates; bounded by epochs, so
    # a run trains the same amount on any hardware. Why: BENCHMARKS.md, "How the Multi30K
    # presets were chosen".
    "multi30k": {
        "model": _MULTI30K_MODEL,
        "train": _MULTI30K_TRAIN,
        "data": dict(batch_tokens=8192),
    },
    # The same model and optimiser bounded by 60 minutes of training, with 4,096-token
    # batches and dropout 0.1; the cooldown spans the last 12 minutes, and the epoch
    # count only has to be out of the budget's way. Why: BENCHMARKS.md, as above.
    "multi30k_hour": {
        "model": dict(_MULTI30K_MODEL, dropout=0.1),
        "train": dict(_MULTI30K_TRAIN, epochs=1000, time_budget_minutes=60.0),
        "data": dict(batch_tokens=4096),
    },
    # A few-second model for tests and smoke runs; not for translation quality.
    "tiny": {
        "model": dict(vocabulary_size=1000, num_layers=2, hidden_dim=32,
                      intermediate_dim=64, num_heads=2, dropout=0.1, max_length=64),
        "train": dict(label_smoothing=0.1, warmup_steps=50, epochs=1,
                      checkpoint_every_steps=20),
        "data": dict(batch_tokens=512),
    },
}

DEFAULT_PRESET = "multi30k"


def preset_config(name):
    """Returns the full `Config` of the preset `name`."""
    if name not in PRESETS:
        raise ConfigError(f"Unknown preset {name!r}. Available presets: {sorted(PRESETS)}.")
    preset = PRESETS[name]
    return Config(
        model=ModelConfig(**preset.get("model", {})),
        data=DataConfig(**preset.get("data", {})),
        train=TrainConfig(**preset.get("train", {})),
    )


def override(config, assignments):
    """Returns `config` with `section.field=value` (or `field=value`) assignments applied.

    Values are parsed as JSON where possible (`dropout=0.2`, `tie_embeddings=false`,
    `data_dir=null`) and taken as plain strings otherwise (`target_language=fr`). A bare
    field name is looked up in every section; it must be unambiguous.
    """
    sections = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    changes = {name: {} for name in sections}
    for assignment in assignments:
        key, separator, text = assignment.partition("=")
        if not separator:
            raise ConfigError(f"Override {assignment!r} must look like field=value.")
        section_name, _, field_name = key.rpartition(".")
        candidates = [section_name] if section_name else [
            name for name, section in sections.items()
            if field_name in {field.name for field in dataclasses.fields(section)}]
        if len(candidates) != 1 or candidates[0] not in sections or field_name not in {
                field.name for field in dataclasses.fields(sections[candidates[0]])}:
            known = sorted(f"{name}.{field.name}" for name, section in sections.items()
                           for field in dataclasses.fields(section))
            raise ConfigError(f"Override {assignment!r}: {key!r} names no single config "
                             f"field. Known fields: {known}.")
        changes[candidates[0]][field_name] = _parse_value(text)
    return dataclasses.replace(config, **{
        name: dataclasses.replace(sections[name], **values)
        for name, values in changes.items() if values})


def _parse_value(text):
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return tuple(value) if isinstance(value, list) else value


# Checks of a whole `Config`, made before a run writes anything: a value that the model
# or the training would refuse minutes later (or, like a negative `keep_checkpoints`,
# act on wrongly) is refused here instead, naming the field as an override writes it,
# so that a bad value never leaves half a run directory behind.

def _at_least(minimum):
    return lambda value: value >= minimum


def _fraction(value):
    return 0 <= value < 1


def _none_or(requirement):
    return lambda value: value is None or requirement(value)


# What the data and training fields must satisfy beyond their types, and how to say so.
# The model's fields are checked by the model's own rules (`check_model_arguments`).
_REQUIREMENTS = {
    "data": {
        "batch_tokens": ("at least 1", _at_least(1)),
        "subword_nbest": ("at least 1", _at_least(1)),
    },
    "train": {
        "label_smoothing": ("in [0, 1)", _fraction),
        "cooldown_fraction": ("in [0, 1)", _fraction),
        "rdrop_alpha": ("at least 0 (0 turns R-Drop off)", _at_least(0)),
        "learning_rate_scale": ("positive", lambda value: value > 0),
        "steps_per_epoch": ("null (one pass over the data) or at least 1",
                            _none_or(_at_least(1))),
        "mixed_precision": (
            f"one of {', '.join(map(json.dumps, PRECISION_POLICIES))}",
            lambda value: value in PRECISION_POLICIES),
        "keep_checkpoints": ("at least 0 (0 keeps every checkpoint)", _at_least(0)),
        "time_budget_minutes": ("null (no limit) or positive",
                                _none_or(lambda value: value > 0)),
        **{name: ("at least 1", _at_least(1)) for name in (
            "warmup_steps", "epochs", "gradient_accumulation_steps",
            "checkpoint_every_steps", "log_every_steps")},
        **{name: ("null or at least 1", _none_or(_at_least(1))) for name in (
            "bleu_every_steps", "bleu_patience")},
        **{name: ("at least 0", _at_least(0)) for name in (
            "bleu_sentences", "monitor_sentences")},
    },
}


def check_types(config):
    """Raises `ConfigError` naming the first field of `config` whose value is not of its
    type (an int where a float is asked is fine)."""
    for section_field in dataclasses.fields(config):
        section = getattr(config, section_field.name)
        for field in dataclasses.fields(section):
            if not _has_type(getattr(section, field.name), field.type):
                raise ConfigError(f"{_assignment(section_field.name, section, field.name)}: "
                                  f"expected {_type_name(field.type)}.")


def check_file_types(config, path):
    """`check_types`, its error naming the file `path` the config was read from."""
    try:
        check_types(config)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def check_config(config):
    """Raises `ConfigError` naming the first field of `config` with an unusable value.

    Every value must have its field's type (an int where a float is asked is fine),
    then meet its section's rules.
    """
    check_types(config)
    sections = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    # Only now: a rule may compare fields of its section (hidden_dim and num_heads).
    try:
        check_model_arguments(**dataclasses.asdict(config.model))
    except ValueError as error:
        raise ConfigError(f"model: {error}") from None
    for section_name, section in sections.items():
        for name, (requirement, holds) in _REQUIREMENTS.get(section_name, {}).items():
            if not holds(getattr(section, name)):
                raise ConfigError(f"{_assignment(section_name, section, name)}: it must be "
                                  f"{requirement}.")


def _assignment(section_name, section, name):
    """`section.field=value`, the value as an override writes it."""
    return f"{section_name}.{name}={json.dumps(getattr(section, name), default=str)}"


def _has_type(value, annotation):
    """Whether `value` is of the (simple, union or tuple) type `annotation`."""
    arguments = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType):
        return any(_has_type(value, argument) for argument in arguments)
    if typing.get_origin(annotation) is tuple:
        if arguments[1:] == (Ellipsis,):  # tuple[str, ...]
            arguments = arguments[:1] * len(value) if isinstance(value, tuple) else ()
        return (isinstance(value, tuple) and len(value) == len(arguments)
                and all(map(_has_type, value, arguments)))
    if isinstance(value, bool):  # JSON's true is no number
        return annotation is bool
    if annotation is float:
        return isinstance(value, (int, float))
    return isinstance(value, annotation)


def _type_name(annotation):
    if annotation is types.NoneType:
        return "null"
    if isinstance(annotation, types.UnionType):
        return " or ".join(map(_type_name, typing.get_args(annotation)))
    if typing.get_origin(annotation) is tuple:
        items = dict.fromkeys(argument for argument in typing.get_args(annotation)
                              if argument is not Ellipsis)
        return "a list of " + " and ".join(_PLURALS[item] for item in items)
    return {int: "an integer", float: "a number", bool: "true or false",
            str: "a string"}[annotation]


_PLURALS = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def check_model_arguments(**arguments):
    """Raises `ValueError` naming the first argument of `Transformer` that is invalid.

    Other keyword arguments (the rest of a `ModelConfig`) are ignored.
    """
    def fail(name, requirement):
        raise ValueError(f"Transformer argument {name}={arguments[name]!r} is invalid: "
                         f"{requirement}.")

    for name in ("vocabulary_size", "num_layers", "hidden_dim", "intermediate_dim",
                 "num_heads", "max_length"):
        if not isinstance(arguments[name], int) or arguments[name] < 1:
            fail(name, "it must be a positive integer")
    if arguments["hidden_dim"] % arguments["num_heads"]:
        fail("hidden_dim", f"it must be divisible by num_heads={arguments['num_heads']}")
    if arguments["hidden_dim"] % 2:
        fail("hidden_dim", "it must be even (sines and cosines pair up, §3.5)")
    for name in ("dropout", "attention_dropout", "token_dropout"):
        if not 0.0 <= arguments.get(name, 0.0) < 1.0:
            fail(name, "it must be in [0, 1)")
    if not 0 <= arguments["pad_id"] < arguments["vocabulary_size"]:
        fail("pad_id", "it must be a token id below vocabulary_size")
