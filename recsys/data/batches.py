"""Padded sequence windows and ComiRec's training sampler, vectorised with numpy.

Sequences are stored in CSR layout (``items[indptr[u]:indptr[u + 1]]`` is row ``u``'s clicks,
oldest first) and handed to models right-padded: valid clicks at positions ``0..len-1``,
zeros after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def pad_sequences(
    indptr: np.ndarray, items: np.ndarray, users: np.ndarray, max_len: int, ends: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The last ``max_len`` clicks of each selected row, right-padded with 0.

    Args:
        indptr ``[R + 1]`` int64, items ``[nnz]`` int64: the CSR sequences.
        users ``[B]`` int64: rows to take.
        max_len: width of the output.
        ends ``[B]`` int64 (optional): take only ``items[indptr[u]:ends[b]]`` for row ``b``
            (absolute positions into ``items``, ``indptr[u] <= ends[b] <= indptr[u + 1]``);
            default: the whole row.

    Returns:
        inputs ``[B, max_len]`` int64 and lengths ``[B]`` int64 (``min(n, max_len)``).
    """
    users = np.asarray(users, dtype=np.int64)
    starts = indptr[users]
    ends = indptr[users + 1] if ends is None else np.asarray(ends, dtype=np.int64)
    if np.any(ends < starts) or np.any(ends > indptr[users + 1]):
        raise ValueError("pad_sequences: ends must lie within each selected row")
    lengths = np.minimum(ends - starts, max_len).astype(np.int64)
    cols = np.arange(max_len)
    valid = cols[None, :] < lengths[:, None]  # [B, max_len]
    inputs = np.zeros((len(users), max_len), dtype=np.int64)
    if valid.any():
        index = (ends - lengths)[:, None] + cols[None, :]  # [B, max_len] positions into items
        inputs[valid] = items[index[valid]]
    return inputs, lengths


def following_clicks(items: np.ndarray, first: np.ndarray, row_end: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` clicks from absolute position ``first`` on, 0 past the row's end.

    Args:
        items ``[nnz]`` int64: the CSR clicks.
        first ``[...]`` int64: absolute positions into ``items`` (``first < row_end`` where a target is
            wanted; elsewhere the output is all 0).
        row_end ``[...]`` int64 (broadcast against ``first``): each position's row end, exclusive.
        count: clicks to take.

    Returns:
        ``[..., count]`` int64: ``items[first + j]`` where ``first + j < row_end``, else 0.
    """
    index = np.asarray(first, dtype=np.int64)[..., None] + np.arange(count)  # [..., count]
    valid = index < np.asarray(row_end, dtype=np.int64)[..., None]
    out = np.zeros(index.shape, dtype=np.int64)
    out[valid] = items[index[valid]]
    return out


def gather_rows(items: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A new CSR holding ``items[starts[b]:ends[b]]`` as row ``b``.

    ``starts``/``ends`` ``[B]`` int64 are absolute positions into ``items [nnz]``; returns
    ``(indptr [B + 1] int64, items [sum(ends - starts)] int64)``.
    """
    sizes = np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
    out_indptr = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=out_indptr[1:])
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - out_indptr[:-1], sizes)
    return out_indptr, items[offsets + np.arange(out_indptr[-1])].astype(np.int64)


class _SequenceSampler:
    """What both samplers share: the CSR sequences, the rows long enough to draw from, how many
    following clicks a target position predicts and the random stream (whose state checkpoints carry).

    Under data parallelism every process holds the same stream (the same ``seed``), draws the
    whole global batch of ``batch_size × world_size`` rows and positions (integers, from the
    row lengths alone) and reads the clicks of its own ``rank``-th slice only. The ranks then
    train on the batch one process draws at the global batch size, a checkpoint's stream (rank
    0's) is every rank's, and a run resumed on another number of processes draws what it would
    have.

    Args:
        indptr ``[R + 1]`` int64, items ``[nnz]`` int64: training sequences (CSR).
        max_len: history width.
        seed: the sampler's own random stream; equal seeds give equal batches.
        users ``[U']`` int64 (optional): draw only from these rows.
        predict_next: following clicks each target position predicts (default 1: the next one).
        min_clicks: the shortest row that can give a sample; ``why`` ends the error when none can.
        rank, world_size: this process's slice of the global batch, and the number of slices.
        ends ``[R]`` int64 (optional): row ``r`` is ``items[indptr[r]:ends[r]]`` (default: the
            whole row), so the training part of each user's clicks is read from the dataset's
            own, possibly memory-mapped, arrays without a copy (:class:`~recsys.data.split.Split`).
    """

    def __init__(
        self,
        indptr: np.ndarray,
        items: np.ndarray,
        max_len: int,
        seed: int,
        users: np.ndarray | None,
        predict_next: int,
        min_clicks: int,
        why: str,
        rank: int,
        world_size: int,
        ends: np.ndarray | None,
    ) -> None:
        name = type(self).__name__
        if predict_next < 1:
            raise ValueError(f"{name}: predict_next must be >= 1, got {predict_next}")
        if not 0 <= rank < world_size:
            raise ValueError(f"{name}: rank must be in [0, world_size), got rank {rank} of {world_size}")
        self.rank, self.world_size = rank, world_size
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.items = np.asarray(items, dtype=np.int64)  # a memory-mapped array stays mapped
        self.ends = self.indptr[1:] if ends is None else np.asarray(ends, dtype=np.int64)  # [R]
        self.max_len = max_len
        self.predict_next = predict_next
        lengths = self.ends - self.indptr[:-1]
        pool = np.arange(len(lengths)) if users is None else np.asarray(users, dtype=np.int64)
        self.users = pool[lengths[pool] >= min_clicks]  # [U] rows that can give a sample
        if len(self.users) == 0:
            raise ValueError(f"{name}: no training sequence has {why}")
        self.rng = np.random.default_rng(seed)
        self.weights: np.ndarray | None = None  # [U] cumulative targets of self.users, where rows draw by targets
        self.epoch: _Epoch | None = None  # where every target is drawn once an epoch: the epoch's order

    @property
    def num_users(self) -> int:
        """Rows the sampler draws from (those long enough to give a sample)."""
        return len(self.users)

    def _draw(self, batch_size: int, low: int, past_end: int, stride: int = 0) -> tuple[np.ndarray, ...]:
        """Draw the global batch and keep this rank's slice: ``(rows, starts, ends, at)``, each
        ``[B]`` int64 (``B = batch_size``): each row, the absolute positions of its first click
        and past its last, and for its ``n`` clicks a uniform integer in ``[low, n + past_end)``,
        or with ``stride`` s > 0 a uniform one of ``hi, hi - s, hi - 2s, ... >= low`` where
        ``hi = n + past_end - 1``. Only the slice's clicks are read afterwards."""
        draws = batch_size * self.world_size
        if self.epoch is not None and self.weights is not None:  # the next targets of the epoch's order
            picks = self._next_targets(draws)
            index = np.searchsorted(self.weights, picks, "right")
            rows = self.users[index]
            first = picks - np.concatenate([[0], self.weights[:-1]])[index]  # the target's place in its row
            mine = slice(self.rank * batch_size, (self.rank + 1) * batch_size)
            return rows[mine], self.indptr[rows][mine], self.ends[rows][mine], (low + first)[mine]
        if self.weights is None:
            rows = self.users[self.rng.integers(0, len(self.users), size=draws)]
        else:  # a row as often as it has targets: with the uniform position below, every target equally likely
            picks = self.rng.integers(0, self.weights[-1], size=draws)
            rows = self.users[np.searchsorted(self.weights, picks, "right")]
        starts, ends = self.indptr[rows], self.ends[rows]
        if stride:
            hi = ends - starts + past_end - 1
            at = hi - stride * self.rng.integers(0, (hi - low) // stride + 1)
        else:
            at = self.rng.integers(low, ends - starts + past_end)
        mine = slice(self.rank * batch_size, (self.rank + 1) * batch_size)
        return rows[mine], starts[mine], ends[mine], at[mine]

    def _next_targets(self, draws: int) -> np.ndarray:
        """``[draws]`` int64: the next global target indices of the epoch's order (0 ..
        ``weights[-1] - 1``), a fresh order drawn each time one runs out."""
        assert self.epoch is not None and self.weights is not None
        out = []
        while draws:
            if self.epoch.cursor == len(self.epoch.order):
                self.epoch = _Epoch.drawn(self.rng, int(self.weights[-1]))
            take = self.epoch.order[self.epoch.cursor : self.epoch.cursor + draws]
            self.epoch.cursor += len(take)
            draws -= len(take)
            out.append(take)
        return np.concatenate(out)

    def get_state(self) -> dict[str, Any]:
        """The random stream's state (plain dict of str/int), for checkpoints."""
        return dict(self.rng.bit_generator.state)

    def set_state(self, state: dict) -> None:
        """Resume the random stream from :meth:`get_state`'s result."""
        self.rng.bit_generator.state = state

    def epoch_state(self) -> dict[str, Any] | None:
        """Where targets are drawn by epochs: the stream's state when the epoch's order was drawn
        and how far the order has been read (plain data, for checkpoints); else None."""
        return None if self.epoch is None else {"drawn_from": self.epoch.drawn_from, "cursor": self.epoch.cursor}

    def restore_epoch(self, state: dict[str, Any] | None) -> None:
        """Draw the epoch's order again from :meth:`epoch_state`'s result and read on from where it
        was; the stream itself is left as it is (:meth:`set_state` restores it). None: nothing to do."""
        if state is None or self.epoch is None or self.weights is None:
            return
        now = dict(self.rng.bit_generator.state)
        self.rng.bit_generator.state = state["drawn_from"]
        self.epoch = _Epoch.drawn(self.rng, int(self.weights[-1]))
        self.epoch.cursor = int(state["cursor"])
        self.rng.bit_generator.state = now


@dataclass
class _Epoch:
    """One epoch's order of every training target, and how far it has been read."""

    order: np.ndarray  # [T] int64, a permutation of the global target indices
    cursor: int  # targets already drawn
    drawn_from: dict[str, Any]  # the stream's state before the order was drawn (a checkpoint draws it again)

    @classmethod
    def drawn(cls, rng: np.random.Generator, targets: int) -> _Epoch:
        start = dict(rng.bit_generator.state)
        return cls(rng.permutation(targets).astype(np.int64), 0, start)


class TrainSampler(_SequenceSampler):
    """ComiRec's training samples: a uniformly random user with more than ``min_target``
    clicks, a uniformly random target position ``t`` in ``[min_target, n - 1]`` of that user's
    sequence, and the up-to-``max_len`` clicks before ``t`` as the history. With ``predict_next`` m > 1
    the targets are the clicks at ``t .. t + m - 1`` (fewer at the sequence's end), each read
    out against the same interests: PinnerFormer's "all-action" objective, closer to what the
    ComiRec protocol scores (the whole rest of a sequence) than the next click alone.

    With ``by_targets`` the user is drawn as often as they have targets instead (``n - min_target``),
    so every training target is equally likely, as in an epoch over every prefix of every user (the
    training set of S3Rec's pipeline, which BSARec and its successors share); each draw is
    independent, so in one epoch's worth of draws some targets come twice and about a third not at
    all. With ``epochs`` they are drawn as that pipeline's data loader draws them instead: every
    target exactly once an epoch, in a fresh random order each epoch (an epoch's tail and the next
    one's start may share a batch).

    Args: those of :class:`_SequenceSampler`, ``min_target``: the earliest target position (default 1:
    any click with a history; ComiRec's reference code uses 4), ``by_targets`` (default False) and
    ``epochs`` (default False; implies ``by_targets``).
    """

    def __init__(
        self,
        indptr: np.ndarray,
        items: np.ndarray,
        max_len: int,
        seed: int,
        users: np.ndarray | None = None,
        min_target: int = 1,
        predict_next: int = 1,
        rank: int = 0,
        world_size: int = 1,
        ends: np.ndarray | None = None,
        by_targets: bool = False,
        epochs: bool = False,
    ) -> None:
        if min_target < 1:
            raise ValueError(f"TrainSampler: min_target must be >= 1, got {min_target}")
        self.min_target = min_target
        why = f"more than {min_target} clicks"
        super().__init__(indptr, items, max_len, seed, users, predict_next, min_target + 1, why, rank, world_size, ends)
        if by_targets or epochs:
            self.weights = np.cumsum((self.ends - self.indptr[:-1])[self.users] - min_target)
        if epochs:
            assert self.weights is not None
            self.epoch = _Epoch.drawn(self.rng, int(self.weights[-1]))

    def sample(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This rank's ``B = batch_size`` samples of the global batch: ``seq [B, max_len]`` int64
        (right-padded), ``lengths [B]`` int64 (>= 1) and ``targets``: ``[B]`` int64, the click
        that followed each history, or with ``predict_next`` m > 1 ``[B, m]`` int64, the m clicks that
        followed it (0 past the sequence's end)."""
        rows, starts, row_ends, positions = self._draw(batch_size, self.min_target, 0)  # in [min_target, n - 1]
        seq, lengths = pad_sequences(self.indptr, self.items, rows, self.max_len, ends=starts + positions)
        targets = following_clicks(self.items, starts + positions, row_ends, self.predict_next)  # [B, m]
        return seq, lengths, targets[:, 0] if self.predict_next == 1 else targets


class WindowSampler(_SequenceSampler):
    """Dense training windows: a uniformly random user with at least two clicks, an end ``e`` of
    that user's sequence, and the up-to-``max_len + 1`` clicks before ``e`` as one window.
    Position ``t`` of the window's inputs (clicks ``0..n_w - 2``) predicts click ``t + 1``, so one
    window carries up to ``max_len`` targets, each seeing only the clicks before it (causal models).

    Where the window ends (``train.windows``):

    - ``tiled``: one of ``n, n - max_len, n - 2 max_len, ... >= 2``, uniformly. The windows tile
      the sequence, so each click is a target in exactly one of them, and a user with at most
      ``max_len + 1`` clicks always trains on the whole sequence, as RecTools' SASRec trains every
      user's last clicks once an epoch: the window nearest what serving and the test read (the
      user's latest history) is never rarer than an early prefix.
    - ``random``: uniformly in ``[2, n]``. A click at position ``t`` is a target in a share
      ``(n - t) / (n - 1)`` of a short user's windows, so early clicks, read with short
      histories, train far more often than the latest ones (measured: docs/defaults.md, "Dense
      training windows").

    With ``predict_next`` m > 1, position ``t`` predicts each of clicks ``t + 1 .. t + m`` of the
    user's sequence (reaching past the window's end, fewer at the sequence's end).

    Args: those of :class:`_SequenceSampler` (``min_target`` does not apply: every click with one before it
    is a target somewhere), and ``tiled`` (default True): the window ends above.
    """

    def __init__(
        self,
        indptr: np.ndarray,
        items: np.ndarray,
        max_len: int,
        seed: int,
        users: np.ndarray | None = None,
        predict_next: int = 1,
        rank: int = 0,
        world_size: int = 1,
        ends: np.ndarray | None = None,
        tiled: bool = True,
    ) -> None:
        super().__init__(indptr, items, max_len, seed, users, predict_next, 2, "two clicks", rank, world_size, ends)
        self.tiled = tiled

    def mean_targets(self) -> float:
        """Expected valid positions of one window, ``E[min(e - 1, max_len)]`` over the draw (its
        targets at ``predict_next`` 1)."""
        n = (self.ends - self.indptr[:-1])[self.users]  # [U]
        if self.tiled:  # every click but the first is a target in one of the user's tiles
            return float(((n - 1) / ((n - 2) // self.max_len + 1)).mean())
        full = np.maximum(n - self.max_len - 1, 0)  # ends e in [max_len + 2, n] give max_len targets
        short = np.minimum(n, self.max_len + 1) - 1  # ends e in [2, min(n, max_len + 1)] give e - 1
        per_user = (full * self.max_len + short * (short + 1) / 2) / (n - 1)
        return float(per_user.mean())

    def sample(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This rank's ``B = batch_size`` windows of the global batch: ``seq [B, max_len]`` int64
        (right-padded), ``lengths [B]`` int64 (>= 1) and ``targets [B, max_len]`` int64:
        ``targets[b, t]`` is the click after ``seq[b, t]``, 0 at padded positions; with ``predict_next``
        m > 1 ``[B, max_len, m]``, the m clicks after it (0 at padded positions and past the
        sequence's end)."""
        rows, starts, row_ends, ends = self._draw(batch_size, 2, 1, self.max_len if self.tiled else 0)  # in [2, n]
        ends = starts + ends  # absolute, exclusive
        seq, lengths = pad_sequences(self.indptr, self.items, rows, self.max_len, ends=ends - 1)
        cols = np.arange(self.max_len)
        first = (ends - lengths)[:, None] + cols[None, :]  # [B, max_len] absolute position of each next click
        # padded positions get a row end at their own first target, so no click
        row_end = np.where(cols[None, :] < lengths[:, None], row_ends[:, None], first)
        targets = following_clicks(self.items, first, row_end, self.predict_next)  # [B, max_len, m]
        return seq, lengths, targets[..., 0] if self.predict_next == 1 else targets
