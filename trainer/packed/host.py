"""Packed trials: K trials of one sweep trained in one process, in lockstep, on one base model.

Each member runs the ordinary train() (trainer/run/train.py) in a thread of its own, so its
step, losses, optimizer, lr, seed, data order, KL settings, substeps, evals and checkpoints are
exactly a solo run's code. The threads take turns, one at a time (cooperative, in member order):
a member runs until it asks for the model (trainer/packed/members.py), then the next one runs.
Once every live member waits, the host runs each kind of request as one batch over the members
that asked for it, through one base model whose LoRA-targeted layers add each row's own
member's adapter (trainer/packed/grouped_lora.py), and the members resume.

  sample      one KV-cached decode over every member's prompts (trainer/packed/decode.py)
  logprobs    the reference (adapters off) or the current policy's log-probs, no gradient
  learner     the learner's forward with the gradient; each member gets its rows' log-probs
  backward    each member's d loss / d log-probs, pushed through that forward at once

Randomness: a member's torch default generator is its own. The host keeps each member's
generator state and swaps it in whenever the member's thread runs, and the pack's decode draws
a member's tokens from a generator holding that state. So the member's LoRA init (drawn in its
own load_policy), its sampling and its evals draw exactly the numbers they would alone.
A member that raises (a pruned trial, a non-finite loss) leaves the pack; the others go on.
A new member may join between rounds (run_bodies' `more`: a sweep's queued trial taking the
slot of one that ended). It starts from the RNG state the pack started with, as alone, and
its rows join the batches after the others': each member's numbers stay those of its solo run.
Each member's thread and its turns: turns.py.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM

from trainer.base.errors import ConfigError
from trainer.model.activation_checkpointing import enable_checkpointing
from trainer.model.fast_logprobs import token_logprobs
from trainer.model.merged_lora import is_plain_lora
from trainer.model.rollout import eos_ids
from trainer.model.token_batch import TokenBatch
from trainer.packed.batches import concat, learner_round
from trainer.packed.decode import Chunk, chunks_of, decode_packed
from trainer.packed.grouped_lora import PackedAdapters, Segments, install
from trainer.packed.members import current_source
from trainer.packed.packable import check_packable
from trainer.packed.turns import Member, copy_error, member_thread
from trainer.run.train import Reporter, TrainResult, train
from trainer.sampling.model_source import model_path

log = logging.getLogger(__name__)

# run_bodies' `more`: given a member that ended (its index, its result), a body to join or None.
More = Callable[[int, Any], Callable[[], Any] | None]


class PackHost:
    """Runs K trials' train() in lockstep on one base model (the module docstring says how)."""

    def __init__(self, cfgs: list[DictConfig]) -> None:
        check_packable(cfgs)
        cfg = cfgs[0]
        path = model_path(cfg)
        with torch.random.fork_rng():  # the host's load draws nothing of any member's stream
            self.model = AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, cfg.model.dtype)
            )
        self.model.eval().requires_grad_(False)
        if cfg.gradient_checkpointing:
            enable_checkpointing(self.model)
        self.packed: PackedAdapters | None = None
        self.targets: list[str] | None = None
        self.tokenizer = None
        self.eos: frozenset[int] = frozenset()
        self.back = threading.Event()
        # Set when the host stops early (a signal, an error of its own): what each member
        # still in the pack raises at its next request (an interrupt stays an interrupt, so
        # a sweep trial records itself interrupted and is resumed from its last checkpoint).
        self.stopping: BaseException | None = None
        # A signal a member's thread raised (deferred there until its store call returned,
        # records/database.py): the host raises it too, after that member's turn.
        self.interrupted: KeyboardInterrupt | None = None
        self.forwards: dict[int, tuple[torch.Tensor, dict[int, tuple[int, int, int]]]] = {}
        self.next_forward = 0
        self.round = 0  # rounds of requests answered (a member that joins says when)

    # --- members' adapters ---

    def attach(self, member: Member, peft_model, tokenizer) -> None:
        """Share the host's base weights with the member's PEFT model and add its adapter to
        the grouped layers (installed at the first member's, from its LoRA layers)."""
        self.tokenizer = tokenizer
        base = peft_model.get_base_model()
        adapter = peft_model.active_adapter
        layers = {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
        if not all(is_plain_lora(m, adapter) and not m.fan_in_fan_out for m in layers.values()):
            raise ConfigError("packed trials need plain LoRA on nn.Linear layers")
        if self.targets is None:
            self.targets = sorted(layers)
            self.packed = install(self.model, self.targets)
        elif sorted(layers) != self.targets:
            raise ConfigError("packed trials must adapt the same layers")
        shared = dict(self.model.named_parameters(remove_duplicate=False))
        for name, _ in list(base.named_parameters(remove_duplicate=False)):
            if name in shared:  # not the adapter's: the host's tensor, not a second copy
                module_name, _, leaf = name.rpartition(".")
                setattr(base.get_submodule(module_name), leaf, shared[name])
        self.packed.attach(
            member.index,
            {
                n: (m.lora_A[adapter].weight, m.lora_B[adapter].weight, m.scaling[adapter])
                for n, m in layers.items()
            },
        )

    def detach(self, member: Member) -> None:
        if self.packed is not None:
            self.packed.detach(member.index)

    # --- turns ---

    def yield_to_host(self, member: Member) -> None:
        """Called from a member's thread: hand the turn back and wait for the next one."""
        self.back.set()
        member.go.wait()
        member.go.clear()

    def _turn(self, member: Member) -> None:
        """Let one member run until it asks for something or finishes. A signal that stops
        the host meanwhile waits for that turn's end, so the member is left at a request."""
        member.go.set()
        try:
            self.back.wait()
        except BaseException:
            self.back.wait()
            raise
        finally:
            self.back.clear()
        if self.interrupted is not None and self.stopping is None:
            raise copy_error(self.interrupted)

    def run(
        self, cfgs: list[DictConfig], reporters: list[Reporter | None] | None = None
    ) -> list[TrainResult | BaseException]:
        """Train every trial; each one's TrainResult, or the exception that ended it."""
        reporters = reporters or [None] * len(cfgs)
        return self.run_bodies(
            [
                functools.partial(_train_member, cfg, reporter)
                for cfg, reporter in zip(cfgs, reporters, strict=True)
            ]
        )

    def run_bodies(
        self,
        bodies: list[Callable[[], Any]],
        more: More | None = None,
    ) -> list[Any]:
        """Run each body in a member thread of its own, in turns: a body's train() (by way of
        trainer.backends.train or train_packed) runs as a member of this pack. Each body's
        return value, or the exception that ended it, in the order they joined.

        `more`, when given, is called with each member's index and result as it ends, on this
        thread and between rounds (no member runs meanwhile); a body it returns joins the pack
        as a new member (index: the next one), so a queued trial takes the ended one's slot."""
        state = torch.get_rng_state()
        members: list[Member] = []
        threads: list[threading.Thread] = []
        try:
            for body in bodies:
                self._turn(self._join(members, threads, body, state))
            self._refill(members, threads, more, state)
            while True:
                waiting = [m for m in members if not m.done and m.request is not None]
                if not waiting:
                    break
                for member in self._answer(waiting):
                    self._turn(member)
                self.round += 1
                self._drop_orphans(members)
                self._refill(members, threads, more, state)
        except BaseException as e:
            self.stopping = copy_error(e) if isinstance(e, KeyboardInterrupt) else None
            raise
        finally:
            torch.set_rng_state(state)
            self.stopping = self.stopping or RuntimeError("the pack stopped")
            for member in members:
                if not member.done:  # each one raises at its request, and records its end
                    member.reply = copy_error(self.stopping)
                    self._turn(member)
            for thread in threads:
                thread.join()
        return [m.result for m in members]

    def _join(
        self,
        members: list[Member],
        threads: list[threading.Thread],
        body: Callable[[], Any],
        rng_state: torch.Tensor,
    ) -> Member:
        """A new member, its thread waiting for its first turn. Every member starts from the
        RNG state the pack started with, as it would alone, whenever it joins."""
        member = Member(self, len(members), body, rng_state.clone())
        thread = threading.Thread(target=member.main, name=member_thread(member.index), daemon=True)
        members.append(member)
        threads.append(thread)
        thread.start()
        return member

    def _refill(
        self,
        members: list[Member],
        threads: list[threading.Thread],
        more: More | None,
        rng_state: torch.Tensor,
    ) -> None:
        """Tell `more` of each member that ended since the last round; each body it returns
        joins and runs to its first request (the list grows as it is walked: a new member
        that ends at once is told of too)."""
        if more is None:
            return
        for member in members:
            if member.done and not member.told:
                member.told = True
                body = more(member.index, member.result)
                if body is not None:
                    self._turn(self._join(members, threads, body, rng_state))

    def _drop_orphans(self, members: list[Member]) -> None:
        """Learner forwards whose members have all left before their backward: their graphs
        go (a member that leaves between the two gives its rows no gradient)."""
        live = {m.index for m in members if not m.done}
        self.forwards = {f: v for f, v in self.forwards.items() if live & set(v[1])}

    def _answer(self, waiting: list[Member]) -> list[Member]:
        """Each kind of request, batched over the members that made it, in member order; the
        members answered (a learner piece that does not fit this round waits for the next).
        Backwards first: their graphs go before a new learner forward holds its own."""
        groups: dict[tuple, list[Member]] = defaultdict(list)
        for member in waiting:
            groups[member.request[0]].append(member)
        learners = [k for k in groups if k[0] == "learner"]
        for key in learners[1:]:  # one learner forward a round (a temperature of its own waits)
            del groups[key]
        if learners:
            group = groups[learners[0]]
            groups[learners[0]] = group[: learner_round([m.request[1] for m in group])]
        answered = []
        for key, group in sorted(groups.items(), key=lambda kv: kv[0][0] != "backward"):
            answered += group
            payloads = [m.request[1] for m in group]
            for m in group:
                m.request = None
            try:
                replies = HANDLERS[key[0]](self, key, group, payloads)
            except Exception as e:  # each member raises it, as its solo run would
                replies = [e] * len(group)
            for m, reply in zip(group, replies, strict=True):
                m.reply = reply
        return answered

    # --- the batched model calls ---

    def _sample(self, key, group: list[Member], payloads) -> list:
        settings = payloads[0][2]
        tokenizer = self.tokenizer
        eos = eos_ids(self.model, tokenizer)
        plans, generators = [], []
        for member, (ids_N, batch_tokens, _) in zip(group, payloads, strict=True):
            plans.append(chunks_of(ids_N, batch_tokens, settings.max_tokens))
            generator = None
            if not settings.greedy:
                generator = torch.Generator()
                generator.set_state(member.rng_state)
            generators.append(generator)
        rollouts: list[list] = [[] for _ in group]
        for c in range(max(len(chunks) for _, chunks in plans)):
            chunks = [
                Chunk(m.index, ids_D, rows[c], generators[i])
                for i, (m, (ids_D, rows)) in enumerate(zip(group, plans, strict=True))
                if c < len(rows)
            ]
            who = [i for i, (_, rows) in enumerate(plans) if c < len(rows)]
            outs = decode_packed(self.model, self.packed, chunks, settings, eos, tokenizer)
            for i, out in zip(who, outs, strict=True):
                rollouts[i] += out
        for member, generator in zip(group, generators, strict=True):
            if generator is not None:
                member.rng_state = generator.get_state()
        return rollouts

    def _logprobs(self, key, group: list[Member], batches: list[TokenBatch]) -> list:
        _, role, temperature = key
        with torch.no_grad():
            (logp_NT, _), owners = self._forward(group, batches, temperature, role == "inference")
        return [logp_NT[n0:n1, :width] for n0, n1, width in owners.values()]

    def _learner(self, key, group: list[Member], payloads) -> list:
        parts = [batch.select(rows.to(batch.prompt_of_N.device)) for batch, rows, _ in payloads]
        with torch.enable_grad():
            (logp_NT, entropy_NT), owners = self._forward(group, parts, key[1], True, True)
        forward = self.next_forward
        self.next_forward += 1
        self.forwards[forward] = (logp_NT, owners)
        replies = []
        for member, (_, rows, _) in zip(group, payloads, strict=True):
            n0, n1, width = owners[member.index]
            logp = logp_NT[n0:n1, :width].detach().clone()
            replies.append((forward, [(rows, logp, entropy_NT[n0:n1, :width])]))
        return replies

    def _backward(self, key, group: list[Member], payloads) -> list:
        by_forward: dict[int, dict[int, torch.Tensor]] = defaultdict(dict)
        for member, (forward, grads) in zip(group, payloads, strict=True):
            by_forward[forward][member.index] = grads[0]
        for forward, grads in by_forward.items():
            logp_NT, owners = self.forwards.pop(forward)
            grad_NT = torch.zeros_like(logp_NT)
            for index, grad in grads.items():
                n0, n1, width = owners[index]
                grad_NT[n0:n1, :width] = grad
            torch.autograd.backward(logp_NT, grad_NT)
        return [None] * len(group)

    def _forward(self, group, batches, temperature, adapters_on, with_entropy=False):
        """token_logprobs over the members' batches stacked; and each member's (first row,
        end row, completion width) in the result."""
        members = [m.index for m in group]
        batch, by_rows, owners = concat(members, batches, self.tokenizer.pad_token_id)
        with self.packed.rows(Segments(by_rows, adapters_on)):
            return token_logprobs(self.model, batch, temperature, with_entropy), owners


HANDLERS = {
    "sample": PackHost._sample,
    "logprobs": PackHost._logprobs,
    "learner": PackHost._learner,
    "backward": PackHost._backward,
}


def _train_member(cfg: DictConfig, reporter: Reporter | None) -> TrainResult:
    return train(cfg, reporter, current_source())


def train_packed(
    cfgs: list[DictConfig], reporters: list[Reporter | None] | None = None
) -> list[TrainResult | BaseException]:
    """Train the trials packed on one base model; each one's result or its exception."""
    return PackHost(cfgs).run(cfgs, reporters)
