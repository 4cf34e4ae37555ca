"""Our trainer against TRL's GRPOTrainer on equal work, alternated A B A B.

    pip install ".[bench]"                              # TRL, for this benchmark only
    python bench/bench_vs_trl.py --workload small       # 8 prompts x 4, 8 tokens, LoRA r8
    python bench/bench_vs_trl.py --workload medium      # 16 prompts x 8, 8 tokens, LoRA r16
    python bench/bench_vs_trl.py --workload large       # hidden 512, 4 layers, 64 tokens
    python bench/bench_vs_trl.py --workload large --trainers ours-equal trl --matmul
                                            # the time a step's matrix products take: its floor
    python bench/bench_vs_trl.py --workload smollm2-32 --trainers ours trl --repeats 2
    python bench/bench_vs_trl.py --workload smollm2-256 --trainers ours trl --repeats 1
                                            # the real model (tests/real_model.py), 32 and 256
                                            # tokens, on bench/arithmetic.jsonl (task=jsonl)

Both trainers load the same checkpoint directory and tokenizer, get the same prompts (the
addition task's training problems, BOS added by the tokenizer in both), the same exact-match
reward, temperature 1, LoRA on every linear layer, fp32, one AdamW step per batch, no KL
penalty, no gradient checkpointing (TRL's default turns it on: `trl-defaults` keeps it), torch
on --threads threads. Each run is its own process (so peak RSS is its own), and runs alternate
ours, TRL, ours, TRL, ... --repeats times. Per run: the median step time
excluding the first step (and our last, which holds the final eval), rollouts/s, the split
into sampling / forward+backward / optimizer, and peak RSS. Nothing here asserts a timing;
results go to bench/results/vs_trl_<workload>.json and BENCHMARKS.md.

The large workload's model is random (built here, cached): its output layer makes
end-of-sequence rare, so nearly every completion runs the full 64 tokens in both trainers and
generation dominates, as with long reasoning completions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_models import model_dir  # bench/ is on the path: this runs as a script
from machine_info import machine
from matmul_clock import MatmulClock

RESULTS = Path(__file__).parent / "results"
WORKLOADS = {
    "small": {"prompts": 8, "group": 4, "tokens": 8, "rank": 8, "model": "tiny"},
    "medium": {"prompts": 16, "group": 8, "tokens": 8, "rank": 16, "model": "tiny"},
    "default": {"prompts": 32, "group": 8, "tokens": 8, "rank": 8, "model": "tiny"},  # no flags
    "large": {"prompts": 8, "group": 4, "tokens": 64, "rank": 8, "model": "large"},
    # SmolLM2-135M-Instruct (dequantized Q4_1), arithmetic questions chat-rendered in the file
    # (bench_real_model.write_questions): short and long completions.
    "smollm2-32": {"prompts": 8, "group": 4, "tokens": 32, "rank": 8, "model": "smollm2"},
    "smollm2-256": {"prompts": 8, "group": 4, "tokens": 256, "rank": 8, "model": "smollm2"},
}
QUESTIONS = Path(__file__).parent / "arithmetic.jsonl"  # the real model's task (both trainers)
LR = 2e-3
SPLITS = {  # our step's time split: the metric that holds each part
    "sample": "time/sample_s",
    "forward_backward": "time/forward_backward_s",
    "optimizer": "time/optimizer_s",
    "post_kl": "time/post_kl_s",  # the post-update KL's forward (compute_post_kl)
    "reference": "time/reference_s",  # the reference's forward (a KL penalty only)
}
OPTIONAL = ("post_kl", "reference")  # 0 where that forward did not run
# Not timed, so kept short in every run of ours: the baseline and final evals (TRL runs none).
EVAL = ["eval_greedy=false"]
CLOCK: MatmulClock | None = None  # set in a --matmul run


def run_ours(work: dict, path: Path, steps: int, extra: tuple[str, ...] = ()) -> dict:
    import logging

    from hydra import compose, initialize_config_dir

    try:
        from trainer.base.config import config_dir
        from trainer.run.train import train
    except ImportError:  # a checkout from before the trainer's layers (--before)
        from trainer.config import config_dir
        from trainer.train import train

    logging.disable(logging.WARNING)
    tokens = count_our_tokens()
    stamps: list[float] = []
    splits: dict[str, list[float]] = {key: [] for key in SPLITS}

    class Timer:
        def report(self, step: int, metrics: dict[str, float]) -> None:
            stamps.append(time.perf_counter())
            if step > 0:  # an older trainer (--before) may lack the split: nan
                for key, name in SPLITS.items():
                    splits[key].append(metrics.get(name, 0.0 if key in OPTIONAL else float("nan")))
                if CLOCK:
                    CLOCK.step_ended()

    with (
        tempfile.TemporaryDirectory() as out,
        initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"),
    ):
        cfg = compose(
            "config",
            overrides=[
                f"output_dir={out}",
                f"model.path={path}",
                f"batch_size={work['prompts']}",
                f"group_size={work['group']}",
                f"max_tokens={work['tokens']}",
                f"lora_rank={work['rank']}",
                f"lora_alpha={2 * work['rank']}",
                f"lr={LR}",
                f"max_steps={steps}",
                "eval_every=0",
                "save_every=0",
                *EVAL,
                *task_overrides(work),
                *extra,
            ],
        )
        train(cfg, Timer())
    step_s = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][1:-1]
    if not step_s:  # a run of two steps (the real model's memory): the last one, eval and all
        return summarise([stamps[-1] - stamps[-2]], {k: v[-1:] for k, v in splits.items()}, work)
    return summarise(step_s, {k: v[1:-1] for k, v in splits.items()}, work, tokens[1:-1])


def count_our_tokens() -> list[int]:
    """The completion tokens each training step generates (evals sample elsewhere)."""
    try:
        from trainer.rl import pipelines
    except ImportError:  # a checkout from before the trainer's layers (--before)
        from trainer import pipelines

    tokens: list[int] = []
    sample = pipelines.sample_groups

    def counted(*args, **kwargs):
        groups = sample(*args, **kwargs)
        tokens.append(sum(len(r.completion_ids) for r in groups.rollouts_N))
        return groups

    pipelines.sample_groups = counted
    return tokens


def run_trl(
    work: dict, path: Path, steps: int, checkpointing: bool = False, **options: bool
) -> dict:
    """TRL's GRPOTrainer on our work. TRL turns gradient checkpointing on by default (one more
    forward a step, for less memory); equal work means off, `trl-defaults` keeps it on.
    onednn: its model's linear layers through the routing ours takes (cpu_linear.use_onednn:
    equal kernels). accumulate: the batch as 4 micro-batches of 8 rollouts, gradients
    accumulated, one optimizer step (equal work in less memory than one 32-row batch)."""
    import random

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.env.rewards import exact_match_reward
    from trainer.env.tasks import AdditionTask, DatasetTask

    real = work["model"] == "smollm2"
    task = (
        DatasetTask(str(QUESTIONS), eval_fraction=0.004)
        if real
        else AdditionTask(num_digits=2, eval_size=400, seed=0)
    )
    problems = task.train_problems(work["prompts"] * (steps + 1), random.Random(0))
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])
    tokenizer = AutoTokenizer.from_pretrained(path)
    eos = tokenizer.eos_token_id

    def reward(completions, answer, completion_ids, **_) -> list[float]:
        return [
            exact_match_reward(a, c, bool(ids) and ids[-1] == eos)
            for c, a, ids in zip(completions, answer, completion_ids, strict=True)
        ]

    micro_batches = 4 if options.get("accumulate") else 1
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=work["prompts"] * work["group"] // micro_batches,
            num_generations=work["group"],
            gradient_accumulation_steps=micro_batches,
            # steps_per_generation left at its default (= gradient_accumulation_steps): one
            # generation of all prompts x group rollouts per optimizer step, as ours samples.
            # Set to 1, TRL would decode each micro-batch as a batch of its own (4 x 8 rows
            # instead of 32), slower at 256 tokens: not equal work.
            max_completion_length=work["tokens"],
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            temperature=1.0,
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            disable_tqdm=True,
            seed=0,
            shuffle_dataset=False,
            gradient_checkpointing=checkpointing,
        )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if options.get("onednn"):  # before PEFT wraps them: its base layers keep the class
            from trainer.model.cpu_linear import use_onednn

            use_onednn(model)
        lora = LoraConfig(
            r=work["rank"],
            lora_alpha=2 * work["rank"],
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        trainer = GRPOTrainer(
            model, reward, args, dataset, processing_class=tokenizer, peft_config=lora
        )
        times: dict[str, list[float]] = {"step": [], "sample": [], "optimizer": [], "tokens": []}
        # With accumulation TRL generates each micro-batch's rollouts apart: summed a step.
        pending = {"sample": 0.0, "tokens": 0}
        generate = trainer._generate_and_score_completions  # sampling, scoring, advantages

        def timed_generate(*a, **k):
            started = time.perf_counter()
            result = generate(*a, **k)
            pending["sample"] += time.perf_counter() - started
            pending["tokens"] += int(result["completion_mask"].sum())
            return result

        trainer._generate_and_score_completions = timed_generate

        class Timer(TrainerCallback):
            def on_step_begin(self, *_, **__):
                self.step_started = time.perf_counter()

            def on_pre_optimizer_step(self, *_, **__):
                self.optimizer_started = time.perf_counter()

            def on_optimizer_step(self, *_, **__):
                times["optimizer"].append(time.perf_counter() - self.optimizer_started)

            def on_step_end(self, *_, **__):
                times["step"].append(time.perf_counter() - self.step_started)
                for key in pending:
                    times[key].append(pending[key])
                    pending[key] = 0
                if CLOCK:
                    CLOCK.step_ended()

        trainer.add_callback(Timer())
        trainer.train()
    step_s = times["step"][1:]
    sample, optimizer = times["sample"][1:], times["optimizer"][1:]
    forward_backward = [t - s - o for t, s, o in zip(step_s, sample, optimizer, strict=True)]
    splits = {"sample": sample, "forward_backward": forward_backward, "optimizer": optimizer}
    return summarise(step_s, splits, work, times["tokens"][1:])


def task_overrides(work: dict) -> list[str]:
    """The task: the real model's arithmetic questions from a file, else addition (its eval
    short in both: it is not timed)."""
    if work["model"] != "smollm2":
        return ["task.eval_size=64"]
    # exact match, as TRL is given (the file's default would be last_number): the same reward
    return [
        "task=jsonl",
        f"task.path={QUESTIONS}",
        "task.eval_fraction=0.004",
        "task.rewards=[exact_match]",
    ]


def run_ours_equal(work: dict, path: Path, steps: int) -> dict:
    return run_ours(work, path, steps, ("compute_post_kl=false",))


def run_trl_defaults(work: dict, path: Path, steps: int) -> dict:
    return run_trl(work, path, steps, checkpointing=True)


def trl_with(**options: bool):
    return lambda work, path, steps: run_trl(work, path, steps, **options)


TRAINERS = {
    "ours": run_ours,
    "ours-equal": run_ours_equal,
    "trl": run_trl,
    "trl-defaults": run_trl_defaults,
    "before": run_ours,
    "before-equal": run_ours_equal,
    "ours-blas": run_ours,  # ours with every linear layer on torch's own path (cpu_linear.py)
    "trl-onednn": trl_with(onednn=True),  # TRL on the kernels ours takes: equal kernels
    "trl-accum": trl_with(accumulate=True),
    "trl-accum-onednn": trl_with(accumulate=True, onednn=True),
}
ONEDNN_OFF = ("ours-blas",)  # GRPO_SWEEPER_ONEDNN=0 in these runs


def summarise(
    step_s: list[float], splits: dict[str, list[float]], work: dict, tokens: list[int] = ()
) -> dict:
    """tokens: the completion tokens each timed step generated (both stop at end-of-sequence,
    so a step's work varies): their median, and the step's seconds per generated token."""
    median = statistics.median(step_s)
    generated = statistics.median(tokens) if tokens else float("nan")
    return {
        "median_step_s": round(median, 4),
        "median_tokens_per_step": generated,
        "ms_per_generated_token": round(1000 * median / generated, 2) if tokens else None,
        "rollouts_per_s": round(work["prompts"] * work["group"] / median, 1),
        **{f"median_{k}_s": round(statistics.median(v), 4) for k, v in splits.items()},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "steps_timed": len(step_s),
        **({"matmul_s": round(CLOCK.seconds_per_step, 4)} if CLOCK else {}),
    }


def one_run(trainer: str, path: Path, args: argparse.Namespace, steps: int) -> dict:
    """A run in a fresh process, so its peak memory and thread pool are its own; every run
    gets the same model directory."""
    command = [sys.executable, __file__, "--workload", args.workload, "--steps", str(steps)]
    command += ["--threads", str(args.threads), "--only", trainer, "--model", str(path)]
    command += ["--matmul"] if args.matmul else []
    before = args.before
    env = dict(os.environ)
    if trainer.startswith("before"):  # an older checkout's trainer package, first on the path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [before, env.get("PYTHONPATH")]))
    if trainer in ONEDNN_OFF:
        env["GRPO_SWEEPER_ONEDNN"] = "0"
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{trainer} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


BEFORE_OF = {"ours": "before", "ours-equal": "before-equal"}


def round_ratios(runs: list[dict], references: list[dict]) -> dict[str, float]:
    """Each round's rollouts/s ratio (the runs alternate, so a round shares the machine's
    state): the median and the spread. From the step times: the same work a step, and not
    rounded (a real model's rollouts/s, ~2, rounds to 0.1, up to 4% off)."""
    ratios = [
        b["median_step_s"] / a["median_step_s"] for a, b in zip(runs, references, strict=True)
    ]
    return {
        "median": round(statistics.median(ratios), 2),
        "min": round(min(ratios), 2),
        "max": round(max(ratios), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="small")
    parser.add_argument("--steps", type=int, default=None, help="per run (default by workload)")
    parser.add_argument("--repeats", type=int, default=3, help="A B pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--trainers",
        nargs="+",
        default=["ours", "ours-equal", "trl", "trl-defaults"],
        choices=sorted(TRAINERS),
        help="ours: the defaults; ours-equal: without the post-update KL, which TRL does not "
        "compute; trl: TRL without gradient checkpointing (equal work); trl-defaults: TRL as "
        "configured by default (gradient checkpointing on); before, before-equal: ours and "
        "ours-equal from the checkout at --before; ours-blas: ours with every linear layer "
        "on torch's own matmul (GRPO_SWEEPER_ONEDNN=0); trl-onednn: TRL with its linear layers "
        "through ours' oneDNN routing (equal kernels); trl-accum(-onednn): TRL with 4 "
        "micro-batches of 8 and gradient accumulation, no checkpointing (the 256-token equal "
        "work that fits memory)",
    )
    parser.add_argument(
        "--before",
        help="an older checkout of this repo, for --trainers before and before-equal",
    )
    parser.add_argument(
        "--matmul",
        action="store_true",
        help="one profiled run a trainer: the time its matrix products take a step, which "
        "bounds the ratio any change can reach (bench/results/matmul_<workload>.json)",
    )
    parser.add_argument("--tag", help="results/vs_trl_<workload>_<tag>.json (kept apart)")
    parser.add_argument("--note", default="", help="how the host was used, for the result")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # internal: one run, JSON to stdout
    parser.add_argument("--model", help=argparse.SUPPRESS)  # internal: the run's model
    args = parser.parse_args()
    work = WORKLOADS[args.workload]
    steps = args.steps or (12 if args.workload == "large" else 30)
    if work["model"] == "smollm2":
        steps = args.steps or 4
    if args.model:
        path = Path(args.model)
    elif work["model"] == "smollm2":
        sys.path.insert(0, str(Path(__file__).parents[1]))
        from tests.real_model import smollm2_dir

        path = smollm2_dir()
    else:
        path = model_dir(work["model"])
    if args.only:
        import torch

        global CLOCK
        CLOCK = MatmulClock() if args.matmul else None
        torch.set_num_threads(args.threads)
        print(json.dumps(TRAINERS[args.only](work, path, steps)))
        return
    if args.matmul:
        # The profiler slows the rest of a run and swells its memory: keep the products only.
        profiled = {name: one_run(name, path, args, steps) for name in args.trainers}
        report = {
            "workload": args.workload,
            "date": time.strftime("%Y-%m-%d"),
            "matmul_s_per_step": {name: run["matmul_s"] for name, run in profiled.items()},
        }
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"matmul_{args.workload}.json").write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report))
        return

    runs: dict[str, list[dict]] = {name: [] for name in args.trainers}
    for repeat in range(args.repeats):  # each round written: a cut-short run keeps its rounds
        for name in args.trainers:
            result = one_run(name, path, args, steps)
            runs[name].append(result)
            print(f"[{repeat + 1}/{args.repeats}] {name}: {json.dumps(result)}", flush=True)
        report = write_report(args, work, steps, runs)
    print(json.dumps({k: v for k, v in report.items() if k == "median" or k.startswith("ratio")}))


REFERENCES = ("trl", "trl-onednn", "trl-accum", "trl-accum-onednn", "trl-defaults")


def write_report(args: argparse.Namespace, work: dict, steps: int, runs: dict) -> dict:
    report = {
        "workload": {"name": args.workload, **work, "threads": args.threads, "steps": steps},
        "machine": machine(args.note),
        "date": time.strftime("%Y-%m-%d"),
        "rounds": len(next(iter(runs.values()))),
        "runs": runs,
        "median": {
            name: {
                key: statistics.median(r[key] for r in results if r[key] is not None)
                for key in results[0]
                if key != "steps_timed" and results[0][key] is not None
            }
            for name, results in runs.items()
        },
    }
    for reference in REFERENCES:  # each round's ratio: ours / TRL
        if reference in runs:
            report[f"ratio_to_{reference}"] = {
                name: round_ratios(runs[name], runs[reference])
                for name in sorted(set(runs) - set(REFERENCES))
            }
    # What the change bought: each of ours against the same settings at --before.
    changed = {new: old for new, old in BEFORE_OF.items() if new in runs and old in runs}
    if changed:
        report["ratio_to_before"] = {
            new: round_ratios(runs[new], runs[old]) for new, old in changed.items()
        }
    if "ours" in runs and "ours-blas" in runs:  # what oneDNN's matmuls bought
        report["ratio_to_ours_blas"] = {"ours": round_ratios(runs["ours"], runs["ours-blas"])}
    if "trl" in runs and "trl-onednn" in runs:  # and what they buy TRL
        report["ratio_trl_onednn_to_trl"] = round_ratios(runs["trl-onednn"], runs["trl"])
    RESULTS.mkdir(exist_ok=True)
    name = f"vs_trl_{args.workload}" + (f"_{args.tag}" if args.tag else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
