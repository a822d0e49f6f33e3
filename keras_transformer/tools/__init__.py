"""Tools around the main flow: distillation and fuzzing of exported translators."""
