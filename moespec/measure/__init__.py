"""Measurement: timers and ceilings (timing), the expert-operation bench (bench) and its fits (fits), and the engine
runs on a whole model (run)."""
