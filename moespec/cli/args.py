"""Argument parsing the commands share."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Callable

from moespec import MoespecError
from moespec.defaults import LAYERS_LIMIT, MAGNITUDE_LIMIT, MODEL
from moespec.formats.checkpoint import FRESH
from moespec.formats.files import check_apart

# what a command reads from a Hugging Face checkpoint folder (--model, --draft-model): its config, weights and
# tokenizer; an output of one of these names there would replace the model
CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "*.bin",
                    "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt", "*.model")


def check_paths(args: argparse.Namespace, outputs: tuple[str, ...], inputs: Mapping[str, tuple[str, ...]]) -> None:
    """Before a command's work, no output given to a flag of `outputs` the same file as an input or another
    output (files.check_apart). `inputs`: flag -> the names it reads in a folder given there (a file given there
    is read itself). A positional argument is named by its metavar (TRACE: args.trace)."""
    def given(flag: str) -> str | None:
        return getattr(args, flag.lstrip("-").replace("-", "_").lower())

    def read(path: Path, names: tuple[str, ...]) -> list[Path]:
        try:
            return [file for name in names for file in path.glob(name)] if path.is_dir() else \
                [path] if path.exists() else []  # a missing input (or a preset's name) is no file to destroy
        except OSError:  # unreadable: its loader says why
            return []

    def paths(flag: str) -> list[Path]:  # a positional of nargs="+" gives several
        value = given(flag)
        return [Path(v) for v in (value if isinstance(value, list) else [value])]

    check_apart({flag: given(flag) for flag in outputs},
                {flag: [file for path in paths(flag) for file in read(path, names)]
                 for flag, names in inputs.items() if given(flag) is not None})


def parse_ints(text: str, flag: str, least: int, most: int | None = None, what: str = "values") -> list[int]:
    """'1-9' or '1,2,9' -> sorted distinct integers in least..most; one line naming the flag otherwise."""
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-"))
            if lo > hi:
                raise MoespecError(f"{flag} {text}: empty range (start above end)")
            values = [lo, hi] if lo < least or (most is not None and hi > most) else list(range(lo, hi + 1))
        else:
            values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise MoespecError(f"{flag} {text!r}: give a range like 1-9 or a list like 1,2,9") from None
    if values[0] < least or (most is not None and values[-1] > most):
        raise MoespecError(f"{flag} {text}: {what} must be >= {least}" if most is None else
                           f"{flag} {text}: {what} must lie in {least}..{most}")
    return values


def seed(text: str) -> int:
    """A --seed: an integer >= 0 (numpy's generators take no negative seed)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def bounded(least: int, most: int) -> Callable[[str], int]:
    """An argparse type: an integer in least..most (most: one of the bounds in moespec.defaults, which the flag's
    help states); argparse names the flag in the one-line error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"expected an integer in {least}..{most:,}, got {text!r}")
        return value
    return parse


MAGNITUDES = f"{1 / MAGNITUDE_LIMIT:g}..{MAGNITUDE_LIMIT:g}"  # the magnitudes of a typed number, both ends taken


def within_magnitudes(value: float | Fraction) -> bool:
    """Zero, or a magnitude in MAGNITUDES (moespec.defaults.MAGNITUDE_LIMIT): the one check of a number a user
    types. Compared as the float moespec computes with, so an end typed exactly ("1e-100") is taken."""
    try:
        x = abs(float(value))
    except OverflowError:
        return False
    return x == 0 or 1 / MAGNITUDE_LIMIT <= x <= MAGNITUDE_LIMIT


def check_number(flag: str, value: float, what: str, positive: bool) -> float:
    """A typed `value` of `flag`: `what` (a time, ...) > 0 where `positive`, else >= 0, within MAGNITUDES; one line
    naming the flag otherwise."""
    if not (within_magnitudes(value) and (value > 0 if positive else value >= 0)):
        raise MoespecError(f"{flag} {value:g}: must be a {'positive' if positive else 'non-negative'} {what} of "
                           f"magnitude {MAGNITUDES}{'' if positive else ' or 0'}")
    return value


def add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    """--fresh, and --resume kept for old command lines, on a job that checkpoints its finished units (bench, run,
    trace): a rerun resumes them by default."""
    choice = p.add_mutually_exclusive_group()
    choice.add_argument(FRESH, action="store_true",
                   help="drop the finished units an interrupted run left in OUT.partial/ and start over (by default "
                        "a rerun resumes them when its settings match, and refuses when they differ)")
    choice.add_argument("--resume", action="store_true", help="resume OUT.partial/: the default, kept for old scripts")


class _Renamed(argparse.Action):
    """An old flag name, out of --help: giving it is refused in one line naming the flag that now means it."""

    def __init__(self, option_strings: list[str], dest: str, now: str, **kwargs: object) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.now = now

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} is now {self.now}")


def add_level_flags(p: argparse.ArgumentParser) -> None:
    """--pin-gbps and --pin-wait of a timed job (bench, run): pin the host's bandwidth level its rounds are kept at
    (moespec.measure.level; off unless asked for, on the CPU only). --level and --level-wait, their old names,
    are refused naming the new ones: `reuse --level` is an interval level."""
    from moespec.measure.level import LEVEL_BAND, WAIT_S

    p.add_argument("--pin-gbps", type=float, default=None, metavar="GBPS",
                   help=f"keep only timed rounds whose reference read is within +-{LEVEL_BAND:.0%}% of GBPS, waiting "
                        "--pin-wait for the host to return to it (default: no pinning; with --pin-wait alone, a run "
                        "with --plan pins the plan's level, else the first round's). CPU only")
    p.add_argument("--pin-wait", type=float, default=None, metavar="S",
                   help="pin the host's bandwidth level, waiting S seconds at most per measurement for it to return "
                        f"(default 0: no pinning; {WAIT_S:g} with --pin-gbps). CPU only")
    p.add_argument("--level", action=_Renamed, now="--pin-gbps (the bandwidth level to pin, GB/s)")
    p.add_argument("--level-wait", action=_Renamed, now="--pin-wait (seconds to wait for the pinned level)")


def add_model_source(p: argparse.ArgumentParser, classes: str, layers_default: str) -> None:
    """--model (a local checkpoint of `classes`) or --preset (random weights), and --layers of a preset."""
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", help=f"a local HF checkpoint folder ({classes})")
    source.add_argument("--preset", help=f"a model preset with random weights (default {MODEL})")
    p.add_argument("--layers", type=bounded(1, LAYERS_LIMIT),
                   help=f"decoder layers of a preset model (default {layers_default}, at most {LAYERS_LIMIT:,})")
