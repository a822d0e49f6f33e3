"""Tools around the main flow: distillation, fuzzing of exported translators, figures."""
