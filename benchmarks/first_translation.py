"""Translate one sentence with an exported SavedModel, as a fresh serving process would.

    python benchmarks/first_translation.py SAVED_MODEL ["A sentence."]

Imports only TensorFlow and tf-text (whose tokenizer ops the graph needs), loads the
SavedModel, translates once and then once more, and prints one JSON line of wall-clock
timestamps (`time.time()`, comparable with the launching process's clock) so that
`benchmarks.cold_start` can split the time from process start to the first translation
into interpreter start-up, imports, loading and the first call.
"""

import json
import sys
import time

started = time.time()  # the interpreter has started; nothing imported yet

import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  registers the tokenizer ops of the graph

imported = time.time()


def main(path, sentence):
    translate = tf.saved_model.load(path).signatures["serving_default"]
    loaded = time.time()
    first = translate(sentences=tf.constant([sentence]))["translations"].numpy()[0]
    translated = time.time()
    translate(sentences=tf.constant([sentence]))["translations"].numpy()
    again = time.time()
    print(json.dumps({"started": started, "imported": imported, "loaded": loaded,
                      "translated": translated, "translated_again": again,
                      "translation": first.decode("utf-8", errors="replace")}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "A man rides a bike.")
