"""Prediction: whole-model verify times and their error bounds (verify), the plan (plan), the six scoring rules
(score) and the staircase of a step-time vector (staircase)."""
