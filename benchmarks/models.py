"""The two models the training benchmark compares, built from the same arguments.

`build_ours` is the project's `Transformer`; `build_keras_hub` assembles the same
architecture from keras-hub's `TokenAndPositionEmbedding`, `TransformerEncoder` and
`TransformerDecoder`: same vocabulary, width, heads, feed-forward width and layers, one
embedding shared by both sides and reused (reversed) as the output projection, as ours
ties them (§3.4). keras-hub drops attention weights with the layer's `dropout`; ours
is given the same `attention_dropout` unless `attention_dropout` says otherwise.
"""

import keras
from keras import ops

from keras_transformer.model import Transformer


def build_ours(arguments, vocabulary_size):
    return Transformer(
        vocabulary_size, num_layers=arguments.num_layers, hidden_dim=arguments.hidden_dim,
        intermediate_dim=arguments.intermediate_dim, num_heads=arguments.num_heads,
        dropout=arguments.dropout,
        attention_dropout=(arguments.dropout if arguments.attention_dropout is None
                           else arguments.attention_dropout),
        max_length=arguments.max_length,
        use_fused_attention=arguments.use_fused_attention)


def build_keras_hub(arguments, vocabulary_size):
    """The same architecture from keras-hub's layers, as a functional model."""
    import keras_hub  # here: an optional dependency, for this comparison alone
    source_ids = keras.Input((None,), dtype="int32", name="source_ids")
    target_ids = keras.Input((None,), dtype="int32", name="target_ids")
    # Explicit masks: Keras 3 attention drops implicit ones after the first layer.
    source_padding = ops.not_equal(source_ids, 0)
    target_padding = ops.not_equal(target_ids, 0)
    embedding = keras_hub.layers.TokenAndPositionEmbedding(
        vocabulary_size, arguments.max_length, arguments.hidden_dim, tie_weights=True,
        name="shared_embedding")
    embedding_dropout = keras.layers.Dropout(arguments.dropout)
    layer_arguments = dict(intermediate_dim=arguments.intermediate_dim,
                           num_heads=arguments.num_heads, dropout=arguments.dropout,
                           layer_norm_epsilon=1e-6)
    x = embedding_dropout(embedding(source_ids))
    for _ in range(arguments.num_layers):
        x = keras_hub.layers.TransformerEncoder(**layer_arguments)(
            x, padding_mask=source_padding)
    y = embedding_dropout(embedding(target_ids))
    for _ in range(arguments.num_layers):
        y = keras_hub.layers.TransformerDecoder(**layer_arguments)(
            y, x, decoder_padding_mask=target_padding, encoder_padding_mask=source_padding)
    logits = embedding.token_embedding(y, reverse=True)
    model = keras.Model({"source_ids": source_ids, "target_ids": target_ids}, logits,
                        name="keras_hub_transformer")
    # What `losses.compile_model` reads from a model.
    model.pad_id, model.hidden_dim = 0, arguments.hidden_dim
    return model


def build(name, arguments, vocabulary_size):
    """Returns the model `name` (`"ours"` or `"keras_hub"`)."""
    return (build_ours if name == "ours" else build_keras_hub)(arguments, vocabulary_size)
