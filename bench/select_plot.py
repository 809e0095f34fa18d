"""Plots bench/select_bench.py's results: seconds and MB to the client per query and system, one
row per link. Usage: select_plot.py UNSHAPED.json SHAPED.json OUT.png"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = ("tessera-select", "minio-select", "duckdb-tessera")
COLORS = {"tessera-select": "#1f77b4", "minio-select": "#d62728", "duckdb-tessera": "#7f7f7f"}


def main() -> None:
    runs = [json.load(open(path)) for path in sys.argv[1:3]]
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 3.6 * len(runs)), squeeze=False)
    for row, run in enumerate(runs):
        queries = list(dict.fromkeys(r["query"] for r in run["results"]))
        for col, (field, label, scale) in enumerate((("seconds", "seconds", 1), ("bytes", "MB to client", 1e6))):
            ax = axes[row][col]
            width = 0.8 / len(SYSTEMS)
            for i, system in enumerate(SYSTEMS):
                values = [next(r[field] for r in run["results"] if r["query"] == q and r["system"] == system) / scale
                          for q in queries]
                ax.bar([x + i * width for x in range(len(queries))], values, width, label=system,
                       color=COLORS[system])
            ax.set_xticks([x + width for x in range(len(queries))], queries)
            ax.set_ylabel(label)
            if field == "bytes":
                ax.set_yscale("log")
            ax.set_title(f"{run['rows']:,} rows, {run['csv_bytes'] / 1e6:.0f} MB CSV, {run['link']} link")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[3], dpi=110)


if __name__ == "__main__":
    main()
