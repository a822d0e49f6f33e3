"""Where a training step's time goes: TensorFlow's profiler, summed by op and by part.

`profile(run_steps, steps)` records `steps` steps with `tf.profiler.experimental` and
reads the trace back (the `.xplane.pb` protobuf that TensorBoard's profile plugin reads):
each TensorFlow op executed on the inter-op threads is one event whose duration is the
op's wall time, intra-op parallelism included. On CPU, ops of one step rarely overlap,
so shares of the summed time are shares of the step.
"""

import collections
import glob
import os
import re
import tempfile

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

# A part of the model is named by the first of these keywords in a segment of an op's
# scope path ("adam" is the optimizer's scope; "ArithmeticOptimizer" is grappler's).
PARTS = (("loss", ("compile_loss",)), ("optimizer", ("adam",)), ("layer_norm", ("norm",)),
         ("attention", ("attention",)), ("feed_forward", ("feed_forward", "feedforward")),
         ("embedding", ("embedding",)))
# The tied pre-softmax projection: a Tensordot in the model's scope (ours, a method of
# the embedding called outside its scope) or in keras-hub's reversed token embedding.
OUTPUT_PROJECTION = re.compile(r"^[^/]+/(token_embedding[^/]*/)?tensordot")
_EXECUTOR_EVENTS = ("Threadpool", "ExecutorState", "ExecutorDoneCallback", "ParallelFor")


def profile(run_steps, steps, top=15):
    """Profiles `run_steps(steps)`; returns op-time totals by op type, part and op.

    Returns:
        `{"total_ms", "by_type": [(type, ms, share)], "by_part": [...],
        "top_ops": [(scope/name:type, ms, share)]}`, each list largest first;
        times are per step.
    """
    with tempfile.TemporaryDirectory() as directory:
        tf.profiler.experimental.start(directory)
        try:
            run_steps(steps)
        finally:
            tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)
        space = xplane_pb2.XSpace()
        with open(path, "rb") as file:
            space.ParseFromString(file.read())
    op_ms = _op_milliseconds(space)
    total = sum(op_ms.values())

    def ranked(counter, limit=None):
        return [(name, ms / steps, ms / total) for name, ms in counter.most_common(limit)]

    by_type, by_part = collections.Counter(), collections.Counter()
    for name, ms in op_ms.items():
        by_type[name.rpartition(":")[2].removeprefix("_Mkl")] += ms
        by_part[_part(name)] += ms
    return {"total_ms": total / steps, "by_type": ranked(by_type, top),
            "by_part": ranked(by_part), "top_ops": ranked(op_ms, top)}


def _op_milliseconds(space):
    """Sums event durations per op name over the host's `tf_Compute` threads."""
    totals = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if not name.startswith(_EXECUTOR_EVENTS):
                    totals[name.removeprefix("StatefulPartitionedCall/")] += (
                        event.duration_ps / 1e9)
    return totals


def _part(op_name):
    scope = op_name.rpartition(":")[0].lower().removeprefix("gradient_tape/")
    if OUTPUT_PROJECTION.match(scope):
        return "output_projection"
    segments = scope.split("/")
    for part, keywords in PARTS:
        if any(segment.startswith(keyword) or keyword in segment and keyword != "adam"
               for segment in segments for keyword in keywords):
            return part
    if "encoder" in scope or "decoder" in scope:
        return "other_in_layers"
    # Under the model's scope but in no layer: the masks, for ours.
    return "model_level" if len(segments) > 1 else "other"  # metrics, step bookkeeping


def print_profile(result):
    """Prints the per-step op time by part, by op type and the largest ops."""
    print(f"op time per step: {result['total_ms']:.0f} ms")
    for title in ("by_part", "by_type", "top_ops"):
        print(f"  {title.replace('_', ' ')}:")
        for name, ms, share in result[title]:
            print(f"    {100 * share:5.1f} %  {ms:8.1f} ms  {name}")
