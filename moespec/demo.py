"""`moespec demo`: the main job on the built-in default (what `make demo` runs).

The built-in default is OLMoE-1B-7B's shape (16 MoE layers, N = 64 experts, top m = 8, expert width 1024,
hidden 2048) in bf16 at context depth 512. This stage of the project is THEORY ON STATED ASSUMPTIONS, not a
measurement:
- one bandwidth for every byte and no fixed work, so a step time is its bytes (any common bandwidth divides
  every V(k) alike and leaves k*(a) and every speedup unchanged, Section 3.5);
- per-slot kernel: a step drafting k tokens reads D(k+1) + m (k+1) W + kv(k) bytes, linear in k+1;
- deduplicating kernel under uniform iid routing: 1 - rho(n) = q^(n-1) with q = 1 - m/N, so by (2) each layer
  selects U(n) = N (1 - q^n) distinct experts and the step reads D(k+1) + E_dedup(k+1) + kv(k) bytes,
  E_dedup(k+1) = mW + mWk(1 - rho_bar_k) by (12).
It prints both staircases side by side (k*(a), speedup (9), step points (B.31)) and the reuse threshold
rho*_k(a) of (16) against the drafted reuse rho_bar_k (11) of uniform routing.
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from typing import Any

from moespec import theory
from moespec.io import console, provenance, write_json
from moespec.spec import ModelSpec

DEFAULT_MODEL = "olmoe-1b-7b"
DEFAULT_FORMAT = "bf16"
DEFAULT_DEPTH = 512  # the paper's shorter context depth (Section 4)
DEFAULT_KMAX = 8  # the paper verifies up to 9 tokens per pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model preset (default {DEFAULT_MODEL})")
    p.add_argument("--format", default=DEFAULT_FORMAT, help=f"weight format (default {DEFAULT_FORMAT})")
    p.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help=f"context depth d (default {DEFAULT_DEPTH})")
    p.add_argument("--kmax", type=int, default=DEFAULT_KMAX, help=f"largest draft length (default {DEFAULT_KMAX})")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--out", metavar="FILE", help="also write the JSON result (with provenance) to FILE")


def uniform_profile(spec: ModelSpec, fmt: str, depth: int, kmax: int) -> dict[str, Any]:
    """Byte step times of both kernels under one bandwidth and uniform iid routing, exact on Fractions."""
    N, m = spec.N, spec.m
    q = 1 - Fraction(m, N)
    w = [spec.expert_bytes(layer, fmt) for layer in range(spec.L)]
    W = sum(w)
    kv = [spec.kv_bytes(k, depth) for k in range(kmax + 1)]
    D = [spec.dense_bytes(fmt, tokens=k + 1) for k in range(kmax + 1)]  # D(k+1) without the cache
    rho = [[None] + [1 - q ** (n - 1) for n in range(1, kmax + 2)] for _ in w]  # rho_l(n), index n
    rho_bars = [theory.mean_drafted_reuse(rho, w, k) for k in range(1, kmax + 1)]
    V_slot = [D[k] + m * (k + 1) * W + kv[k] for k in range(kmax + 1)]
    V_dedup = [D[k] + theory.union_bytes(m * W, k, rb) + kv[k] for k, rb in enumerate([0, *rho_bars])]
    return {"w": w, "W": W, "mW": m * W, "D": D, "kv": kv, "q": q, "rho_bars": rho_bars,
            "V_slot": V_slot, "V_dedup": V_dedup}


def run_demo(model: str, fmt: str, depth: int, kmax: int) -> dict[str, Any]:
    spec = ModelSpec.from_name(model)
    prof = uniform_profile(spec, fmt, depth, kmax)
    acc = theory.PAPER_ACCEPTANCES
    kernels = {}
    for name in ("slot", "dedup"):
        V = prof[f"V_{name}"]
        points = theory.step_points(V)
        kernels[name] = {
            "step_bytes": [int(v) for v in V],
            "a0": float(theory.first_draft_threshold(V)),
            "step_points": [float(p) for p in points],
            "table": [{"a": float(a), "k_star": (k := theory.best_draft_length(V, a)),
                       "speedup": float(theory.speedup(V, a, k))} for a in acc],
        }
    # Reuse threshold (16): byte form with D(1) = D + kv(0) folded in; D(k+1) - D(1) joins the kv growth.
    D0, mW = prof["D"][0], prof["mW"]
    growth = [prof["kv"][k] + prof["D"][k] - D0 for k in range(kmax + 1)]
    thresholds = [{"a": float(a), "rho_star": [float(theory.reuse_threshold_bytes(a, k, mW, D0, growth))
                                              for k in range(1, kmax + 1)]} for a in acc]
    return {
        "model": spec.name, "format": fmt, "depth": depth, "kmax": kmax,
        "assumptions": ["one bandwidth for every byte, no fixed work: step time = bytes",
                        "uniform iid routing: 1 - rho(n) = q^(n-1), q = 1 - m/N",
                        "theory on stated assumptions, not a measurement"],
        "shape": {"L": spec.L, "N": spec.N, "m": spec.m, "hidden": spec.hidden, "expert_width": spec.expert_width},
        "bytes": {"w_l": prof["w"][0], "W": prof["W"], "mW": mW, "D": D0, "kv0": prof["kv"][0]},
        "byte_share_u": [float(prof["V_dedup"][k] - prof["D"][k] - prof["kv"][k]) / float((k + 1) * mW)
                         for k in range(kmax + 1)],
        "kernels": kernels,
        "rho_bar_uniform": [float(x) for x in prof["rho_bars"]],
        "reuse_threshold": thresholds,
    }


def print_report(r: dict[str, Any]) -> None:
    from rich.table import Table

    c = console()
    b, s = r["bytes"], r["shape"]
    c.print(f"[bold]moespec demo[/bold]: {r['model']} shapes (L={s['L']} MoE layers, N={s['N']}, m={s['m']}, "
            f"hidden {s['hidden']}, expert width {s['expert_width']}), {r['format']}, context depth {r['depth']}")
    c.print("[yellow]Theory on stated assumptions, not a measurement:[/yellow] " + "; ".join(r["assumptions"][:2]))
    c.print(f"bytes: w_l = {b['w_l'] / 1e6:.2f} MB, W = {b['W'] / 1e9:.3f} GB, mW = {b['mW'] / 1e9:.3f} GB, "
            f"D = {b['D'] / 1e9:.3f} GB, kv(0) = {b['kv0'] / 1e6:.1f} MB")
    t = Table(title="step bytes V(k) and byte share u(k+1) = E_dedup/E_slot", title_justify="left")
    for col in ("k", "V_slot (GB)", "V_dedup (GB)", "u(k+1)"):
        t.add_column(col, justify="right")
    for k in range(r["kmax"] + 1):
        t.add_row(str(k), f"{r['kernels']['slot']['step_bytes'][k] / 1e9:.3f}",
                  f"{r['kernels']['dedup']['step_bytes'][k] / 1e9:.3f}", f"{r['byte_share_u'][k]:.3f}")
    c.print(t)
    for name in ("slot", "dedup"):
        pts = ", ".join(f"{p:.4f}" for p in r["kernels"][name]["step_points"])
        c.print(f"{name:>5}: a0 = {r['kernels'][name]['a0']:.4f}; step points a_1..a_{r['kmax']} = {pts}")
    t = Table(title="staircases side by side: k*(a) and speedup (9)", title_justify="left")
    for col in ("a", "k* slot", "speedup slot", "k* dedup", "speedup dedup"):
        t.add_column(col, justify="right")
    for rs, rd in zip(r["kernels"]["slot"]["table"], r["kernels"]["dedup"]["table"]):
        t.add_row(f"{rs['a']:g}", str(rs["k_star"]), f"{rs['speedup']:.3f}", str(rd["k_star"]), f"{rd['speedup']:.3f}")
    c.print(t)
    t = Table(title="reuse threshold rho*_k(a) (16); * where uniform rho_bar_k exceeds it (dedup beats plain)",
              title_justify="left")
    t.add_column("a", justify="right")
    for k in range(1, r["kmax"] + 1):
        t.add_column(f"k={k}", justify="right")
    t.add_row("rho_bar_k", *[f"{x:.3f}" for x in r["rho_bar_uniform"]])
    for row in r["reuse_threshold"]:
        cells = [f"{x:+.3f}{'*' if rb > x else ' '}" for x, rb in zip(row["rho_star"], r["rho_bar_uniform"])]
        t.add_row(f"{row['a']:g}", *cells)
    c.print(t)


def run(args: argparse.Namespace) -> int:
    from moespec import MoespecError

    if args.kmax < 1 or args.depth < 0:
        raise MoespecError(f"need --kmax >= 1 and --depth >= 0, got {args.kmax} and {args.depth}")
    result = run_demo(args.model, args.format, args.depth, args.kmax)
    if args.out:
        write_json(args.out, {**result, "provenance": provenance(dtype=args.format)})
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 0
