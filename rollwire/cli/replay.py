"""`rollwire replay score` and `replay train`: re-score a recorded run into a shadow prefix, retrain
from one of its checkpoints; each with a report."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollwire.cli.options import add_command_group, add_run_options, add_step, recorded_run


def add_replay(sub) -> None:
    commands = add_command_group(sub, "replay", metavar="STEP",
                                 help="re-score or retrain a recorded run into shadow topics and report what changed",
                                 description="Takes a recorded run apart after the fact, never touching its topics.")
    score = add_step(
        commands, "score", help="re-run group rewards and advantages over the recorded rollouts",
        description="Reads the run's recorded rollouts, scores them with the live scorer's own state machine\n"
                    "(with the run's settings, or a changed recipe or algorithm), writes the results as\n"
                    "`<into>.scored` and `<into>.drops` on the same log, and compares them with what the run\n"
                    "recorded: reward and advantage per environment before and after, sign flips, the\n"
                    "largest changes, groups left with no signal. With nothing changed the shadow events\n"
                    "equal the recorded ones.",
        epilog="examples:\n"
               "  rollwire replay score --run-dir runs/demo --into demo-check\n"
               "  rollwire replay score --run-dir runs/demo --into demo-rloo --algorithm rloo\n"
               "  rollwire replay score --run-dir runs/demo --into demo-nobonus --recipe examples/no_group_bonus.toml\n"
               "  rollwire replay score --run-dir runs/demo --into demo-backfill --reward-module "
               "examples/strict_match_reward.py\n"
               "  rollwire replay score --bus kafka --prefix run7 --into run7-nostd --algorithm grpo-nostd\n\n"
               "outputs: the report is printed, and written with a histogram of the advantages to\n"
               "<run-dir>/replays/<into>/ (or ./replays/<into>/ without --run-dir)")
    score.add_argument("--into", required=True, metavar="PREFIX", help="shadow topic prefix to write (never the run's)")
    score.add_argument("--recipe", type=Path,
                       help="a changed recipe (TOML): its [scorer] table and its environments' algorithms apply")
    score.add_argument("--algorithm", action="append", default=[], metavar="[ENV=]NAME",
                       help="advantage algorithm for every environment, or for ENV (repeatable)")
    score.add_argument("--reward-module", type=Path, metavar="FILE.py",
                       help="judge every rollout again with the @reward functions in this file: their weighted "
                            "sum replaces the recorded reward (the task comes from `tasks`, the answer from `traces`)")
    score.add_argument("--from", dest="start", metavar="WHEN",
                       help="first group taken: `step:N` (groups trainer step N used, on), `offset:N` (groups "
                            "whose first rollout is at offset N or later of its rollouts partition), a UTC time "
                            "2026-12-01T17:05[:SS], or epoch milliseconds (groups first recorded then, on)")
    score.add_argument("--to", dest="end", metavar="WHEN", help="last group taken, in the same form as --from")
    score.add_argument("--report-dir", type=Path, help="where report.md and advantages.png go")
    add_run_options(score)
    score.set_defaults(run=cmd_replay_score)

    train = add_step(
        commands, "train", help="retrain from a trainer checkpoint over recorded or re-scored rollouts",
        description="Loads the run's trainer checkpoint of --from-step (model, optimizer and random state; 0:\n"
                    "the run's starting weights) and trains each later step again on exactly the rollouts that\n"
                    "step trained, in the same order, with the run's trainer settings: no inference, no\n"
                    "environments. The rollouts come as the run scored them, or as a `replay score` shadow\n"
                    "scored them (--scored). Steps and weights go out as policy <into>: `<into>.train`,\n"
                    "`<into>.weights` and `<into>/v<version>` in the run's object store. Each version is\n"
                    "compared with the one the run published: over the run's own scores, on CPU, they are\n"
                    "byte for byte the same; otherwise the report gives the largest weight difference.",
        epilog="examples:\n"
               "  rollwire replay train --run-dir runs/demo --into demo-again               # reproduce the run\n"
               "  rollwire replay train --run-dir runs/demo --from-step 40 --into demo-again\n\n"
               "a reward-bug backfill: re-score with the fixed reward, retrain from the last good step:\n"
               "  rollwire replay score --run-dir runs/demo --into demo-fixed --reward-module "
               "examples/strict_match_reward.py --from step:51\n"
               "  rollwire replay train --run-dir runs/demo --scored demo-fixed --from-step 50 --into demo-fixed\n\n"
               "outputs: the report is printed, and written to <run-dir>/replays/<into>/train-report.md;\n"
               "checkpoints of --from-step > 0 must still be on disk (trainer.keep_checkpoints)")
    train.add_argument("--run-dir", type=Path, required=True,
                       help="the run's directory: its recipe.json gives the log, the store and the trainer settings")
    train.add_argument("--into", required=True, metavar="NAME",
                       help="policy name and topic prefix to write (never the run's own)")
    train.add_argument("--scored", metavar="PREFIX",
                       help="read scored rollouts under this prefix, e.g. a `replay score --into` shadow "
                            "(default: the run's own)")
    train.add_argument("--from-step", type=int, default=0, metavar="N",
                       help="start from the trainer's checkpoint of step N (default 0: the starting weights)")
    train.add_argument("--to-step", type=int, metavar="M", help="last step to retrain (default: the run's last)")
    train.add_argument("--report-dir", type=Path, help="where train-report.md goes")
    train.set_defaults(run=cmd_replay_train)


def _when(text: str | None, flag: str) -> tuple[str, int] | None:
    """("step", N) or ("ms", epoch ms) from a --from/--to value."""
    import datetime
    if text is None:
        return None
    if text.startswith("step:") and text[5:].isdigit():
        return "step", int(text[5:])
    if text.startswith("offset:") and text[7:].isdigit():
        return "offset", int(text[7:])
    if text.isdigit():
        return "ms", int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"rollwire replay score: {flag} {text!r} is not step:N, offset:N, a time like "
                         "2026-12-01T17:05, or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return "ms", int(moment.timestamp() * 1000)


def _range(start: str | None, end: str | None):
    from rollwire.streams.replay import Range
    first, last = _when(start, "--from"), _when(end, "--to")
    kinds = {w[0] for w in (first, last) if w is not None}
    if len(kinds) > 1:
        raise SystemExit("rollwire replay score: --from and --to must be of one kind: steps, offsets, or times")
    if kinds == {"step"}:
        return Range(first_step=first[1] if first else None, last_step=last[1] if last else None)
    if kinds == {"offset"}:
        return Range(from_offset=first[1] if first else None, to_offset=last[1] if last else None)
    return Range(since_ms=first[1] if first else None, until_ms=last[1] if last else None)


def _algorithms(values: list[str]) -> dict[str, str]:
    from rollwire.streams.advantages import ALGORITHMS
    out = {}
    for value in values:
        env, _, name = value.rpartition("=")
        out[env or "*"] = ALGORITHMS.check(name)
    return out


def cmd_replay_score(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.progress import Progress

    from rollwire.core.bus import open_log
    from rollwire.schemas.topics import Topics
    from rollwire.streams import replay
    from rollwire.streams.scoring import GroupScorer, ScorerSettings

    algorithms = _algorithms(args.algorithm)
    span = _range(args.start, args.end)
    run, log_settings, prefix = recorded_run(args)
    settings = run.scorer if run is not None else ScorerSettings()
    what = f"Groups: {span.describe()}. Recorded settings."
    if args.recipe is not None:
        from rollwire.run.recipe import load_recipe
        changed = load_recipe(args.recipe)
        settings = changed.scorer
        algorithms = {e.name: e.algorithm for e in changed.environments} | algorithms
        what = f"Scorer settings and algorithms from {args.recipe}."
    module = replay.RewardModule(args.reward_module) if args.reward_module is not None else None
    if module is not None:
        what += f" Rewards judged again by {', '.join(module.functions)} from {args.reward_module}."
    if algorithms:
        what += " Algorithms: " + ", ".join(f"{env} → {name}" for env, name in sorted(algorithms.items())) + "."
    report_dir = args.report_dir or (args.run_dir or Path(".")) / "replays" / args.into
    console = Console(stderr=True)
    with open_log(log_settings) as log:
        total = sum(log.end_offsets(Topics(prefix).rollouts).values()) if prefix else 0
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("re-scoring recorded rollouts", total=total or None)
            comparison = replay.score_into(log, Topics(prefix), Topics(args.into), GroupScorer(settings),
                                           algorithms=algorithms, reward_module=module, span=span,
                                           progress=lambda n: progress.update(task, completed=n))
    report = replay.report_markdown(comparison, run=prefix, shadow=args.into, what=what)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "report.md").write_text(report)
    replay.plot_advantages(comparison, report_dir / "advantages.png")
    Console().print(Markdown(report))
    where = (f"--log-dir {log_settings.path}" if log_settings.type == "embedded"
             else f"--bus kafka --bootstrap {log_settings.bootstrap_servers}")
    print(f"shadow events: `rollwire tail scored --prefix {args.into} {where}`; report: {report_dir / 'report.md'}")
    return 0


def cmd_replay_train(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.progress import Progress, TaskID

    from rollwire.core.bus import open_log
    from rollwire.core.objectstore import open_store
    from rollwire.schemas.topics import Topics
    from rollwire.trainer import replay

    run, log_settings, prefix = recorded_run(args)
    assert run is not None, "--run-dir is required"
    torch.set_num_threads(run.trainer_threads)  # as the run's trainer: a thread count changes float sums
    report_dir = args.report_dir or args.run_dir / "replays" / args.into
    with open_log(log_settings) as log, Progress(console=Console(stderr=True), transient=True) as progress:
        tasks: dict[str, TaskID] = {}

        def show(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                label = "reading scored rollouts" if stage == "reading" else "retraining steps"
                tasks[stage] = progress.add_task(label, total=total or None)
            progress.update(tasks[stage], completed=done)

        result = replay.train_into(log, Topics(prefix), Topics(args.scored or prefix), Topics(args.into),
                                   open_store(run.store), run.trainer, from_step=args.from_step,
                                   to_step=args.to_step, progress=show)
    report = replay.report_markdown(result)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "train-report.md").write_text(report)
    Console().print(Markdown(report))
    print(f"report: {report_dir / 'train-report.md'}; weights: policy {args.into!r} in the run's store")
    return 0
