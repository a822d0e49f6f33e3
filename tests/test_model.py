import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import Transformer
from keras_transformer.layers import masks

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

SOURCE = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], dtype="int32")
TARGET = np.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]], dtype="int32")


@pytest.fixture(scope="module")
def model():
    return Transformer(vocabulary_size=50, num_layers=2, hidden_dim=16, intermediate_dim=32,
                       num_heads=2, dropout=0.1, max_length=32)


def logits(model, source, target):
    return ops.convert_to_numpy(model({"source_ids": source, "target_ids": target}))


def paper_parameter_count(vocabulary, width, inner, layers):
    """The weights of the paper's model, counted from its description (§3, Table 3)."""
    attention = 4 * (width * width + width)  # query, key, value, output: kernel + bias
    feed_forward = 2 * width * inner + inner + width
    norm = 2 * width  # gamma and beta
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    return vocabulary * width + layers * (encoder_layer + decoder_layer)  # one tied matrix


@pytest.mark.slow
def test_paper_base_has_the_papers_parameter_count():
    count = Transformer.from_preset("paper_base", vocabulary_size=37000).count_params()
    assert count == paper_parameter_count(37000, 512, 2048, 6) == 63_082_496


def test_a_small_model_has_the_counted_parameters():
    model = Transformer(vocabulary_size=50, num_layers=2, hidden_dim=16, intermediate_dim=32,
                        num_heads=2)
    assert model.count_params() == paper_parameter_count(50, 16, 32, 2)


def test_every_weight_matrix_starts_with_values_of_its_own(model):
    # Glorot-uniform draws (Glorot and Bengio, 2010) are independent per matrix: no two
    # kernels hold the same values, not even flattened (same draws, other shape).
    kernels = [ops.convert_to_numpy(v).ravel() for v in model.weights
               if len(v.shape) == 2]
    assert len(kernels) == 1 + 2 * (4 + 2) + 2 * (8 + 2)  # embedding, encoder, decoder
    firsts = {tuple(np.round(kernel[:8], 6)) for kernel in kernels}
    assert len(firsts) == len(kernels)


def test_a_seed_gives_the_same_weights_again():
    def weights():
        keras.utils.set_random_seed(7)
        return [ops.convert_to_numpy(v) for v in Transformer.from_preset(
            "tiny", vocabulary_size=50, num_layers=1).weights]

    for first, second in zip(weights(), weights()):
        np.testing.assert_array_equal(first, second)


def test_model_is_built_on_construction(model):
    assert model.built and model.count_params() > 0


def test_output_shape_and_dtype(model):
    output = model({"source_ids": SOURCE, "target_ids": TARGET})
    assert tuple(output.shape) == (2, 5, 50)
    assert keras.backend.standardize_dtype(output.dtype) == "float32"


def test_appending_source_padding_does_not_change_outputs(model):
    padded = np.pad(SOURCE, ((0, 0), (0, 6)))
    np.testing.assert_allclose(logits(model, padded, TARGET), logits(model, SOURCE, TARGET),
                               rtol=1e-5, atol=1e-5)


def test_appending_target_padding_does_not_change_outputs_at_real_positions(model):
    padded = np.pad(TARGET, ((0, 0), (0, 4)))
    np.testing.assert_allclose(logits(model, SOURCE, padded)[:, :5],
                               logits(model, SOURCE, TARGET), rtol=1e-5, atol=1e-5)


def test_future_target_tokens_do_not_change_earlier_outputs(model):
    changed = TARGET.copy()
    changed[:, 3:] = [[40, 41], [42, 43]]
    before, after = logits(model, SOURCE, TARGET), logits(model, SOURCE, changed)
    np.testing.assert_allclose(after[:, :3], before[:, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(after[0, 3:], before[0, 3:])


def test_source_tokens_do_change_outputs(model):
    changed = SOURCE.copy()
    changed[0, 0] = 30
    assert not np.allclose(logits(model, changed, TARGET)[0], logits(model, SOURCE, TARGET)[0])


def test_cached_decode_steps_equal_the_full_decode(model):
    encoder_output = model.encode(SOURCE)
    full = ops.convert_to_numpy(model.decode(TARGET, encoder_output, SOURCE))
    cache = model.init_cache(encoder_output, SOURCE, max_length=8)
    for index in range(TARGET.shape[1]):
        step, cache = model.decode_step(TARGET[:, index], cache, index)
        real = TARGET[:, index] != 0
        np.testing.assert_allclose(ops.convert_to_numpy(step)[real], full[real, index],
                                   rtol=1e-4, atol=1e-4)


def test_tied_embeddings_share_one_matrix_with_the_output_projection(model):
    vocabulary_matrices = [w for w in model.weights if tuple(w.shape) == (50, 16)]
    assert len(vocabulary_matrices) == 1
    embeddings = ops.convert_to_numpy(model.shared_embedding.embeddings)
    encoder_output = model.encode(SOURCE)
    source_padding = masks.padding_mask(SOURCE)
    hidden = model.decoder(
        model.shared_embedding(TARGET), encoder_output,
        self_attention_mask=masks.decoder_self_attention_mask(masks.padding_mask(TARGET)),
        cross_attention_mask=masks.key_padding_attention_mask(source_padding))
    expected = ops.convert_to_numpy(hidden) @ embeddings.T
    np.testing.assert_allclose(logits(model, SOURCE, TARGET), expected, rtol=1e-4, atol=1e-4)


def test_untied_model_has_three_vocabulary_matrices():
    untied = Transformer(vocabulary_size=50, num_layers=1, hidden_dim=16, intermediate_dim=32,
                         num_heads=2, tie_embeddings=False)
    shapes = [tuple(w.shape) for w in untied.weights]
    assert shapes.count((50, 16)) == 2 and shapes.count((16, 50)) == 1


def test_dropout_is_active_only_in_training(model):
    inputs = {"source_ids": SOURCE, "target_ids": TARGET}
    np.testing.assert_array_equal(ops.convert_to_numpy(model(inputs)),
                                  ops.convert_to_numpy(model(inputs)))
    assert not np.allclose(ops.convert_to_numpy(model(inputs, training=True)),
                           ops.convert_to_numpy(model(inputs)))


def test_cross_attention_weights_are_returned_per_layer(model):
    encoder_output = model.encode(SOURCE)
    weights = model.cross_attention_weights(TARGET, encoder_output, SOURCE)
    assert tuple(weights.shape) == (2, 2, 2, 5, 5)  # (B, N, H, T, S)
    cross = ops.convert_to_numpy(weights)
    np.testing.assert_allclose(cross[1, :, :, :, 3:], 0.0, atol=1e-7)  # source padding
    np.testing.assert_allclose(cross.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("options", [{}, {"tie_embeddings": False, "normalize_first": True,
                                          "token_dropout": 0.1}])
def test_keras_file_round_trip_gives_identical_outputs(tmp_path, options):
    original = Transformer.from_preset("tiny", **options)
    original.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    assert restored.get_config() == original.get_config()
    assert all(embedding.token_dropout == options.get("token_dropout", 0.0)
               for embedding in (restored._source_embedding, restored._target_embedding))
    np.testing.assert_array_equal(logits(restored, SOURCE, TARGET),
                                  logits(original, SOURCE, TARGET))


def test_from_preset_applies_overrides():
    model = Transformer.from_preset("tiny", vocabulary_size=123, num_layers=1)
    assert model.vocabulary_size == 123 and len(model.encoder.encoder_layers) == 1


@pytest.mark.parametrize("arguments, name", [
    ({"hidden_dim": 30, "num_heads": 4}, "hidden_dim=30"),
    ({"dropout": -0.1}, "dropout=-0.1"),
    ({"attention_dropout": 1.5}, "attention_dropout=1.5"),
    ({"token_dropout": 1.0}, "token_dropout=1.0"),
    ({"num_layers": 0}, "num_layers=0"),
    ({"pad_id": 99}, "pad_id=99"),
])
def test_bad_arguments_raise_value_error_naming_them(arguments, name):
    with pytest.raises(ValueError, match=name):
        Transformer(**{"vocabulary_size": 50, "hidden_dim": 16, "num_heads": 2, **arguments})


def test_unknown_preset_and_unknown_override_are_named():
    with pytest.raises(ValueError, match="'paper_huge'"):
        Transformer.from_preset("paper_huge")
    with pytest.raises(ValueError, match="hiden_dim"):
        Transformer.from_preset("tiny", hiden_dim=8)
