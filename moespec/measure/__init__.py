"""Measurement: timers and ceilings (timing), the expert-operation bench (bench; what it times: layer, passes) and
its fits (fits), and the engine runs on a whole model (run)."""
