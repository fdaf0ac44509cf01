"""Issue 31: every public function of moespec.theory, the kernels' API and the routing API, given a hostile value
for any one argument (None, a string, a bool, a list, NaN, inf, -1, 10**400), computes or raises ValueError, never
another exception and never a hang; the native kernels refuse a size of 0 and an integer x before native code runs;
the exact arithmetic is bounded (G_a(k) for huge k, the staircase on long fractions)."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from moespec import kernels as K
from moespec import theory
from moespec.defaults import DIGITS_LIMIT, DRAFT_LIMIT
from moespec.formats.trace import Trace
from moespec.routing import reuse, synth

HOSTILE = (None, "0.5", True, [1], float("nan"), float("inf"), -1, 10**400)
V = [Fraction(1), Fraction(3, 2), Fraction(2)]
ENGINE = dict(mW=4, tau1=1, beta1=2, betaD=2, B=[2, 2, 2], dD=[0, 0, 0], dphi=[0, 0, 0])

# One valid call per public function: positional arguments (defaults included, so they are attacked too).
THEORY = {
    "delta_from_eps": (0.1,), "kernel_margin": (0.5, 0.7, 0.1), "saving_bound": (0.1, 1.0, 0.5),
    "separated": (V, 0.5, 0.01), "speedup_band": (1.5, 0.1), "throughput_floor": (0.1,),
    "throughput_loss_bound": (0.1,), "verify_time_bound": (0.1, 1.0), "beats_plain": (V, 0.5, 1),
    "best_draft_length": (V, 0.5), "check_acceptance": (0.5, False), "check_step_times": (V, 1),
    "convex_at_least": (V, 0.5, 1), "convex_increments": (V,), "crossing_acceptance": (V, 2, 1),
    "first_draft_threshold": (V,), "first_step_point_convex": (V,), "geometric_sum": (0.5, 3),
    "speculation_helps": (V, 0.5), "speedup": (V, 0.5, 1), "staircase": (V, [0.5]), "staircase_intervals": (V,),
    "step_points": (V,), "throughput": (V, 0.5, 1), "byte_step_times": (4, 10, [1, 1, 1], [0.5, 0.5]),
    "crossover": ({2: 1.0, 3: 2.0},), "dedup_faster": (0.5, 0.7), "mean_drafted_reuse": ([[0, 0, 0.5]], [1], 1),
    "requested_bytes": ("slot", 2, 3, 2, 10), "reuse_threshold_bytes": (0.5, 1, 4, 10, [1, 1]),
    "saving": (1.0, 2.0, 0.5, 0.7, 0), "union_bytes": (4, 1, 0.5), "verify_time": (0.1, 1, 2, 1, 2, 0),
    "best_draft_length_for": (V, [0.5, 0.5]), "check_profile": ([0.5, 0.5], 2), "estimate_profile": ([(2, 1)], 2, (0, 0)),
    "expected_tokens": ([0.5, 0.5], 2), "profile_beats_plain": (V, [0.5, 0.5], 1),
    "profile_speedup": (V, [0.5, 0.5], 1), "profile_throughput": (V, [0.5, 0.5], 1),
    "DedupEngine": tuple(ENGINE.values()),
}
THEORY_DATA = {"Bracket", "Step"}  # plain records of results, built by the functions above


def _tensors():
    torch.manual_seed(0)
    return (torch.randn(2, 8), torch.tensor([[0, 1], [1, 2]]), torch.full((2, 2), 0.5), torch.randn(4, 8, 8),
            torch.randn(4, 8, 4))


KERNELS = {
    "expert_op": lambda: ("slot", *_tensors(), None, None, K.SILU, 1),
    "reference_float64": lambda: (*_tensors(), None, None, K.SILU),
    "implementation": lambda: ("slot", torch.float32, "cpu"),
    "expert_bytes": lambda: (*_tensors()[3:], None, None),
    "distinct_experts": lambda: (_tensors()[1],),
    "requested_bytes": lambda: ("dedup", _tensors()[1], *_tensors()[3:], None, None),
}
KERNELS_ELSEWHERE = {"from_hf_experts"}  # takes a transformers module: attacked in its own test below


def _trace() -> Trace:
    return synth.synthesize("olmoe-1b-7b", "uniform", 40, 2)


ROUTING = {
    (synth, "synthesize"): lambda: ("olmoe-1b-7b", "calibrated", 20, 2, 0, "paper-wikitext", None, False, None),
    (synth, "document_lengths"): lambda: (10, 2),
    (synth.KeepPool, "calibrate"): lambda: (8, 64, 0.363, 0.762),
    (reuse, "uniform_rho"): lambda: (4, 64, 8),
    (reuse, "reuse_stats"): lambda: (_trace(), 3, 10, 0, 0.95, None, None, False),
    (reuse, "document_stats"): lambda: (_trace(), 3, False),
    (reuse, "trace_expert_bytes"): lambda: (_trace(), "bf16"),
}


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang("the call ran past 20 s")


def _attack(label: str, call, args: tuple) -> list[str]:
    """Call with each hostile value in each position; the calls that raised anything but ValueError or hung."""
    wrong = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(len(args)):
            for bad in HOSTILE:
                attacked = (*args[:i], bad, *args[i + 1:])
                signal.alarm(20)
                try:
                    call(*attacked)
                except ValueError:
                    pass
                except Exception as e:  # noqa: BLE001  (the point: which exception, reported)
                    wrong.append(f"{label} argument {i} = {bad!r:.20}: {type(e).__name__}: {str(e)[:120]}")
                finally:
                    signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    return wrong


def test_every_public_theory_callable_has_a_baseline():
    public = {name for name in theory.__all__ if callable(getattr(theory, name))}
    assert public == set(THEORY) | THEORY_DATA


@pytest.mark.parametrize("name", sorted(THEORY))
def test_theory_refuses_hostile_values_with_value_error(name):
    call = getattr(theory, name)
    call(*THEORY[name])  # the baseline computes
    assert _attack(name, call, THEORY[name]) == []


def test_every_kernels_api_function_is_attacked():
    public = {name for name in K.__all__ if inspect.isfunction(getattr(K, name))}
    assert public == set(KERNELS) | KERNELS_ELSEWHERE


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernels_api_refuses_hostile_values_with_value_error(name):
    call = getattr(K, name)
    call(*KERNELS[name]())
    assert _attack(name, call, KERNELS[name]()) == []


@pytest.mark.parametrize("module, name", sorted(ROUTING, key=lambda key: key[1]), ids=lambda x: getattr(x, "__name__", x))
def test_routing_api_refuses_hostile_values_with_value_error(module, name):
    call = getattr(module, name)
    call(*ROUTING[module, name]())
    assert _attack(name, call, ROUTING[module, name]()) == []


@pytest.mark.parametrize("bad", HOSTILE)
def test_from_hf_experts_refuses_what_is_not_an_experts_module(bad):
    with pytest.raises(ValueError, match="module must be a transformers experts module"):
        K.from_hf_experts(bad)


# -- the named examples of the issue --

@pytest.mark.parametrize("call, needle", [
    (lambda: theory.best_draft_length(V, "0.5"), "acceptance a = '0.5'"),
    (lambda: theory.DedupEngine(**(ENGINE | {"tau1": True})), "tau1 = True"),
    (lambda: theory.dedup_faster("0.5", "0.7"), "u = '0.5'"),
    (lambda: theory.requested_bytes("slot", -1, 3, 2, 10), "n must be an integer >= 0"),
    (lambda: theory.saving(1.0, 2.0, float("nan"), 0.7), "u = nan"),
    (lambda: theory.union_bytes(4, 1, float("nan")), "rho_bar_k = nan"),
    (lambda: theory.kernel_margin(float("nan"), 0.7, 0.1), "u = nan"),
    (lambda: theory.first_draft_threshold([1]), "need 2..1025 step times"),
    (lambda: theory.first_draft_threshold(None), "step times V must be a list"),
    (lambda: theory.geometric_sum(Fraction(1, 2), 10**7), f"draft length k = 10000000 is outside 0..{DRAFT_LIMIT}"),
    (lambda: synth.synthesize("olmoe-1b-7b", "uniform", 10**12, 10), "tokens must be an integer in 1..10,000,000"),
    (lambda: theory.step_points([Fraction(1), Fraction(10**60 + 1, 10**60)]), f"more than {DIGITS_LIMIT} digits"),
])
def test_named_examples_raise_value_error_naming_the_argument(call, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(".", r"\.").replace("+", r"\+")):
        call()


def test_ordinary_staircases_are_unchanged_by_the_digit_bound():
    """Step times of 17 significant digits (a float's decimal) stay inside DIGITS_LIMIT, and the results exact."""
    V17 = [Fraction(str(1e-5 * (1 + 0.1 * k + 1e-13 * k))) for k in range(9)]
    assert len(theory.step_points(V17)) == 8
    assert theory.step_points([Fraction(1), Fraction(3, 2), Fraction(2)])[0].value == Fraction(1, 2)


# -- the native kernels: sizes of 0 and integer tensors never reach native code --

def _expert_args(f: int = 4, n: int = 2, d: int = 8, N: int = 4, m: int = 2, x_dtype=torch.float32):
    return (torch.ones(n, d, dtype=x_dtype), torch.zeros(n, m, dtype=torch.int64), torch.full((n, m), 0.5),
            torch.randn(N, 2 * f, d), torch.randn(N, d, f))


@pytest.mark.parametrize("kernel", ["slot", "dedup"])
@pytest.mark.parametrize("size, needle", [("f", "expert width f is 0"), ("n", "tokens n is 0"),
                                          ("d", "hidden size d is 0"), ("N", "experts N is 0"), ("m", "slots m is 0")])
def test_expert_op_refuses_a_size_of_zero(kernel, size, needle):
    with pytest.raises(ValueError, match=needle):
        K.expert_op(kernel, *_expert_args(**{size: 0}))


@pytest.mark.parametrize("kernel", ["slot", "dedup", "reference"])
def test_expert_op_refuses_integer_x(kernel):
    with pytest.raises(ValueError, match="x is torch.int64; the expert operation takes floating-point"):
        K.expert_op(kernel, *_expert_args(x_dtype=torch.int64))


CHILD = """
import sys, torch
from moespec import kernels as K
try:
    K.expert_op(sys.argv[1], torch.randn(2, 8), torch.tensor([[0, 1], [1, 2]]), torch.full((2, 2), 0.5),
                torch.randn(4, 0, 8), torch.randn(4, 8, 0))
except ValueError as e:
    print(e)
    sys.exit(3)
"""


@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_a_process_passing_f_zero_ends_with_value_error_not_sigfpe(kernel):
    got = subprocess.run([sys.executable, "-c", CHILD, kernel], capture_output=True, text=True, timeout=120)
    assert got.returncode == 3 and "expert width f is 0" in got.stdout, (got.returncode, got.stderr[-400:])


# -- the CLI: bounded exact arithmetic, one line and exit 2 --

@pytest.mark.parametrize("times", [
    ",".join(f"{k + 1}.{'7' * 3999}" for k in range(3)),  # 3 step times of 4,000 digits
    ",".join(f"{k + 1}.{str(k + 3) * 89}" for k in range(33)),  # 33 step times of 90 digits
])
def test_staircase_cli_refuses_long_fractions_in_one_line(times):
    got = subprocess.run([sys.executable, "-c", "import sys; from moespec.cli import main; sys.exit(main())",
                          "staircase", "--step-times", times],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 2, got.stderr[-400:]
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "digits" in lines[0] and "Traceback" not in got.stderr


def test_geometric_sum_still_computes_at_the_limit():
    assert theory.geometric_sum(np.array([0.5]), DRAFT_LIMIT)[0] == pytest.approx(2.0)
    assert theory.geometric_sum(1, DRAFT_LIMIT) == DRAFT_LIMIT + 1
