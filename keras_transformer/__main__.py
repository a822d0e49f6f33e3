"""`python -m keras_transformer VERB ...`: the same command as `keras-transformer`."""

import sys

from keras_transformer import cli

sys.exit(cli.main())
