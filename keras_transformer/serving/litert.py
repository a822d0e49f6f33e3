"""What LiteRT needs of this process: tf-text's kernels, a malloc that keeps memory, and
the interpreter options that keep its results right.

All for `runners.TFLiteRunner`, without TensorFlow's Python package.
"""

import ctypes
import functools
import importlib.util
import os
import platform

# Options of every interpreter (`InterpreterWithCustomOps`). Delegate clustering lets
# LiteRT reorder nodes so that XNNPACK takes larger partitions. With it, a new
# interpreter that scored batches of other shapes one after the other sometimes gave
# one batch scores up to 2 nats off, the same wrong values from the float and the int8
# file: in 13 of 60 processes, depending on where the heap had put the buffers (first
# seen as a test that failed in the full suite alone). Without it: right in 63 of 63
# such processes, and as fast (greedy and beam, batch 1 and 32: 0.96 to 1.22 times).
INTERPRETER_OPTIONS = {"experimental_disable_delegate_clustering": True}

# glibc's `mallopt` parameters (malloc.h) and the values `reuse_freed_memory` sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_THRESHOLD_BYTES, _MMAP_THRESHOLD_BYTES = 1 << 30, 1 << 28


@functools.cache
def tf_text_kernels():
    """Returns tf-text's TFLite kernel registrars, loaded without importing TensorFlow.

    `import tensorflow_text` imports TensorFlow (2.5 to 6 s); its TFLite kernels live in
    one extension module that needs only TensorFlow's framework library, loaded first
    with its symbols global. The same registrars as `SELECT_TFTEXT_OPS` (every `Add…`).
    """
    tensorflow = importlib.util.find_spec("tensorflow").submodule_search_locations[0]
    text = importlib.util.find_spec("tensorflow_text").submodule_search_locations[0]
    ctypes.CDLL(os.path.join(tensorflow, "libtensorflow_framework.so.2"),
                mode=ctypes.RTLD_GLOBAL)
    path = os.path.join(text, "core", "pybinds", "tflite_registrar.so")
    spec = importlib.util.spec_from_file_location(
        "tensorflow_text.core.pybinds.tflite_registrar", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [getattr(module, name) for name in sorted(dir(module)) if name.startswith("Add")]


@functools.cache
def reuse_freed_memory():
    """Makes glibc's malloc keep the memory this process frees, for its next requests.

    LiteRT's `WHILE` reallocates the loop's dynamic tensors (the decoding caches, a
    megabyte and more at batch 32) at every step. glibc serves blocks that large with
    `mmap` and returns them, or the top of its heap, to the system when they are freed,
    so every step faulted freshly zeroed pages in (the kernel's page-fault and
    page-clearing code in a profile of beam search). With no `mmap` below 256 MB and
    no trimming below 1 GB, freed blocks are reused: the process keeps the memory its
    largest batch needed instead of giving it back between steps. Process-wide, set
    once; nothing happens with another C library.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
