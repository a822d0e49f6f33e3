"""Residual connection and layer normalisation around a sub-layer (§3.1, §5.4)."""


def residual_block(x, sublayer, norm, dropout, normalize_first, training=None):
    """Wraps `sublayer` in dropout, a residual connection and layer normalisation.

    Post-LN, the paper's form: `LayerNorm(x + Dropout(Sublayer(x)))` (§3.1, §5.4).
    Pre-LN (`normalize_first=True`): `x + Dropout(Sublayer(LayerNorm(x)))`, a deviation
    that trains stably without warmup at depth (Xiong et al., 2020); the stack then ends
    with one more LayerNorm.

    Args:
        x: float tensor `(B, L, D)`, the residual stream.
        sublayer: callable `(B, L, D) -> (B, L, D)`.
        norm: the `keras.layers.LayerNormalization` of this block.
        dropout: the `keras.layers.Dropout` of this block.
        normalize_first: bool. Pre-LN instead of the paper's post-LN.
        training: bool. Whether dropout is active.
    """
    if normalize_first:
        return x + dropout(sublayer(norm(x)), training=training)
    return norm(x + dropout(sublayer(x), training=training))
