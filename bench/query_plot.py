"""Plots bench/query_bench.py results: time, bytes to the client and bytes the storage nodes read
from their peers, per query and system, one column of panels per link (unshaped, 1 Gbit/s).

    python bench/query_plot.py UNSHAPED.json SHAPED.json OUT.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    *inputs, out = sys.argv[1:]
    runs = [json.load(open(path)) for path in inputs]
    fields = (("seconds", "seconds (median)", 1), ("bytes", "MB to the client", 1e6),
              ("node_peer_bytes", "MB nodes read from peers", 1e6))
    fig, axes = plt.subplots(len(fields), len(runs), figsize=(6 * len(runs), 10), squeeze=False)
    for col, run in enumerate(runs):
        queries = list(dict.fromkeys(r["query"] for r in run["results"]))
        systems = list(dict.fromkeys(r["system"] for r in run["results"]))
        width = 0.8 / len(systems)
        for row, (field, label, scale) in enumerate(fields):
            ax = axes[row][col]
            for i, system in enumerate(systems):
                # A system that refused a query (MinIO's S3 Select) has no bar there.
                # A system that does not count a field (S3 Select: peer bytes) has no bar either.
                found = [next((r.get(field) for r in run["results"] if r["query"] == q and r["system"] == system),
                              None) for q in queries]
                values = [float("nan") if v is None else v / scale for v in found]
                ax.bar([q + i * width for q in range(len(queries))], values, width, label=system)
            ax.set_xticks([q + width * (len(systems) - 1) / 2 for q in range(len(queries))], queries)
            ax.set_ylabel(label)
            if field == "bytes":
                ax.set_yscale("log")
            ax.set_title(f"{run['rows'] / 1e6:.0f}M rows, {run['parquet_bytes'] / 1e6:.0f} MB Parquet, {run['link']} link")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
