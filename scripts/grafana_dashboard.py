"""Build Narwhal's Grafana dashboard, deploy/grafana/narwhal.json.

    python scripts/grafana_dashboard.py           # write the file
    python scripts/grafana_dashboard.py --check   # exit 1 if the file is not what this builds

The panels are declared in scripts/grafana_panels.py rather than edited as JSON, so that
every one reads the same selector variables and data source, and the layout is computed:
a panel is a title, its queries and a unit. tests/deploy checks that the checked-in file
is this script's output and that every series it queries exists on a running router's
/metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from generated_file import write_or_check
from grafana_panels import DATASOURCE, ROWS, Panel

OUTPUT = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "narwhal.json"
WIDTH = 24  # Grafana's grid columns


def variable(name: str, label: str, query: str, include_all: bool) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": query,
        "refresh": 2,  # on time range change: engines and routers come and go
        "includeAll": include_all,
        "multi": include_all,
        "allValue": ".*" if include_all else None,
        "current": {},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def templating() -> dict[str, Any]:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "options": [],
                "regex": "",
                "refresh": 1,
                "hide": 0,
            },
            variable("job", "Job", "label_values(narwhal_build_info, job)", False),
            variable(
                "instance",
                "Router",
                'label_values(narwhal_build_info{job=~"$job"}, instance)',
                True,
            ),
            variable(
                "engine",
                "Engine",
                'label_values(narwhal_engine_up{job=~"$job", instance=~"$instance"}, engine)',
                True,
            ),
        ]
    }


def render_panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [
        {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": q.expr,
            "legendFormat": q.legend or "__auto",
            "range": not q.instant,
            "instant": q.instant,
            "refId": chr(ord("A") + n),
        }
        for n, q in enumerate(panel.queries)
    ]
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "mappings": panel.mappings,
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": c, "value": v} for v, c in panel.thresholds],
        },
        "color": {"mode": "thresholds" if panel.kind == "stat" else "palette-classic"},
    }
    if panel.minimum is not None:
        defaults["min"] = panel.minimum
    if panel.maximum is not None:
        defaults["max"] = panel.maximum
    options: dict[str, Any]
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if panel.stacked else 5,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
        }
        if panel.threshold_lines:
            defaults["custom"]["thresholdsStyle"] = {"mode": "line"}
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background" if panel.overrides else "value",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "name" if panel.show_names else "auto",
        }
    elif panel.kind == "state-timeline":
        defaults["custom"] = {"fillOpacity": 80, "lineWidth": 0}
        options = {
            "mergeValues": True,
            "showValue": "auto",
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
            "tooltip": {"mode": "single", "sort": "none"},
        }
    else:
        raise ValueError(f"unknown panel kind {panel.kind}")
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": panel.overrides},
        "options": options,
        "targets": targets,
    }


def layout() -> list[dict[str, Any]]:
    """Rows top to bottom; within a row, panels left to right, wrapping at 24 columns."""
    panels: list[dict[str, Any]] = []
    panel_id = 1
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panels.append(render_panel(panel, panel_id, x, y))
            panel_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return panels


def dashboard() -> dict[str, Any]:
    return {
        "uid": "narwhal-router",
        "title": "Narwhal",
        "description": "Narwhal routers: the promise's SLO burn rates, traffic and outcomes, "
        "refusals, latency per engine, engine health, admission, prefix cache, the router "
        "process.",
        "tags": ["narwhal", "llm", "router"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,  # shared crosshair
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": templating(),
        "panels": layout(),
    }


def rendered() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    return write_or_check(OUTPUT, rendered(), script=__file__, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
