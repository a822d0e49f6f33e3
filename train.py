"""Train the Transformer: `python train.py --help`.

The design card's training entry point, the same command as `keras-transformer train`
(`keras_transformer.cli`): a preset or a saved config, `FIELD=VALUE` overrides, and a
run directory that resumes after an interruption.
"""

import sys

from keras_transformer import cli

if __name__ == "__main__":
    sys.exit(cli.main(["train", *sys.argv[1:]]))
