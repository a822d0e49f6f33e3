"""What the CPU is and which instruction sets it has, read from /proc/cpuinfo.

Apart from `distribution` because it needs no TensorFlow: the benchmarks record the
machine with it on JAX-only machines too.
"""


def flags():
    """Returns the instruction-set flags of the first CPU in /proc/cpuinfo (empty elsewhere)."""
    return set(info().get("flags", "").split())


def has_bfloat16():
    """Whether the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX)."""
    return bool(flags() & {"avx512_bf16", "amx_bf16"})


def info():
    """Returns the fields of the first processor in /proc/cpuinfo; `{}` where there is none."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass  # not Linux: nothing known
    return fields
