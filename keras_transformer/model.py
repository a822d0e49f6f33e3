"""The Transformer: encoder-decoder assembled from the layers (Vaswani et al., 2017)."""

import dataclasses

import keras
from keras import ops

from keras_transformer import config as config_lib
from keras_transformer.layers import masks
from keras_transformer.layers.decoder import Decoder
from keras_transformer.layers.encoder import Encoder
from keras_transformer.layers.token_embedding import TokenEmbedding


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    Takes source and target token ids and returns next-token logits. Every mask is
    derived from the ids (`pad_id` marks padding; the decoder also hides the future),
    so inputs need no Keras masks. By default the source embedding, the target
    embedding and the pre-softmax projection share one matrix (§3.4), which requires a
    vocabulary shared by both languages. The model is built on construction:
    `count_params()` works at once.

    Args:
        vocabulary_size: int. Size of the shared vocabulary (`V`).
        num_layers: int. Layers in each of the encoder and decoder (`N`).
        hidden_dim: int. Model width (`d_model`).
        intermediate_dim: int. Feed-forward width (`d_ff`).
        num_heads: int. Attention heads (`h`); must divide `hidden_dim`.
        dropout: float. Dropout on embeddings and every sub-layer output (`P_drop`).
        attention_dropout: float. Dropout on attention weights; `0.0` as in the paper.
        token_dropout: float. Rate at which whole source and target tokens are dropped
            from the embeddings in training (word dropout, see `TokenEmbedding`); `0.0`
            as in the paper.
        max_length: int. Longest source or target sequence, start/end tokens included.
        pad_id: int. The padding token id.
        tie_embeddings: bool. Share source/target embeddings and output projection
            (§3.4). `False` gives each its own matrix.
        normalize_first: bool. Pre-LN instead of the paper's post-LN (a deviation that
            trains deep stacks stably with little warmup).
        layer_norm_epsilon: float. Epsilon of every layer normalisation.
        use_fused_attention: bool. Use `keras.ops.dot_product_attention` (fused GPU
            kernels) wherever attention weights are not requested, except in the
            one-position steps of cached decoding.
        **kwargs: passed to `keras.Model`.

    Call arguments:
        inputs: dict with int tensors `source_ids` `(B, S)` and `target_ids` `(B, T)`
            (the target shifted right: start token first).
        training: bool. Whether dropout is active.

    Returns:
        Float32 logits `(B, T, V)`.

    Example:
    >>> model = Transformer.from_preset("tiny")
    >>> ids = np.array([[5, 6, 7, 3, 0]])
    >>> tuple(model({"source_ids": ids, "target_ids": ids}).shape)
    (1, 5, 1000)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762).
    """

    def __init__(self, vocabulary_size, num_layers=6, hidden_dim=512, intermediate_dim=2048,
                 num_heads=8, dropout=0.1, attention_dropout=0.0, max_length=256, pad_id=0,
                 tie_embeddings=True, normalize_first=False, layer_norm_epsilon=1e-6,
                 use_fused_attention=False, token_dropout=0.0, **kwargs):
        config_lib.check_model_arguments(vocabulary_size=vocabulary_size, num_layers=num_layers,
                        hidden_dim=hidden_dim, intermediate_dim=intermediate_dim,
                        num_heads=num_heads, dropout=dropout,
                        attention_dropout=attention_dropout, max_length=max_length,
                        pad_id=pad_id, token_dropout=token_dropout)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.token_dropout = token_dropout
        self.max_length = max_length
        self.pad_id = pad_id
        self.tie_embeddings = tie_embeddings
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_fused_attention = use_fused_attention
        # R-Drop (`compute_loss`): a `training.losses.RDrop`, which
        # `training.losses.compile_model` sets where the config asks for it.
        self.rdrop = None

        def embedding(name):
            return TokenEmbedding(vocabulary_size, hidden_dim, max_length, dropout,
                                  token_dropout=token_dropout, dtype=self.dtype_policy,
                                  name=name)

        stack_arguments = dict(
            num_layers=num_layers, intermediate_dim=intermediate_dim, num_heads=num_heads,
            dropout=dropout, attention_dropout=attention_dropout,
            normalize_first=normalize_first, layer_norm_epsilon=layer_norm_epsilon,
            use_fused_attention=use_fused_attention, dtype=self.dtype_policy)
        if tie_embeddings:
            # §3.4: one matrix for both embeddings and the pre-softmax projection.
            self.shared_embedding = embedding("shared_embedding")
            self.output_projection = None
        else:
            self.source_embedding = embedding("source_embedding")
            self.target_embedding = embedding("target_embedding")
            self.output_projection = keras.layers.Dense(
                vocabulary_size, use_bias=False, dtype=self.dtype_policy,
                name="output_projection")
        self.encoder = Encoder(**stack_arguments, name="encoder")
        self.decoder = Decoder(**stack_arguments, name="decoder")
        self.build()

    def build(self, inputs_shape=None):
        if self.built:
            return
        ids_shape, hidden_shape = (None, None), (None, None, self.hidden_dim)
        self._source_embedding.build(ids_shape)
        self.encoder.build(hidden_shape)
        self._target_embedding.build(ids_shape)
        self.decoder.build(hidden_shape, hidden_shape)
        if self.output_projection is not None:
            self.output_projection.build(hidden_shape)

    @property
    def _source_embedding(self):
        return self.shared_embedding if self.tie_embeddings else self.source_embedding

    @property
    def _target_embedding(self):
        return self.shared_embedding if self.tie_embeddings else self.target_embedding

    @classmethod
    def from_preset(cls, name, **overrides):
        """Returns a built model of the preset `name` (see `config.PRESETS`).

        Args:
            name: str. `"paper_base"`, `"paper_big"`, `"multi30k"` or `"tiny"`.
            **overrides: constructor arguments replacing the preset's, e.g.
                `vocabulary_size=37000`.
        """
        model_config = config_lib.preset_config(name).model
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(model_config)})
        if unknown:
            raise ValueError(f"Unknown Transformer argument(s) {unknown} for preset {name!r}.")
        return cls(**dataclasses.asdict(dataclasses.replace(model_config, **overrides)))

    def encode(self, source_ids, training=None):
        """Returns the encoder output `(B, S, D)` for source ids `(B, S)`."""
        padding_mask = masks.padding_mask(source_ids, self.pad_id)  # (B, S)
        x = self._source_embedding(source_ids, training=training)  # (B, S, D)
        return self.encoder(x, padding_mask=padding_mask, training=training)

    def decode(self, target_ids, encoder_output, source_ids, training=None):
        """Returns logits `(B, T, V)` for every position of the target prefix.

        Args:
            target_ids: int `(B, T)`, starting with the start token.
            encoder_output: float `(B, S, D)` from `encode`.
            source_ids: int `(B, S)`, the ids `encoder_output` came from (for its mask).
            training: bool. Whether dropout is active.
        """
        x = self._target_embedding(target_ids, training=training)  # (B, T, D)
        x = self.decoder(x, encoder_output, *self._decoder_masks(target_ids, source_ids),
                         training=training)
        return self._logits(x)

    def cross_attention_weights(self, target_ids, encoder_output, source_ids):
        """Returns float32 `(B, N, H, T, S)`: each decoder layer's encoder-decoder
        attention while `decode` reads `target_ids` (without dropout)."""
        x = self._target_embedding(target_ids, training=False)  # (B, T, D)
        return self.decoder.cross_attention_weights(
            x, encoder_output, *self._decoder_masks(target_ids, source_ids))

    def _decoder_masks(self, target_ids, source_ids):
        """Returns the decoder's self-attention `(B, T, T)` and cross-attention
        `(B, 1, S)` masks."""
        target_padding = masks.padding_mask(target_ids, self.pad_id)  # (B, T)
        source_padding = masks.padding_mask(source_ids, self.pad_id)  # (B, S)
        return (masks.decoder_self_attention_mask(target_padding),
                masks.key_padding_attention_mask(source_padding))

    def _logits(self, hidden):
        if self.output_projection is None:
            logits = self.shared_embedding.attend(hidden)  # (B, T, V)
        else:
            logits = self.output_projection(hidden)  # (B, T, V)
        # Float32 logits keep the softmax and loss stable under mixed precision.
        return ops.cast(logits, "float32")

    def call(self, inputs, training=None):
        source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        encoder_output = self.encode(source_ids, training=training)
        return self.decode(target_ids, encoder_output, source_ids, training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The compiled loss; in training with `self.rdrop` set, R-Drop's.

        R-Drop passes the batch through the model a second time, with other dropout
        masks, and combines both passes' losses and logits (`training.losses.RDrop`).
        The metrics see the first pass; validation (`training=False`) computes the
        plain loss.
        """
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        if not training or self.rdrop is None:
            return loss
        second = self(x, training=True)
        second_loss = super().compute_loss(x, y, second, sample_weight, training=training)
        return self.rdrop(loss, second_loss, y, y_pred, second, sample_weight)

    # Entries of the decoding cache that are the same for every hypothesis of a sentence:
    # beam search keeps one row of them per sentence (`decode_step`'s `hypotheses`).
    sentence_cache_entries = ("cross_keys", "cross_values", "source_padding_mask")

    def init_cache(self, encoder_output, source_ids, max_length):
        """Returns the decoding cache for `max_length` target positions.

        A dict of tensors with the batch on axis 0 (so beam search reorders it with one
        `gather` per tensor): per-layer lists `self_keys` `(B, H, K, max_length)` and
        `self_values` `(B, H, max_length, K)` (zeros, filled step by step), `cross_keys`
        `(B, H, K, S)` and `cross_values` `(B, H, S, K)` (the encoder output projected
        once), and `source_padding_mask` `(B, S)`. Keys are stored transposed and values
        head-first, the layouts the attention matmuls read, so no step transposes them.
        """
        batch = ops.shape(encoder_output)[0]
        head_dim = self.hidden_dim // self.num_heads
        empty_keys = ops.zeros((batch, self.num_heads, head_dim, max_length),
                               encoder_output.dtype)
        empty_values = ops.zeros((batch, self.num_heads, max_length, head_dim),
                                 encoder_output.dtype)
        cross_keys, cross_values = self.decoder.project_encoder_output(encoder_output)
        return {
            "self_keys": [empty_keys] * self.num_layers,
            "self_values": [empty_values] * self.num_layers,
            "cross_keys": cross_keys,
            "cross_values": cross_values,
            "source_padding_mask": masks.padding_mask(source_ids, self.pad_id),
        }

    def grow_cache(self, cache, max_length):
        """Returns `cache` with room for `max_length` target positions (at least its own).

        The self-attention keys and values get zero positions appended; what was written
        stays. Decoders that grow the cache as they go (`cache_chunk`) read and copy fewer
        positions at every step than one allocated for the longest output at the start.
        """
        cache = dict(cache)
        length = ops.shape(cache["self_values"][0])[2]
        grown = ops.maximum(max_length - length, 0)

        def append(tensor, axis):
            shape = [ops.shape(tensor)[i] for i in range(4)]
            shape[axis] = grown
            return ops.concatenate([tensor, ops.zeros(shape, tensor.dtype)], axis=axis)

        cache["self_keys"] = [append(keys, 3) for keys in cache["self_keys"]]
        cache["self_values"] = [append(values, 2) for values in cache["self_values"]]
        return cache

    def decode_step(self, token_ids, cache, index, hypotheses=1, write_cache=None):
        """Decodes one position with the cache; always returns `(logits, cache)`.

        Args:
            token_ids: int `(B,)`, the tokens at position `index`.
            cache: from `init_cache` or the previous step.
            index: scalar int, the position of `token_ids` (0 for the start token).
            hypotheses: int. Rows of `token_ids` per row of the `sentence_cache_entries`:
                beam search's `K` hypotheses of a sentence (rows `b·K … b·K + K - 1`)
                read one copy of its encoder keys and values. The other entries have a
                row per token.
            write_cache: how the cache's new position is written (see
                `DecoderLayer.decode_step`; the default suits TensorFlow).

        Returns:
            `(logits, cache)`: float32 `(B, V)` for position `index + 1`, and the cache
            with position `index` written.
        """
        x = self._target_embedding(ops.expand_dims(token_ids, 1), start_position=index,
                                   training=False)  # (B, 1, D)
        # One row per sentence (see `MultiHeadAttention.attend_cached`).
        x = ops.reshape(x, (-1, self.hidden_dim))  # (B, D)
        cross_mask = masks.key_padding_attention_mask(cache["source_padding_mask"])
        x, cache = self.decoder.decode_step(x, cache, index, cross_mask, hypotheses,
                                            write_cache)  # (B, D)
        return self._step_logits(x), cache

    def _step_logits(self, hidden):
        """Returns float32 logits `(B, V)` for one position's hidden state `(B, D)`."""
        if self.output_projection is None:
            logits = tied_step_logits(hidden, self.shared_embedding.embeddings)
        else:
            logits = self.output_projection(hidden)
        return ops.cast(logits, "float32")

    def get_config(self):
        return {**super().get_config(),
                **{field.name: getattr(self, field.name)
                   for field in dataclasses.fields(config_lib.ModelConfig)}}


def tied_step_logits(hidden, embeddings):
    """Returns logits `(B, V)` = h·Eᵀ of hidden states `(B, D)`, computed as (E·hᵀ)ᵀ.

    The tied projection of a decoding step (§3.4). Multiplying the `(V, D)` matrix as
    stored and transposing only the small `(B, V)` result avoids transposing all `V·D`
    weights at every step, which `h·Eᵀ` costs; the products are the same.
    """
    embeddings = ops.cast(embeddings, hidden.dtype)
    return ops.transpose(ops.matmul(embeddings, ops.transpose(hidden)))  # (B, V)
