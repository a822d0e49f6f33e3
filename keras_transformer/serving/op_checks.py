"""Which ops an exported translator needs, and whether its runtimes have them.

TF Serving runs core TensorFlow ops plus the tf-text ops it links in; LiteRT runs TFLite
builtins plus the tf-text kernels that `tensorflow_text.tflite_registrar` registers (the
Flex delegate is in neither wheel). An op from anywhere else, or a Python callback
(`PyFunc`), would load here and fail there, so export lists every op and refuses such
artifacts with a message naming the offending ops.

Public API:
    - `saved_model_ops(directory)`: sorted op names of every graph and function.
    - `tflite_ops(model_content)`: `{op name: count}` over every subgraph.
    - `check_saved_model_ops(ops)` / `check_tflite_ops(ops)`: return the tf-text ops
      used, or raise `UnsupportedOpsError`.
"""

import collections
import glob
import os
import re

import tensorflow as tf
import tensorflow_text
from ai_edge_litert import schema_py_generated as schema
from tensorflow.core.protobuf import saved_model_pb2

# Core ops that call back into the Python interpreter: absent from a model server.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
# tf-text prefixes the names of its newer ops in TFLite graphs.
_TFTEXT_PREFIX = "TFText>"


class UnsupportedOpsError(ValueError):
    """An exported graph uses ops that the serving runtime does not have."""

    exit_status = 1  # the command line's status for a failure (not a usage error)


def saved_model_ops(directory):
    """Returns the sorted names of every op in a SavedModel.

    Covers the nodes of each meta graph and of every function in its library (the
    signatures' bodies and the loops inside them live there).
    """
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(directory, "saved_model.pb"), "rb") as file:
        saved_model.ParseFromString(file.read())
    ops = set()
    for meta_graph in saved_model.meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    return sorted(ops)


def tflite_ops(model_content):
    """Returns `{op name: count}` over every subgraph of a TFLite flatbuffer.

    Builtins are named as in the TFLite schema (`FULLY_CONNECTED`), custom ops by their
    custom code (`TFText>FastSentencepieceTokenize`).
    """
    model = schema.Model.GetRootAs(model_content, 0)
    builtin_names = {code: name for name, code in vars(schema.BuiltinOperator).items()
                     if not name.startswith("_")}
    names = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        # Codes above 127 live in `BuiltinCode`, older ones in the deprecated field.
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        names.append(code.CustomCode().decode() if builtin == schema.BuiltinOperator.CUSTOM
                     else builtin_names.get(builtin, f"BUILTIN_{builtin}"))
    counts = collections.Counter()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for j in range(subgraph.OperatorsLength()):
            counts[names[subgraph.Operators(j).OpcodeIndex()]] += 1
    return dict(sorted(counts.items()))


def tf_text_op_names():
    """Returns the TensorFlow op names that tf-text's op libraries define.

    Names are returned as Python identifiers (`TFText>X` reads `TFText_X`), the way the
    libraries' generated wrappers name their raw ops; compare with `_identifier`.
    """
    package = os.path.dirname(tensorflow_text.__file__)
    names = set()
    for library in glob.glob(os.path.join(package, "python", "**", "_*.so"), recursive=True):
        module = tf.load_op_library(library)  # already loaded: returns the same module
        names.update(name for name, value in vars(module).items()
                     if callable(value) and name[:1].isupper() and not name.startswith("TV_")
                     and name not in {"TypeVar", "List", "Any", "Annotated"})
    return names


def check_saved_model_ops(ops):
    """Returns the tf-text ops among `ops`; raises if any op is not core TF or tf-text.

    Raises:
        UnsupportedOpsError: naming the ops TF Serving would not have.
    """
    core = set(dir(tf.raw_ops))
    tf_text = tf_text_op_names()
    python = sorted(set(ops) & PYTHON_OPS)
    unknown = sorted(op for op in ops if op not in core and _identifier(op) not in tf_text)
    if python or unknown:
        raise UnsupportedOpsError(
            "The SavedModel uses ops a model server cannot run: "
            + "; ".join(filter(None, [
                python and f"Python callbacks {python} (replace tf.py_function / "
                           "tf.numpy_function with TensorFlow ops)",
                unknown and f"ops that are neither core TensorFlow nor tf-text {unknown}"]))
            + ".")
    return sorted(op for op in ops if op not in core)


def check_tflite_ops(ops):
    """Returns the custom (tf-text) ops among `ops`; raises on any other custom op.

    Raises:
        UnsupportedOpsError: naming custom ops that tf-text does not register (e.g. a
            TensorFlow op the converter could not lower, or a Flex op).
    """
    builtins = {name for name in vars(schema.BuiltinOperator) if not name.startswith("_")}
    # Registrars are named `Add<Op>`; their ops are `<Op>` or `TFText><Op>`.
    registered = {registrar.__name__[len("Add"):]
                  for registrar in tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS}
    custom = sorted(op for op in ops if op not in builtins)
    unsupported = [op for op in custom if op.removeprefix(_TFTEXT_PREFIX) not in registered]
    if unsupported:
        raise UnsupportedOpsError(
            f"The TFLite model uses custom ops that tf-text does not provide: {unsupported}. "
            "LiteRT has no Flex delegate, so these would fail at run time; they are "
            "TensorFlow ops the converter could not lower to TFLite builtins.")
    return custom


def _identifier(op):
    return re.sub(r"\W", "_", op)
