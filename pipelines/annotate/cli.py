"""``t2i annotate``: people in the loop.

    t2i annotate plan RUN_DIR --protocol gep --output TASKS_DIR [--n N | --n-per-stratum K] [--seed S]
    t2i annotate plan RUN_DIR ... [--target-width W | --budget N [--allocation neyman]] [--pilot TASKS_DIR]
    t2i annotate serve TASKS_DIR [--host 127.0.0.1 --port 8765] [--annotators alice,bob]
    t2i annotate import TASKS_DIR FILE --format {table,label-studio,crowd-csv}
    t2i annotate export TASKS_DIR --format {table,label-studio,crowd-csv,gep-annotations} --output PATH
    t2i annotate simulate TASKS_DIR [--annotators 3 --error-rate 0.1 --unsure-rate 0.05]
    t2i annotate report TASKS_DIR
    t2i annotate agreement LABELS [--level ordinal --order 1,2,3] [--unsure unsure]
    t2i annotate estimate TASKS_DIR [--positive female] [--method ppi|rogan-gladen|both] [--ppi cross-fit|package]
    t2i annotate estimate --predictions PRED --labels LABELS --drawn-at-random --positive C --output DIR

Errors in the input (a file, a label, a setting) are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from pipelines.annotate import dalleval_corrected as DC
from pipelines.annotate import derived as D
from pipelines.annotate import gep_corrected as GC
from pipelines.annotate import estimate as E
from pipelines.annotate import interchange as X
from pipelines.annotate import plan as PL
from pipelines.annotate import report as R
from pipelines.annotate.agreement import LEVELS, majority
from pipelines.annotate.protocols import PRESETS, YES
from pipelines.annotate.simulate import simulate
from pipelines.annotate.store import AnswerStore
from pipelines.annotate.tasks import ANSWERS_DB, AnnotateError, TaskSet, check_labels
from pipelines.engine.stats import intervals as I
from schemas import annotation as A

FORMATS = ("table", "label-studio", "crowd-csv")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t2i annotate", description="human labels of a finished run: task sets, "
                                "imports, agreement (Krippendorff's alpha, the classifier against the majority)")
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="draw a protocol's items from a finished run into a task set")
    pl.add_argument("run_dir")
    pl.add_argument("--protocol", required=True, choices=[*PRESETS, "custom"])
    pl.add_argument("--output", required=True, help="the task set's folder (new or empty)")
    size = pl.add_mutually_exclusive_group()
    size.add_argument("--n", type=int, help="images in all, split equally over the strata (the preset's by default)")
    size.add_argument("--n-per-stratum", type=int, help="images per stratum")
    size.add_argument("--target-width", type=float, help="label budget planner: images per stratum for a 95%% "
                      "interval of at most this full width on each stratum's corrected share")
    size.add_argument("--budget", type=int, help="label budget planner: images in all, allocated where they narrow "
                      "the headline interval most (--allocation)")
    pl.add_argument("--allocation", choices=["neyman", "equal-width"], default="neyman",
                    help="--budget: neyman (the pooled share; n_h ~ N_h sigma_h) or equal-width (the widest "
                         "stratum's; n_h ~ sigma_h^2)")
    pl.add_argument("--pilot", help="planner: an earlier task set with answers, for the classifier's disagreement "
                                    "rate per stratum")
    pl.add_argument("--assumed-disagreement", type=float, default=0.25,
                    help="planner without --pilot: the classifier's disagreement rate with people (0.25: as if "
                         "there were no classifier)")
    pl.add_argument("--annotators", type=int, help="answers wanted per item (the preset's by default)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--strata", help="comma-separated columns to draw within ('' for none; the preset's by default)")
    pl.add_argument("--custom", help="--protocol custom: the YAML file (question, choices, where, ...)")
    pl.add_argument("--known-answers", help="CSV of attention-check items (image_id, answer; subject where items "
                                            "have one): shown like the others, left out of the estimates")
    sv = sub.add_parser("serve", help="the labelling page (a local web app; answers go to answers.sqlite)")
    sv.add_argument("tasks_dir")
    sv.add_argument("--host", default="127.0.0.1", help="another address than 127.0.0.1 needs --annotators")
    sv.add_argument("--port", type=int, default=8765, help="0: any free port")
    sv.add_argument("--annotators", help="comma-separated names: each gets a secret link (tokens in annotators.json)")
    im = sub.add_parser("import", help="add answers from a label table, Label Studio's JSON export or a crowd CSV")
    im.add_argument("tasks_dir")
    im.add_argument("file")
    im.add_argument("--format", choices=FORMATS, default="table")
    for role, default in X.CROWD_COLUMNS.items():
        im.add_argument(f"--{role}-column", default=default, help=f"crowd CSV: the {role} column ({default})")
    ex = sub.add_parser("export", help="the tasks for Label Studio or a crowd platform, or the answers")
    ex.add_argument("tasks_dir")
    ex.add_argument("--format", choices=[*FORMATS, "gep-annotations"], required=True)
    ex.add_argument("--output", required=True)
    ex.add_argument("--image-base", help="URL prefix of the task set's images/ folder as the tool will see it")
    si = sub.add_parser("simulate", help="answers of simulated annotators (marked simulated): demo and tests only")
    si.add_argument("tasks_dir")
    si.add_argument("--annotators", type=int, default=3)
    si.add_argument("--error-rate", type=float, default=0.1)
    si.add_argument("--unsure-rate", type=float, default=0.05)
    si.add_argument("--seed", type=int, default=0)
    for name, helptext in (("report", "agreement of a task set's answers"),):
        rp = sub.add_parser(name, help=helptext)
        rp.add_argument("tasks_dir")
        _interval_flags(rp)
    ag = sub.add_parser("agreement", help="Krippendorff's alpha and the majority of any long label table")
    ag.add_argument("labels", help="CSV or parquet with item_id, annotator, answer")
    ag.add_argument("--level", choices=LEVELS, default="nominal")
    ag.add_argument("--order", help="ordinal: the answers from lowest to highest, comma-separated")
    ag.add_argument("--unsure", help="the answer that means 'cannot tell' (a missing value for alpha)")
    _interval_flags(ag)
    es = sub.add_parser("estimate", help="the classifier's proportions per stratum corrected by people's labels "
                        "(PPI++; Rogan-Gladen as an option), with the unsure share")
    es.add_argument("tasks_dir", nargs="?", help="a task set: its run's classifier answers and its answers")
    es.add_argument("--predictions", help="CSV or parquet: item_id, stratum, prediction (optionally score) of "
                                          "every item the classifier answered")
    es.add_argument("--labels", help="CSV or parquet: item_id, annotator, answer (default: the task set's answers)")
    es.add_argument("--drawn-at-random", action="store_true",
                    help="labels without a task set: state that their items are a simple random sample of each stratum")
    es.add_argument("--positive", help="the class whose share is estimated (the preset's: female, or yes)")
    es.add_argument("--unsure", help="the answer meaning 'cannot tell' (the task set's by default)")
    es.add_argument("--method", choices=["ppi", "rogan-gladen", "both"], default="ppi")
    es.add_argument("--ppi", choices=list(E.K.VARIANTS), default=E.K.CROSSFIT,
                    help="PPI++ with lambda cross-fitted over two folds and a small-sample variance (default: "
                         "covers at its level from 40 labels on), or ppi_py's as packaged (short with few labels)")
    es.add_argument("--output", help="folder for estimates.csv/.parquet/.json (default: TASKS_DIR/estimate)")
    es.add_argument("--interval-level", type=float, default=0.95)
    es.add_argument("--resamples", type=int, default=200,
                    help="paper002-a4: bootstrap resamples of E[A] from corrected percentages")
    return p


def _interval_flags(p):
    p.add_argument("--interval-level", type=float, default=0.95)
    p.add_argument("--interval-resamples", type=int, default=2000)
    p.add_argument("--interval-seed", type=int, default=0)


def _settings(args) -> I.IntervalSettings:
    return I.IntervalSettings(level=args.interval_level, resamples=args.interval_resamples, seed=args.interval_seed,
                              method="percentile")


def _store(tasks: TaskSet) -> AnswerStore:
    return AnswerStore(tasks.path / ANSWERS_DB)


def cmd_plan(a) -> int:
    strata = None if a.strata is None else [s for s in a.strata.split(",") if s]
    out = PL.plan(a.run_dir, a.protocol, a.output, n=a.n, n_per_stratum=a.n_per_stratum, annotators=a.annotators,
                  seed=a.seed, strata=strata, custom=a.custom, known_answers=a.known_answers,
                  target_width=a.target_width, budget=a.budget, pilot=a.pilot,
                  assumed_disagreement=a.assumed_disagreement, allocation=a.allocation)
    tasks = TaskSet.load(out)
    per = tasks.meta["drawing"]["per_stratum"]
    planned = tasks.meta["drawing"].get("planner") or {}
    print(f"{len(tasks.items)} items ({sum(v['drawn'] for v in per.values())} images) for {a.protocol} in {out}")
    for stratum, v in per.items():
        width = (planned.get("per_stratum") or {}).get(stratum, {}).get("expected_width")
        print(f"  {stratum}: {v['drawn']} of {v['units']} images"
              + (f" (expected 95% width of its corrected share: {width:.3f})" if width is not None else ""))
    if planned.get("pooled_expected_width") is not None:
        print(f"  pooled over the strata: expected 95% width {planned['pooled_expected_width']:.3f} "
              f"(disagreement: {planned['disagreement']})")
    return 0


def cmd_serve(a) -> int:
    from pipelines.annotate.server import serve   # deferred: Flask, which only the page needs

    serve(a.tasks_dir, a.host, a.port, [n for n in (a.annotators or "").split(",") if n] or None)
    return 0


def cmd_import(a) -> int:
    tasks = TaskSet.load(a.tasks_dir)
    rejected = 0
    if a.format == "table":
        labels, origin = X.read_table(a.file), A.Origin.TABLE
    elif a.format == "label-studio":
        labels, origin = X.import_label_studio(a.file), A.Origin.LABEL_STUDIO
    else:
        labels, rejected = X.import_crowd_csv(a.file, a.item_column, a.worker_column, a.answer_column)
        origin = A.Origin.CROWD_CSV
    checked = check_labels(tasks, labels, a.file)
    if A.ANSWERED_AT in labels:
        checked[A.ANSWERED_AT] = labels[A.ANSWERED_AT].to_numpy()
    done = _store(tasks).record_many(checked, origin)
    print(f"{a.file}: {done['new']} new answers, {done['replaced']} replaced an earlier answer of the same "
          f"annotator (the last kept), {done['same']} unchanged" + (f"; {rejected} rejected assignments left out"
                                                                   if rejected else ""))
    return 0


def cmd_export(a) -> int:
    tasks = TaskSet.load(a.tasks_dir)
    if a.format == "label-studio":
        for f in X.export_label_studio(tasks, a.output, a.image_base):
            print(f)
    elif a.format == "crowd-csv":
        print(X.export_crowd_csv(tasks, a.output, a.image_base))
    elif a.format == "table":
        X.write_table(_store(tasks).labels(), a.output)
        print(a.output)
    else:
        print(export_gep(tasks, a.output))
    return 0


def export_gep(tasks: TaskSet, path) -> str:
    """The majority label of each (image, attribute) as ``gep evaluate --annotations`` reads it
    (model, image_id, attribute, present); ties and unsure majorities are left out and counted."""
    if tasks.protocol["name"] != "gep":
        raise AnnotateError(f"{tasks.path}: gep-annotations needs a gep task set, not {tasks.protocol['name']}")
    m = majority(_store(tasks).labels(), tasks.unsure)
    df = tasks.items.merge(m, on=A.ITEM_ID)
    decided = df[df[A.MAJORITY_STATUS] == A.MajorityStatus.MAJORITY]
    out = pd.DataFrame({"model": decided["model"], "image_id": decided[A.IMAGE_ID], "attribute": decided["attribute"],
                        "present": (decided[A.MAJORITY] == YES).astype(int)})
    X.write_table(out, path)
    left = len(df) - len(decided)
    return f"{path}: {len(out)} (image, attribute) majority labels" + (f"; {left} without a majority left out"
                                                                      if left else "")


def cmd_simulate(a) -> int:
    tasks = TaskSet.load(a.tasks_dir)
    labels = simulate(tasks.items, tasks.choices, tasks.unsure, a.annotators, a.error_rate, a.unsure_rate, a.seed)
    done = _store(tasks).record_many(labels, A.Origin.SIMULATED)
    print(f"{done['new'] + done['replaced']} answers of {a.annotators} SIMULATED annotators (error rate {a.error_rate},"
          f" unsure rate {a.unsure_rate}): not people; for the demo and the tests")
    return 0


def cmd_report(a) -> int:
    tasks = TaskSet.load(a.tasks_dir)
    built = R.build(tasks, _store(tasks).labels(), _settings(a))
    out = R.write(tasks, built)
    print(R.text(built))
    print(f"written to {out}")
    for f in R.attach_to_run(tasks, built):
        print(f"updated {f} (Checked by people)")
    return 0


def cmd_agreement(a) -> int:
    labels, replaced = X.plain_labels(X.read_table(a.labels), a.labels)
    if labels.empty:
        raise AnnotateError(f"{a.labels}: no labels in the file")
    if replaced:
        print(f"{a.labels}: {replaced} earlier answers of an annotator to the same item replaced by their last")
    answers = sorted(set(labels[A.ANSWER]) - {a.unsure})
    if a.order:
        scale = [s.strip() for s in a.order.split(",")]
        outside = sorted(set(answers) - set(scale))
        if outside:
            raise AnnotateError(f"{a.labels}: answers {', '.join(outside)} are not in --order")
    elif a.level == "ordinal":
        raise AnnotateError("--level ordinal needs --order (the answers from lowest to highest)")
    else:
        scale = answers
    settings = _settings(a)
    block = R.alpha_block(labels, scale, a.level, settings)
    al = I.Interval(**block["alpha"])
    m = majority(labels, a.unsure)
    print(f"{a.labels}: {block['answers']} answers by {block['annotators']} annotators on {block['items']} items")
    print(f"Krippendorff's alpha ({a.level}): {al.text(3)} over {block['items_pairable']} items with two answers or more")
    print("majority per item: " + ", ".join(f"{k} {v}" for k, v in m[A.MAJORITY_STATUS].value_counts().items()))
    return 0


def derived_numbers(tasks: TaskSet, labels, a) -> tuple[list, list[str]]:
    """The numbers a preset's study derives from the corrected shares, and where the correction
    changes one: paper 002's E[A], GEP's frequencies and scores, DALL-Eval's gender MAD."""
    name = tasks.protocol["name"]
    if name == "paper002-a4":
        table = D.amplification(tasks, labels, a.resamples, a.interval_level, variant=a.ppi)
        return [E.Derived("amplification", "amplification_corrected", "E[A] from corrected % female (paper 002, "
                          "Table 3 and section 6)", "Groups without two labelled images keep the classifier's "
                          "percentage; the counts beside are over the whole computation (every group of every T "
                          "and G).", table, ["model", "approach", "classifier", A.CORRECTED, "groups_corrected",
                                             "groups_uncorrected"])], D.sign_changes(table)
    if name == "gep":
        freq, scores = GC.corrected_gep(tasks, labels, a.resamples, a.interval_level, variant=a.ppi)
        return [E.Derived("gep_scores", "gep_scores_corrected", "GEP scores from corrected frequencies (paper 001, "
                          "Eq. 2)", "auto: CLS's frequencies (GEP_auto); human: people's labels alone (GEP_human "
                          "on the drawn images); corrected: CLS's corrected toward people's. Each over the "
                          "attributes counted beside it.", scores,
                          ["model", "setting", "comparison", "auto", "human", A.CORRECTED, "corrected_attributes"]),
                E.Derived("gep_frequencies", "gep_frequencies_corrected", "Attribute frequencies corrected toward "
                          "GEP_human (paper 001, Eq. 1)", "Per model, setting, gender and attribute: CLS's mean "
                          "score, people's share on the labelled images, and the corrected share; a cell with "
                          "fewer than two decided labels has none.", freq,
                          ["model", "setting", "gender", "attribute", A.ITEMS, A.LABELLED, A.DECIDED, "auto", "human",
                           A.CORRECTED, A.FLAG], 3)], GC.ranking_changes(scores)
    if name == "dalleval-social":
        table = DC.corrected_mad(tasks, labels, a.resamples, a.interval_level)
        return [E.Derived("gender_mad", "gender_mad_corrected", "Gender MAD and average gender from corrected shares "
                          "(paper 000, Table 8)", "Over the neutral prompts with a detected gender; the detector's "
                          "sensitivity and specificity from the labelled images people and the detector both decided.",
                          table, ["model", "prompts", A.DECIDED, "sensitivity", "specificity", "classifier",
                                  A.CORRECTED, "classifier_average", "corrected_average", A.FLAG], 3)], \
            E.order_changes(table, "gender MAD", "classifier", A.CORRECTED)
    return [], []


def cmd_estimate(a) -> int:
    tasks = TaskSet.load(a.tasks_dir) if a.tasks_dir else None
    if tasks is None and not (a.predictions and a.labels):
        raise AnnotateError("estimate needs a task set, or --predictions and --labels")
    if tasks is None and not a.drawn_at_random:
        raise AnnotateError(f"{a.labels}: {E.NOT_RANDOM}")
    if tasks is None and not a.output:
        raise AnnotateError("--output is needed without a task set")
    if not 0.5 <= a.interval_level < 1:
        raise AnnotateError(f"--interval-level must be in [0.5, 1), not {a.interval_level}")
    if a.predictions:
        pred = E.check_predictions(X.read_table(a.predictions), a.predictions)
    else:
        pred = E.check_predictions(E.run_predictions(tasks), f"{tasks.meta['run']['path']} (the task set's run)")
    if a.labels:
        raw = X.read_table(a.labels)
        labels = check_labels(tasks, raw, a.labels) if tasks is not None else X.plain_labels(raw, a.labels)[0]
        simulated = 0
    else:
        stored = _store(tasks).labels()
        simulated = int((stored[A.ORIGIN] == A.Origin.SIMULATED).sum())
        labels = stored[list(A.LABEL_COLUMNS)]
    if tasks is not None:
        labels = E.labels_of(tasks, labels)
    if labels.empty:
        raise AnnotateError("no answers to correct with (known-answer items never count)")
    positive = a.positive or (E.default_positive(tasks) if tasks is not None else None)
    if positive is None:
        raise AnnotateError("--positive: which class's share to estimate")
    unsure = a.unsure if a.unsure is not None else (tasks.unsure if tasks is not None else None)
    methods = {"ppi": (E.K.PPI,), "rogan-gladen": (E.K.ROGAN_GLADEN,), "both": E.K.METHODS}[a.method]
    table = E.estimate(pred, labels, positive, unsure, methods, a.interval_level, a.ppi)
    meta = {"positive": positive, "unsure": unsure, "methods": list(methods), "ppi": a.ppi,
            "interval_level": a.interval_level,
            "drawn": E.DRAWN_BY_PLAN if tasks is not None else E.DRAWN_STATED,
            "predictions": a.predictions or "the task set's run", "labels": a.labels or "the task set's answers",
            "answers": int(len(labels)), "annotators": int(labels[A.ANNOTATOR].nunique()),
            "simulated_answers": simulated, "estimand": "the share of the positive class among the items people "
            "could decide (majority neither unsure nor a tie); the classifier's share over every item it answered"}
    name = tasks.protocol["name"] if tasks is not None else "estimate"
    derived, said = derived_numbers(tasks, labels, a) if tasks is not None and not a.predictions else ([], [])
    out, html, record = E.write(a.output or tasks.path / "estimate", table, meta, name, derived, said)
    print(E.text(table, positive))
    for line in record["conclusions"]:
        print(f"the correction changes a conclusion: {line}")
    if simulated:
        print(f"note: {simulated} of the answers are SIMULATED annotators', not people's")
    print(f"written to {out}")
    if tasks is not None:
        for f in R.attach_block(tasks, E.CORRECTED_MARK, html, "corrected_by_people", record):
            print(f"updated {f} (Corrected by people)")
    return 0


COMMANDS = {"plan": cmd_plan, "serve": cmd_serve, "import": cmd_import, "export": cmd_export, "simulate": cmd_simulate,
            "report": cmd_report, "agreement": cmd_agreement, "estimate": cmd_estimate}


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (AnnotateError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
