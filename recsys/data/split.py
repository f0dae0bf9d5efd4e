"""Train / validation / test splits of a :class:`~recsys.data.prepare.Dataset`.

``split = "user"`` (ComiRec): users are shuffled with ``seed`` and cut into train, valid and
test (``1 - valid_frac - test_frac : valid_frac : test_frac``, 8:1:1 by default; at least one
test user). Train users keep their whole sequence. For each valid/test user with ``n`` clicks
the first ``int(eval_input_frac * n)`` clicks are the input (its last ``max_len`` clicks are
fed to the model) and the remaining clicks are the truth.

``split = "time"``: a global cutoff at the ``time_cutoff_quantile`` of all click times.
Training sequences are every user's clicks strictly before the cutoff (users with none are
left out). Users with clicks on both sides are evaluated: input = their clicks before the
cutoff, truth = their clicks at or after it; they are shuffled with ``seed`` and shared
between valid and test in the ratio ``valid_frac : test_frac``. No click at or after the
cutoff ever reaches training. Needs real timestamps.

``split = "leave_one_out"`` (the protocol of SASRec and the papers after it): every user with at
least 3 clicks trains on all but their last two clicks; validation scores their second-to-last
click and test their last one, each given every click before it as the input (its last
``max_len`` fed to the model), so every such user is in both sets. Users with fewer than 3 clicks
cannot hold out two clicks: all their clicks train and they are never evaluated. Which targets
are scored is ``loo_rules``'s: with ``"rectools"`` (RecTools' rules, the eSASRec benchmark's) a
target is dropped (its user leaves that set only) when

- the user already clicked its item earlier (a repeat: excluding the user's clicks, as this
  protocol does by default, would make it unreachable), or
- its item is cold: for validation, no training click is that item; for test, no click but the
  users' last clicks is (the training clicks and the validation targets: RecTools' "train"
  part for its test split, all but the last click).

With ``"every_user"`` (the rules of S3Rec's pipeline, which FMLP-Rec, BSARec, TV-Rec and WEARec
share) nothing is dropped: every held-out user is scored, and a repeated or cold target counts
as the miss it almost always is (that pipeline scores the user's clicked items 0 instead of
excluding them, which differs only where the whole top N scores below 0).

Ties in time keep the source's row order (:mod:`recsys.data.prepare` sorts stably), so on a
file whose rows are in the published order the split is the published one. No seed applies.

Evaluation users whose input or truth would be empty (in the user split: users with fewer
than 2 clicks at the default fraction) are dropped from the evaluation sets.

**Held-out items** (``data.held_out_items``, :func:`read_held_out`, kept as ``Dataset.held_out``):
after any of the three splits, every click on those items is taken out of the training part (the
training users' sequences, the time split's clicks before the cutoff, leave-one-out's training
prefixes), and out of nothing else: the evaluation sets keep them in inputs and truth. Their
training count is then 0, so a model with item features represents them by their features alone
(:mod:`recsys.items.features`), as it would items that are new: how to measure new items on a log
where every item has clicks. Which targets the leave-one-out rules drop is decided on the log before
the items are held out (a held-out item is not a cold target), so its targets are scored. The
training rows are then a copy without those clicks (:func:`hold_out`), not read in place.

Every split reads the dataset's clicks in place (they may be memory-mapped): what it computes over
every click (the time split's cutoff and each user's clicks before it, the leave-one-out's
training counts and repeated targets) is computed :data:`CLICK_BLOCK` clicks or
:data:`USER_BLOCK` users at a time, so a process of a large job never holds an array as long as
the log. The arrays it keeps are per user, and the evaluation sets' inputs and truth.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recsys.config import DataConfig
from recsys.data.batches import gather_rows, pad_sequences
from recsys.data.prepare import Dataset
from recsys.data.readers import DataError
from recsys.text import count

CLICK_BLOCK = 1 << 22  # clicks read at a time by a pass over every click (32 MiB of float64 times)
USER_BLOCK = 1 << 16  # users whose rows are read at a time


@dataclass(eq=False)
class EvalSet:
    """Evaluation users with model input and held-out truth.

    users ``[U]`` int64 user indices; inputs ``[U, max_len]`` int64 right-padded with 0 (the
    last ``max_len`` input clicks); lengths ``[U]`` int64; truth ``items`` of user ``i`` are
    ``truth_items[truth_indptr[i]:truth_indptr[i + 1]]`` (in click order, duplicates kept).

    The whole input (every click before the truth, not only the last ``max_len``), which is what
    ``eval.exclude_history`` removes from the recommendations, is
    ``clicks[clicks_indptr[users[i]]:input_end[i]]``: ``clicks_indptr [R + 1]`` / ``clicks [nnz]``
    are the dataset's own CSR sequences (shared, not copied: they may be memory-mapped) and
    ``input_end [U]`` int64 absolute positions into ``clicks``. An eval set built by hand may
    leave them out; its input is then ``inputs`` (:meth:`history`).
    """

    users: np.ndarray
    inputs: np.ndarray
    lengths: np.ndarray
    truth_indptr: np.ndarray
    truth_items: np.ndarray
    clicks_indptr: np.ndarray | None = None
    clicks: np.ndarray | None = None
    input_end: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.users)

    def sample(self, n: int, seed: int) -> EvalSet:
        """A fixed random sample of ``n`` of the users (in their order; all of them when ``n``
        is 0 or at least their number): validation's users on a large log."""
        if n <= 0 or n >= len(self):
            return self
        return self.rows(np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False)))

    def rows(self, rows: np.ndarray) -> EvalSet:
        """The users at positions ``rows [U']`` (int64, distinct, ascending), as an eval set of their own."""
        if len(rows) == len(self):
            return self
        truth_indptr, truth_items = gather_rows(self.truth_items, self.truth_indptr[rows], self.truth_indptr[rows + 1])
        return EvalSet(
            self.users[rows],
            self.inputs[rows],
            self.lengths[rows],
            truth_indptr,
            truth_items,
            self.clicks_indptr,
            self.clicks,
            None if self.input_end is None else self.input_end[rows],
        )

    def history(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Users ``start..stop-1``'s whole inputs as CSR ``(indptr [stop - start + 1], items)`` int64."""
        if self.clicks_indptr is None or self.clicks is None or self.input_end is None:
            lengths = np.asarray(self.lengths[start:stop], dtype=np.int64)
            inputs = np.asarray(self.inputs[start:stop], dtype=np.int64)
            indptr = np.concatenate([[0], np.cumsum(lengths)])
            return indptr, inputs[np.arange(inputs.shape[1])[None, :] < lengths[:, None]]
        starts = self.clicks_indptr[self.users[start:stop]]
        return gather_rows(self.clicks, starts, self.input_end[start:stop])


@dataclass(eq=False)
class Split:
    """The training sequences and the two evaluation sets.

    The training clicks are not copied: user ``u``'s are ``clicks[clicks_indptr[u]:train_ends[u]]``,
    a prefix of its row in the dataset's own CSR arrays (memory-mapped for a dataset prepared on
    disk), so a process reads only the rows it samples (with held-out items, :func:`hold_out`, they are a
    copy without those items' clicks). ``clicks_indptr [U + 1]``, ``clicks [nnz]``
    and ``train_ends [U]`` are int64; ``train_users [R]`` are the users with training clicks (the
    others' ``train_ends`` are their rows' starts). ``cutoff`` is the time split's cutoff
    (``None`` otherwise).
    """

    clicks_indptr: np.ndarray
    clicks: np.ndarray
    train_ends: np.ndarray
    train_users: np.ndarray
    valid: EvalSet
    test: EvalSet
    cutoff: float | None = None

    @property
    def train_lengths(self) -> np.ndarray:
        """``[R]`` int64: the training clicks of each of ``train_users``."""
        return (self.train_ends - self.clicks_indptr[:-1])[self.train_users]

    def train_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """The training sequences copied into a CSR of their own, ``(indptr [R + 1], items)``
        int64, row ``r`` being user ``train_users[r]``: every training click in memory (small
        data and inspection; training reads the rows in place)."""
        return gather_rows(self.clicks, self.clicks_indptr[self.train_users], self.train_ends[self.train_users])

    @property
    def train_indptr(self) -> np.ndarray:
        """``[R + 1]``: the row pointers of :meth:`train_csr` (a copy in memory; code written
        against the split's in-memory CSR reads these two, the reference SASRec among it)."""
        return self._train_csr[0]

    @property
    def train_items(self) -> np.ndarray:
        """The training clicks of :meth:`train_csr`, row after row (see :attr:`train_indptr`)."""
        return self._train_csr[1]

    @functools.cached_property
    def _train_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return self.train_csr()

    def train_item_counts(self, num_items: int, block: int = 1 << 16) -> np.ndarray:
        """``[num_items]`` int64 training clicks per item, counted ``block`` users at a time (in
        bounded memory, whatever the log's size)."""
        users = self.train_users
        return _count_items(self.clicks, self.clicks_indptr[users], self.train_ends[users], num_items, block)


def _count_items(
    items: np.ndarray, starts: np.ndarray, ends: np.ndarray, num_items: int, block: int | None = None
) -> np.ndarray:
    """``[num_items]`` int64 occurrences of each item in the rows ``items[starts[r]:ends[r]]``
    (``starts``, ``ends [R]`` absolute positions), ``block`` rows (:data:`USER_BLOCK`) at a time."""
    block = block or USER_BLOCK
    counts = np.zeros(num_items, dtype=np.int64)
    for first in range(0, len(starts), block):
        _, clicks = gather_rows(items, starts[first : first + block], ends[first : first + block])
        counts += np.bincount(clicks, minlength=num_items)
    return counts


def split_dataset(ds: Dataset, cfg: DataConfig) -> Split:
    """Split ``ds`` as ``cfg.split`` says (see the module docstring); reproducible by ``cfg.seed``.
    The items of ``ds.held_out`` leave the training part (:func:`hold_out`)."""
    if cfg.split == "user":
        split = _user_split(ds, cfg)
    elif cfg.split == "time":
        split = _time_split(ds, cfg)
    elif cfg.split == "leave_one_out":
        split = _leave_one_out_split(ds, cfg)
    else:
        raise DataError(f"data.split: unknown split {cfg.split!r} (user | time | leave_one_out)")
    return split if ds.held_out is None or not len(ds.held_out) else hold_out(split, ds.held_out)


def read_held_out(cfg: DataConfig, ds: Dataset) -> np.ndarray | None:
    """The sorted item ids ``[h]`` int64 of ``cfg.held_out_items`` (a text file of raw item ids, one a
    line; blank lines are skipped), or ``None`` without the setting. An id must be one of ``ds``'s
    items (clicked, or a new item of its features); an unknown one is a :class:`DataError` naming the
    file and the first few unknown ids."""
    if not cfg.held_out_items:
        return None
    path = Path(cfg.held_out_items)
    try:
        raw = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"data.held_out_items: cannot read {path} ({err})") from err
    ids, unknown = ds.item_map.encode([r for r in raw if r])
    if unknown:
        shown = ", ".join(repr(r) for r in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise DataError(
            f"data.held_out_items: {path}: {count(len(unknown), 'item id')} not among the prepared items "
            f"(never clicked or dropped by the filter, and not in data.item_features): {shown}"
        )
    return np.unique(ids)


def hold_out(split: Split, items: np.ndarray) -> Split:
    """``split`` with every click on ``items [h]`` (item ids) removed from its training part: the
    training rows become a CSR of their own (user ``u``'s kept training clicks, in order, are
    ``clicks[clicks_indptr[u]:train_ends[u]]``), built :data:`USER_BLOCK` users at a time, and the
    users left without a training click leave ``train_users``. The evaluation sets are untouched."""
    users = split.train_users
    kept, lengths = [], np.zeros(len(users), dtype=np.int64)
    for first in range(0, len(users), USER_BLOCK):
        block = users[first : first + USER_BLOCK]
        indptr, clicks = gather_rows(split.clicks, split.clicks_indptr[block], split.train_ends[block])
        keep = ~np.isin(clicks, items)
        row = np.repeat(np.arange(len(block)), np.diff(indptr))
        lengths[first : first + len(block)] = np.bincount(row[keep], minlength=len(block))
        kept.append(clicks[keep])
    per_user = np.zeros(len(split.clicks_indptr) - 1, dtype=np.int64)
    per_user[users] = lengths
    indptr = np.concatenate([[0], np.cumsum(per_user)]).astype(np.int64)
    return dataclasses.replace(
        split,
        clicks_indptr=indptr,
        clicks=np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64),
        train_ends=indptr[1:].copy(),
        train_users=users[lengths > 0],
    )


def make_eval_set(
    indptr: np.ndarray,
    items: np.ndarray,
    users: np.ndarray,
    split_at: np.ndarray,
    max_len: int,
    truth_end: np.ndarray | None = None,
) -> EvalSet:
    """Input = ``items[indptr[u]:split_at]``, truth = ``items[split_at:truth_end]`` for each user
    ``u`` in ``users [U]`` (``split_at``, ``truth_end [U]`` absolute positions; ``truth_end``
    defaults to the row's end). Users whose input or truth is empty are dropped."""
    users = np.asarray(users, dtype=np.int64)
    split_at = np.asarray(split_at, dtype=np.int64)
    truth_end = indptr[users + 1] if truth_end is None else np.asarray(truth_end, dtype=np.int64)
    ok = (split_at > indptr[users]) & (split_at < truth_end)
    users, split_at, truth_end = users[ok], split_at[ok], truth_end[ok]
    inputs, lengths = pad_sequences(indptr, items, users, max_len, ends=split_at)
    truth_indptr, truth_items = gather_rows(items, split_at, truth_end)
    return EvalSet(
        users=users,
        inputs=inputs,
        lengths=lengths,
        truth_indptr=truth_indptr,
        truth_items=truth_items,
        clicks_indptr=indptr,
        clicks=items,
        input_end=split_at,
    )


def _user_split(ds: Dataset, cfg: DataConfig) -> Split:
    n = ds.num_users
    n_test = max(1, round(cfg.test_frac * n))
    n_valid = round(cfg.valid_frac * n)
    if n_valid + n_test >= n:
        raise DataError(f"{count(n, 'user')} after filtering: too few for a user split with a training part")
    perm = np.random.default_rng(cfg.seed).permutation(n)
    valid, test, train = (np.sort(part) for part in np.split(perm, [n_valid, n_valid + n_test]))
    starts = ds.indptr[:-1]
    split_at = starts + (cfg.eval_input_frac * ds.lengths).astype(np.int64)  # int(frac * n)
    train_ends = starts.copy()
    train_ends[train] = ds.indptr[train + 1]  # a training user's whole row
    return Split(
        clicks_indptr=ds.indptr,
        clicks=ds.items,
        train_ends=train_ends,
        train_users=train,
        valid=make_eval_set(ds.indptr, ds.items, valid, split_at[valid], cfg.max_len),
        test=make_eval_set(ds.indptr, ds.items, test, split_at[test], cfg.max_len),
    )


def _time_split(ds: Dataset, cfg: DataConfig) -> Split:
    if ds.times is None:
        raise DataError(
            f"data.split='time' needs click timestamps, but {ds.source or 'this dataset'} only has "
            "click positions; use data.split='user'"
        )
    cutoff = quantile(ds.times, cfg.time_cutoff_quantile)
    before = _clicks_before(ds.times, ds.indptr, cutoff)  # [U] a prefix of each row: sorted by time
    split_at = ds.indptr[:-1] + before
    train = np.flatnonzero(before > 0)
    if len(train) == 0:
        raise DataError(f"no click is before the time cutoff {cutoff} (data.time_cutoff_quantile)")
    straddle = np.flatnonzero((before > 0) & (split_at < ds.indptr[1:]))
    perm = np.random.default_rng(cfg.seed).permutation(straddle)
    n_valid = round(len(perm) * cfg.valid_frac / (cfg.valid_frac + cfg.test_frac))
    valid, test = np.sort(perm[:n_valid]), np.sort(perm[n_valid:])
    return Split(
        clicks_indptr=ds.indptr,
        clicks=ds.items,
        train_ends=split_at,  # every click before the cutoff
        train_users=train,
        valid=make_eval_set(ds.indptr, ds.items, valid, split_at[valid], cfg.max_len),
        test=make_eval_set(ds.indptr, ds.items, test, split_at[test], cfg.max_len),
        cutoff=cutoff,
    )


def _leave_one_out_split(ds: Dataset, cfg: DataConfig) -> Split:
    starts, ends = ds.indptr[:-1], ds.indptr[1:]
    held = ds.lengths >= 3  # [U] users who can give a validation and a test click
    train_ends = np.where(held, ends - 2, ends)
    users = np.flatnonzero(held)
    valid_at, test_at = ends[users] - 2, ends[users] - 1  # [U'] absolute positions of the targets
    if cfg.loo_rules == "every_user":
        valid = make_eval_set(ds.indptr, ds.items, users, valid_at, cfg.max_len, truth_end=valid_at + 1)
        test = make_eval_set(ds.indptr, ds.items, users, test_at, cfg.max_len, truth_end=test_at + 1)
    else:
        known = _count_items(ds.items, starts, train_ends, ds.num_items) > 0  # [num_items] with a training click
        valid = _next_click_set(ds, users, valid_at, known, cfg.max_len)
        known[ds.items[valid_at]] = True  # the test's "train" part: every click but the users' last ones
        test = _next_click_set(ds, users, test_at, known, cfg.max_len)
    return Split(
        clicks_indptr=ds.indptr,
        clicks=ds.items,
        train_ends=train_ends,
        train_users=np.arange(ds.num_users, dtype=np.int64),
        valid=valid,
        test=test,
    )


def _next_click_set(ds: Dataset, users: np.ndarray, at: np.ndarray, known: np.ndarray, max_len: int) -> EvalSet:
    """Each user in ``users [U']`` scores its click at absolute position ``at [U']`` given every
    click before it; dropped where that item is not ``known [num_items]`` or the user clicked it
    before (the module docstring's rules)."""
    target = ds.items[at]  # [U']
    keep = known[target] & ~_clicked_before(ds, users, at)
    users, at = users[keep], at[keep]
    return make_eval_set(ds.indptr, ds.items, users, at, max_len, truth_end=at + 1)


def _clicked_before(ds: Dataset, users: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``[U']`` bool: user ``users[i]`` clicked ``items[at[i]]`` somewhere before position ``at[i]``
    (read :data:`USER_BLOCK` users at a time)."""
    out = np.zeros(len(users), dtype=bool)
    for first in range(0, len(users), USER_BLOCK):
        block = slice(first, first + USER_BLOCK)
        indptr, clicks = gather_rows(ds.items, ds.indptr[users[block]], at[block])  # the clicks before each target
        sizes = np.diff(indptr)
        row = np.repeat(np.arange(len(sizes)), sizes)  # [clicks] the block's row of each
        repeat = clicks == np.repeat(ds.items[at[block]], sizes)
        out[block] = np.bincount(row[repeat], minlength=len(sizes)) > 0
    return out


def _clicks_before(times: np.ndarray, indptr: np.ndarray, cutoff: float) -> np.ndarray:
    """``[U]`` int64: each row's clicks with a time before ``cutoff`` (``times [nnz]`` in CSR rows
    ``indptr [U + 1]``), read :data:`USER_BLOCK` rows at a time."""
    users = len(indptr) - 1
    before = np.zeros(users, dtype=np.int64)
    for first in range(0, users, USER_BLOCK):
        bounds = indptr[first : min(first + USER_BLOCK, users) + 1]  # the block's rows are contiguous
        seen = np.concatenate([[0], np.cumsum(times[bounds[0] : bounds[-1]] < cutoff)])  # [clicks + 1]
        before[first : first + len(bounds) - 1] = np.diff(seen[bounds - bounds[0]])
    return before


_SIGN = np.uint64(1 << 63)
_LOW = np.int64(0x7FFF_FFFF_FFFF_FFFF)


def _order_keys(x: np.ndarray) -> np.ndarray:
    """``x [n]`` as float64 -> ``[n]`` uint64 keys in the floats' order (the sign-magnitude bits
    turned into an unsigned order: negative floats' magnitudes flipped, the sign bit flipped)."""
    bits = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
    return (bits ^ ((bits >> 63) & _LOW)).view(np.uint64) ^ _SIGN


def _from_key(key: np.uint64) -> float:
    bits = np.array([key ^ _SIGN], dtype=np.uint64).view(np.int64)
    return float((bits ^ ((bits >> 63) & _LOW)).view(np.float64)[0])


def _kth_smallest(values: np.ndarray, k: int) -> float:
    """The ``k``-th smallest (0-based) of ``values [n]``, read :data:`CLICK_BLOCK` at a time: a radix
    select on :func:`_order_keys`, 16 bits a pass (4 passes), holding 65,536 counts."""
    prefix = np.uint64(0)
    for shift in (48, 32, 16, 0):
        counts = np.zeros(1 << 16, dtype=np.int64)
        for first in range(0, len(values), CLICK_BLOCK):
            keys = _order_keys(values[first : first + CLICK_BLOCK])
            if shift < 48:  # the values whose higher digits are the ones chosen so far
                keys = keys[keys >> np.uint64(shift + 16) == prefix]
            digits = (keys >> np.uint64(shift)) & np.uint64(0xFFFF)
            counts += np.bincount(digits.astype(np.intp), minlength=1 << 16)
        upto = np.cumsum(counts)
        digit = int(np.searchsorted(upto, k, side="right"))  # the first digit with more than k values up to it
        k -= int(upto[digit - 1]) if digit else 0
        prefix = (prefix << np.uint64(16)) | np.uint64(digit)
    return _from_key(prefix)


def quantile(values: np.ndarray, q: float) -> float:
    """``np.quantile(values, q)`` (its default, linear method) of ``values [n]`` (n >= 1), to the
    bit, read :data:`CLICK_BLOCK` values at a time instead of partitioning a copy of them all: the
    order statistic at ``floor(q (n - 1))`` by :func:`_kth_smallest`, the next one in one more pass,
    and numpy's interpolation between them."""
    n = len(values)
    q = np.float64(q)
    virtual = (n - 1) * q  # numpy's virtual index for its linear method
    below = np.floor(virtual)
    gamma = virtual - below
    k = int(min(max(below, 0), n - 1))
    a = _kth_smallest(values, k)
    b = a
    if 0 <= virtual < n - 1:  # the next order statistic: a again where it repeats, else the next value
        at_most, above = 0, np.inf
        for first in range(0, n, CLICK_BLOCK):
            x = np.asarray(values[first : first + CLICK_BLOCK], dtype=np.float64)
            at_most += int(np.count_nonzero(x <= a))
            larger = x[x > a]
            above = min(above, float(larger.min())) if larger.size else above
        b = a if at_most > k + 1 else above
    diff = np.float64(b) - np.float64(a)
    return float(np.float64(b) - diff * (1 - gamma) if gamma >= 0.5 else np.float64(a) + diff * gamma)
