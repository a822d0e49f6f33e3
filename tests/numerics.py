"""Float comparisons whose tolerance follows the values' scale, in float32 ulps.

One float32 computation gives other last bits on other CPUs: TensorFlow runs oneDNN's
kernels where the CPU has AVX-512 VNNI or bf16 or AMX and Eigen's elsewhere, and oneDNN
picks its code by instruction set (`ONEDNN_MAX_CPU_ISA`). A fixed `atol` fits values of
one size: beam scores near -184 differ by 3.05e-5 between two decoding paths with
Eigen's kernels (one ulp there), three times an `atol` of 1e-5 tuned elsewhere.

`ULPS` was set from the spread measured on the comparisons of the decoding, ensemble
and model tests under three kernel sets on one CPU (oneDNN with AVX-512, oneDNN capped
at AVX2, Eigen: `TF_ENABLE_ONEDNN_OPTS=0`): at most 4 ulps of each tensor's largest
value. 32 leaves 8 times that; a decoding bug moves values by a thousand times more.
"""

import numpy as np

FLOAT32_ULP = float(np.finfo(np.float32).eps)  # 2^-23, relative to the value
ULPS = 32


def assert_close_in_ulps(found, expected, ulps=ULPS):
    """Asserts |found - expected| ≤ `ulps` float32 ulps of expected's largest magnitude.

    The scale is the array's, not each element's: a sum or product of float32 terms is
    rounded relative to its terms, so values near 0 may carry the error of large ones.
    """
    expected = np.asarray(expected, np.float64)
    scale = float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(found, expected, rtol=0, atol=ulps * FLOAT32_ULP * scale)
