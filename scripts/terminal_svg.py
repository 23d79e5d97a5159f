#!/usr/bin/env python3
"""Renders a captured terminal session (plain text) as an SVG picture of a
terminal window, for the README. Used by scripts/record-demo.sh.

    terminal_svg.py COMMAND_LINE < captured.txt > picture.svg

Lines longer than the terminal's width wrap, as a terminal wraps them. The
demo's own kinds of line get the colours a person's eye looks for: its
events (`== t=...`), the progress lines (`t=  1s ...`), the table headers and
the verdict. No fonts are embedded: a monospace font of the viewer's.
"""

import html
import sys

COLUMNS = 120
FONT_SIZE = 13
CHAR_W = FONT_SIZE * 0.6  # every common monospace font's advance
LINE_H = 17
PAD = 16
BAR = 28

BG, FG, DIM = "#1e1f29", "#d8d8d2", "#8a8f98"
COLOURS = [
    (lambda l: l.startswith("$ "), "#8be9fd"),
    (lambda l: l.startswith("== "), "#f1fa8c"),
    (lambda l: l.startswith("t="), "#50fa7b"),
    (lambda l: l.lstrip().startswith("NODE ") or l.startswith("node "), "#bd93f9"),
    (lambda l: l.startswith("lost = 0, answered twice or crossed = 0"), "#50fa7b"),
    (lambda l: l.startswith("lost = "), "#ff5555"),
    (lambda l: l.startswith("switch log: "), DIM),
]


def colour(line):
    for test, c in COLOURS:
        if test(line):
            return c
    return FG


def wrapped(lines):
    """(text, colour) per screen row: a long line continues on the next rows
    in its own colour."""
    rows = []
    for line in lines:
        c = colour(line)
        line = line.expandtabs()
        while len(line) > COLUMNS:
            rows.append((line[:COLUMNS], c))
            line = line[COLUMNS:]
        rows.append((line, c))
    return rows


def render(command, text):
    lines = [f"$ {command}"] + text.rstrip("\n").split("\n")
    rows = wrapped(lines)
    width = int(COLUMNS * CHAR_W + 3 * PAD)
    height = BAR + PAD + len(rows) * LINE_H + PAD
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(command)}">',
        f"<title>{html.escape(command)}</title>",
        "<style>text{font-family:'DejaVu Sans Mono',Menlo,Consolas,'Liberation Mono',monospace;"
        f"font-size:{FONT_SIZE}px;white-space:pre}}</style>",
        f'<rect width="{width}" height="{height}" rx="8" fill="{BG}"/>',
        f'<rect width="{width}" height="{BAR}" rx="8" fill="#2b2d3a"/>',
        f'<rect y="{BAR - 8}" width="{width}" height="8" fill="#2b2d3a"/>',
    ]
    for i, c in enumerate(["#ff5f56", "#ffbd2e", "#27c93f"]):
        out.append(f'<circle cx="{PAD + i * 20}" cy="{BAR // 2}" r="6" fill="{c}"/>')
    out.append(
        f'<text x="{width // 2}" y="{BAR // 2 + 4}" fill="{DIM}" text-anchor="middle">'
        f"{html.escape(command)}</text>"
    )
    y = BAR + PAD + FONT_SIZE
    for text, c in rows:
        if text.strip():
            out.append(
                f'<text x="{PAD}" y="{y}" fill="{c}" xml:space="preserve">{html.escape(text)}</text>'
            )
        y += LINE_H
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: terminal_svg.py COMMAND_LINE < captured.txt > picture.svg")
    sys.stdout.write(render(sys.argv[1], sys.stdin.read()))
