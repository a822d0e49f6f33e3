"""Sinusoidal positional encoding (Vaswani et al., 2017, §3.5)."""

import numpy as np


def sinusoidal_positional_encoding(max_length, hidden_dim):
    """Returns the `(max_length, hidden_dim)` float32 table of §3.5.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)) and
    PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model)): even dimensions hold sines,
    odd dimensions the cosines of the same frequency.

    Args:
        max_length: int. Number of positions, starting at position 0.
        hidden_dim: int. `d_model`; must be even so that sines and cosines pair up.
    """
    if hidden_dim % 2:
        raise ValueError(f"hidden_dim must be even for sinusoidal positions, got {hidden_dim}.")
    positions = np.arange(max_length, dtype=np.float64)[:, None]  # (L, 1)
    two_i = np.arange(0, hidden_dim, 2, dtype=np.float64)[None, :]  # (1, D/2)
    angles = positions / np.power(10000.0, two_i / hidden_dim)  # (L, D/2)
    table = np.empty((max_length, hidden_dim), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table.astype(np.float32)
