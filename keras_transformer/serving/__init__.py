"""The exported translator: its module, the export writer, op checks, self-check, runners."""
