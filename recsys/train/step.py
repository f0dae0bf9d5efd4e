"""One training step: forward, the loss, backward, clipping and the update, launched eagerly or
replayed as a captured CUDA graph.

:class:`TrainStep` holds what a step needs from step to step: the model (wrapped in
DistributedDataParallel under torchrun), its item table in the form ``train.item_updates`` trains
it with (:mod:`recsys.items`), the loss ``train.loss`` names (:mod:`recsys.train.losses`), the
optimiser and the weight average. The loop around it (:mod:`recsys.train.loop`) decides when to
validate, drop the rate or stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from recsys.config import Config, require_resolved
from recsys.items import RowUpdates
from recsys.models import InterestModel, spec_for
from recsys.nn.masking import gather_last
from recsys.train import distributed
from recsys.train.averaging import WeightAverage
from recsys.train.graphs import (
    DDP_WARMUP_STEPS,
    WARMUP_STEPS,
    GraphPlan,
    capturing,
    launch_line,
    plan_graph,
    side_stream,
)
from recsys.train.losses import LossOutput, LossRows, attention_collision, interest_cosine, make_loss, readouts

Log = Callable[[str], None]


def make_optimizer(
    model: torch.nn.Module, cfg: Config, device: torch.device, weight_decay: float, capturable: bool = False
) -> torch.optim.Optimizer:
    """Fused Adam/AdamW (one pass over each parameter per step, on the CPU too: on taobao's
    37k-item table the unfused CPU update was a third of a step) with ``weight_decay`` (the
    config's, or the automatic value of :mod:`recsys.train.plan`) over the parameters that need a
    gradient; ``capturable`` keeps its state on the device for CUDA graphs."""
    cls = torch.optim.AdamW if cfg.train.optimizer == "adamw" else torch.optim.Adam
    return cls(
        [p for p in model.parameters() if p.requires_grad],  # a row-sparse item table updates itself
        lr=cfg.train.lr,
        weight_decay=weight_decay,
        fused=True,
        capturable=capturable and device.type == "cuda",
    )


class TrainStep:
    """One optimisation step: batch -> interests -> readout -> the loss (``train.loss``,
    :mod:`recsys.train.losses`) -> backward -> update.

    With ``train.cuda_graph`` (``"auto"`` by default; see :mod:`recsys.train.graphs`) the whole
    step (forward, backward, the gradient all-reduce under DDP, clipping, fused Adam) is captured
    once into a CUDA graph and replayed: one launch per step instead of hundreds, which is what
    short click sequences need on a GPU whose CPU launch overhead dominates. Negatives are drawn
    outside the graph and copied into its static inputs. Where the step cannot be captured it
    runs with eager launches; one line through ``log`` says how the step runs, and why.

    Args:
        model: the (unwrapped) model; its ``item_embeddings()`` are the output embeddings.
        cfg: the resolved run config (``train`` section: negatives, sampler, logQ, z-loss, AMP,
            clipping); a value still automatic is a ``ValueError`` naming it.
        device: where the batch and the negatives live.
        item_counts: ``[num_items]`` training click counts (for the unigram sampler).
        generator: the negative sampler's random stream (on ``device``).
        world_size: processes training together; above 1 the model is wrapped in
            DistributedDataParallel here (which syncs gradients), on the capture stream.
        log: where the launch line goes.
        weight_decay: the optimiser's (the resolved ``train.weight_decay``, through the plan).
        graph: the run's :func:`~recsys.train.graphs.plan_graph` (made once a run); None plans here.
    """

    def __init__(
        self,
        model: InterestModel,
        cfg: Config,
        device: torch.device,
        item_counts: Tensor,
        generator: torch.Generator,
        *,
        world_size: int = 1,
        log: Log = lambda line: None,
        weight_decay: float = 0.0,
        graph: GraphPlan | None = None,
    ):
        require_resolved(cfg, "TrainStep")
        self.model, self.cfg, self.device, self.world_size, self.log = model, cfg, device, world_size, log
        t = cfg.train
        self.use_graph, why_not = graph or plan_graph(cfg, device, world_size)
        if not self.use_graph:
            log(launch_line(cfg, False, why_not))
        self.objective = make_loss(cfg, item_counts, device, generator)  # train.loss
        # the item table in the form train.item_updates trains it with, before DDP and the optimiser
        # are built: they then train only what the form leaves to them
        self.items = model.train_items(
            t.item_updates,
            RowUpdates(
                lr=t.lr,
                weight_decay=weight_decay,
                decoupled=t.optimizer == "adamw",
                ema_decay=t.ema_decay,
                world_size=world_size,
            ),
        )
        # warm-up and capture run on this stream; DDP is built on it too (its gradient hooks
        # remember the stream they were made on)
        self.stream = torch.cuda.Stream(device) if self.use_graph else None
        self.forward: torch.nn.Module = model
        if world_size > 1:
            with side_stream(self.stream):
                self.forward = torch.nn.parallel.DistributedDataParallel(
                    model, device_ids=[device.index] if device.type == "cuda" else None
                )
        self.soft = torch.zeros((), device=device)  # the readout's soft share, set before every step
        # the soft readout's warm-up (K > 1 only); afterwards the step is rebuilt with the plain argmax
        self.soft_phase = t.soft_readout_steps > 0 and model.num_interests > 1
        # negatives scored by each row's best-matching interest (K > 1 only; for K = 1 the same)
        self.max_scores = t.negative_readout == "max" and model.num_interests > 1
        # interest 0 is the encoder's next-click state, read out against every target by itself (its spec)
        self.state_interest = spec_for(cfg.model.name).state_interest and model.num_interests > 1
        self.amp = t.amp and device.type == "cuda"
        self.dense = t.predict_at == "all"  # every position of a window is a target (resolved by the model spec)
        self.masked = self.dense or t.predict_next > 1  # the loss averages over the valid rows only
        self.optimizer = make_optimizer(model, cfg, device, weight_decay, capturable=self.use_graph)
        self.loss_fn = torch.compile(self.loss, dynamic=False) if t.compile else self.loss
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: tuple[Tensor, ...] = ()
        self.static_out: tuple[LossOutput, Tensor | None] | None = None
        self._announced = False
        # the weights validation scores (train.ema_decay); None scores the last weights
        self.average = WeightAverage(model, t.ema_decay) if t.ema_decay else None

    def negatives(self) -> tuple[Tensor, Tensor]:
        """The loss's random inputs (:meth:`~recsys.train.losses.CatalogueLoss.draw`): ``([S_base]
        negative ids, [S_hard] uniforms for the hard draws)``, both empty for the exact softmax.
        Drawn outside the step so a CUDA graph replays with fresh ones."""
        return self.objective.draw()

    def counts(self, lengths: Tensor, targets: Tensor) -> Tensor | None:
        """What the masked means of a step divide by under DDP: ``[2]`` float32, the global batch's
        valid target rows and (dense) non-empty prefixes, each over the number of processes; None
        in one process, or when every rank's rows are as many (last-position targets, horizon 1).

        Each rank's loss is then its rows' sum over ``count`` (:func:`~recsys.train.losses.masked_mean`),
        i.e. ``world_size ×`` its share of the global mean, and the gradients DDP averages (and
        the row-sparse table's, which it averages the same way) are one process's at the global
        batch. One all-reduce of two integers on the device: no host sync, and a CUDA graph
        captures it with the step (NCCL, as the gradients' all-reduce)."""
        if self.world_size == 1 or not self.masked:
            return None
        counts = torch.stack([(targets > 0).sum(), lengths.sum()])  # [2] long: this rank's rows
        torch.distributed.all_reduce(counts)
        return counts.clamp_min(1).float() / self.world_size

    def loss(
        self,
        seq: Tensor,
        lengths: Tensor,
        targets: Tensor,
        negatives: Tensor,
        hard_uniforms: Tensor,
        soft: Tensor,
        counts: Tensor | None = None,
    ) -> LossOutput:
        """``seq [B, L]``, ``lengths [B]``, ``targets`` (``[B]``, or ``[B, L]`` with 0 at padding
        when dense; a trailing ``[m]`` with ``train.predict_next`` m > 1), ``negatives [S_base]``,
        ``hard_uniforms [S_hard]``, ``soft`` (0-d readout blend) on the device, ``counts``
        (:meth:`counts`, under DDP) -> the loss.

        Dense (``train.predict_at = "all"``): the interests at every prefix ``[B, L, K, d]`` become
        ``B·L`` rows, each read out against its own next click; padding positions are masked out
        of the loss (no gradient), and the hard-negative proposal reads each window's last prefix.
        With ``train.predict_next`` m > 1 every row repeats m times, once for each of its following clicks (a
        missing one, past the sequence's end, is masked out like padding). Under DDP the masked
        means divide by the global batch's rows (``counts``), so the ranks train what one
        process does.
        """
        t = self.cfg.train
        autocast = (  # the autocast weight cache cannot live across graph replays
            torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not self.use_graph)
            if self.amp
            else contextlib.nullcontext()
        )
        targets = targets.flatten()  # [R] (R = B, or B L dense; times train.predict_next), 0: no click there
        catalogue_ids = (targets, negatives)  # what the sampler's logQ is a function of
        # a form that gathers the step's rows gives the model their positions instead of the ids
        with self.items.step_rows(seq, targets, negatives) as (seq, targets, negatives), autocast:
            interests, proposal_interests, scores = self._interests(seq, lengths)
            # each row's next m clicks, read out against the same interests; max-scored negatives
            # take the unrepeated interests and score each row once (recsys.train.losses.negative_logits)
            per_target = interests.repeat_interleave(t.predict_next, dim=0) if t.predict_next > 1 else interests
            item_emb = self.model.item_embeddings()  # [N, d]
            mask = targets > 0 if self.masked else None  # one mask for every readout's rows
            count = None if counts is None else counts[0]  # the global batch's valid targets, a process
            users = readouts(
                per_target,
                item_emb[targets],
                soft=soft if self.soft_phase else 0.0,
                max_scores=self.max_scores,
                state_interest=self.state_interest,
            )
            rows = [  # each readout's rows: its user vectors [R, d] and the interests scoring negatives
                LossRows(user, targets, item_emb, scoring, proposal_interests, mask, count, catalogue_ids)
                for user, scoring in users
            ]
            outs = [self.objective(r, negatives, hard_uniforms) for r in rows]
        out = outs[0] if len(outs) == 1 else _summed(outs)
        return self._regularised(out, interests, scores, lengths, counts)

    def _interests(self, seq: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(interests [R, K, d], the hard-negative proposal's [B, K, d], attention logits [B, L, K]
        or None)``: dense, the interests at every prefix as ``R = B·L`` rows and the proposal at each
        window's last prefix; the logits only where the routing regulariser reads them."""
        if self.dense:
            prefix = self.forward(seq, lengths, prefix=True)  # [B, L, K, d]
            proposal = gather_last(prefix.flatten(2), lengths).view(-1, *prefix.shape[2:])  # [B, K, d]
            return prefix.flatten(0, 1), proposal, None  # [B L, K, d]
        if self.cfg.train.attention_reg:  # the attention logits [B, L, K] feed the routing regulariser
            interests, scores = self.forward(seq, lengths, with_attention=True)  # [B, K, d]
            return interests, interests, scores
        interests = self.forward(seq, lengths)
        return interests, interests, None

    def _regularised(
        self, out: LossOutput, interests: Tensor, scores: Tensor | None, lengths: Tensor, counts: Tensor | None
    ) -> LossOutput:
        """``out`` plus the routing regulariser (``train.attention_reg``, on ``scores``) and the
        interests' parting hinge (``train.interest_reg``)."""
        t = self.cfg.train
        if scores is not None:
            out = dataclasses.replace(out, loss=out.loss + t.attention_reg * attention_collision(scores, lengths))
        if t.interest_reg:  # dense: the padding's prefixes have zero interests, which the term skips
            # dense under DDP: over the global batch's prefixes (the ranks' last-position rows are as many)
            prefixes = counts[1] if counts is not None and self.dense else None
            parting = interest_cosine(interests, t.interest_margin, prefixes)
            out = dataclasses.replace(out, loss=out.loss + t.interest_reg * parting)
        return out

    def _update(
        self, seq: Tensor, lengths: Tensor, targets: Tensor, negatives: Tensor, hard_uniforms: Tensor, soft: Tensor
    ) -> tuple[LossOutput, Tensor | None]:
        """Loss, backward, clip, optimizer step (gradients must be None or zero on entry)."""
        counts = self.counts(lengths, targets)  # its all-reduce outside torch.compile
        out = self.loss_fn(seq, lengths, targets, negatives, hard_uniforms, soft, counts)
        out.loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grads += self.items.collect()  # the gradients the table applies itself (every rank's under DDP)
        grad_norm = clip_gradients(grads, self.cfg.train.grad_clip) if self.cfg.train.grad_clip > 0 else None
        self.optimizer.step()
        self.items.update()
        if self.average is not None:
            self.average.update()
        return out, grad_norm

    def _capture(self, batch: tuple[Tensor, ...]) -> None:
        """Warm up on the capture stream, undo those updates in place, then capture one step.

        The optimizer state must exist before capture (its lazy initialisation would otherwise
        be recorded and replayed), so the warm-up creates it and the states are then put back
        in place: copied from before the warm-up where they existed (a resumed run), zeroed
        (Adam's fresh state) where they did not; the weight average is put back too. Under DDP
        the warm-up is the :data:`~recsys.train.graphs.DDP_WARMUP_STEPS` eager iterations DDP
        needs; every rank undoes the same synchronised updates, so the replicas stay equal.
        """
        self.static_in = tuple(x.clone() for x in batch)
        params = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        average = self.average.state_dict() if self.average is not None else None  # undone like the weights
        items = self.items.train_state()  # and the item table's own
        saved = {
            p: {k: v.clone() for k, v in st.items() if torch.is_tensor(v)} for p, st in self.optimizer.state.items()
        }
        try:
            with side_stream(self.stream):
                for _ in range(DDP_WARMUP_STEPS if self.world_size > 1 else WARMUP_STEPS):
                    self.optimizer.zero_grad(set_to_none=True)
                    self._update(*self.static_in)
        finally:  # also when a warm-up step fails: eager launches go on from the same weights
            with torch.no_grad():
                self.model.load_state_dict(params)
                if self.average is not None and average is not None:
                    self.average.load_state_dict(average)
                self.items.load_train_state(items)
                for p, st in self.optimizer.state.items():
                    for k, v in st.items():
                        if torch.is_tensor(v):
                            v.copy_(saved[p][k]) if k in saved.get(p, {}) else v.zero_()
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        assert self.stream is not None
        with capturing(graph, self.stream, thread_local=self.world_size > 1):  # DDP: NCCL's watchdog thread
            out, grad_norm = self._update(*self.static_in)
        # detached: no autograd node of the capture outlives it (a re-capture would find them)
        self.graph, self.static_out = graph, (_detached(out), grad_norm)

    def _try_capture(self, batch: tuple[Tensor, ...]) -> bool:
        """Capture the step (every rank, or none); False after falling back to eager launches."""
        error: Exception | None = None
        try:
            self._capture(batch)
        except Exception as err:  # noqa: BLE001 - "auto" falls back to eager launches, true reports it
            error = err
        captured = distributed.all_true(error is None, self.device)
        if captured:
            if not self._announced:
                self.log(launch_line(self.cfg, True))
                self._announced = True
            return True
        self.use_graph, self.graph, self.static_in, self.static_out = False, None, (), None
        self.optimizer.zero_grad(set_to_none=True)
        reason = (
            "capturing the step failed on another rank"
            if error is None
            else f"capturing the step failed: {type(error).__name__}: {(str(error).strip() or '?').splitlines()[0]}"
        )
        if self.cfg.train.cuda_graph is True:
            raise ValueError(
                f'train.cuda_graph = true: {reason}; set it to "auto" to fall back to eager launches, or false'
            ) from error
        self.log(launch_line(self.cfg, False, reason))
        return False

    def __call__(
        self, seq: Tensor, lengths: Tensor, targets: Tensor, step: int = 0
    ) -> tuple[LossOutput, Tensor | None]:
        """Forward, backward, clip and update at 0-based ``step``; returns the loss and the
        pre-clip gradient norm (a device tensor, or None without clipping). Never syncs the host
        (except once, under DDP, to agree that every rank captured its graph)."""
        self.model.train()
        warm = self.cfg.train.soft_readout_steps
        if self.soft_phase and step >= warm:  # the blend has reached the argmax: drop its cost
            self.soft_phase, self.graph = False, None
        self.soft.fill_(max(0.0, 1.0 - step / warm) if warm else 0.0)
        if self.average is not None:
            self.average.prepare(step)
        batch = (seq, lengths, targets, *self.negatives(), self.soft)
        if self.use_graph and self.graph is None:
            self._try_capture(batch)
        if not self.use_graph:
            self.optimizer.zero_grad(set_to_none=True)
            return self._update(*batch)
        for static, x in zip(self.static_in, batch):
            static.copy_(x, non_blocking=True)
        assert self.graph is not None and self.static_out is not None
        self.graph.replay()
        return self.static_out

    def scale_lr(self, factor: float) -> None:
        """Multiply every parameter group's learning rate by ``factor``. A captured step is
        captured again at its next call: the graph holds the rate as a constant."""
        for group in self.optimizer.param_groups:
            group["lr"] *= factor
        self.items.scale_lr(factor)
        self.graph = None

    @contextlib.contextmanager
    def scored_weights(self) -> Iterator[None]:
        """The model holds the weights validation scores inside the block: every item row brought
        up to the current step (row-sparse), and the weight average where there is one."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.items.scored())
            if self.average is not None:
                stack.enter_context(self.average.swapped_in())
            yield

    def reset_average(self, step: int) -> None:
        """Average afresh from the current weights after ``step`` (a plateau's lr drop)."""
        self.items.reset_average()
        if self.average is not None:
            self.average.reset(step)

    def state_dict(self) -> dict[str, Any]:
        """The step's resume state beside the model's weights: the optimiser's, and the weight
        average's and the row-sparse item table's where they exist (after :meth:`scored_weights`
        has brought the rows up to date)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            **({"average": self.average.state_dict()} if self.average is not None else {}),
            **({"item_rows": items} if (items := self.items.train_state()) else {}),
        }

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Put back :meth:`state_dict`'s entries of a resume checkpoint."""
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.average is not None:
            self.average.load_state_dict(checkpoint["average"])
        self.items.load_train_state(checkpoint.get("item_rows", {}))


def _summed(outs: list[LossOutput]) -> LossOutput:
    """Losses of several readouts of one batch as one: their sum, the first's log-partition, the largest logit."""
    return LossOutput(
        loss=torch.stack([o.loss for o in outs]).sum(),
        log_z=outs[0].log_z,
        max_logit=torch.stack([o.max_logit for o in outs]).max(),
    )


def clip_gradients(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale ``grads`` in place so that their joint L2 norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does for parameters (a row-sparse step's row gradients
    belong to no parameter); returns the norm before clipping (a device tensor, no host sync)."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def _detached(out: LossOutput) -> LossOutput:
    return dataclasses.replace(out, loss=out.loss.detach())
