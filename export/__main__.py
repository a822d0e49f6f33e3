"""`python -m export RUN_DIR`: the same command as `keras-transformer export`."""

import sys

from keras_transformer import cli

if __name__ == "__main__":
    sys.exit(cli.main(["export", *sys.argv[1:]]))
