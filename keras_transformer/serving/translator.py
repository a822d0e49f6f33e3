"""The translator that is exported: sentences in, translations out, in one graph.

`Translator` is a `tf.Module` holding the trained `Transformer` and the `Tokenizer`. Its
functions tokenize, decode (greedy or beam search, `keras_transformer.decoding`) and
detokenize inside one TensorFlow graph, so a SavedModel or a `.tflite` file made from it
needs nothing but TensorFlow (or LiteRT) and tf-text's ops to translate.

Public API:
    - `Translator(model, tokenizer, ...)`: `translate(sentences)` (greedy),
      `translate_beam(sentences)`, `translate_n_best(sentences)`,
      `score(sentences, translations)`, `translate_prefix(sentences, prefixes)`,
      `sample(sentences, seeds)`, `align(sentences)`, `source_ids(sentences)`,
      `signatures()`.
    - `source_ids(tokenizer, sentences, max_length)`: what every translator feeds the
      model.
    - `save_saved_model(translator, directory)`: a SavedModel with the signatures below.
    - `convert_to_tflite(translator, quantize=False)`: the same signatures as TFLite
      bytes: TFLite builtins plus tf-text's custom ops, no Flex ops;
      `convert_to_tflite_models(translator, quantizations)`: several at once.

The signatures (names in `keras_transformer.files`; `Translator(signatures=…)` exports
fewer), each taking `sentences: string[B]`, and their outputs:

- `serving_default` (`translate`, greedy) and `beam_search` (`translate_beam`):
  `translations` string[B], `token_ids` int32[B, L], `scores` float32[B].
- `n_best` (`translate_n_best`): `translations` string[B, N], `token_ids`
  int32[B, N, L], `scores` and `normalized_scores` float32[B, N].
- `score` (`score`; a second input, `translations: string[B]`): `scores` float32[B],
  `token_scores` float32[B, T], `token_ids` int32[B, T], `tokens` string[B, T].
- `prefix` (`translate_prefix`; a second input, `prefixes: string[B]`): beam search's
  outputs, each translation starting with its prefix's pieces.
- `sample` (`sample`; a second input, `seeds: int32[B]`): the outputs of greedy
  decoding, each token drawn among the `sampling_top_k` most probable at
  `sampling_temperature` (`decoding.sampling`).
- `align` (`align`): beam search's outputs and `attention` float32[B, L, S] (the
  `alignment_layer`'s heads averaged, over the source ids START..END),
  `source_words` int32[B, S] and `target_words` int32[B, L] (each token's whitespace
  word, -1 at special tokens), `alignments` int32[B, L] (the source word each output
  token aligns to, or -1; `decoding.alignment`).

`token_ids` are decoder outputs, END and padding included; `scores` sum the output
tokens' log-probabilities, and `normalized_scores` divide them by beam search's length
penalty (what ranks the n-best list). Any string is accepted: sources longer than the
model's `max_length` are truncated (keeping room for START and END), and outputs stop
at `min(source length + extra_length, max_length - 1, max_output_length)` tokens, so every
call ends. A sentence without a token translates to an empty string, and no other does.
"""

import functools
import inspect
import tempfile
import types

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID, add_start_end
from keras_transformer.decoding import alignment, sampling
from keras_transformer.files import (
    ALIGN_SIGNATURE,
    BEAM_SIGNATURE,
    DEFAULT_N_BEST,
    GREEDY_SIGNATURE,
    INPUT_NAME,
    N_BEST_SIGNATURE,
    PAPER_BEAM_SIZE,
    PAPER_LENGTH_PENALTY,
    PREFIX_SIGNATURE,
    PREFIXES_INPUT,
    SAMPLE_SIGNATURE,
    SAMPLING_TEMPERATURE,
    SAMPLING_TOP_K,
    SCORE_SIGNATURE,
    SEEDS_INPUT,
    SIGNATURES,
    TRANSLATIONS_INPUT,
)
from keras_transformer.layers.decoder_layer import write_by_slice_update

_SENTENCES_SPEC = tf.TensorSpec([None], tf.string, name=INPUT_NAME)
_TRANSLATIONS_SPEC = tf.TensorSpec([None], tf.string, name=TRANSLATIONS_INPUT)
_PREFIXES_SPEC = tf.TensorSpec([None], tf.string, name=PREFIXES_INPUT)
_SEEDS_SPEC = tf.TensorSpec([None], tf.int32, name=SEEDS_INPUT)

# Positions the exported decoders' caches grow by (`decoding.common.chunked_loop`);
# finished sentences leave the batch between chunks. Measured against 16 and 32 on a
# trained multi30k_hour model (float .tflite, one thread): 8 was the fastest at batch
# 32 (beam 4 +18 %, greedy +9 % over 16) and within 4 % of 16 at batch 1.
CACHE_CHUNK = 8


# The options of `Translator` that decide what its signatures output: an export records
# them (`Translator.settings`), and its self-check compares the in-memory translator
# with them.
OPTIONS = ("max_output_length", "extra_length", "beam_size", "length_penalty", "n_best",
           "sampling_top_k", "sampling_temperature", "alignment_layer")


class Translator(tf.Module):
    """Translates a batch of sentences with a `Transformer` and its `Tokenizer`.

    Sources are tokenized, truncated to the model's `max_length` and wrapped in START
    and END as in training (`tokenizer.add_start_end`). Decoding is cached, with caches
    that grow `CACHE_CHUNK` positions at a time, and each loop's tensors keep their
    shapes apart from the batch, so the same functions run eagerly, in a SavedModel and
    in TFLite.

    Args:
        model: `keras_transformer.Transformer` (or a `decoding.ensemble.Ensemble`).
        tokenizer: `keras_transformer.data.tokenizer.Tokenizer`, the one the model was
            trained with.
        max_output_length: int or `None`. Most output tokens (END included); `None` for
            the model's limit. Smaller values make every decoding step cheaper.
        extra_length: int. Output tokens allowed beyond the source length (§6.1: 50).
        beam_size: int. Hypotheses of beam search (§6.1: 4).
        length_penalty: float. α of beam search's length penalty (§6.1: 0.6).
        n_best: int or `None`. Hypotheses of `translate_n_best`, at most `beam_size`;
            `None` for `min(DEFAULT_N_BEST, beam_size)`.
        sampling_top_k: int ≥ 0. `sample` draws among this many most probable
            tokens; 0 (the default, as fairseq's) for the whole vocabulary.
        sampling_temperature: float. `sample`'s temperature (1: the model's own
            distribution).
        alignment_layer: int or `None`. The decoder layer (0-based) whose attention
            `align` reads; `None` for `alignment.default_layer`.
        signatures: names of the signatures to export (`files.SIGNATURES`, the
            default); `serving_default` among them. Fewer convert faster.
        jit_compile: bool. Decode with XLA (`decoding.decode_function`), for translating
            in this process, e.g. validation BLEU during training. Such a translator
            cannot be exported: TF Serving runs XLA on CPU only behind an experimental
            flag, and TFLite not at all.
        name: str. Module name.

    Example:
        translator = Translator(model, tokenizer)
        translator.translate(tf.constant(["A man rides a bike."]))["translations"]
    """

    def __init__(self, model, tokenizer, *, max_output_length=None, extra_length=50,
                 beam_size=PAPER_BEAM_SIZE, length_penalty=PAPER_LENGTH_PENALTY,
                 n_best=None, sampling_top_k=SAMPLING_TOP_K,
                 sampling_temperature=SAMPLING_TEMPERATURE,
                 alignment_layer=None, signatures=SIGNATURES, jit_compile=False,
                 name="translator"):
        super().__init__(name=name)
        if beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {beam_size}.")
        n_best = min(DEFAULT_N_BEST, beam_size) if n_best is None else n_best
        if not 1 <= n_best <= beam_size:
            raise ValueError(f"n_best={n_best} must lie in 1..beam_size ({beam_size}): "
                             "beam search keeps no more hypotheses.")
        sampling.check_sampling(sampling_top_k, sampling_temperature)
        layers = getattr(model, "num_layers", None)
        if alignment_layer is None:
            alignment_layer = alignment.default_layer(layers or 1)
        if layers is not None and not 0 <= alignment_layer < layers:
            raise ValueError(f"alignment_layer={alignment_layer} must lie in "
                             f"0..{layers - 1}: the decoder has {layers} layers.")
        unknown = sorted(set(signatures) - set(SIGNATURES))
        if unknown or GREEDY_SIGNATURE not in signatures:
            raise ValueError(f"signatures={list(signatures)}: choose among "
                             f"{', '.join(SIGNATURES)}, {GREEDY_SIGNATURE} included"
                             + (f" ({', '.join(unknown)} unknown)." if unknown else "."))
        # The SavedModel keeps the model's underlying tf.Variables, not the Keras model:
        # Keras 3 variables reached only through a Keras model are restored by
        # `tf.saved_model.load` but not by the session-based loader of TF Serving and
        # `saved_model_cli`, and tracking both would save every weight twice. A plain
        # namespace is not tracked.
        self._untracked = types.SimpleNamespace(model=model)
        self.model_variables = [variable.value for variable in model.variables]
        self.tokenizer = tokenizer
        self.max_output_length = max_output_length
        self.extra_length = extra_length
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.n_best = n_best
        self.sampling_top_k = sampling_top_k
        self.sampling_temperature = float(sampling_temperature)
        self.alignment_layer = alignment_layer
        self.exported_signatures = tuple(name for name in SIGNATURES if name in signatures)
        self.jit_compile = jit_compile
        # Untracked as well: XLA-compiled decoders serve this process and are not exported.
        self._untracked.compiled = {
            beam: decoding.decode_function(self._decoder(beam), model, jit_compile=True)
            for beam in (False, True)} if jit_compile else None

    @property
    def model(self):
        """The `Transformer` (not saved as an object; its variables are)."""
        return self._untracked.model

    def settings(self):
        """Returns the decoding settings of this translator as a JSON-ready dict, the
        form export reports and CTranslate2's `translator.json` record them in: the
        model's `max_source_length` and the `OPTIONS` it was made with."""
        return {"max_source_length": self.model.max_length,
                **{name: getattr(self, name) for name in OPTIONS}}

    def source_ids(self, sentences):
        """Returns int32 `(B, S)` source ids: see `source_ids`."""
        return source_ids(self.tokenizer, sentences, self.model.max_length)

    @tf.function(input_signature=[_SENTENCES_SPEC])
    def translate(self, sentences):
        """Greedy translation; see the module docstring for inputs and outputs."""
        return self._translate(sentences, beam=False)

    @tf.function(input_signature=[_SENTENCES_SPEC])
    def translate_beam(self, sentences):
        """Beam-search translation; same inputs and outputs as `translate`."""
        return self._translate(sentences, beam=True)

    @tf.function(input_signature=[_SENTENCES_SPEC])
    def translate_n_best(self, sentences):
        """The `n_best` best hypotheses of beam search, best first: `translations`
        string `(B, n)`, `token_ids` int32 `(B, n, L)`, `scores` and
        `normalized_scores` float32 `(B, n)`. A sentence with fewer hypotheses (an
        empty source has one) gets empty strings scored -1e9 for the rest."""
        return self._translate_n_best(sentences)

    @tf.function(input_signature=[_SENTENCES_SPEC, _TRANSLATIONS_SPEC])
    def score(self, sentences, translations):
        """Scores given translations (forced decoding): `scores` float32 `(B,)`, the
        log-probability of each translation's pieces and END; `token_scores` `(B, T)`,
        each token's (0 at padding); `token_ids` int32 `(B, T)` and `tokens` string
        `(B, T)`, the pieces scored ("" at padding). Translations are tokenized as
        targets are in training and truncated to the model's `max_length - 1` tokens.
        TFLite drops the check that both inputs have one entry per sentence (here and
        in `translate_prefix` and `sample`): callers of a `.tflite` file check it
        (`runners.TFLiteRunner` does)."""
        return self._score(sentences, translations)

    @tf.function(input_signature=[_SENTENCES_SPEC, _PREFIXES_SPEC])
    def translate_prefix(self, sentences, prefixes):
        """Beam search whose translations start with the given target prefixes (their
        pieces, tokenized as targets; "" forces nothing); outputs as `translate`. TFLite
        drops the check that there is one prefix per sentence (see `score`)."""
        return self._translate_prefix(sentences, prefixes)

    @tf.function(input_signature=[_SENTENCES_SPEC, _SEEDS_SPEC])
    def sample(self, sentences, seeds):
        """Seeded sampling (`decoding.sampling`); outputs as `translate`. A sentence's
        sample depends on its seed and its text alone. TFLite drops the check that
        there is one seed per sentence (see `score`)."""
        return self._sample(sentences, seeds)

    @tf.function(input_signature=[_SENTENCES_SPEC])
    def align(self, sentences):
        """Beam search with word alignments; see the module docstring for outputs."""
        return self._align(sentences)

    def _translate_prefix(self, sentences, prefixes, write_cache=None):
        sentences, prefixes = _one_entry_each(sentences, prefixes, "prefixes")
        pieces = self.tokenizer.tokenize(prefixes).to_tensor(
            default_value=PAD_ID, shape=[None, self.model.max_length - 2])
        decoded = self._decoder(beam=True, write_cache=write_cache)(
            self.model, self.source_ids(sentences),
            prefix_ids=_without_padding_columns(pieces, minimum=1))
        return self._outputs(decoded)

    def _sample(self, sentences, seeds, write_cache=None):
        sentences, seeds = _one_entry_each(sentences, seeds, "seeds")
        options = self._decoding_options(write_cache)
        decoded = sampling.sample(self.model, self.source_ids(sentences), seeds,
                                  top_k=self.sampling_top_k,
                                  temperature=self.sampling_temperature, **options)
        return self._outputs(decoded)

    def _align(self, sentences, write_cache=None):
        source_ids = self.source_ids(sentences)
        decoded = self._decoder(beam=True, write_cache=write_cache)(
            self.model, source_ids, return_attention=True)
        attention = alignment.layer_attention(decoded.attention,
                                              self.alignment_layer)  # (B, L, S)
        starts = self._word_starts()
        source_words = alignment.word_indices(source_ids, starts)
        target_words = alignment.word_indices(decoded.ids, starts)
        return {**self._outputs(decoded), "attention": attention,
                "source_words": source_words, "target_words": target_words,
                "alignments": alignment.hard_alignment(attention, source_words,
                                                       target_words)}

    def _word_starts(self):
        """Whether each piece starts a whitespace word, a bool constant `(V,)`."""
        return tf.constant([self.tokenizer.id_to_piece(i).startswith("\u2581")
                            for i in range(self.tokenizer.vocabulary_size)])

    def _outputs(self, decoded):
        return {"translations": self.detokenize(decoded.ids), "token_ids": decoded.ids,
                "scores": decoded.scores}

    def _score(self, sentences, translations):
        sentences, translations = _one_entry_each(sentences, translations, "translations")
        pieces = self.tokenizer.tokenize(translations).to_tensor(
            default_value=PAD_ID, shape=[None, self.model.max_length - 2])
        ids = _without_padding_columns(add_start_end(pieces, start=False),
                                       minimum=1)  # (B, T)
        token_scores, scores = decoding.score_outputs(self.model, self.source_ids(sentences),
                                                      ids)
        tokens = tf.gather(self._pieces(), ids)
        return {"scores": scores, "token_scores": token_scores, "token_ids": ids,
                "tokens": tokens}

    def _translate_n_best(self, sentences, write_cache=None):
        decoded = self._decoder(beam=True, write_cache=write_cache)(
            self.model, self.source_ids(sentences), num_hypotheses=self.n_best)
        ids = decoded.ids  # (B, n, L)
        batch, width = tf.shape(ids)[0], tf.shape(ids)[2]
        # Sizes spelled out, not -1: an empty batch has L = 0, and -1 is then ambiguous.
        flat = tf.reshape(ids, [batch * self.n_best, width])  # (B*n, L)
        translations = tf.reshape(self.detokenize(flat), [batch, self.n_best])
        return {"translations": translations, "token_ids": ids, "scores": decoded.scores,
                "normalized_scores": decoded.normalized_scores}

    def _pieces(self):
        """The vocabulary's pieces as a string constant `(V,)`, "" for PAD: a gather
        reads them in any runtime (tf-text has no TFLite kernel for id-to-piece, and
        TFLite's select takes no strings)."""
        return tf.constant(["" if i == PAD_ID else self.tokenizer.id_to_piece(i)
                            for i in range(self.tokenizer.vocabulary_size)])

    def _translate(self, sentences, beam, write_cache=None):
        source_ids = self.source_ids(sentences)
        if self.jit_compile and write_cache is None:
            decoded = self._untracked.compiled[beam](source_ids)
        else:
            decoded = self._decoder(beam, write_cache)(self.model, source_ids)
        return self._outputs(decoded)

    def _decoder(self, beam, write_cache=None):
        """Returns `decode(model, source_ids) -> Decoded` with this translator's options
        (`write_cache`: see `layers.decoder_layer.DecoderLayer.decode_step`)."""
        options = self._decoding_options(write_cache)
        if beam:
            return functools.partial(decoding.beam_search, beam_size=self.beam_size,
                                     length_penalty=self.length_penalty, **options)
        return functools.partial(decoding.greedy_decode, **options)

    def _decoding_options(self, write_cache=None):
        # XLA compiles fixed shapes only: its decoders allocate the whole cache at once.
        return dict(max_length=self.max_output_length, extra_length=self.extra_length,
                    start_id=START_ID, end_id=END_ID, pad_id=PAD_ID,
                    cache_chunk=None if self.jit_compile else CACHE_CHUNK,
                    write_cache=write_cache)

    def detokenize(self, ids):
        """Returns string `(B,)` for decoder output ids `(B, L)` (read up to END)."""
        text = self.tokenizer.detokenize(ids)
        # tf-text's TFLite detokenize kernel gives its output the static shape of the
        # graph (1 when the batch is unknown) whatever the batch; a gather over the
        # batch reads every string back with the right shape (identity in TensorFlow).
        return tf.gather(text, tf.range(tf.shape(ids)[0]))

    def signatures(self):
        """Returns the `{name: concrete function}` signatures to export."""
        _check_exportable(self)
        functions = {GREEDY_SIGNATURE: self.translate, BEAM_SIGNATURE: self.translate_beam,
                     N_BEST_SIGNATURE: self.translate_n_best, SCORE_SIGNATURE: self.score,
                     PREFIX_SIGNATURE: self.translate_prefix, SAMPLE_SIGNATURE: self.sample,
                     ALIGN_SIGNATURE: self.align}
        return {name: functions[name].get_concrete_function()
                for name in self.exported_signatures}

    def tflite_signatures(self):
        """Returns the concrete functions to convert to TFLite, each named as its signature.

        The same functions as `signatures`, traced apart (once per translator) with the
        cache writes TFLite runs in place: slice updates, its `DYNAMIC_UPDATE_SLICE`
        (`layers.decoder_layer.write_by_slice_update`). Scoring has no cache.
        """
        _check_exportable(self)
        if getattr(self._untracked, "tflite_signatures", None) is None:
            in_place = dict(write_cache=write_by_slice_update)
            functions = {
                GREEDY_SIGNATURE: (functools.partial(self._translate, beam=False, **in_place),
                                   [_SENTENCES_SPEC]),
                BEAM_SIGNATURE: (functools.partial(self._translate, beam=True, **in_place),
                                 [_SENTENCES_SPEC]),
                N_BEST_SIGNATURE: (functools.partial(self._translate_n_best, **in_place),
                                   [_SENTENCES_SPEC]),
                SCORE_SIGNATURE: (self._score,
                                  [_SENTENCES_SPEC, _TRANSLATIONS_SPEC]),
                PREFIX_SIGNATURE: (functools.partial(self._translate_prefix, **in_place),
                                   [_SENTENCES_SPEC, _PREFIXES_SPEC]),
                SAMPLE_SIGNATURE: (functools.partial(self._sample, **in_place),
                                   [_SENTENCES_SPEC, _SEEDS_SPEC]),
                ALIGN_SIGNATURE: (functools.partial(self._align, **in_place),
                                  [_SENTENCES_SPEC])}
            self._untracked.tflite_signatures = [
                _named_function(name, *functions[name]) for name in self.exported_signatures]
        return self._untracked.tflite_signatures


def default_settings(max_length, num_layers, *, beam_size, length_penalty):
    """Returns the `Translator.settings()` of a translator of a model with `max_length`
    and `num_layers` decoder layers, made with this beam size and α and every other
    option at its default: what an export given no other options records."""
    parameters = inspect.signature(Translator).parameters
    options = {name: parameters[name].default for name in OPTIONS}
    options.update(beam_size=beam_size, length_penalty=length_penalty,
                   n_best=min(DEFAULT_N_BEST, beam_size),
                   sampling_temperature=float(options["sampling_temperature"]),
                   alignment_layer=alignment.default_layer(num_layers))
    return {"max_source_length": max_length, **options}


def source_ids(tokenizer, sentences, max_length):
    """Returns int32 `(B, S)` source ids of `sentences`: START, pieces, END, then padding.

    Sentences with more pieces than fit `max_length` (the model's) are cut (START and
    END always fit); `S` is the longest row of this batch.
    """
    # `to_tensor` with a static width truncates longer rows; the only ragged op,
    # which TFLite runs as tf-text's RaggedTensorToTensor kernel.
    pieces = tokenizer.tokenize(sentences).to_tensor(
        default_value=PAD_ID, shape=[None, max_length - 2])  # (B, S - 2)
    return _without_padding_columns(add_start_end(pieces), minimum=2)  # (B, S)


# The name of the check `_one_entry_each` adds to a graph.
ONE_ENTRY_EACH = "one_entry_each"


def _one_entry_each(sentences, others, name):
    """Returns `sentences` and `others` (`(B,)` each) once a check that their batches
    match has passed. The check must come first: in a graph, ops that do not depend on
    each other run in any order, and a mismatch would otherwise fail as often inside
    the model (a reshape's sizes) as in the check that names the inputs."""
    check = tf.debugging.assert_equal(tf.shape(sentences), tf.shape(others), message=(
        f"sentences and {name} must have one entry each per sentence"),
        name=ONE_ENTRY_EACH)
    with tf.control_dependencies([check]):
        return tf.identity(sentences), tf.identity(others)


def _without_padding_columns(ids, minimum):
    """Returns `ids` `(B, W)` cut to its longest row, `minimum` columns at least (for an
    empty batch): short batches need not pay for the full width in every attention."""
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)  # (B,)
    return ids[:, :tf.reduce_max(tf.concat([lengths, [minimum]], axis=0))]


def save_saved_model(translator, directory):
    """Writes `translator` as a SavedModel with its signatures (`Translator.signatures`).

    Args:
        translator: `Translator`.
        directory: str. Where to write (replaced if present).
    """
    _save_functions(translator, directory, translator.signatures())


def _save_functions(translator, directory, signatures, options=None):
    """Writes the `{name: concrete function}` `signatures` of `translator` as a SavedModel
    (`options`: `tf.saved_model.SaveOptions`)."""
    # The signatures alone, under a root that tracks what they read (the weights, the
    # tokenizer): saved with its `tf.function` attributes too, the Translator wrote every
    # function twice (the signatures call copies of them), and `tf.saved_model.load`
    # spent half its time importing the copies. Loaders call the signatures.
    root = tf.Module(name="translator")
    root.model_variables = translator.model_variables
    root.tokenizer = translator.tokenizer
    tf.saved_model.save(root, directory, signatures=signatures, options=options)


def convert_to_tflite(translator, quantize=False):
    """Returns the translator as a TFLite flatbuffer (bytes) with its signatures.

    The SavedModel's (`Translator.signatures`), with the same names. Only TFLite
    builtin ops and tf-text's custom ops (register them with
    `tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`): the Flex delegate is not in the
    TensorFlow or LiteRT wheels, so the model must not need it.

    Args:
        translator: `Translator`. Converting the same one again reuses its traces.
        quantize: bool. Dynamic-range quantization: int8 weights, float activations;
            about 4x smaller weights, and outputs that may differ from the float model's.
    """
    return convert_to_tflite_models(translator, [quantize])[0]


def convert_to_tflite_models(translator, quantizations):
    """Returns one `convert_to_tflite(translator, quantize)` per entry of the bools
    `quantizations`, converted from one SavedModel of the TFLite functions.

    Not `TFLiteConverter.from_concrete_functions`: for each conversion it saves the
    whole translator (every `tf.function` attribute) as a SavedModel and loads it
    back, 13 s of a one-layer tiny model's 18 s. From one lean SavedModel, a float and
    a quantized conversion took 22 s instead of 36 s, with the same flatbuffers but for
    the model type their metadata records.
    """
    functions = translator.tflite_signatures()
    names = [function.graph.name for function in functions]  # `_named_function`'s
    with tempfile.TemporaryDirectory(prefix="tflite_functions_") as directory:
        # With the functions' source lines, which the converter's errors then name.
        _save_functions(translator, directory, dict(zip(names, functions)),
                        tf.saved_model.SaveOptions(save_debug_info=True))
        models = []
        for quantize in quantizations:
            converter = tf.lite.TFLiteConverter.from_saved_model(directory,
                                                                 signature_keys=names)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            converter.allow_custom_ops = True
            if quantize:
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
            models.append(converter.convert())
    return models


def _check_exportable(translator):
    if translator.jit_compile:
        raise ValueError("A Translator made with jit_compile=True cannot be exported (its "
                         "decoders are XLA programs): export one with jit_compile=False.")


def _named_function(name, function, input_signature):
    """Returns `function` as a concrete function called `name`.

    The converter names each TFLite signature after its function, and its inputs after
    the specs of `input_signature`.
    """
    if len(input_signature) == 1:
        def call(sentences):
            return function(sentences)
    else:
        def call(sentences, second):
            return function(sentences, second)

    call.__name__ = name
    return tf.function(call, input_signature=input_signature).get_concrete_function()
