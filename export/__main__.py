"""`python -m export RUN_DIR`: see `keras_transformer.exporting`."""

import sys

from keras_transformer import exporting

if __name__ == "__main__":
    sys.exit(exporting.main())
