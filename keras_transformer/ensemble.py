"""Several trained models that translate as one: at every step, the mean of their
next-token probabilities.

The ensemble of neural translation (Sutskever et al., 2014; Sennrich et al., 2016, among
many): independently trained models agree on what is right more than on their mistakes,
so their averaged distribution usually decodes better than each of them, for the
members' added decoding cost. Averaging probabilities, unlike averaging weights
(`averaging.py`), needs no shared training history: the members must only share the
vocabulary, since each reads and writes the same token ids.

An `Ensemble` has the decoding interface of `Transformer` (`encode`, `init_cache`,
`decode_step`, `decode`, `max_length`, `variables`), so `greedy_decode`, `beam_search`
and `serving.Translator` take it unchanged, and an exported ensemble is one artifact
like a single model's.
"""

import math
import os

from keras import ops


class TokenizerMismatchError(ValueError):
    """Runs named as one ensemble were trained with different tokenizers."""


class Ensemble:
    """Decodes with the mean of its members' probabilities.

    Args:
        models: two or more `Transformer`s with the same `vocabulary_size` and `pad_id`,
            trained with the same tokenizer (the caller's to ensure: ids are all the
            members exchange).

    Raises:
        ValueError: fewer than two models, or members that disagree on the vocabulary.

    Example:
    >>> ensemble = Ensemble([model_a, model_b])
    >>> decoding.beam_search(ensemble, source_ids).ids
    """

    def __init__(self, models):
        models = tuple(models)
        if len(models) < 2:
            raise ValueError(f"An ensemble needs two or more models, got {len(models)}.")
        for attribute in ("vocabulary_size", "pad_id"):
            values = [getattr(model, attribute) for model in models]
            if len(set(values)) > 1:
                raise ValueError(f"Ensemble members must share {attribute}; got {values}.")
        self.models = models
        self.vocabulary_size = models[0].vocabulary_size
        self.pad_id = models[0].pad_id
        # Every member must hold every position the decoder writes.
        self.max_length = min(model.max_length for model in models)

    @property
    def variables(self):
        """The members' variables, member by member."""
        return [variable for model in self.models for variable in model.variables]

    def encode(self, source_ids, training=None):
        """Returns the members' encoder outputs, a tuple of `(B, S, D_m)`."""
        return tuple(model.encode(source_ids, training=training) for model in self.models)

    def init_cache(self, encoder_outputs, source_ids, max_length):
        """Returns the members' decoding caches, a tuple (batch on axis 0 throughout)."""
        return tuple(model.init_cache(output, source_ids, max_length)
                     for model, output in zip(self.models, encoder_outputs))

    def decode_step(self, token_ids, caches, index):
        """Returns `(log_probs, caches)`: float32 `(B, V)` log of the mean probability.

        Log-probabilities stand where a member returns logits: the decoders' log-softmax
        leaves them as they are.
        """
        steps = [model.decode_step(token_ids, cache, index)
                 for model, cache in zip(self.models, caches)]
        return self._mean_log_probs([logits for logits, _ in steps]), tuple(
            cache for _, cache in steps)

    def decode(self, target_ids, encoder_outputs, source_ids, training=None,
               return_attention_scores=False):
        """Returns the log mean probability `(B, T, V)` at every target position.

        With `return_attention_scores`, also the members' attention weights averaged
        layer by layer, which needs members of one depth and head count.
        """
        outputs = [model.decode(target_ids, output, source_ids, training=training,
                                return_attention_scores=return_attention_scores)
                   for model, output in zip(self.models, encoder_outputs)]
        if not return_attention_scores:
            return self._mean_log_probs(outputs)
        shapes = {(model.num_layers, model.num_heads) for model in self.models}
        if len(shapes) > 1:
            raise ValueError("Averaged attention weights need members with the same "
                             f"(num_layers, num_heads); got {sorted(shapes)}.")
        layers = zip(*(scores for _, scores in outputs))
        attention = [{name: sum(member[name] for member in layer) / len(self.models)
                      for name in layer[0]} for layer in layers]
        return self._mean_log_probs([logits for logits, _ in outputs]), attention

    def _mean_log_probs(self, member_logits):
        log_probs = ops.stack([ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
                               for logits in member_logits])  # (M, ..., V)
        return ops.logsumexp(log_probs, axis=0) - math.log(len(self.models))


def load_ensemble(run_dirs, weights=None):
    """Returns `(config, tokenizer, ensemble, weight_paths)` of two or more run directories.

    The config and tokenizer are the first run's; every other run must have been
    trained with the same tokenizer (the same SentencePiece model, byte for byte).

    Args:
        run_dirs: sequence of str, run directories that `training.train` wrote.
        weights: which weights of each run (see `runs.find_weights`).

    Raises:
        ValueError: fewer than two runs.
        TokenizerMismatchError: a run with another tokenizer.
    """
    from keras_transformer import runs
    from keras_transformer.tokenizer import MODEL_FILE

    if len(run_dirs) < 2:
        raise ValueError("An ensemble needs two or more run directories, got "
                         f"{list(run_dirs)}.")

    def tokenizer_bytes(run_dir):
        with open(os.path.join(run_dir, runs.TOKENIZER, MODEL_FILE), "rb") as file:
            return file.read()

    first = tokenizer_bytes(run_dirs[0])
    for run_dir in run_dirs[1:]:
        if tokenizer_bytes(run_dir) != first:
            raise TokenizerMismatchError(
                f"{os.path.join(run_dir, runs.TOKENIZER, MODEL_FILE)} differs from "
                f"{os.path.join(run_dirs[0], runs.TOKENIZER, MODEL_FILE)}: ensemble members "
                "exchange token ids, so they must share one tokenizer. Train the other "
                "members with the first run's (copy its tokenizer/ folder into their run "
                "directories before training).")
    # Resolved once, so that the paths returned (which a report records) are the files
    # loaded even when `weights=None` picks the newest file of a run still being written.
    weight_paths = [runs.find_weights(run_dir, weights) for run_dir in run_dirs]
    loaded = [runs.load_run(run_dir, path) for run_dir, path in zip(run_dirs, weight_paths)]
    config, tokenizer, _ = loaded[0]
    return config, tokenizer, Ensemble(model for _, _, model in loaded), weight_paths
