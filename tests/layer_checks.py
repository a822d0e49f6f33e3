"""One shared check every layer passes: build, symbolic and eager calls, config, saving."""

import keras
import numpy as np


def check_layer(make_layer, input_shapes, expected_shape, tmp_path, input_dtype="float32"):
    """Checks the Keras contract of the layer made by `make_layer()`.

    Builds it explicitly, calls it symbolically and eagerly (shape and dtype), rebuilds it
    from `get_config`, and saves/loads it as `.keras` inside a functional model, which
    must give identical outputs.

    Args:
        make_layer: callable returning a fresh layer.
        input_shapes: list of input shapes without the batch axis, in call order.
        expected_shape: output shape without the batch axis.
        tmp_path: a directory for the saved model.
        input_dtype: dtype of the inputs ("int32" gives small token ids). The output is
            expected in float32.
    """
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 10, size=(2, *shape)).astype(input_dtype)
              if input_dtype.startswith("int")
              else rng.normal(size=(2, *shape)).astype(input_dtype)
              for shape in input_shapes]

    layer = make_layer()
    layer.build(*[(2, *shape) for shape in input_shapes])
    assert layer.built
    assert layer.weights, "the built layer created no weights"

    symbolic = layer(*[keras.Input(shape=shape, dtype=input_dtype) for shape in input_shapes])
    assert tuple(symbolic.shape[1:]) == tuple(expected_shape)

    eager = layer(*arrays)
    assert tuple(eager.shape) == (2, *expected_shape)
    assert keras.backend.standardize_dtype(eager.dtype) == "float32"

    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config

    inputs = [keras.Input(shape=shape, dtype=input_dtype) for shape in input_shapes]
    model = keras.Model(inputs, make_layer()(*inputs))
    path = tmp_path / "layer.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model(arrays)),
        keras.ops.convert_to_numpy(restored(arrays)))
