"""Tests for the figures: panels and labels follow the weights and tokens; PNGs are valid."""

import sys

import numpy as np
import pytest

from keras_transformer.training import plotting

SOURCE = ["▁a", "▁black", "▁dog", "</s>"]
TARGET = ["<s>", "▁ein", "▁schwarzer", "▁Hund", "</s>"]


def _attention(heads, target_length=len(TARGET), source_length=len(SOURCE)):
    weights = np.random.default_rng(0).random((heads, target_length, source_length))
    return weights / weights.sum(axis=-1, keepdims=True)


def _tick_labels(axes_list, axis):
    getter = {"x": "get_xticklabels", "y": "get_yticklabels"}[axis]
    return [[label.get_text() for label in getattr(axes, getter)()] for axes in axes_list]


@pytest.mark.parametrize("heads", [1, 2, 4, 5, 8])
def test_attention_figure_has_one_axes_per_head(heads):
    figure = plotting.plot_attention(_attention(heads), SOURCE, TARGET)
    assert len(figure.axes) == heads
    assert [axes.get_title() for axes in figure.axes] == [f"head {h}" for h in range(heads)]


def test_attention_axes_are_labelled_with_the_tokens():
    figure = plotting.plot_attention(_attention(2), SOURCE, TARGET, title="layer 1",
                                     head_names=["first", "second"])
    assert _tick_labels(figure.axes, "x") == [SOURCE, SOURCE]
    # Panels of a row share the queries: only the row's first panel names them.
    assert _tick_labels(figure.axes, "y") == [TARGET, []]
    assert [axes.get_title() for axes in figure.axes] == ["first", "second"]
    assert figure.get_suptitle() == "layer 1"


def test_attention_of_one_head_accepts_a_matrix_and_cuts_padding():
    weights = _attention(1, target_length=7, source_length=9)[0]  # padded (T, S)
    figure = plotting.plot_attention(weights, SOURCE, TARGET)
    (axes,) = figure.axes
    shown = axes.images[0].get_array()
    assert shown.shape == (len(TARGET), len(SOURCE))
    np.testing.assert_allclose(shown, weights[:len(TARGET), :len(SOURCE)], rtol=1e-6)
    assert axes.images[0].get_clim() == (0.0, 1.0)


def test_attention_rejects_more_labels_than_weights():
    with pytest.raises(ValueError, match="do not fit"):
        plotting.plot_attention(_attention(2, source_length=3), SOURCE, TARGET)


def test_matrix_figure_has_labels_and_a_colour_bar():
    figure = plotting.plot_matrix(np.eye(3), title="mask", x_label="key", y_label="query",
                                  x_tick_labels=["a", "b", "c"])
    assert len(figure.axes) == 2  # the heat map and its colour bar
    axes = figure.axes[0]
    assert (axes.get_title(), axes.get_xlabel(), axes.get_ylabel()) == ("mask", "key", "query")
    assert _tick_labels([axes], "x") == [["a", "b", "c"]]


def test_masks_figure_has_one_panel_per_mask():
    causal = np.tril(np.ones((4, 4), bool))
    padding = np.array([[True, True, True, False]])
    figure = plotting.plot_masks([padding, causal], ["padding", "look-ahead"],
                                 x_tick_labels=list("abcd"), y_tick_labels=list("abcd"))
    assert [axes.get_title() for axes in figure.axes] == ["padding", "look-ahead"]
    assert _tick_labels(figure.axes, "y")[1] == list("abcd")


def test_curve_and_distribution_figures():
    curve = plotting.plot_curve(np.arange(5), {"a": np.arange(5), "b": -np.arange(5)},
                                x_label="step", y_label="rate")
    assert len(curve.axes[0].get_lines()) == 2
    assert curve.axes[0].get_legend() is not None
    bars = plotting.plot_distribution([0.1, 0.7, 0.2], labels=["x", "y", "z"], highlight=1)
    assert len(bars.axes[0].patches) == 3


def test_png_bytes_are_a_png():
    png = plotting.figure_to_png(plotting.plot_attention(_attention(2), SOURCE, TARGET))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_figure_to_image_gives_an_image_summary_tensor():
    figure = plotting.new_figure(width=2.0, height=1.5, dpi=50)
    figure.add_subplot().plot([0, 1], [1, 0])
    image = plotting.figure_to_image(figure)
    assert image.dtype.name == "uint8"
    assert tuple(image.shape) == (1, 75, 100, 4)  # (1, height, width, RGBA)
    assert int(np.asarray(image).max()) > 0


def test_figures_do_not_go_through_pyplot():
    plotting.plot_attention(_attention(2), SOURCE, TARGET)
    if "matplotlib.pyplot" in sys.modules:  # another test may have imported it
        import matplotlib.pyplot as pyplot
        assert pyplot.get_fignums() == []
