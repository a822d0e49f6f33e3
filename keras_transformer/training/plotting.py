"""Figures of the model's pieces and of training: attention maps, encodings, masks, curves.

Used by the notebooks and by `monitoring.TranslationMonitor`, which writes the same
pictures to TensorBoard. Figures are built with matplotlib's object API
(`matplotlib.figure.Figure` on an Agg canvas), never through pyplot: nothing needs a
display, no window opens, and a callback that draws every epoch leaves no figure behind
in pyplot's global list. In a notebook, a returned figure shows inline like any other
(`%matplotlib inline`). matplotlib is imported on first use, so importing this module
costs nothing.
"""

import io
import math

import numpy as np

# Largest side of one attention panel, in inches.
_MAX_PANEL_INCHES = 6.0


def new_figure(width=6.0, height=4.0, dpi=100):
    """Returns an empty `matplotlib.figure.Figure` drawn with the Agg backend.

    Args:
        width, height: float. Size in inches.
        dpi: int. Pixels per inch of the PNG rendering.
    """
    # Here: matplotlib loads on the first figure, not when this module is imported.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself as `figure.canvas`
    return figure


def _heat_map(axes, matrix, x_labels=None, y_labels=None, vmin=None, vmax=None,
              cmap="viridis"):
    """Draws `matrix` `(rows, columns)` on `axes`, with one tick label per row/column."""
    image = axes.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                        interpolation="nearest")
    if x_labels is not None:
        axes.set_xticks(range(len(x_labels)), labels=list(x_labels), rotation=90)
    if y_labels is not None:
        axes.set_yticks(range(len(y_labels)), labels=list(y_labels))
    return image


def plot_attention(weights, source_tokens, target_tokens, title=None, head_names=None,
                   columns=4):
    """Returns a figure of attention weights: one heat map per head.

    Rows are the queries (target tokens, top to bottom), columns the keys (source tokens);
    each row sums to 1. Colours span `[0, 1]` in every panel so heads compare at a glance.
    Tokens beyond the given labels (padding) are cut off.

    Args:
        weights: array `(T, S)` (one head) or `(H, T, S)`, e.g. one layer's weights
            of one sentence, `[b, layer]` of `Transformer.cross_attention_weights` or of
            a decoder's `Decoded.attention` `(B, N, H, T, S)`.
        source_tokens: sequence of `S'` ≤ `S` key labels.
        target_tokens: sequence of `T'` ≤ `T` query labels.
        title: str or `None`. Title of the whole figure.
        head_names: sequence of `H` panel titles. Defaults to `"head 0"`, `"head 1"`, ….
        columns: int. Panels per row.

    Returns:
        A `matplotlib.figure.Figure` with exactly `H` axes.
    """
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim == 2:
        weights = weights[None]
    if weights.ndim != 3:
        raise ValueError(f"weights must be (T, S) or (H, T, S), got shape {weights.shape}.")
    heads = weights.shape[0]
    target_length, source_length = len(target_tokens), len(source_tokens)
    if target_length > weights.shape[1] or source_length > weights.shape[2]:
        raise ValueError(f"{target_length} target and {source_length} source labels do "
                         f"not fit weights of shape {weights.shape}.")
    head_names = head_names or [f"head {head}" for head in range(heads)]
    columns = max(1, min(columns, heads))
    rows = math.ceil(heads / columns)
    panel_width, x_font = _panel_size(source_length)
    panel_height, y_font = _panel_size(target_length)
    figure = new_figure(width=1.0 + panel_width * columns, height=0.8 + panel_height * rows)
    grid = figure.subplots(rows, columns, squeeze=False)
    for head, axes in enumerate(grid.flat):
        if head >= heads:
            figure.delaxes(axes)  # an empty slot of the last row
            continue
        _heat_map(axes, weights[head, :target_length, :source_length],
                  x_labels=source_tokens, y_labels=target_tokens, vmin=0.0, vmax=1.0)
        axes.tick_params(axis="x", labelsize=x_font)
        axes.tick_params(axis="y", labelsize=y_font)
        axes.set_title(head_names[head])
        if head % columns:
            axes.tick_params(labelleft=False)  # the row's first panel names the queries
    if title:
        figure.suptitle(title)
    return figure


def _panel_size(labels):
    """Returns `(inches, font points)` for a panel side carrying `labels` tick labels.

    A quarter inch per token, but an untrained model's 60-token outputs should not make a
    poster: past `_MAX_PANEL_INCHES` the labels shrink instead (down to 4 points).
    """
    inches = min(_MAX_PANEL_INCHES, 0.35 + 0.25 * labels)
    return inches, max(4.0, min(10.0, 0.8 * 72 * inches / max(labels, 1)))


def plot_matrix(matrix, title=None, x_label=None, y_label=None, x_tick_labels=None,
                y_tick_labels=None, cmap="viridis", colorbar=True):
    """Returns a figure with one heat map of `matrix` `(rows, columns)`.

    For positional-encoding tables, masks (booleans show as 0/1), attention of one head.

    Args:
        matrix: 2-D array.
        title, x_label, y_label: str or `None`.
        x_tick_labels, y_tick_labels: one label per column/row, or `None` for numbers.
        cmap: str. A matplotlib colour map.
        colorbar: bool. Add a colour bar (a second axes).
    """
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {matrix.shape}.")
    figure = new_figure(width=7.0 if matrix.shape[1] > 12 else 4.5, height=4.0)
    axes = figure.add_subplot()
    image = _heat_map(axes, matrix, x_tick_labels, y_tick_labels, cmap=cmap)
    axes.set_title(title or "")
    axes.set_xlabel(x_label or "")
    axes.set_ylabel(y_label or "")
    if colorbar:
        figure.colorbar(image, ax=axes)
    return figure


def plot_masks(masks, titles, x_tick_labels=None, y_tick_labels=None):
    """Returns a figure with one panel per boolean mask (white = may attend, dark = not).

    Args:
        masks: sequence of 2-D boolean arrays `(queries, keys)`; a `(1, keys)` padding
            mask shows as a single row.
        titles: one title per mask.
        x_tick_labels, y_tick_labels: labels of keys and queries, shared by the panels.

    Returns:
        A `matplotlib.figure.Figure` with one axes per mask.
    """
    figure = new_figure(width=3.6 * len(masks), height=3.6)
    for index, (mask, title) in enumerate(zip(masks, titles, strict=True)):
        axes = figure.add_subplot(1, len(masks), index + 1)
        mask = np.asarray(mask, dtype=np.float32)
        # A one-row padding mask has no query labels of its own.
        row_labels = y_tick_labels if y_tick_labels and len(y_tick_labels) == len(mask) \
            else None
        _heat_map(axes, mask, x_tick_labels, row_labels, vmin=0.0, vmax=1.0, cmap="gray")
        axes.set_title(title)
        axes.set_xlabel("key position")
        if len(mask) == 1:  # a padding mask: the same row for every query
            axes.set_yticks([])
        else:
            axes.set_ylabel("query position")
    return figure


def plot_curve(x, ys, title=None, x_label=None, y_label=None):
    """Returns a line plot of one or more curves over the same `x`.

    Args:
        x: 1-D array.
        ys: dict `{legend label: 1-D array like x}`.
        title, x_label, y_label: str or `None`.
    """
    figure = new_figure()
    axes = figure.add_subplot()
    for label, y in ys.items():
        axes.plot(np.asarray(x), np.asarray(y), label=label)
    if len(ys) > 1:
        axes.legend()
    axes.set_title(title or "")
    axes.set_xlabel(x_label or "")
    axes.set_ylabel(y_label or "")
    axes.grid(alpha=0.3)
    return figure


def plot_distribution(probabilities, labels=None, title=None, highlight=None):
    """Returns a bar chart of one probability distribution (e.g. a smoothed target).

    Args:
        probabilities: 1-D array.
        labels: one label per bar, or `None` for token ids.
        title: str or `None`.
        highlight: int or `None`. Index of a bar drawn in another colour (the reference).
    """
    probabilities = np.asarray(probabilities, dtype=np.float32)
    figure = new_figure(width=max(4.0, 0.35 * len(probabilities)), height=3.0)
    axes = figure.add_subplot()
    colours = ["tab:orange" if index == highlight else "tab:blue"
               for index in range(len(probabilities))]
    positions = np.arange(len(probabilities))
    axes.bar(positions, probabilities, color=colours)
    if labels is not None:
        axes.set_xticks(positions, labels=list(labels), rotation=90)
    axes.set_ylim(0.0, 1.0)
    axes.set_ylabel("probability")
    axes.set_title(title or "")
    return figure


def figure_to_png(figure, dpi=None):
    """Returns the PNG bytes of `figure` (rendered by Agg; no display needed)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def figure_to_image(figure, dpi=None):
    """Returns `figure` as a uint8 tensor `(1, height, width, 4)` for `tf.summary.image`.

    Args:
        figure: a `matplotlib.figure.Figure`.
        dpi: int or `None` (the figure's own).
    """
    import tensorflow as tf  # here: drawing figures needs no TensorFlow, TensorBoard does

    image = tf.image.decode_png(figure_to_png(figure, dpi), channels=4)  # (H, W, 4)
    return image[None]
