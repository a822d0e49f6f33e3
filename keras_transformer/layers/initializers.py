"""One initializer per weight: what layers with several sublayers give each of them."""


def sublayer_initializer(initializer):
    """Returns a fresh copy of `initializer` for one sublayer's weight.

    A Keras 3 initializer without a seed draws one seed when it is made and returns the
    same values at every call: a layer that hands one instance to several sublayers of
    one shape gives them identical weights (all four projections of an attention layer,
    say). A copy made from its config draws a seed of its own, as Keras's own
    `MultiHeadAttention` does for its sublayers. A seeded initializer stays seeded.
    """
    return initializer.__class__.from_config(initializer.get_config())

