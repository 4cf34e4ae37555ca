"""A plain TRL GRPOTrainer script with our health rules (docs/trl.md, "Health rules in your
own TRL script"): the rules a sweep prunes by stop this run at its first breach.

    python docs/examples/trl_health_callback.py --model PATH --lr 3e-2 --out runs/x

Prints the line of the rule that stopped the run, or that none did. `--report-to mlflow` logs
the run, the KLs the callback computes and the breach to MLflow (MLFLOW_TRACKING_URI).
"""

import argparse

from datasets import Dataset
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from trainer.backends.trl.health_callback import HealthCallback


def short_answer(completions, **kwargs):
    """A reward of our own: completions near 20 characters score best."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [-abs(len(t) - 20) / 20 for t in texts]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="a local Hugging Face model directory")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--out", default="runs/health-example")
    p.add_argument("--report-to", default="none")
    args = p.parse_args()

    questions = ["What is 2+2?", "Name a colour.", "Say hello.", "What is 3x3?"]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in questions])
    config = GRPOConfig(
        output_dir=args.out,
        learning_rate=args.lr,
        max_steps=args.max_steps,
        num_generations=4,
        per_device_train_batch_size=4,  # 1 prompt x 4 completions a step
        max_completion_length=8,
        logging_steps=1,
        save_strategy="no",
        report_to=args.report_to,
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=short_answer,
        args=config,
        train_dataset=data,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
    )
    health = HealthCallback(trainer)  # the default rules; HealthCallback(trainer, rules=[...])
    trainer.add_callback(health)
    trainer.train()
    print(health.breach or "no health rule stopped the run")


if __name__ == "__main__":
    main()
