"""Results out: JSON and a PNG chart per scenario under results/, Markdown tables.

python -m benchmarks.report   # print every saved scenario's tables as Markdown
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import Measurement, ScenarioResult, Table, format_value

RESULTS = Path(__file__).resolve().parent / "results"


def save_json(result: ScenarioResult, header: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{result.name}.json"
    document = {
        "scenario": result.name,
        "title": result.title,
        **header,
        "repeats": result.repeats,
        "params": result.params,
        "tables": [table.as_dict() for table in result.tables],
    }
    if result.text_tables:
        document["text_tables"] = [table.as_dict() for table in result.text_tables]
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def save_chart(result: ScenarioResult) -> Path:
    """One horizontal bar chart per table (medians, min-max whiskers), stacked; ~800 px wide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    RESULTS.mkdir(exist_ok=True)
    tables = [table for table in result.tables if any(not row.missing for row in table.rows)]
    heights = [0.7 + 0.19 * len(table.rows) for table in tables]
    figure, axes = plt.subplots(
        len(tables),
        1,
        figsize=(8, max(3.2, sum(heights) + 0.3)),
        dpi=100,
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for axis, table in zip(axes[:, 0], tables, strict=True):
        rows = [row for row in table.rows if not row.missing][::-1]
        medians = [row.median for row in rows]
        low = [row.median - min(row.values) for row in rows]
        high = [max(row.values) - row.median for row in rows]
        colours = [
            "#999999"
            if row.name == table.floor
            else "#2a7ab0"
            if "rcoord" in row.name
            else "#e0a030"
            for row in rows
        ]
        bars = axis.barh(
            range(len(rows)),
            medians,
            xerr=[low, high],
            color=colours,
            error_kw={"elinewidth": 0.8, "capsize": 2},
        )
        axis.bar_label(
            bars, labels=[format_value(value) for value in medians], fontsize=6, padding=3
        )
        axis.set_yticks(range(len(rows)), [row.name for row in rows], fontsize=7)
        axis.tick_params(axis="x", labelsize=7)
        positive = [value for value in medians if value > 0]
        if positive and max(positive) / min(positive) > 30:
            axis.set_xscale("log")
            axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_value(value)))
            axis.xaxis.set_minor_formatter(NullFormatter())
        better = "lower is better" if table.lower_is_better else "higher is better"
        axis.set_title(table.title, fontsize=8, loc="left")
        axis.set_xlabel(f"{table.unit}, {better}", fontsize=7, labelpad=1)
        axis.grid(axis="x", linewidth=0.3)
    figure.tight_layout(pad=0.4)
    path = RESULTS / f"{result.name}.png"
    figure.savefig(path)
    plt.close(figure)
    return path


def markdown_tables(document: dict[str, Any]) -> str:
    """The tables of one saved scenario (its JSON document) as Markdown."""
    out = []
    for table in document["tables"]:
        extras = [
            name
            for name in table["rows"][0]
            if name not in _ROW_FIELDS and not name.startswith("_")
        ]
        headers = ["", "round trips", f"{table['unit']} (median)", "spread", "vs floor"]
        headers += extras
        out.append(f"**{table['title']}**" + (f" ({table['note']})" if table["note"] else ""))
        out.append("")
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "---|" * len(headers))
        for row in table["rows"]:
            name = row["name"] + (f" ({row['note']})" if row["note"] and row["values"] else "")
            if not row["values"]:
                cells = [row["name"], row["round_trips"], f"not measured: {row['note']}", "", ""]
                cells += [""] * len(extras)
            else:
                ratio = row["vs_floor"]
                cells = [
                    name,
                    row["round_trips"],
                    format_value(row["median"]),
                    f"{row['spread']:.0%}",
                    "-" if ratio is None else f"{ratio:.2f}x",
                ]
                cells += [format_value(row.get(extra)) for extra in extras]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    for text_table in document.get("text_tables", []):
        out.append(f"**{text_table['title']}**")
        out.append("")
        out.append("| " + " | ".join(text_table["columns"]) + " |")
        out.append("|" + "---|" * len(text_table["columns"]))
        out.extend("| " + " | ".join(row) + " |" for row in text_table["rows"])
        out.append("")
    return "\n".join(out)


_ROW_FIELDS = {"name", "round_trips", "values", "median", "spread", "vs_floor", "note"}


def load(document: dict[str, Any]) -> ScenarioResult:
    """A saved scenario (its JSON document) back as a ScenarioResult."""
    tables = []
    for table in document["tables"]:
        extras = [name for name in table["rows"][0] if name not in _ROW_FIELDS]
        rows = [
            Measurement(
                row["name"],
                row["round_trips"],
                row["values"],
                note=row["note"],
                extra={name: row[name] for name in extras},
            )
            for row in table["rows"]
        ]
        tables.append(
            Table(
                table["title"],
                table["unit"],
                rows,
                floor=table["floor"],
                lower_is_better=table["lower_is_better"],
                extra_columns=extras,
                note=table["note"],
            )
        )
    return ScenarioResult(document["scenario"], document["title"], tables)


def main() -> None:
    parser = argparse.ArgumentParser(description="Saved benchmark results as Markdown.")
    parser.add_argument("--charts", action="store_true", help="also redraw every PNG chart")
    options = parser.parse_args()
    for path in sorted(RESULTS.glob("*.json")):
        document = json.loads(path.read_text())
        if "scenario" not in document:
            continue  # not a scenario's tables: the scaling grid's cells (cluster_queues)
        print(f"### {document['title']}\n")
        print(markdown_tables(document))
        if options.charts:
            save_chart(load(document))


if __name__ == "__main__":
    main()
