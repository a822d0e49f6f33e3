"""Watch translation quality in TensorBoard while training: sample outputs and attention.

`TranslationMonitor` is a Keras callback. At the end of every `every_epochs` epochs it
translates a few fixed validation sentences greedily and writes, at step = epoch (the
step Keras's `TensorBoard` callback uses for its `epoch_*` scalars):

    - `samples/translations` (Text dashboard): a table of source, reference and the
      model's hypothesis for each sentence;
    - `cross_attention/layer_<n>` (Images dashboard): the cross-attention weights of each
      head of decoder layer `n` while it translated sentence `attention_index`.

Scalars are not its business: Keras's `TensorBoard` callback already records the loss,
the metrics and `epoch_learning_rate`, and `callbacks.ThroughputLogger` adds
`tokens_per_second` and the per-step `learning_rate` that it then records.
"""

import os
import types

import keras
import tensorflow as tf

from keras_transformer import data, decoding, distribution, plotting, runs


class TranslationMonitor(keras.callbacks.Callback):
    """Writes sample translations and cross-attention maps to TensorBoard every epoch.

    Only the chief of a worker cluster writes. Arguments follow `BleuCallback`'s, so the
    two sit side by side in a run (see `for_run`).

    Args:
        sources: sequence of str. Source sentences to translate, a handful (they are
            decoded together, in one batch, every time).
        references: sequence of str. Their reference translations.
        tokenizer: a `tokenizer.Tokenizer`, or the directory of a saved one. A directory
            is read when training begins, so the callback can be made before
            `training.train` has written the run's tokenizer.
        log_dir: str. Directory of the summaries (a TensorBoard run), e.g.
            `RUN_DIR/logs/validation`, next to Keras's validation scalars.
        attention_index: int or `None`. Which sentence's attention is drawn; `None` for
            no images.
        every_epochs: int. Write every this many epochs (and after the last one).
        max_length: int or `None`. Most output tokens per sentence; defaults to the
            paper's source length + 50 (see `decoding.greedy_decode`).

    `training.train` adds one itself when `train.monitor_sentences` is set; pass your
    own only with that field at 0.

    Example:
    >>> sources, references = bleu_callback.validation_slice(config.data, 3)
    >>> training.train(config, run_dir, callbacks=[
    ...     TranslationMonitor.for_run(run_dir, sources, references)])
    """

    def __init__(self, sources, references, tokenizer, *, log_dir, attention_index=0,
                 every_epochs=1, max_length=None):
        super().__init__()
        if len(sources) != len(references) or not sources:
            raise ValueError(f"Give as many references as sources (at least one); got "
                             f"{len(sources)} sources and {len(references)} references.")
        if attention_index is not None and not 0 <= attention_index < len(sources):
            raise ValueError(f"attention_index={attention_index} names none of the "
                             f"{len(sources)} sources.")
        if every_epochs < 1:
            raise ValueError(f"every_epochs must be at least 1, got {every_epochs}.")
        self.sources = list(sources)
        self.references = list(references)
        self.tokenizer = tokenizer
        self.log_dir = os.fspath(log_dir)
        self.attention_index = attention_index
        self.every_epochs = every_epochs
        self.max_length = max_length
        self._writer = None
        self._translate = None

    @classmethod
    def for_run(cls, run_dir, sources, references, **kwargs):
        """Returns a monitor of a run directory (layout in `keras_transformer.runs`).

        It reads the run's `tokenizer/` and writes to `run_dir/logs/validation`; `kwargs`
        are the other arguments of `TranslationMonitor`.
        """
        return cls(sources, references, os.path.join(run_dir, runs.TOKENIZER),
                   log_dir=os.path.join(run_dir, runs.LOGS, "validation"), **kwargs)

    def on_train_begin(self, logs=None):
        if isinstance(self.tokenizer, (str, os.PathLike)):
            from keras_transformer.tokenizer import Tokenizer
            self.tokenizer = Tokenizer.load(self.tokenizer)
        self._source_ids = encode_sources(self.tokenizer, self.sources,
                                          self.model.max_length)  # (B, S)
        # One graph for every epoch: eager decoding is 10-100x slower.
        self._translate = decoding.decode_function(
            decoding.greedy_decode, self.model, max_length=self.max_length,
            return_attention=self.attention_index is not None)
        if distribution.is_chief():
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_epoch_end(self, epoch, logs=None):
        last_epoch = self.params.get("epochs") if self.params else None
        if (epoch + 1) % self.every_epochs and epoch + 1 != last_epoch:
            return
        self.write_summaries(epoch)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def write_summaries(self, step):
        """Translates the sentences and writes their text and attention at `step`."""
        if self._writer is None:
            return
        decoded = self._translate(self._source_ids)
        ids = decoded.ids.numpy()  # (B, L)
        hypotheses = [text.decode("utf-8")
                      for text in self.tokenizer.detokenize(decoded.ids).numpy()]
        with self._writer.as_default(step=step):
            tf.summary.text("samples/translations",
                            translations_table(self.sources, self.references, hypotheses))
            if self.attention_index is not None:
                self._write_attention(ids, decoded.attention.numpy())
        self._writer.flush()

    def _write_attention(self, ids, attention):
        """Writes one image per decoder layer for sentence `attention_index`."""
        index = self.attention_index
        figures = cross_attention_figures(self.tokenizer, self._source_ids[index],
                                          ids[index], attention[index])
        for layer, figure in enumerate(figures):
            tf.summary.image(f"cross_attention/layer_{layer}",
                             plotting.figure_to_image(figure),
                             description=f"Source: {self.sources[index]}")


def cross_attention_figures(tokenizer, source_ids, output_ids, attention):
    """Returns one figure per decoder layer of the cross-attention behind a translation.

    Row `i` of each map is the attention while the decoder emitted output token `i`;
    padding is left out on both axes.

    Args:
        tokenizer: the `Tokenizer` that names the pieces.
        source_ids: int `(S,)`, one sentence's source ids (as `encode_sources` makes them).
        output_ids: int `(L,)`, its decoder output (`Decoded.ids[b]`).
        attention: float `(N, H, L, S)`, its weights (`Decoded.attention[b]`).

    Returns:
        A list of `N` `matplotlib.figure.Figure`, each with one panel per head.
    """
    source_tokens = token_pieces(tokenizer, source_ids)
    target_tokens = token_pieces(tokenizer, output_ids)
    return [plotting.plot_attention(weights, source_tokens, target_tokens,
                                    title=f"decoder layer {layer}, cross-attention")
            for layer, weights in enumerate(attention)]  # (H, L, S) per layer


def token_pieces(tokenizer, ids):
    """Returns the pieces (str) of `ids` with the padding dropped, e.g. `["<s>", "▁A"]`."""
    return [tokenizer.id_to_piece(int(i)) for i in ids if int(i) != decoding.PAD_ID]


def encode_sources(tokenizer, sentences, max_length):
    """Returns int32 `(B, S)` source ids as the data pipeline makes them, padded.

    `START sentence END` (see `data.tokenize_pairs`), so the model sees its training
    input form.

    Raises:
        ValueError: when a sentence does not fit `max_length`.
    """
    text = types.SimpleNamespace(source_lines=list(sentences), target_lines=list(sentences))
    pairs = data.tokenize_pairs(text, tokenizer, max_length=max_length)
    if pairs.num_too_long:
        raise ValueError(f"{pairs.num_too_long} of the sentences to monitor do not fit "
                         f"max_length={max_length}: choose shorter ones.")
    return pairs.source_ids.to_tensor(default_value=decoding.PAD_ID).numpy()


def translations_table(sources, references, hypotheses):
    """Returns a Markdown table (TensorBoard renders it) with one row per sentence."""
    def cell(text):
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| # | source | reference | hypothesis |", "|---|---|---|---|"]
    rows += [f"| {number} | {cell(source)} | {cell(reference)} | {cell(hypothesis)} |"
             for number, (source, reference, hypothesis)
             in enumerate(zip(sources, references, hypotheses, strict=True))]
    return "\n".join(rows)
