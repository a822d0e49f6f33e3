"""The Transformer's layers, one per file (Vaswani et al., 2017, §3)."""

from keras_transformer.layers.attention import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.layers.decoder import Decoder
from keras_transformer.layers.decoder_layer import DecoderLayer
from keras_transformer.layers.encoder import Encoder
from keras_transformer.layers.encoder_layer import EncoderLayer
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.positional_encoding import sinusoidal_positional_encoding
from keras_transformer.layers.token_embedding import TokenEmbedding

__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "FeedForward",
           "MultiHeadAttention", "TokenEmbedding", "scaled_dot_product_attention",
           "sinusoidal_positional_encoding"]
