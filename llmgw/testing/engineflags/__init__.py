"""Engine CLI flag fixtures written by scripts/engine_flags.py from each engine's own parser (see SOURCE.md)."""
