#!/usr/bin/env python3
"""Rate against nodes per site, as an SVG, from bench/cluster.sh scale's table rows.

usage: bench/cluster_plot.py ROWS.md OUT.svg [--cap-gbps 0.2]
ROWS.md holds the markdown rows `| dataset | nodes | s | Gb/s | ...` (other lines are ignored).
"""
import sys

rows, out = sys.argv[1], sys.argv[2]
cap = float(sys.argv[sys.argv.index("--cap-gbps") + 1]) if "--cap-gbps" in sys.argv else 0.2
series = {}
for line in open(rows):
    f = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(f) < 4 or not f[1].isdigit():
        continue
    series.setdefault(f[0], {})[int(f[1])] = float(f[3])
ks = sorted({k for s in series.values() for k in s})
W, H, L, B, T, R = 520, 340, 60, 50, 20, 150
kmax, ymax = max(ks), cap * max(ks) * 1.1
x = lambda k: L + (k - 1) / max(kmax - 1, 1) * (W - L - R)
y = lambda g: H - B - g / ymax * (H - B - T)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
for k in ks:
    svg.append(f'<text x="{x(k)}" y="{H-B+18}" text-anchor="middle">{k}</text>')
for i in range(5):
    g = ymax * i / 4
    svg.append(f'<text x="{L-6}" y="{y(g)+4}" text-anchor="end">{g:.2f}</text>')
svg.append(f'<text x="{(L+W-R)/2}" y="{H-12}" text-anchor="middle">nodes per site</text>')
svg.append(f'<text x="14" y="{(T+H-B)/2}" transform="rotate(-90 14 {(T+H-B)/2})" text-anchor="middle">Gb/s</text>')
ideal = " ".join(f"{x(k)},{y(cap*k)}" for k in ks)
svg.append(f'<polyline points="{ideal}" fill="none" stroke="#999" stroke-dasharray="4 3"/>')
svg.append(f'<text x="{W-R+8}" y="{y(cap*kmax)+4}" fill="#666">k × {cap*1000:.0f} Mb/s cap</text>')
colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"]
for i, (name, pts) in enumerate(sorted(series.items())):
    c = colors[i % len(colors)]
    p = " ".join(f"{x(k)},{y(g)}" for k, g in sorted(pts.items()))
    svg.append(f'<polyline points="{p}" fill="none" stroke="{c}" stroke-width="2"/>')
    for k, g in pts.items():
        svg.append(f'<circle cx="{x(k)}" cy="{y(g)}" r="3" fill="{c}"/>')
    last = max(pts)
    svg.append(f'<text x="{W-R+8}" y="{y(pts[last])+4+14*i}" fill="{c}">{name}</text>')
svg.append("</svg>")
open(out, "w").write("\n".join(svg) + "\n")
