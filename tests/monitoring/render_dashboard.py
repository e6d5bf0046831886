#!/usr/bin/python3
"""Renders the main panels of dashboards/sluice-overview.json from a live
Prometheus into a PNG (Grafana is not installable here; this shows what an
operator sees, from real data).

  render_dashboard.py --prometheus=http://127.0.0.1:9090 --output=out.png

The panels' own PromQL is used, with the dashboard variables set to "All".
"""
import argparse
import json
import os
import sys
import time
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAIN_PANELS = [
    "Epoch progress", "Trainer sessions", "Lease grants, completions, expiries",
    "Lease grant latency", "Samples served", "Decode latency", "Cache hit ratio",
    "Journal fsync latency",
]
VARIABLES = {"$namespace": ".*", "$job": ".*", "$__rate_interval": "30s"}


def fmt(unit):
    def f(v, _):
        if unit == "percentunit":
            return f"{v * 100:.0f}%"
        if unit == "s":
            if abs(v) < 1e-3:
                return f"{v * 1e6:.0f} µs"
            return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.1f} s"
        if unit == "Bps":
            return f"{v / 1e6:.1f} MB/s"
        if unit == "ops":
            return f"{v:.1f}/s" if abs(v) < 10 else f"{v:.0f}/s"
        return f"{v:.0f}"
    return FuncFormatter(f)


def legend(template, labels):
    out = template
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out.strip() or "value"


def query_range(prom, expr, start, end, step):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{params}", timeout=60) as r:
        body = json.load(r)
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--output", required=True, help="PNG to write")
    parser.add_argument("--minutes", type=float, default=10, help="time range to show")
    args = parser.parse_args()
    with open(os.path.join(ROOT, "dashboards", "sluice-overview.json")) as f:
        board = json.load(f)
    panels = {}

    def walk(ps):
        for p in ps:
            walk(p.get("panels", []))
            if p.get("targets"):
                panels[p["title"]] = p
    walk(board["panels"])

    end = time.time()
    start = end - args.minutes * 60
    step = max(1, int(args.minutes * 60 / 300))
    plt.style.use("dark_background")
    fig, axes = plt.subplots(4, 2, figsize=(16, 14))
    fig.patch.set_facecolor("#111217")
    with_data = 0
    for ax, title in zip(axes.flat, MAIN_PANELS):
        panel = panels[title]
        unit = panel["fieldConfig"]["defaults"].get("unit", "none")
        ax.set_facecolor("#181b1f")
        ax.set_title(title, loc="left", fontsize=11, color="#d8d9da")
        lines = 0
        for target in panel["targets"]:
            expr = target["expr"]
            for k, v in VARIABLES.items():
                expr = expr.replace(k, v)
            for series in query_range(args.prometheus, expr, start, end, step):
                xs = [float(t) - end for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot([x / 60 for x in xs], ys, linewidth=1.2,
                        label=legend(target.get("legendFormat", ""), series["metric"]))
                lines += 1
        with_data += lines > 0
        ax.yaxis.set_major_formatter(fmt(unit))
        ax.set_xlim(-args.minutes, 0)
        ax.set_xlabel("minutes ago", fontsize=8, color="#8e8e8e")
        ax.grid(color="#2c3235", linewidth=0.6)
        ax.tick_params(labelsize=8, colors="#8e8e8e")
        if lines:
            ax.legend(fontsize=7, loc="upper left", framealpha=0.3, ncol=2)
        else:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"{board['title']}  (rendered from a live Prometheus, last {args.minutes:g} min)",
                 fontsize=13, color="#d8d9da", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(args.output, dpi=80, facecolor=fig.get_facecolor())
    print(f"panels with data: {with_data}/{len(MAIN_PANELS)}")
    print(f"wrote {args.output}")
    return 0 if with_data == len(MAIN_PANELS) else 1


if __name__ == "__main__":
    sys.exit(main())
