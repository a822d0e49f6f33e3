"""`python -m export.check RUN_DIR`: see `keras_transformer.self_check`."""

import sys

from keras_transformer import self_check

if __name__ == "__main__":
    sys.exit(self_check.main())
