"""Translate one sentence with an exported artifact, as a fresh serving process would.

    python benchmarks/first_translation.py ARTIFACT ["A sentence."]

ARTIFACT is a SavedModel directory or a `.tflite` file. Opens it with the package's own
runner (`keras_transformer.serving.runners.open_runner`, which imports only what the
artifact needs: TensorFlow and tf-text for a SavedModel, LiteRT and tf-text's kernels
for a `.tflite` file), translates once and then once more, and prints one JSON line of
wall-clock timestamps (`time.time()`, comparable with the launching process's clock) so
that `benchmarks.cold_start` can split the time from process start to the first
translation into interpreter start-up, opening (imports and loading) and the first call.
"""

import json
import sys
import time

started = time.time()  # the interpreter has started; nothing imported yet

from keras_transformer.serving import runners  # noqa: E402


def main(path, sentence):
    runner = runners.open_runner(path)
    loaded = time.time()
    first = runners.translations(runner([sentence]))[0]
    translated = time.time()
    runner([sentence])
    again = time.time()
    print(json.dumps({"started": started, "loaded": loaded, "translated": translated,
                      "translated_again": again, "translation": first,
                      "tensorflow_imported": "tensorflow" in sys.modules}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "A man rides a bike."))
