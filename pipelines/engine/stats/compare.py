"""`t2i compare RUN ... --output DIR`: finished runs side by side, with intervals and tie marks.

Reads each run's ``metrics.json["headline"]`` and ``headline_units.parquet`` (``headline.py``),
local or on any fsspec store, and writes per study one table with one row per subject (model):
every headline metric with its interval (recomputed from the units with this comparison's interval
settings, so every row is made the same way), its rank, and which models it cannot be told apart
from. Two subjects are compared on the units they share (the same occupations, prompts, seeds:
paired) with a sign-flip permutation test, else unpaired with a label-permutation test; the
p-values of all pairs of one metric are adjusted with Holm's method, and a pair counts as
distinguishable when the adjusted p-value is below 1 - level.

Runs are comparable when their study's protocol (prompts, seeds policy, classifier, thresholds:
what each study records as ``protocol``) is the same; differences are listed, and refused unless
``--allow-mismatch``. Runs of one model in different studies are joined on the model's recorded
identity (weights' sha256, else hub id and commit), never on a free-text name.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.engine.cli import arguments
from pipelines.engine.storage import dataset_card, io
from pipelines.engine.report import figures, page
from pipelines.engine.stats import compare_corrected as CC
from pipelines.engine.stats import headline
from pipelines.engine.run import publish
from pipelines.engine.report import html as H
from pipelines.engine.stats import intervals as iv

FILES = {"overview": "overview", "html": "overview.html", "json": "comparison.json"}


class CompareError(ValueError):
    """A comparison that cannot be made (one line for the console)."""


@dataclass
class Run:
    uri: str
    run_id: str
    headline: dict
    units: pa.Table
    metrics: dict

    @property
    def study(self) -> str:
        return self.headline["study"]

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        """``units`` as pandas, converted once (every subject and metric filters it)."""
        return self.units.to_pandas()


def _read(uri: str, name: str) -> bytes:
    fs, path = io.output_fs(uri)
    with fs.open_input_file(f"{path}/{name}") as f:
        return f.read()


def load_run(uri: str) -> Run:
    """A finished run's headline numbers and units; a one-line CompareError for anything else."""
    try:
        metrics = json.loads(_read(uri, "metrics.json"))
    except FileNotFoundError:
        raise CompareError(f"{uri}: no metrics.json (not a finished run directory)") from None
    except Exception as exc:  # noqa: BLE001
        raise CompareError(f"{uri}: cannot read metrics.json: {type(exc).__name__}: {exc}") from None
    if "headline" not in metrics:
        raise CompareError(no_headline(uri, metrics))
    try:
        units = pq.read_table(pa.BufferReader(_read(uri, headline.HEADLINE_UNITS_FILE)))
    except Exception as exc:  # noqa: BLE001
        raise CompareError(f"{uri}: cannot read {headline.HEADLINE_UNITS_FILE}: {type(exc).__name__}: {exc}") from None
    run_id = metrics.get("run_id") or uri.rstrip("/").rsplit("/", 1)[-1]
    return Run(uri, str(run_id), metrics["headline"], units, metrics)


def no_headline(uri: str, metrics: dict) -> str:
    """Why a run without headline numbers cannot be compared, and what to compare instead: a run of
    a command that measures no generated images (paper 002's ``captions`` and ``paraphrase``) never
    has them; only a study run made before intervals gets them by running its command again."""
    if metrics.get("stage") == "captions":
        return (f"{uri}: a captions-only run (t2i-amplification captions): it measured the training captions and "
                f"generated no images, so it has no generated side and no headline numbers (E[A]) to compare. "
                f"Compare runs of `t2i-amplification run` (the caption side, the training and the generated "
                f"images); this run's caption numbers are in its similarity_summary.csv and metrics.json "
                f"(caption_headline)")
    if metrics.get("study") == "paper002-paraphrases":
        return (f"{uri}: a paraphrase-only run (t2i-amplification paraphrase): it paraphrased captions and "
                f"generated no images, so it has no headline numbers to compare. Compare runs of "
                f"`t2i-amplification run --paraphrases` (its images from the paraphrases, App. A.6)")
    return (f"{uri}: its metrics.json has no headline numbers (a run made before intervals; run its command again "
            f"to resume it and write them)")


def model_key(identity: dict) -> str:
    """The key that joins one model across studies: its identity without the study's generation
    settings (``spec``)."""
    return headline.identity_key({k: v for k, v in identity.items() if k != "spec"})


# ------------------------------------------------------------------------------ comparability
def protocol_differences(runs: list[Run]) -> dict[str, dict[str, object]]:
    """{protocol key: {run id: value}} for every key whose value is not the same in all ``runs``."""
    keys = sorted(set().union(*(r.headline.get("protocol", {}) for r in runs)))
    out = {}
    for k in keys:
        values = {r.run_id: r.headline.get("protocol", {}).get(k, "<absent>") for r in runs}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            out[k] = values
    return out


# ------------------------------------------------------------------------------ one study
@dataclass
class Row:
    """One subject of one run in a study's table."""

    run: Run
    subject: dict

    @property
    def name(self) -> str:
        return headline.shown(self.subject)


def _unit_values(row: Row, metric: str) -> pd.DataFrame:
    df = row.run.frame
    return df[(df[headline.SUBJECT] == row.subject["key"]) & (df[headline.METRIC] == metric)]


def _replicates(u: pd.DataFrame) -> np.ndarray | None:
    """(image resamples x units) of a metric's unit rows, in their order; None where the run
    recorded none (a run made before they were, or a metric without them)."""
    if headline.REPLICATES not in u or u[headline.REPLICATES].isna().any():
        return None
    reps = [np.asarray(r, np.float64) for r in u[headline.REPLICATES]]
    if len({len(r) for r in reps}) != 1:
        return None
    return np.vstack(reps).T


def study_tables(rows: list[Row], settings: iv.IntervalSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per subject and metric: value, interval, rank, ties; one row per pair of subjects and
    metric: difference, interval, p-values, distinguishable)."""
    metrics: dict[str, dict] = {}
    for r in rows:
        for m in r.subject["metrics"]:
            metrics.setdefault(m["key"], m)
    alpha = 1 - settings.level
    table, pairs = [], []
    names = _labels(rows)
    corrected = [CC.corrected_values(r.run.metrics) for r in rows]
    for key, meta in metrics.items():
        have = [(i, r, _unit_values(r, key)) for i, r in enumerate(rows)]
        have = [(i, r, u) for i, r, u in have if len(u)]
        cis = {}
        for i, r, u in have:
            own = next((m for m in r.subject["metrics"] if m["key"] == key), {})
            if own.get("method") == "t":
                cis[i] = iv.t_interval(u[headline.VALUE].to_numpy(), settings.level)
            else:
                strata = None if u[headline.STRATUM].isna().all() else u[headline.STRATUM].fillna("").to_numpy()
                cis[i] = iv.mean_interval(u[headline.VALUE].to_numpy(), u[headline.WEIGHT].to_numpy(), strata, settings,
                                          _replicates(u))
        found, mine = [], []
        for (i, ri, ui), (j, rj, uj) in itertools.combinations(have, 2):
            a = ui.set_index(headline.UNIT)[headline.VALUE].dropna()
            b = uj.set_index(headline.UNIT)[headline.VALUE].dropna()
            shared = a.index.intersection(b.index)     # units with a value in both runs
            paired = len(shared) >= 2 and ri.run.headline.get("protocol") == rj.run.headline.get("protocol")
            ra, rb = _replicates(ui), _replicates(uj)
            if ra is not None and rb is not None:   # both runs resampled their images: the two-level test
                if paired:
                    pos_a = {x: k for k, x in enumerate(ui[headline.UNIT])}
                    pos_b = {x: k for k, x in enumerate(uj[headline.UNIT])}
                    ca, cb = [pos_a[x] for x in shared], [pos_b[x] for x in shared]
                    res = iv.two_level_test(ra[:, ca], rb[:, cb], a.loc[shared].to_numpy(), b.loc[shared].to_numpy(),
                                            True, settings)
                else:
                    res = iv.two_level_test(ra, rb, a.to_numpy(), b.to_numpy(), False, settings)
            elif paired:
                res = iv.paired_test(a.loc[shared].to_numpy(), b.loc[shared].to_numpy(), settings)
            else:
                res = iv.unpaired_test(a.to_numpy(), b.to_numpy(), settings)
            found.append((i, j, res))
        adjusted = iv.holm([res["p_value"] for *_, res in found])
        apart: dict[int, set] = {i: set() for i, *_ in have}
        for (i, j, res), p in zip(found, adjusted):
            distinct = p is not None and p < alpha
            same = _weights(rows[i]) is not None and _weights(rows[i]) == _weights(rows[j])
            if distinct:
                apart[i].add(j)
                apart[j].add(i)
            mine.append({"metric": key, "label": meta["label"], "a": names[i], "b": names[j],
                         "difference": res["difference"], "low": res["low"], "high": res["high"],
                         "p_value": res["p_value"], "p_holm": p, "distinguishable": bool(distinct),
                         "test": res["test"], "units": res["n"], "same_weights": same,
                         "same_generator": same and rows[i].subject["identity"].get("spec")
                         == rows[j].subject["identity"].get("spec"),
                         **CC.difference(corrected[i].get((rows[i].subject["name"], key)),
                                         corrected[j].get((rows[j].subject["name"], key)), settings.level)})
        CC.adjust(mine, alpha)
        pairs += mine
        order = _rank_order({i: cis[i].value for i, *_ in have}, meta["better"])
        for rank, i in enumerate(order, 1):
            ci = cis[i]
            tied = [names[j] for j in order if j != i and j not in apart[i]]
            fixed = corrected[i].get((rows[i].subject["name"], key)) or {}
            table.append({"metric": key, "label": meta["label"], "unit": meta["unit"], "better": meta["better"],
                          "scale": meta.get("scale", 1.0), "digits": meta.get("digits", 2),
                          "lead": bool(meta.get("lead", True)), "model": names[i], "run": rows[i].run.run_id,
                          "value": ci.value, "low": ci.low, "high": ci.high, "units": ci.n, "method": ci.method,
                          "rank": rank, "tied_with": ", ".join(tied), "distinguishable_from_all": not tied,
                          "corrected": fixed.get("value"), "corrected_low": fixed.get("low"),
                          "corrected_high": fixed.get("high"), "corrected_by": fixed.get("preset")})
    return pd.DataFrame(table), pd.DataFrame(pairs)


def _weights(row: Row) -> str | None:
    """The sha256 of a model subject's weights (None: not recorded, or the training data)."""
    if row.subject.get("kind", "model") != "model":
        return None
    return (row.subject.get("identity") or {}).get("weights_sha256")


def same_weight_notes(tables: dict[str, pd.DataFrame], all_pairs: dict[str, pd.DataFrame]) -> list[str]:
    """One sentence per pair of rows with the same weights: what their difference is, and what the
    units' intervals leave out."""
    notes = []
    for study, pairs in all_pairs.items():
        if not len(pairs) or "same_weights" not in pairs:
            continue
        t = tables[study]
        per_image = set(t.loc[t["unit"] == "image", "metric"])   # units that are images already
        for (a, b), part in pairs[pairs["same_weights"]].groupby(["a", "b"], sort=False):
            gen = bool(part["same_generator"].all())
            unit_only = part[~part["test"].str.contains("two-level") & ~part["metric"].isin(per_image)]
            apart = sorted(set(unit_only.loc[unit_only["distinguishable"], "label"]))
            text = f"{study}: {a} and {b} are the same weights" + (
                " and generation settings: their differences are the sampling noise of their images (other seeds)"
                if gen else "") + "."
            if len(unit_only):
                text += (f" The tests of {len(set(unit_only['label']))} metric(s) resample the study's units "
                         "(occupations, prompts, attributes), not the images within them" + (
                             f"; called distinguishable on {', '.join(apart)}: image noise these tests do not "
                             "include, not a difference of models" if apart and gen else "") + ".")
            if part["test"].str.contains("two-level").any():
                text += (" Metrics with two-level tests resample the images within the units too: a difference "
                         "they call distinguishable is more than image noise.")
            notes.append(text + " (docs/method.md, comparing runs)")
    return notes


def cell(rec: dict) -> str:
    """One row of a study table (``study_tables``) as "value [low, high]", at its metric's scale and digits."""
    return iv.Interval(rec["value"], rec["low"], rec["high"], rec["method"], rec["units"], 0.0).text(
        rec["digits"], rec["scale"])


def corrected_cell(rec: dict) -> str:
    """The row's value corrected by people's labels as ``cell`` shows a value; "" where it has none."""
    if rec["corrected"] is None or pd.isna(rec["corrected"]):
        return ""
    return cell({**rec, "value": rec["corrected"], "low": rec["corrected_low"], "high": rec["corrected_high"]})


def _rank_order(values: dict[int, float | None], better: str) -> list[int]:
    def key(i):
        v = values[i]
        if v is None:
            return (1, 0.0)
        return (0, {"lower": v, "higher": -v, "zero": abs(v)}[better])
    return sorted(values, key=lambda i: (key(i), i))


def _labels(rows: list[Row]) -> list[str]:
    """Subject names, with the run id where one name occurs in several rows."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.name] = counts.get(r.name, 0) + 1
    return [r.name if counts[r.name] == 1 else f"{r.name} ({r.run.run_id})" for r in rows]


# ------------------------------------------------------------------------------ all studies
@dataclass
class Comparison:
    runs: list[Run]
    tables: dict[str, pd.DataFrame]
    pairs: dict[str, pd.DataFrame]
    overview: pd.DataFrame
    differences: dict[str, dict]
    settings: iv.IntervalSettings
    same_weights: list[str]            # same_weight_notes: console, comparison.json and the page
    corrected: list[str]               # compare_corrected.notes: where people's labels correct a metric

    @property
    def standin(self) -> bool:
        return any(r.headline.get("standin") for r in self.runs)


def compare(runs: list[Run], settings: iv.IntervalSettings, allow_mismatch: bool = False) -> Comparison:
    seen: dict[str, int] = {}
    for r in runs:   # two runs of one id (copies, two output roots): told apart by where they are
        seen[r.run_id] = seen.get(r.run_id, 0) + 1
    for r in runs:
        if seen[r.run_id] > 1:
            r.run_id = f"{r.run_id} ({r.uri})"
    by_study: dict[str, list[Run]] = {}
    for r in runs:
        by_study.setdefault(r.study, []).append(r)
    differences = {s: protocol_differences(rs) for s, rs in by_study.items()}
    bad = {s: d for s, d in differences.items() if d}
    if bad and not allow_mismatch:
        lines = [f"{s}: {k} differs ({'; '.join(f'{rid}: {_short(v)}' for rid, v in vals.items())})"
                 for s, d in bad.items() for k, vals in d.items()]
        raise CompareError("runs with different protocols measure different things: " + " | ".join(lines)
                           + " (--allow-mismatch compares them anyway, listing the differences)")
    tables, pairs = {}, {}
    for s, rs in by_study.items():
        rows = [Row(r, sub) for r in rs for sub in r.headline["subjects"]]
        tables[s], pairs[s] = study_tables(rows, settings)
    return Comparison(runs, tables, pairs, overview(runs, tables), differences, settings,
                      same_weight_notes(tables, pairs), CC.notes(tables))


def _short(v, n: int = 60) -> str:
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return s if len(s) <= n else s[:n - 3] + "..."


def overview(runs: list[Run], tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per model (joined across studies on its identity), one column group per study:
    each lead headline metric (``Metric.lead``) as "value [low, high]" with its rank."""
    key_of, name_of = {}, {}
    for r in runs:
        for s in r.headline["subjects"]:
            mk = model_key(s["identity"]) if s.get("kind", "model") == "model" else f"data:{s['name']}"
            key_of[(r.run_id, headline.shown(s))] = mk
            name_of.setdefault(mk, headline.shown(s))
    cells: dict[str, dict] = {}
    for study, t in tables.items():
        for rec in t[t["lead"]].to_dict("records") if len(t) else []:   # the lead numbers; the rest: study tables
            run_name = rec["model"].split(" (")[0]
            mk = key_of.get((rec["run"], run_name))
            row = cells.setdefault(mk, {"model": name_of.get(mk, rec["model"])})
            tie = "" if rec["distinguishable_from_all"] else "="
            row[f"{study} | {rec['label']}"] = f"{cell(rec)} (#{rec['rank']}{tie})"
    return pd.DataFrame(list(cells.values()))


# ------------------------------------------------------------------------------ writing
def forest_figure(t: pd.DataFrame, metric: str):
    """Each model's value with its interval for one metric (a forest plot), best rank on top."""
    part = t[t["metric"] == metric].sort_values("rank")
    scale = float(part["scale"].iloc[0]) if len(part) else 1.0
    fig = figures.new_figure(6.0, 0.45 * max(2, len(part)) + 0.9)
    ax = fig.add_subplot()
    y = np.arange(len(part))[::-1]
    for yi, rec in zip(y, part.to_dict("records")):
        if rec["value"] is None or pd.isna(rec["value"]):
            continue
        v = rec["value"] * scale
        if rec["low"] is not None and not pd.isna(rec["low"]):
            ax.plot([rec["low"] * scale, rec["high"] * scale], [yi, yi], color=page.COLORS[0], lw=2)
        ax.plot([v], [yi], "o", color=page.COLORS[0] if rec["distinguishable_from_all"] else page.COLORS[1])
    if part["better"].iloc[0] == "zero" if len(part) else False:
        ax.axvline(0, color="#888", lw=0.8, ls="--")
    ax.set_yticks(y, [f"#{r} {m}" for r, m in zip(part["rank"], part["model"])])
    ax.set_xlabel(part["label"].iloc[0] if len(part) else metric)
    ax.grid(axis="x", alpha=0.3)
    return fig


def write(c: Comparison, output: str) -> dict:
    """Write the tables, pairs, overview, figures, comparison.json and the HTML page under ``output``."""
    fs, root = io.output_fs(output)
    files = []
    for study, t in c.tables.items():
        io.write_table_and_csv(pa.Table.from_pandas(t, preserve_index=False), fs, f"{root}/{study}")
        io.write_table_and_csv(pa.Table.from_pandas(c.pairs[study], preserve_index=False) if len(c.pairs[study])
                               else pa.table({"metric": pa.array([], pa.string())}), fs, f"{root}/{study}-pairs")
        files += [f"{study}.csv", f"{study}-pairs.csv"]
    io.write_table_and_csv(pa.Table.from_pandas(c.overview, preserve_index=False), fs, f"{root}/{FILES['overview']}")
    figs = figures.FigureDir(fs, root)
    sections = []
    for study, t in c.tables.items():
        plots = [figs.save(forest_figure(t, m), f"forest-{study}-{m}", caption=f"{study}: {t[t['metric'] == m]['label'].iloc[0]}")
                 for m in dict.fromkeys(t["metric"])] if len(t) else []
        sections.append(_study_html(study, t, c.pairs[study], plots))
    record = {"runs": [{"uri": r.uri, "run_id": r.run_id, "study": r.study, "standin": r.headline.get("standin")}
                       for r in c.runs],
              "interval": c.settings.record(), "correction": "Holm (per study and metric, over all pairs of models)",
              "distinguishable": f"Holm-adjusted p < {1 - c.settings.level:.2f}",
              "protocol_differences": c.differences, "same_weights": c.same_weights, "corrected_by_people": c.corrected,
              "files": files + [f"{FILES['overview']}.csv", FILES["html"]]}
    io.write_text(json.dumps(io.clean_json(record), indent=2, sort_keys=True), fs, f"{root}/{FILES['json']}")
    io.write_text(render_html(c, sections), fs, f"{root}/{FILES['html']}")
    models = [{"role": f"generator ({r.study})", "model": headline.shown(s), "standin": r.headline.get("standin"),
               "detail": s.get("identity", {})} for r in c.runs for s in r.headline["subjects"]]
    description = (f"{len(c.runs)} finished runs of {len(c.tables)} studies ({', '.join(c.tables)}) side by side: each "
                   f"headline metric per model with its interval, rank and the models it cannot be told apart from "
                   f"({record['correction']}; distinguishable: {record['distinguishable']}).")
    dataset_card.write(fs, root, "t2i compare: " + ", ".join(c.tables), "compare",
                       {"models": models, "studies": sorted(c.tables),
                        "headline": {"standin": c.standin}}, description,
                       f"`{FILES['json']}` records the runs compared, the interval settings, the correction and any "
                       f"protocol differences; `{FILES['html']}` is the page with the forest plots.")
    return record


def _study_html(study: str, t: pd.DataFrame, pairs: pd.DataFrame, plots: list[str]) -> str:
    fixed = len(t) and t["corrected"].notna().any()
    shown = t.assign(value=[cell(r) for r in t.to_dict("records")],
                     corrected=[corrected_cell(r) for r in t.to_dict("records")] if len(t) else [])
    shown = shown[["label", "rank", "model", "value", *(["corrected"] if fixed else []), "units", "tied_with",
                   "run"]].rename(columns={"value": "value [interval]", "corrected": "corrected by people [interval]",
                                           "tied_with": "not distinguishable from"})
    pair_html = H.table(pairs[["label", "a", "b", "difference", "low", "high", "p_value", "p_holm",
                               "distinguishable", "test", "units", "same_weights",
                               *(["corrected_difference", "corrected_p_holm", "corrected_distinguishable"]
                                 if fixed else [])]], digits=3) if len(pairs) \
        else "<p>one model: no pairs</p>"
    return (f"<h2 id='{H.esc(study)}'>{H.esc(study)}</h2>" + H.scroll(H.table(shown, digits=3))
            + f"<div class=figs>{''.join(plots)}</div>" + page.details("Every pair of models", H.scroll(pair_html)))


def render_html(c: Comparison, sections: list[str]) -> str:
    notes = c.same_weights
    runs = pd.DataFrame([{"run": r.run_id, "study": r.study, "where": r.uri,
                          "models": ", ".join(headline.shown(s) for s in r.headline["subjects"])} for r in c.runs])
    diffs = [f"<li>{H.esc(s)}: {H.esc(k)}: " + "; ".join(f"{H.esc(rid)} = {H.esc(_short(v))}" for rid, v in vals.items())
             + "</li>" for s, d in c.differences.items() for k, vals in d.items()]
    lead = (H.scroll(H.table(c.overview)) + "<p class=behind>Each cell: value [interval] (#rank; <b>=</b> when the "
            "model cannot be told apart from at least one other at the corrected level). " + H.esc(
                headline.method_text(c.settings.record())) + " Pairs: paired sign-flip permutation test on the units "
            "two runs share (else unpaired label permutation), Holm-adjusted over all pairs of a metric.</p>")
    body = [page.standin_banner("At least one run used stand-in models.") if c.standin else "",
            page.headline(lead, [f"{len(c.runs)} runs", f"{len(c.tables)} studies"], title="Models compared"),
            "<h2>Runs</h2>" + H.table(runs),
            ("<h2>Protocol differences (compared with --allow-mismatch)</h2><ul>" + "".join(diffs) + "</ul>") if diffs else "",
            ("<h2>Runs of the same weights</h2><ul>" + "".join(f"<li>{H.esc(n)}</li>" for n in notes) + "</ul>")
            if notes else "",
            ("<h2>Corrected by people</h2><ul>" + "".join(f"<li>{H.esc(n)}</li>" for n in c.corrected) + "</ul>")
            if c.corrected else "",
            *sections]
    return page.document("t2i compare", body)


# ------------------------------------------------------------------------------ CLI
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t2i compare", description="finished runs of any studies side by side: "
                                "headline metrics with intervals, ranks and which differences are distinguishable")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR_OR_URI", help="finished run directories (local or fsspec URIs)")
    arguments.add_output(p)
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare runs whose protocols differ (prompts, seeds, classifier, thresholds), listing the "
                        "differences, instead of refusing")
    arguments.add_intervals(p)
    publish.add_arguments(p)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        publish.check(args)
        settings = arguments.interval_settings(args)
        runs = [load_run(u) for u in args.runs]
        c = compare(runs, settings, args.allow_mismatch)
        record = write(c, args.output)
        publish.after_run(args, args.output, "t2i-compare", args.output.rstrip("/").rsplit("/", 1)[-1], {}, record)
    except (CompareError, ValueError, io.InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"compared {len(runs)} runs of {len(c.tables)} studies: {args.output}/{FILES['html']}")
    for study, t in c.tables.items():
        for rec in t.to_dict("records"):
            tie = f" (not distinguishable from {rec['tied_with']})" if rec["tied_with"] else ""
            fixed = corrected_cell(rec)
            print(f"  {study} | {rec['label']} | #{rec['rank']} {rec['model']}: {cell(rec)}{tie}"
                  + (f"; corrected by people {fixed}" if fixed else ""))
    for note in [*c.same_weights, *c.corrected]:
        print(f"note: {note}")
    if c.standin:
        print(page.STANDIN_CONSOLE)
    return 0
