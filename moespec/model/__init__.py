"""The models a pass runs: shapes and bytes per weight format (spec, weights), loading Hugging Face checkpoints and
presets (load), our expert kernels and routing replay installed in them (policies), speculative decoding
(speculative)."""
