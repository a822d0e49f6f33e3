"""The command's console: its log output, and TensorFlow's start-up lines dropped.

A command writes its results to stdout and everything else to stderr, each message once
in the package's format (`warning: …` from warnings on); C++ libraries' start-up lines,
which no Python setting reaches, are filtered from file descriptor 2 unless `--verbose`.
"""

import contextlib
import logging
import os
import re
import select
import sys
import threading

# What TensorFlow's C++ code writes to stderr while it loads, before its logging (and
# TF_CPP_MIN_LOG_LEVEL) applies: dropped unless --verbose.
_STARTUP_NOISE = re.compile(
    r"absl::InitializeLog|port\.cc:\d+\] oneDNN|cudart_stub\.cc|cpu_feature_guard\.cc|"
    r"To enable the following instructions|rebuild TensorFlow with the appropriate|"
    r"cuda_executor|cuInit|computation placer|TF-TRT Warning|Unable to register cu|"
    r"Created TensorFlow Lite XNNPACK delegate")

logger = logging.getLogger("keras_transformer")


class _MessageFormatter(logging.Formatter):
    def format(self, record):
        message = super().format(record)
        return message if record.levelno < logging.WARNING else f"warning: {message}"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a message comes (tests replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass  # always sys.stderr


@contextlib.contextmanager
def console(verbose):
    """The command's log output: every message once, on stderr, in the package's format.

    The root logger's handlers are the command's, set before TensorFlow loads: absl's
    first message (`tf.saved_model.save` sends one) runs `logging.basicConfig()` on a
    root logger without handlers, and TensorFlow gives its logger a handler of its own
    in that case too, which printed every later message of the package a second time
    (`INFO:keras_transformer.recipe:…`). The package's messages go to the command's
    handler alone (`propagate=False`), so that a handler a library adds to the root
    later changes nothing they show. Other libraries' messages show from warnings on,
    from INFO with `verbose` (TensorFlow's own lines, C++ start-up lines aside: see
    `native_stderr_filtered`). Everything is put back when the command ends, for a
    process that runs it in-process (tests, notebooks).
    """
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    handler = _StderrHandler()
    handler.setFormatter(_MessageFormatter("%(message)s"))
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logger.handlers[:], logger.level,
             logger.propagate)
    root.handlers = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        root.handlers, level, logger.handlers, logger_level, logger.propagate = saved
        root.setLevel(level)
        logger.setLevel(logger_level)


def load_tensorflow(verbose):
    """Imports TensorFlow and tf-text (registering the ops exported graphs use) early,
    so that the verb's own messages come after TensorFlow's start-up; quiets TensorFlow's
    Python logger unless `verbose`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    if not verbose:
        tf.get_logger().setLevel("ERROR")


@contextlib.contextmanager
def native_stderr_filtered():
    """Passes file descriptor 2 (where C++ libraries write) through a filter.

    TensorFlow and LiteRT write start-up lines from C++ straight to the descriptor,
    some before their logging (and TF_CPP_MIN_LOG_LEVEL) applies, so no Python setting
    reaches them. Here the descriptor is a pipe, and a thread copies what comes through
    to the real stderr as it comes, less `_STARTUP_NOISE` lines; progress bars (ended by
    a carriage return) pass at once.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    stderr_gone = threading.Event()

    def write(piece):
        if stderr_gone.is_set() or _STARTUP_NOISE.search(piece.decode("utf-8", "replace")):
            return
        remaining = memoryview(piece)
        while remaining:  # a write may take part of it
            try:
                remaining = remaining[os.write(saved, remaining):]
            except BlockingIOError:  # a stderr shared in non-blocking mode
                select.select([], [saved], [])
            except OSError:
                # A closed pipe, a full disk: the rest is dropped, and the thread reads
                # on, or the command would block on its next message.
                stderr_gone.set()
                return

    def copy():
        pending = b""
        while chunk := os.read(read_end, 65536):
            pending += chunk
            *pieces, pending = re.split(rb"(?<=[\r\n])", pending)
            for piece in pieces:
                write(piece)
        if pending:
            write(pending)

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread reads to its end
        thread.join(timeout=5)
        if not thread.is_alive():  # else a child holds the pipe: its descriptors stay
            os.close(read_end)
            os.close(saved)
