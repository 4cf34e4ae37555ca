"""Packed trials: several LoRA trials of one sweep trained in one process, in lockstep, on one
base model (issue 76). Each trial keeps its own adapter, optimizer, lr, seed, data order and
loss settings; sampling and log-probs run as one batch over all of them, each row through its
own trial's adapter.

    from trainer.packed.host import train_packed
    results = train_packed([cfg_a, cfg_b], [reporter_a, reporter_b])

A sweep packs its jobs with `hydra.sweeper.pack=K` (sweeper/sweep/packs.py): each member runs
the sweep's whole job in its thread, and its train() finds its member (members.current_source).

Modules, bottom to top:

  packable      which trials can share one base model and batch shape
  grouped_lora  one base model, K adapters: the base product once, each member's low-rank delta
  batches       several members' TokenBatches as one, member-major; which learner pieces fit
  decode        one KV-cached decode over every member's prompts, each drawing from its own generator
  members       what a member's own train() sees: its policy and sampler, asking the host
  turns         a member's thread: it runs until it asks the host, then waits for its turn
  host          the members in turns (new ones joining as others end), and the batched model
                calls that answer them

A layer of the trainer's own, above run (a member runs trainer.run.train) and below backends.
"""
