"""`saved_model_cli` with tf-text's ops registered, for translators that tokenize.

The stock command does not import tensorflow_text, so loading the translator fails with
"Op type not registered". Same arguments as `saved_model_cli`, e.g.:

    python -m export.saved_model_cli run --dir RUN_DIR/export/saved_model \\
        --tag_set serve --signature_def serving_default \\
        --input_exprs 'sentences=["A man rides a bike."]'
"""

import tensorflow_text  # noqa: F401  registers the ops before the graph is loaded
from tensorflow.python.tools import saved_model_cli

if __name__ == "__main__":
    saved_model_cli.main()
