"""Command-line entry points for exporting a trained run; the logic is in the package.

    python -m export RUN_DIR             SavedModel + TFLite under RUN_DIR/export
    python -m export.check RUN_DIR       every artifact translates like the model
    python -m export.saved_model_cli ... `saved_model_cli` with tf-text's ops loaded

See `keras_transformer.exporting`, `keras_transformer.self_check` and docs/serving.md.
"""
