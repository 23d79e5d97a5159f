#!/usr/bin/env python3
"""Every metric the Grafana dashboard and the Prometheus alert rules query
must exist in a real scrape of the switch, with the label names they group
or match on and the label values they match literally. For
scripts/checks/monitoring.sh.

    promql_names.py SCRAPE DASHBOARD_JSON ALERTS_YML RULES_OUT

SCRAPE is a /metrics body. RULES_OUT receives the dashboard's expressions as
recording rules (Grafana's variables replaced by plain values) so that
`promtool check rules` parses each as PromQL. Exit status 1, naming the
panel or alert and what is missing, on any miss.
"""

import json
import re
import sys

import yaml

# Labels Prometheus adds to every series it scrapes: never in /metrics.
TARGET_LABELS = {"instance", "job"}
METRIC = re.compile(r"\b(isoswitch_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(isoswitch_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
LABEL_PAIR = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


def scrape_index(text):
    """{metric: {label: {values}}} of every sample."""
    index = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = index.setdefault(m.group(1), {})
        for k, v in LABEL_PAIR.findall(m.group(2) or ""):
            labels.setdefault(k, set()).add(v)
    return index


def dashboard_exprs(dash):
    """(where, expr) for every panel target, nested rows included, and every
    query variable's selector."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"panel {p.get('title')!r} ({t.get('refId')})", t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q)
        if not m:
            raise SystemExit(f"variable {v['name']}: expected label_values(SELECTOR, LABEL): {q}")
        # The label it lists must exist too: check it as a grouping label.
        out.append((f"variable ${v['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def alert_exprs(rules):
    return [
        (f"alert {r.get('alert') or r.get('record')}", r["expr"])
        for g in rules["groups"]
        for r in g["rules"]
    ]


def plain(expr):
    """The expression with Grafana's variables replaced by plain values."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def problems(where, expr, index):
    found = []
    names = set(METRIC.findall(expr))
    if not names:
        found.append(f"{where}: queries no isoswitch metric: {expr}")
    for name in sorted(names):
        if name not in index:
            found.append(f"{where}: {name} is not in the scrape")
    for name, body in SELECTOR.findall(expr):
        labels = index.get(name, {})
        for label, op, value in MATCHER.findall(body):
            if label in TARGET_LABELS:
                continue
            if label not in labels:
                found.append(f"{where}: {name} has no label {label}")
                continue
            if "$" in value or op in ("!=", "!~"):
                continue
            wanted = value.split("|") if op == "=~" else [value]
            for v in wanted:
                if op == "=~" and not re.fullmatch(r"[\w.\-]+", v):
                    break  # a real regular expression: not a list of values
                if v not in labels[label]:
                    found.append(f'{where}: no {name} sample has {label}="{v}" (has: {sorted(labels[label])})')
    known = set(TARGET_LABELS) | {"le"}
    for name in names:
        known |= set(index.get(name, {}))
    for group in LABEL_LIST.findall(expr):
        for label in (x.strip() for x in group.split(",")):
            if label and label not in known:
                found.append(f"{where}: groups or matches on {label}, which none of {sorted(names)} has")
    return found


def layout_problems(dash):
    """Grafana imports a dashboard whatever its layout; a person then sees
    panels on top of each other. Ids must be unique, every panel must have a
    data source and a query, and no two panels may share a grid cell."""
    found, ids, cells = [], set(), {}
    for p in dash.get("panels", []):
        where = f"panel {p.get('title')!r}"
        if p.get("id") in ids:
            found.append(f"{where}: id {p.get('id')} used twice")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if g.get("x", 0) + g.get("w", 0) > 24:
            found.append(f"{where}: wider than the 24-column grid")
        if p.get("type") != "row" and not (p.get("datasource") and p.get("targets")):
            found.append(f"{where}: no data source or no query")
        for x in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
            for y in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
                if (x, y) in cells:
                    found.append(f"{where}: overlaps panel {cells[(x, y)]!r}")
                    break
                cells[(x, y)] = p.get("title")
            else:
                continue
            break
    return found


def main():
    scrape, dashboard, alerts, rules_out = sys.argv[1:5]
    with open(scrape) as f:
        index = scrape_index(f.read())
    with open(dashboard) as f:
        dash = json.load(f)
    with open(alerts) as f:
        rules = yaml.safe_load(f)
    from_dashboard = dashboard_exprs(dash)
    from_alerts = alert_exprs(rules)
    found = layout_problems(dash)
    for where, expr in from_dashboard + from_alerts:
        found += problems(where, plain(expr), index)
    recording = {
        "groups": [{
            "name": "dashboard",
            "rules": [{"record": f"dashboard:expr{i}", "expr": plain(e)} for i, (_, e) in enumerate(from_dashboard)],
        }]
    }
    with open(rules_out, "w") as f:
        yaml.safe_dump(recording, f)
    if found:
        print("\n".join(found))
        sys.exit(1)
    used = {n for _, e in from_dashboard + from_alerts for n in METRIC.findall(e)}
    print(f"{len(from_dashboard)} dashboard and {len(from_alerts)} alert expressions use {len(used)} metrics, "
          f"all in the scrape ({len(index)} metrics) with the labels and values they match")


if __name__ == "__main__":
    main()
