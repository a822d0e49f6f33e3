"""Export a trained model as a CTranslate2 model directory, float32 and int8.

CTranslate2 is the C++ inference engine that OpenNMT, fairseq and Marian models are
converted to for fast CPU and GPU translation. Its `TransformerSpec` describes this
architecture exactly: post-LN (or pre-LN) layers, ReLU feed-forward, embeddings scaled
by √d_model plus a position table, tied embeddings and output projection. This module
copies the Keras weights into that spec, as CTranslate2's own converters do for other
toolkits (it ships none for Keras).

Each directory holds CTranslate2's `model.bin`, `config.json` and vocabularies, the
run's SentencePiece model (`tokenizer.model`) and `translator.json`, the exported
translator's options (source truncation, output limit, beam size, α), so that
`ctranslate2_runner.CTranslate2Runner` tokenizes and decodes as the SavedModel does.

Differences from the SavedModel that no option closes (the self-check reports them):
CTranslate2's beam search divides scores by `length ** α`, not GNMT's
`((5 + length) / 6) ** α`; and it computes in its own kernels, so near-ties of greedy
decoding may break the other way.
"""

import json
import os
import shutil

import ctranslate2
import numpy as np
from ctranslate2.specs import common_spec, transformer_spec

from keras_transformer import files
from keras_transformer.data.tokenizer import END_ID, START_ID, UNK_ID
from keras_transformer.decoding import alignment
from keras_transformer.layers.positional_encoding import sinusoidal_positional_encoding

QUANTIZATIONS = {files.CTRANSLATE2: "float32", files.CTRANSLATE2_INT8: "int8"}


def model_spec(model, tokenizer, alignment_layer=None):
    """Returns the `ctranslate2.specs.TransformerSpec` holding `model`'s weights.

    Args:
        model: a `keras_transformer.Transformer` (an ensemble has no CTranslate2 form).
        tokenizer: its `Tokenizer`; the pieces become CTranslate2's vocabulary.
        alignment_layer: int or `None`. The decoder layer whose attention, averaged
            over all heads, `return_attention` gives (`alignment.default_layer`).

    Raises:
        ValueError: `model` is not a single `Transformer` with the tokenizer's size.
    """
    # Imported here: the package's __init__ is lazy, and this module is imported only
    # when a CTranslate2 export is asked for.
    from keras_transformer.model import Transformer

    if not isinstance(model, Transformer):
        raise ValueError("Only a single Transformer converts to CTranslate2 (an ensemble "
                         "averages several models' probabilities, which CTranslate2 "
                         "cannot): export each member on its own.")
    if model.vocabulary_size != tokenizer.vocabulary_size:
        raise ValueError(f"The model has {model.vocabulary_size} ids but the tokenizer "
                         f"{tokenizer.vocabulary_size} pieces: export the run's own "
                         "tokenizer with it.")
    if alignment_layer is None:
        alignment_layer = alignment.default_layer(model.num_layers)
    # CTranslate2 averages the first `alignment_heads` heads: all of them, as `align`.
    spec = transformer_spec.TransformerSpec.from_config(
        model.num_layers, model.num_heads, pre_norm=model.normalize_first,
        activation=common_spec.Activation.RELU, alignment_layer=alignment_layer,
        alignment_heads=model.num_heads)
    # Our table interleaves sines and cosines (§3.5); CTranslate2's built-in one puts
    # them in two halves, so the table is written out.
    positions = sinusoidal_positional_encoding(model.max_length, model.hidden_dim)
    _set_embeddings(spec.encoder, model._source_embedding, positions)
    _set_embeddings(spec.decoder, model._target_embedding, positions)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.stacked_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention,
                       layer.self_attention_norm, fused=True)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.stacked_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention,
                       layer.self_attention_norm, fused=True)
        _set_attention(layer_spec.attention, layer.cross_attention,
                       layer.cross_attention_norm, fused=False)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    if model.normalize_first:
        _set_layer_norm(spec.encoder.layer_norm, model.encoder.output_norm)
        _set_layer_norm(spec.decoder.layer_norm, model.decoder.output_norm)
    if model.tie_embeddings:
        spec.decoder.projection.weight = _numpy(model.shared_embedding.embeddings)
    else:
        spec.decoder.projection.weight = _numpy(model.output_projection.kernel).T
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocabulary_size)]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    # Sources are START pieces END, as in training; the decoder starts from START.
    spec.config.add_source_bos = True
    spec.config.add_source_eos = True
    spec.config.unk_token = pieces[UNK_ID]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[START_ID]
    spec.config.eos_token = pieces[END_ID]
    spec.config.layer_norm_epsilon = model.layer_norm_epsilon
    return spec


class _SpecConverter(ctranslate2.converters.Converter):
    """CTranslate2's converter around a ready spec: it validates, quantizes, saves."""

    def __init__(self, spec):
        self._spec = spec

    def _load(self):
        return self._spec


def export_ctranslate2(translator, export_dir, export_id=None):
    """Writes the float32 and int8 CTranslate2 directories of `translator`'s model.

    Args:
        translator: the `serving.translator.Translator` being exported (its model,
            tokenizer and options).
        export_dir: str. The export directory; `ctranslate2/` and `ctranslate2_int8/`
            are written (replaced) inside it.
        export_id: str or `None`. The export's id, recorded in each `translator.json`.

    Returns:
        The report entry (a JSON-ready dict) of the two directories.
    """
    options = translator.settings()
    entry = {"ctranslate2": ctranslate2.__version__, "translator": options}
    for name, quantization in QUANTIZATIONS.items():
        # Each spec is quantized in place when saved: build a fresh one per directory.
        spec = model_spec(translator.model, translator.tokenizer,
                          translator.alignment_layer)
        directory = os.path.join(export_dir, name)
        partial = os.path.join(export_dir, files.partial_name(name))
        if os.path.exists(partial):
            shutil.rmtree(partial)
        # Written beside, then renamed: an interrupted export leaves no half directory.
        _SpecConverter(spec).convert(partial, quantization=quantization, force=True)
        files.write_bytes(os.path.join(partial, files.TOKENIZER_MODEL),
                          translator.tokenizer.model_proto)
        files.write_text(os.path.join(partial, files.CTRANSLATE2_OPTIONS),
                         json.dumps({**options, "export_id": export_id}, indent=2) + "\n")
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.replace(partial, directory)
        entry[name] = {"path": name, "quantization": quantization,
                       "bytes": sum(os.path.getsize(os.path.join(directory, file))
                                    for file in os.listdir(directory))}
    return entry


def _numpy(variable):
    return np.asarray(variable.numpy(), dtype=np.float32)


def _set_embeddings(stack_spec, embedding, positions):
    embeddings_spec = stack_spec.embeddings
    if isinstance(embeddings_spec, list):  # the encoder allows several source factors
        embeddings_spec = embeddings_spec[0]
    embeddings_spec.weight = _numpy(embedding.embeddings)
    stack_spec.scale_embeddings = True  # §3.4: "we multiply those weights by √d_model"
    stack_spec.position_encodings.encodings = positions


def _set_linear(spec, dense):
    spec.weight = _numpy(dense.kernel).T  # Keras (in, out); CTranslate2 (out, in)
    spec.bias = _numpy(dense.bias)


def _set_layer_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_attention(spec, attention, norm, fused):
    """Self-attention: one (q, k, v) projection; cross-attention: q, then (k, v)."""
    projections = [attention.query_projection, attention.key_projection,
                   attention.value_projection]
    groups = [projections] if fused else [projections[:1], projections[1:]]
    for linear_spec, group in zip(spec.linear, groups):
        linear_spec.weight = np.concatenate([_numpy(d.kernel).T for d in group], axis=0)
        linear_spec.bias = np.concatenate([_numpy(d.bias) for d in group], axis=0)
    _set_linear(spec.linear[-1], attention.output_projection)
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec, feed_forward, norm):
    _set_linear(spec.linear_0, feed_forward.hidden)
    _set_linear(spec.linear_1, feed_forward.projection)
    _set_layer_norm(spec.layer_norm, norm)
