"""Token embeddings with sinusoidal positions (Vaswani et al., 2017, §3.4 and §3.5)."""

import math

import keras
from keras import ops

from keras_transformer.layers.positional_encoding import sinusoidal_positional_encoding


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Embeds token ids, scales by √d_model, adds sinusoidal positions, applies dropout.

    The same weight matrix can also serve as the pre-softmax projection (`attend`), which
    is how the model ties input embeddings and output logits (§3.4). No Keras mask is
    produced: the model derives its masks from token ids.

    Args:
        vocabulary_size: int. Number of token ids (`V`).
        hidden_dim: int. Embedding width (`d_model`); even.
        max_length: int. Number of positions with an encoding; ids beyond it are an error
            of the caller (the data pipeline and decoders respect it).
        dropout: float. Dropout rate on the sum of embeddings and positions (`P_drop`).
        token_dropout: float. Rate at which a whole token's embedding is dropped in
            training, before the positions are added (the kept ones scaled by
            `1 / (1 - rate)`): word dropout (Sennrich et al., 2016; Gal and
            Ghahramani, 2016), a regulariser for small corpora. `0.0`, as the paper.
        embeddings_initializer: initializer of the `(V, D)` matrix. Defaults to Glorot
            uniform.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        token_ids: int tensor `(B, L)`.
        start_position: int or scalar int tensor. Position of the first token, for
            step-by-step decoding. Defaults to `0`.
        training: bool. Whether dropout is active.

    Returns:
        Float tensor `(B, L, D)`.

    Example:
    >>> layer = TokenEmbedding(vocabulary_size=100, hidden_dim=8, max_length=16)
    >>> tuple(layer(np.array([[5, 6, 0]])).shape)
    (1, 3, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.4, §3.5.
        - [Sennrich et al., 2016](https://aclanthology.org/W16-2323/) (dropout of
          full words); [Gal and Ghahramani, 2016](https://arxiv.org/abs/1512.05287).
    """

    def __init__(self, vocabulary_size, hidden_dim, max_length, dropout=0.1,
                 embeddings_initializer="glorot_uniform", token_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.max_length = max_length
        self.dropout = dropout
        self.token_dropout = token_dropout
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.token_embedding = keras.layers.Embedding(
            vocabulary_size, hidden_dim, embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy, name="token_embedding")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        # One draw per token, broadcast over its D features: the whole vector goes.
        self.whole_token_dropout = keras.layers.Dropout(
            token_dropout, noise_shape=(None, None, 1), dtype=self.dtype_policy,
            name="token_dropout") if token_dropout else None
        self.positional_encoding = sinusoidal_positional_encoding(max_length, hidden_dim)

    def build(self, token_ids_shape):
        self.token_embedding.build(token_ids_shape)

    @property
    def embeddings(self):
        """The `(V, D)` embedding matrix, shared with the output projection when tied."""
        return self.token_embedding.embeddings

    def call(self, token_ids, start_position=0, training=None):
        # §3.4: "we multiply those weights by √d_model".
        scale = ops.cast(math.sqrt(self.hidden_dim), self.compute_dtype)
        x = self.token_embedding(token_ids) * scale  # (B, L, D)
        if self.whole_token_dropout is not None:
            x = self.whole_token_dropout(x, training=training)
        positions = ops.arange(ops.shape(token_ids)[1]) + start_position  # (L,)
        encoding = ops.take(ops.convert_to_tensor(self.positional_encoding), positions,
                            axis=0)  # (L, D)
        x = x + ops.expand_dims(ops.cast(encoding, self.compute_dtype), 0)
        return self.embedding_dropout(x, training=training)

    def attend(self, hidden):
        """Returns logits `(..., V)` = hidden · Eᵀ: the tied pre-softmax projection."""
        return ops.matmul(hidden, ops.transpose(ops.cast(self.embeddings, hidden.dtype)))

    def compute_output_shape(self, token_ids_shape):
        return (*token_ids_shape, self.hidden_dim)

    def get_config(self):
        return {**super().get_config(),
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "max_length": self.max_length,
                "dropout": self.dropout,
                "token_dropout": self.token_dropout,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer)}
