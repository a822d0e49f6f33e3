"""Checks of a whole `Config`, made before a run writes anything.

A value that the model or the training would refuse minutes later (or, like a negative
`keep_checkpoints`, act on wrongly) is refused here instead, naming the field as an
override writes it, so that a bad value never leaves half a run directory behind.
"""

import dataclasses
import json
import types
import typing

from keras_transformer import distribution, model
from keras_transformer.config import ConfigError


def _at_least(minimum):
    return lambda value: value >= minimum


def _fraction(value):
    return 0 <= value < 1


def _none_or(requirement):
    return lambda value: value is None or requirement(value)


# What the data and training fields must satisfy beyond their types, and how to say so.
# The model's fields are checked by the model's own rules (`model.check_arguments`).
_REQUIREMENTS = {
    "data": {
        "batch_tokens": ("at least 1", _at_least(1)),
        "subword_nbest": ("at least 1", _at_least(1)),
    },
    "train": {
        "label_smoothing": ("in [0, 1)", _fraction),
        "cooldown_fraction": ("in [0, 1)", _fraction),
        "learning_rate_scale": ("positive", lambda value: value > 0),
        "steps_per_epoch": ("null (one pass over the data) or at least 1",
                            _none_or(_at_least(1))),
        "mixed_precision": (
            f"one of {', '.join(map(json.dumps, distribution.PRECISION_POLICIES))}",
            lambda value: value in distribution.PRECISION_POLICIES),
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


def check(config):
    """Raises `ConfigError` naming the first field of `config` with an unusable value.

    Every value must have its field's type (an int where a float is asked is fine),
    then meet its section's rules.
    """
    sections = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    for section_name, section in sections.items():
        for field in dataclasses.fields(section):
            if not _has_type(getattr(section, field.name), field.type):
                raise ConfigError(f"{_assignment(section_name, section, field.name)}: "
                                  f"expected {_type_name(field.type)}.")
    # Only now: a rule may compare fields of its section (hidden_dim and num_heads).
    try:
        model.check_arguments(**dataclasses.asdict(config.model))
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
