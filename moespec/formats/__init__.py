"""The files moespec writes and reads, one module per format with its version, typed record and only loader: trace.npz
(trace), bench.json (benchfile), plan.json (planfile), runs.json (runsfile), demo.json (demofile), the checkpoint
folders of long jobs (checkpoint), and what every file shares (files)."""
