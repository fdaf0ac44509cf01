"""Routing: which m of the N experts each token selects in every MoE layer, recorded from a model on text (tracer;
the text split into documents and tokenized: documents) or synthesized (synth), and its reuse rho(n), U(n), u(n) and
expert bytes (reuse)."""
