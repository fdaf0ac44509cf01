"""The `moespec` command: a thin dispatcher. Each subcommand lives in its own module of this package, which
defines `add_arguments(parser)` and `run(args) -> int`: it turns the arguments into its stage's config, calls the
library and prints; a module whose command writes files also names its path flags, OUTPUTS and INPUTS
(moespec.cli.args.check_paths). Bad input, and a failed write to stdout, end with one line and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import sys

from moespec import MoespecError, __version__, printable

# subcommand -> one-line help; its module is moespec.cli.<subcommand>, imported only when the command runs.
COMMANDS: dict[str, str] = {
    "staircase": "best draft length k*(a), step points and speedup for a step-time vector",
    "demo": "the main job on the built-in default (what `make demo` runs)",
    "spec": "model shapes and bytes per weight format: w_l, W, D, kv(k); --list the presets",
    "export": "write an HF MoE checkpoint or a preset as a llama.cpp GGUF file (bf16, q8_0, q4_0, q4_K_M)",
    "trace": "record the experts a local Hugging Face MoE checkpoint routes each token to",
    "synth": "synthetic routing trace: stationary seeded uniform, popularity or calibrated process",
    "reuse": "reuse rho(n), union U(n) and expert bytes of a trace, bootstrap intervals (Figure 1)",
    "profile": "time the device once: the expert kernels' building blocks for bench --predict (device.json)",
    "bench": "time the expert kernels on a layer's real shapes: beta(n), fits (4)/(E.1), r(n), crossover",
    "plan": "verify time (22), saving and band (18), crossover, AUTO kernel, k_hat*(a), speedup (21)",
    "run": "speculative decoding on an HF MoE model: verify time per kernel, throughput, oracle draft",
    "score": "score a plan against whole-model runs by the six rules of Table 8; pre-registration",
    "report": "one self-contained HTML page of a job's artifacts: figures, tables, scores",
    "sweep": "a grid of models x formats x depths x batches x devices through bench and plan, locally or on Ray",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (no usage dump) and exits with 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """All subcommands are listed; only the one named in argv imports its module and adds its arguments, so
    `moespec --help` stays fast and one command's heavy imports never slow down another."""
    parser = _Parser(prog="moespec", description="moespec: speculative decoding on mixture-of-experts models")
    parser.add_argument("--version", action="version", version=f"moespec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, help_text in COMMANDS.items():
        module = f"{__name__}.{name}"
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    if args.command is None:
        build_parser([]).print_help()
        return 2
    from moespec.cli.args import check_paths  # here, not above: `moespec --help` imports neither numpy nor rich
    from moespec.cli.stdout import checked_stdout, discard_stdout

    module = importlib.import_module(args._module)
    try:
        check_paths(args, getattr(module, "OUTPUTS", ()), getattr(module, "INPUTS", {}))  # before any work
        with checked_stdout():
            return int(module.run(args) or 0)
    except MoespecError as e:
        print(f"moespec {args.command}: error: {printable(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`moespec ... | head`): stop quietly, as a Unix filter does
        discard_stdout()
        return 141
    except KeyboardInterrupt as e:  # a job with a checkpoint says how to resume (moespec.formats.checkpoint)
        print(f"moespec {args.command}: interrupted{f'; {e}' if str(e) else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
