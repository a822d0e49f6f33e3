"""The design card's export entry point: thin calls of `keras-transformer` verbs.

    python -m export RUN_DIR [--check]   = keras-transformer export RUN_DIR [--check]
    python -m export.check RUN_DIR       = keras-transformer check RUN_DIR
    python -m export.saved_model_cli ... `saved_model_cli` with tf-text's ops loaded

Run them from the repository root (this folder is not installed with the package). The
logic is in `keras_transformer.serving`; see docs/serving.md.
"""
