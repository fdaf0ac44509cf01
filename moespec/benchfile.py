"""bench.json: the results file of `moespec bench`, its validation on load, and its report (Table 1, the fits,
Figure 2). Later stages (the plan) read a bench only through `load_bench`.

bench.json (FORMAT_NAME, FORMAT_VERSION; JSON object keys for n, layers and U are strings):
  format, format_version, model, spec     model name and ModelSpec fields
  device, device_kind, dtype              "cpu: <model name>, <threads> threads" or "cuda: <GPU name>, sm<major><minor>,
                                          <memory> GiB"; "cpu" or "cuda" (bench --device); "bf16" or "fp32"
  ceiling_kind                            what the ceiling measures (moespec.timing): "streaming read" (cpu) or
                                          "device-to-device copy" (cuda; bytes read + written)
  ceiling_gbps, ceiling_iqr_gbps          the measured ceiling in GB/s (1e9 B/s): median and IQR over the
                                          samples before and after the timing; ceiling_before_after_gbps: each
  layers, n                               MoE layers (trace layer index) and pass sizes timed
  expert_bytes                            {layer: b}
  kernels  {name: {kind, implementation, beta_gbps: {n: v}, beta_iqr_gbps: {n: v}}}  on requested bytes;
           implementation: native or torch for ours (moespec.kernels.implementation), else the peer's engine
           (kind 'slot': n m b, kind 'dedup': U b), median and IQR over recorded windows of all layers
  r        {n: beta_dedup/beta_slot} of our kernels `dedup` and `slot` (empty if either is missing)
  u        {n: E_dedup/E_slot} over every in-document window of every layer of the trace (bytes-weighted)
  eps      {kernel: median over layers of its fit's median relative error on windows, n >= 2}
  eps_engine {engine: max over its kernels' eps}  (moespec: slot, dedup; transformers: hf-*; mlx-lm: mlx-*)
  crossover  smallest n >= 2 from which u(n) < r(n) for every larger n timed; null if none
  fits     {layer: {kernel: {equation, passes, t_op_s, c_u_s_per_byte, c_re_s_per_byte, re_read_cost,
           first_read_gbps | c_g_s_per_byte, c_t_s_per_token, union_gbps; eps}}}; null when not identifiable
  per_layer {layer: {kernels: {kernel: {n: {windows, measured_mean_s, measured_median_s, predicted_mean_s}}},
           one_token_s: {kernel, measured_s, predicted_s}}}: operation times over windows for prediction (22)
           (measured: mean / median of the per-window medians; predicted: the fit at each window's (n, U),
           averaged); t_l(1) from the per-slot kernel
  chosen   {layer: {n: [{U, median_s: {kernel: s}, iqr_s: {kernel: s}}]}}   raw medians on chosen ids
  windows  {layer: {n: [{start, U, median_s, iqr_s}]}}   raw medians on recorded windows (start: first token)
  trace    {path, synthetic, source, note, num_tokens, num_documents, sha1}
  protocol {reps, windows, u_values, seed, flush_bytes, timer, weight_std, noisy_iqr}  timer: "perf_counter" (cpu)
           or "cuda events"
  skipped_kernels {kernel: why}: kernels `--kernels all` left out because they cannot run at this dtype
  noisy    {threshold, count, total, worst}: timings whose IQR exceeds threshold x median
  elapsed_s, provenance (device, host, dtype, versions, timestamp, command)
Files written before `bench --device` lack device_kind, ceiling_kind and protocol.timer: they were all measured on
the CPU against a streaming read, and load_bench fills in those two keys (LEGACY_KEYS).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.io import atomic_write, console, plot_format

FORMAT_NAME = "moespec-bench"
FORMAT_VERSION = 1
DTYPES = ("bf16", "fp32")  # weight formats our native kernels stream
DEVICE_KINDS = ("cpu", "cuda")  # where `bench --device` runs the kernels
# what a file written before `bench --device` was measured on: every such bench ran on the CPU
LEGACY_KEYS = {"device_kind": "cpu", "ceiling_kind": "streaming read"}


# ---- bench.json --------------------------------------------------------------------------------------------
# key -> type(s) every bench.json must carry (external checks read them)
REQUIRED = {"format_version": int, "model": str, "device": str, "dtype": str, "ceiling_gbps": (int, float),
            "layers": list, "n": list, "kernels": dict, "r": dict, "u": dict, "eps": dict,
            "crossover": (int, type(None)), "fits": dict, "per_layer": dict, "chosen": dict, "provenance": dict}


def _fail(path: str, problem: str) -> MoespecError:
    return MoespecError(f"{path}: {problem}")


def _check_n_map(path: str, name: str, values: Any, ns: list[int]) -> None:
    """A {n: positive number} map whose keys are strings of timed pass sizes."""
    if not isinstance(values, dict):
        raise _fail(path, f"{name} must be an object keyed by n")
    for key, value in values.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) in ns):
            raise _fail(path, f"{name} has key {key!r}, not a timed pass size n in {ns}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise _fail(path, f"{name}[{key}] = {value!r} must be a positive number")


def load_bench(path: str | Path) -> dict[str, Any]:
    """Read and validate a bench.json (format, version, required keys and types, n ranges, positive bandwidths,
    model name, device kind); returns the document as stored (n keys are strings), an older file with the
    LEGACY_KEYS it lacks. Raises MoespecError naming the file."""
    where = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise _fail(where, "no such bench file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(where, f"not readable JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise _fail(where, f"not a moespec bench file (format is not {FORMAT_NAME!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise _fail(where, f"bench format version {doc.get('format_version')!r} is not supported (this moespec "
                           f"reads version {FORMAT_VERSION})")
    for key, kind in REQUIRED.items():
        if key not in doc:
            raise _fail(where, f"missing key {key!r}")
        if isinstance(doc[key], bool) or not isinstance(doc[key], kind):
            raise _fail(where, f"{key} has the wrong type ({type(doc[key]).__name__})")
    if not doc["model"] or (isinstance(doc.get("spec"), dict) and doc["spec"].get("name") != doc["model"]):
        raise _fail(where, f"model name {doc['model']!r} is empty or differs from its spec's")
    if doc["dtype"] not in DTYPES:
        raise _fail(where, f"dtype {doc['dtype']!r} is not one of {', '.join(DTYPES)}")
    for key, value in LEGACY_KEYS.items():
        doc.setdefault(key, value)
    if doc["device_kind"] not in DEVICE_KINDS:
        raise _fail(where, f"device_kind {doc['device_kind']!r} is not one of {', '.join(DEVICE_KINDS)}")
    if not isinstance(doc["ceiling_kind"], str) or not doc["ceiling_kind"]:
        raise _fail(where, f"ceiling_kind {doc['ceiling_kind']!r} must name what the ceiling measures")
    ns = doc["n"]
    if not ns or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in ns):
        raise _fail(where, f"n must list pass sizes >= 1, got {ns!r}")
    if not doc["ceiling_gbps"] > 0:
        raise _fail(where, f"ceiling_gbps = {doc['ceiling_gbps']!r} must be positive")
    for name, entry in doc["kernels"].items():
        if not isinstance(entry, dict):
            raise _fail(where, f"kernels.{name} must be an object")
        _check_n_map(where, f"kernels.{name}.beta_gbps", entry.get("beta_gbps"), ns)
    _check_n_map(where, "r", doc["r"], ns)
    _check_n_map(where, "u", doc["u"], ns)
    for kernel, value in doc["eps"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise _fail(where, f"eps[{kernel}] = {value!r} must be a number >= 0")
    if doc["crossover"] is not None and doc["crossover"] not in ns:
        raise _fail(where, f"crossover {doc['crossover']!r} is not a timed pass size")
    return doc


# ---- report: Table 1, fits, Figure 2 -----------------------------------------------------------------------
Rows = tuple[list[str], list[list[str]]]  # (column names, rows of cells), for the terminal and the HTML report
TABLE1_CAPTION = ("median over recorded windows; slot kind on n m b, dedup kind on U b; dedup faster where "
                  "u(n) < r(n) (7)")
FITS_CAPTION = ("eps: median relative error on the recorded windows; no fit: chosen ids at fewer than two pass "
                "sizes n >= 2")


def _gbps(value: float, ceiling: float) -> str:
    return f"{value:.1f} ({value / ceiling:.0%})"


def table1(doc: dict[str, Any]) -> Rows:
    """Table 1: per n, the ceiling, each kernel's beta in GB/s (% of ceiling), r(n), u(n) and the faster kernel."""
    ceiling = doc["ceiling_gbps"]
    kernels = doc["kernels"]
    labels = [k if k == v["kind"] else f"{k} ({v['kind']})" for k, v in kernels.items()]
    rows = []
    for n in map(str, doc["n"]):
        r, u = doc["r"].get(n), doc["u"][n]
        faster = "same kernel" if n == "1" else "-" if r is None else "dedup" if u < r else "slot"
        rows.append([n, f"{ceiling:.1f}", *[_gbps(v["beta_gbps"][n], ceiling) for v in kernels.values()],
                     "-" if r is None else f"{r:.3f}", f"{u:.3f}", faster])
    return ["n", "ceiling", *labels, "r(n)", "u(n)", "faster"], rows


def fits_table(doc: dict[str, Any]) -> Rows:
    """The fits per layer and kernel: equation, t_op, first-read bandwidth, re-read cost c_re/c_u, c_t, eps."""
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = []
    for layer, per_kernel in doc["fits"].items():
        for kernel, f in per_kernel.items():
            if f is None:
                rows.append([layer, kernel, "no fit", *["-"] * 5])
                continue
            c_t = f.get("c_t_s_per_token")
            rows.append([layer, kernel, f["equation"], fmt(f["t_op_s"] * 1e3, ".3f"),
                         fmt(f.get("first_read_gbps", f.get("union_gbps")), ".1f"), fmt(f.get("re_read_cost"), ".3f"),
                         fmt(None if c_t is None else c_t * 1e3, ".3f"), fmt(f["eps"], ".3f")])
    return ["layer", "kernel", "eq.", "t_op ms", "1/c_u or 1/c_g GB/s", "c_re/c_u", "c_t ms/token", "eps"], rows


def print_tables(doc: dict[str, Any]) -> None:
    """Table 1 (table1) and the fits per layer (fits_table) as rich tables."""
    from rich.table import Table

    out = console()
    titles = (f"Table 1: effective bandwidth on requested bytes, GB/s (% of ceiling): {doc['model']} {doc['dtype']}, "
              f"MoE layers {', '.join(map(str, doc['layers']))}",
              "Fits on chosen ids, n >= 2: (4) t = t_op + c_u U b + c_re (nm - U) b;  (E.1) t = t_op + c_g U b + c_t n")
    for title, caption, (columns, rows) in zip(titles, (TABLE1_CAPTION, FITS_CAPTION), (table1(doc), fits_table(doc))):
        table = Table(title=title, caption=caption)
        for name in columns:
            table.add_column(name, justify="right")
        for row in rows:
            table.add_row(*row)
        out.print(table)


def plot_bandwidth(doc: dict[str, Any], path: str) -> None:
    """Save the paper's Figure 2 (bandwidth_figure) to `path` (.png/.pdf/.svg)."""
    fmt = plot_format(path)
    fig = bandwidth_figure(doc)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt))


def bandwidth_figure(doc: dict[str, Any]) -> Any:
    """The paper's Figure 2 as a matplotlib Figure (no pyplot: nothing global to close): each kernel's effective
    bandwidth vs n (median and IQR over recorded windows); per-slot kind solid with filled markers, dedup kind
    dashed with open markers; the ceiling dotted."""
    from matplotlib.figure import Figure

    ns = doc["n"]
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    for i, (name, k) in enumerate(doc["kernels"].items()):
        med = np.array([k["beta_gbps"][str(n)] for n in ns])
        half = np.array([k["beta_iqr_gbps"][str(n)] for n in ns]) / 2
        slot = k["kind"] == "slot"
        ax.errorbar(ns, med, yerr=half, fmt="o-" if slot else "o--", color=f"C{i}", capsize=2,
                    markerfacecolor=f"C{i}" if slot else "white", label=f"{name} ({k['kind']})")
    ax.axhline(doc["ceiling_gbps"], linestyle=":", color="black",
               label=f"{doc['ceiling_kind']} (ceiling) {doc['ceiling_gbps']:.1f} GB/s")
    ax.set(xlabel="tokens per pass n", ylabel="effective bandwidth (GB/s)", xticks=ns, ylim=(0, None),
           title=f"{doc['model']} {doc['dtype']}, MoE layers {', '.join(map(str, doc['layers']))}")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig
