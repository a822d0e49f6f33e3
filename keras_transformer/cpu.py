"""What the processor is, read from /proc/cpuinfo (no TensorFlow needed)."""


def cpu_info():
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
