import math

import numpy as np
import pytest

from keras_transformer.layers.positional_encoding import sinusoidal_positional_encoding


def paper_formula(position, dimension, hidden_dim):
    """§3.5 written out for one entry."""
    i = dimension // 2
    angle = position / 10000 ** (2 * i / hidden_dim)
    return math.sin(angle) if dimension % 2 == 0 else math.cos(angle)


def test_table_follows_the_paper_formula_entry_by_entry():
    table = sinusoidal_positional_encoding(50, 16)
    expected = np.array([[paper_formula(p, d, 16) for d in range(16)] for p in range(50)])
    np.testing.assert_allclose(table, expected, atol=1e-6)


def test_known_values_at_positions_2_and_10():
    table = sinusoidal_positional_encoding(11, 512)
    assert table[2, 0] == pytest.approx(0.909297, abs=1e-6)  # sin 2
    assert table[2, 1] == pytest.approx(-0.416147, abs=1e-6)  # cos 2
    assert table[10, 0] == pytest.approx(-0.544021, abs=1e-6)  # sin 10


def test_odd_width_is_rejected():
    with pytest.raises(ValueError, match="hidden_dim"):
        sinusoidal_positional_encoding(10, 7)
