"""Plots bench/gather.sh's output (JSON lines), one row of panels per run: warm, rows per second
by system (every sampled row, repeats included, as the model consumes them); cold, distinct rows
per second (what the storage must read) against fio's 4 KiB random-read IOPS at queue depth 32
(the disk's limit). Usage: gather_plot.py OUT.png RUN.jsonl...
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def color(system: str) -> str:
    if system.startswith("tessera"):
        return "#9ecae1" if "no read hints" in system else "#1f77b4"
    return {"numpy.memmap": "#7f7f7f"}.get(system, "#d62728")


def main() -> None:
    out, runs = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.8 * len(runs)), squeeze=False)
    for row, path in enumerate(runs):
        lines = [json.loads(line) for line in open(path) if line.startswith("{")]
        graph = next((r for r in lines if "graph" in r), {})
        fio = {r["iodepth"]: r["iops"] for r in lines if r.get("system", "").startswith("fio")}
        for col, cache in enumerate(("warm", "cold")):
            ax = axes[row][col]
            results = [r for r in lines if r.get("cache") == cache and "rows_per_s" in r]
            names = [r["system"] for r in results]
            if cache == "cold":
                values = [r["distinct_rows"] / (r["rows"] / r["rows_per_s"]) for r in results]
                ax.set_xlabel("distinct rows per second (log)")
            else:
                values = [r["rows_per_s"] for r in results]
                ax.set_xlabel("rows per second (log)")
            ax.barh(range(len(results)), values, color=[color(n) for n in names])
            ax.set_yticks(range(len(results)), names, fontsize=8)
            ax.invert_yaxis()
            top = max(values + [fio.get(32, 0) if cache == "cold" else 0])
            if top / min(values) > 20:
                ax.set_xscale("log")
                ax.set_xlim(min(values) / 2, top * 3)
            else:
                ax.set_xlim(0, top * 1.3)
                ax.set_xlabel(ax.get_xlabel().replace(" (log)", ""))
            if cache == "cold" and 32 in fio:
                ax.axvline(fio[32], color="black", linestyle="--", linewidth=1)
                ax.text(fio[32], len(results) - 0.5, f" fio QD32\n {fio[32] / 1000:.0f} k IOPS", fontsize=8)
            for i, value in enumerate(values):
                ax.text(value, i, f" {value / 1000:,.1f} k", va="center", fontsize=8)
            nodes = graph.get("nodes", 0)
            run = os.path.basename(path).rsplit(".", 1)[0]
            ax.set_title(f"{run}, {cache}: {graph.get('graph', '')} {nodes / 1e6:.1f} M nodes, {nodes * 4096 / 2**30:.0f} GiB table",
                         fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
