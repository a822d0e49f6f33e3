"""`python -m export.check RUN_DIR`: the same command as `keras-transformer check`."""

import sys

from keras_transformer import cli

if __name__ == "__main__":
    sys.exit(cli.main(["check", *sys.argv[1:]]))
