"""keras_transformer: the Transformer of "Attention Is All You Need" for Keras 3."""

from keras_transformer.config import Config, DataConfig, ModelConfig, TrainConfig
from keras_transformer.model import Transformer

__all__ = ["Config", "DataConfig", "ModelConfig", "TrainConfig", "Transformer"]
__version__ = "0.1.0"
