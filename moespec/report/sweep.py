"""The summary of a sweep (moespec.sweep): one row per cell, its grid values, the routing its plan stood on, the
crossover, AUTO's k_hat*(a) at ACCEPTANCES and the one-token pass time tau1 with its source, written as
OUT/summary.json, summary.md (the table) and summary.html (the same as one self-contained page)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moespec.formats.files import atomic_write, provenance, write_json
from moespec.report.markup import CSS, table

ACCEPTANCES = (0.5, 0.7, 0.8, 0.9)  # the summary's k_hat*(a) columns
FORMAT_NAME, FORMAT_VERSION = "moespec-sweep", 1


def summary_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The summary's columns and rows: per cell its grid values, the crossover, k_hat*(a) of AUTO and tau1's source."""
    columns = ["model", "format", "depth", "batch", "device", "kernels", "routing", "crossover",
               *(f"k_hat*({a:g})" for a in ACCEPTANCES), "tau1 ms", "tau1 from"]
    body = [[Path(r["model"]).name, r["format"], str(r["depth"]), ",".join(map(str, r["batch"])), r["device"],
             r["kernels"] or "default", str(r["routing"]),
             f"refused: {r['refused']}" if r["refused"] else "none" if r["crossover"] is None else str(r["crossover"]),
             *(str(r["k_hat"].get(str(a), "-")) for a in ACCEPTANCES),
             "-" if r["tau1_s"] is None else f"{r['tau1_s'] * 1e3:.2f}", r["tau1_from"]]
            for r in rows]
    return columns, body


def write_summary(out: Path, rows: list[dict[str, Any]]) -> None:
    """OUT/summary.json (format moespec-sweep, version 1: cells [the summary rows of moespec.sweep.run_sweep],
    acceptances, provenance), summary.md (the table) and summary.html (the same as one self-contained page)."""
    columns, body = summary_table(rows)
    write_json(out / "summary.json", {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "cells": rows,
                                      "acceptances": list(ACCEPTANCES), "provenance": provenance()})
    md = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                     *("| " + " | ".join(row) + " |" for row in body)]) + "\n"
    atomic_write(out / "summary.md", lambda tmp: tmp.write_text(md, encoding="utf-8"))
    page = (f"<!doctype html><meta charset='utf-8'><title>moespec sweep</title><style>{CSS}</style>"
            f"<h1>moespec sweep: {len(rows)} cells</h1>"
            + table(columns, body, "crossover: the smallest n from which the dedup kernel's predicted saving stays "
                    "positive; k_hat*(a): AUTO's best draft length at acceptance a (the plan's prediction)"))
    atomic_write(out / "summary.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))
