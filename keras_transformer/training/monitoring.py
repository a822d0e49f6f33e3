"""Watch translation quality in TensorBoard while training: sample outputs and attention.

`TranslationMonitor` is a Keras callback. At the end of every `every_epochs` epochs it
translates a few fixed validation sentences greedily and writes, at step = epoch (the
step Keras's `TensorBoard` callback uses for its `epoch_*` scalars):

    - `samples/translations` (Text dashboard): a table of source, reference and the
      model's hypothesis for each sentence;
    - `cross_attention/layer_<n>` (Images dashboard): the cross-attention weights of each
      head of decoder layer `n` while it translated sentence `attention_index`.

It translates as `BleuCallback` does, through a `bleu.ValidationTranslator` (the run's
two callbacks share one). Scalars are not its business: Keras's `TensorBoard` callback
already records the loss, the metrics and `epoch_learning_rate`, and
`callbacks.ThroughputLogger` adds `tokens_per_second` and the per-step `learning_rate`
that it then records.
"""

import os

import keras
import tensorflow as tf
from keras import ops

from keras_transformer import files
from keras_transformer.data.tokenizer import PAD_ID, add_start_end
from keras_transformer.training import distribution, plotting
from keras_transformer.training.bleu import ValidationTranslator


class TranslationMonitor(keras.callbacks.Callback):
    """Writes sample translations and cross-attention maps to TensorBoard every epoch.

    Only the chief of a worker cluster writes. Arguments follow `BleuCallback`'s, so the
    two sit side by side in a run (see `for_run`).

    Args:
        sources: sequence of str. Source sentences to translate, a handful (they are
            decoded together, in one batch, every time).
        references: sequence of str. Their reference translations.
        tokenizer: a `Tokenizer`, the directory of a saved one, or the
            `bleu.ValidationTranslator` of the run's `BleuCallback`, to translate with
            the same graph.
        log_dir: str. Directory of the summaries (a TensorBoard run), e.g.
            `RUN_DIR/logs/validation`, next to Keras's validation scalars.
        attention_index: int or `None`. Which sentence's attention is drawn; `None` for
            no images.
        every_epochs: int. Write every this many epochs (and after the last one).
        max_length: int or `None`. Most output tokens per sentence (unless `tokenizer`
            is a `ValidationTranslator`); defaults to the paper's source length + 50.

    `training.fit.train` adds one itself when `train.monitor_sentences` is set; pass your
    own only with that field at 0.

    Example:
        sources, references = bleu.validation_slice(config.data, 3)
        fit.train(config, run_dir, callbacks=[
            TranslationMonitor.for_run(run_dir, sources, references)])
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
        self.translator = (tokenizer if isinstance(tokenizer, ValidationTranslator)
                           else ValidationTranslator(tokenizer, max_length=max_length))
        self.log_dir = os.fspath(log_dir)
        self.attention_index = attention_index
        self.every_epochs = every_epochs
        self._writer = None

    @classmethod
    def for_run(cls, run_dir, sources, references, translator=None, **kwargs):
        """Returns a monitor of a run directory (layout in `keras_transformer.files`).

        It reads the run's `tokenizer/` (unless `translator`, the run's
        `ValidationTranslator`, is given) and writes to `run_dir/logs/validation`;
        `kwargs` are the other arguments of `TranslationMonitor`.
        """
        return cls(sources, references, translator or os.path.join(run_dir, files.TOKENIZER),
                   log_dir=os.path.join(run_dir, files.LOGS, "validation"), **kwargs)

    def on_train_begin(self, logs=None):
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
        hypotheses, token_ids = self.translator.translate(self.model, self.sources)
        with self._writer.as_default(step=step):
            tf.summary.text("samples/translations",
                            translations_table(self.sources, self.references, hypotheses))
            if self.attention_index is not None:
                self._write_attention(token_ids[self.attention_index])
        self._writer.flush()

    def _write_attention(self, output_ids):
        """Writes one image per decoder layer for sentence `attention_index`."""
        index = self.attention_index
        source_ids = self.translator.source_ids(self.model, [self.sources[index]])  # (1, S)
        # The decoder's input while it emitted `output_ids`: START, then all but the last.
        decoder_input = add_start_end(output_ids[None, :-1], end=False).numpy()  # (1, L)
        encoder_output = self.model.encode(source_ids, training=False)
        attention = ops.convert_to_numpy(self.model.cross_attention_weights(
            decoder_input, encoder_output, source_ids))  # (1, N, H, L, S)
        figures = cross_attention_figures(self.translator.load_tokenizer(), source_ids[0],
                                          output_ids, attention[0])
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
        source_ids: int `(S,)`, one sentence's source ids (`Translator.source_ids`).
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
    return [tokenizer.id_to_piece(int(i)) for i in ids if int(i) != PAD_ID]


def translations_table(sources, references, hypotheses):
    """Returns a Markdown table (TensorBoard renders it) with one row per sentence."""
    def cell(text):
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| # | source | reference | hypothesis |", "|---|---|---|---|"]
    rows += [f"| {number} | {cell(source)} | {cell(reference)} | {cell(hypothesis)} |"
             for number, (source, reference, hypothesis)
             in enumerate(zip(sources, references, hypotheses, strict=True))]
    return "\n".join(rows)
