"""Several trained models that translate as one: at every step, the mean of their
next-token probabilities.

The ensemble of neural translation (Sutskever et al., 2014; Sennrich et al., 2016, among
many): independently trained models agree on what is right more than on their mistakes,
so their averaged distribution usually decodes better than each of them, for the
members' added decoding cost. Averaging probabilities, unlike averaging weights
(`training.averaging`), needs no shared training history: the members must only share the
vocabulary, since each reads and writes the same token ids.

An `Ensemble` has the decoding interface of `Transformer` (`encode`, `init_cache`,
`grow_cache`, `decode_step`, `decode`, `cross_attention_weights`, `max_length`,
`num_layers`, `variables`, `sentence_cache_entries`), so `greedy_decode`, `beam_search` and
`serving.translator.Translator` take it unchanged, and an exported ensemble is one
artifact like a single model's.
"""

import math

from keras import ops

from keras_transformer.decoding.common import step_options


class Ensemble:
    """Decodes with the mean of its members' probabilities.

    Args:
        models: two or more `Transformer`s with the same `vocabulary_size` and `pad_id`,
            trained with the same tokenizer (the caller's to ensure: ids are all the
            members exchange).

    Raises:
        ValueError: fewer than two models, or members that disagree on the vocabulary.

    Example:
        ensemble = Ensemble([model_a, model_b])
        decoding.beam_search(ensemble, source_ids).ids
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
        # Where the members agree (`cross_attention_weights` averages them only then):
        # the layers `align` may read, and its default among them.
        layers = {getattr(model, "num_layers", None) for model in models}
        self.num_layers = layers.pop() if len(layers) == 1 else None
        if not all(hasattr(model, "grow_cache") for model in models):
            self.grow_cache = None  # decoders then allocate every member's cache at once
        # One row per sentence only where every member reads its cache that way.
        self.sentence_cache_entries = tuple(sorted(set.intersection(
            *(set(getattr(model, "sentence_cache_entries", ())) for model in models))))

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

    def grow_cache(self, caches, max_length):
        """Returns the members' caches, each grown to `max_length` positions."""
        return tuple(model.grow_cache(cache, max_length)
                     for model, cache in zip(self.models, caches))

    def decode_step(self, token_ids, caches, index, hypotheses=1, write_cache=None):
        """Returns `(log_probs, caches)`: float32 `(B, V)` log of the mean probability.

        Log-probabilities stand where a member returns logits: the decoders' log-softmax
        leaves them as they are. `hypotheses` and `write_cache` as in
        `Transformer.decode_step`.
        """
        options = step_options(hypotheses, write_cache)
        steps = [model.decode_step(token_ids, cache, index, **options)
                 for model, cache in zip(self.models, caches)]
        return self._mean_log_probs([logits for logits, _ in steps]), tuple(
            cache for _, cache in steps)

    def decode(self, target_ids, encoder_outputs, source_ids, training=None):
        """Returns the log mean probability `(B, T, V)` at every target position."""
        return self._mean_log_probs([
            model.decode(target_ids, output, source_ids, training=training)
            for model, output in zip(self.models, encoder_outputs)])

    def cross_attention_weights(self, target_ids, encoder_outputs, source_ids):
        """Returns the members' cross-attention weights `(B, N, H, T, S)`, averaged.

        Needs members of one depth and head count.
        """
        shapes = {(model.num_layers, model.num_heads) for model in self.models}
        if len(shapes) > 1:
            raise ValueError("Averaged attention weights need members with the same "
                             f"(num_layers, num_heads); got {sorted(shapes)}.")
        return sum(model.cross_attention_weights(target_ids, output, source_ids)
                   for model, output in zip(self.models, encoder_outputs)) / len(self.models)

    def _mean_log_probs(self, member_logits):
        log_probs = ops.stack([ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
                               for logits in member_logits])  # (M, ..., V)
        return ops.logsumexp(log_probs, axis=0) - math.log(len(self.models))
