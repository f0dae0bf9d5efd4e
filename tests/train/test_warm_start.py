"""Warm start (recsys train --init-from RUN): a run on a newer log starts from an earlier run's best
weights, the network by name and the item rows by raw item id, with a fresh optimiser."""

import itertools

import numpy as np
import pytest
import torch

from recsys.api import Run, fit
from recsys.cli import main
from recsys.config import ConfigError, load_config
from recsys.run import RunDir, build_experiment, load_run
from recsys.train.trainer import train
from recsys.train.warm_start import follow_model, warm_start

USERS, CLICKS = 80, 12


def _log(path, items: range, popular_last: bool, seed: int):
    """A click CSV over ``items`` (raw ids ``i<n>``) whose popularity falls with the id, or rises
    with it (``popular_last``), so two logs number their common items differently."""
    rng = np.random.default_rng(seed)
    weights = np.arange(1, len(items) + 1, dtype=float)
    weights = weights if popular_last else weights[::-1]
    picked = rng.choice(np.array(items), size=(USERS, CLICKS), p=weights / weights.sum())
    picked[:, 0] = np.resize(np.array(items), USERS)  # every item clicked
    path.write_text("user,item\n" + "".join(f"u{u},i{i}\n" for u in range(USERS) for i in picked[u]))
    return path


def _features(path, items: range, extra: str = ""):
    """Every item's genre ``g<i % 4>``; ``extra`` a genre the items from i36 on have too."""
    rows = [f"i{i},g{i % 4}" + (f"|{extra}" if extra and i >= 36 else "") for i in items]
    path.write_text("item,genre\n" + "\n".join(rows) + "\n")
    return path


def _overrides(tmp_path, source, name, *extra):
    return [
        f"data.source={source}",
        "data.time_col=",
        "data.min_item_count=1",
        "data.min_user_count=1",
        "data.max_len=10",
        "model.dim=8",
        "model.backend=torch",
        "train.batch_size=32",
        "train.max_steps=10",
        "train.eval_every=10",
        "train.device=cpu",
        f"output_dir={tmp_path}",
        f"name={name}",
        *extra,
    ]


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """A trained run on the earlier log: items i1..i35, the low ids most clicked; with genres."""
    tmp = tmp_path_factory.mktemp("earlier")
    log = _log(tmp / "earlier.csv", range(1, 36), popular_last=False, seed=1)
    items = _features(tmp / "items.csv", range(1, 41))
    plain = train(load_config(None, _overrides(tmp, log, "plain")), log=lambda s: None).run_dir
    featured = _overrides(tmp, log, "featured", f"data.item_features={items}")
    return {"plain": plain, "featured": train(load_config(None, featured), log=lambda s: None).run_dir}


@pytest.fixture
def later(tmp_path):
    """The later log: i1..i5 gone, i36..i40 new, the high ids most clicked (every id renumbered)."""
    return _log(tmp_path / "later.csv", range(6, 41), popular_last=True, seed=2)


def _clicked_beside(split, known: set[int]) -> dict[int, list[int]]:
    """Each item outside ``known``: the known items next to it in the training sequences, once a pair."""
    out: dict[int, list[int]] = {}
    for user in split.train_users:
        row = [int(i) for i in split.clicks[split.clicks_indptr[user] : split.train_ends[user]]]
        for a, b in itertools.pairwise(row):
            if (a in known) != (b in known):
                new, old = (b, a) if a in known else (a, b)
                out.setdefault(new, []).append(old)
    return out


def test_neighbour_pairs_stay_inside_each_sequence():
    from types import SimpleNamespace

    from recsys.train.warm_start import neighbour_pairs

    # users 0 and 2 have sequences [1, 5] and [5, 2, 3]; user 1 none; item 5 is new
    split = SimpleNamespace(
        clicks=np.array([1, 5, 9, 5, 2, 3]),
        clicks_indptr=np.array([0, 2, 3, 6]),
        train_ends=np.array([2, 2, 6]),
        train_users=np.array([0, 2]),
    )
    new = np.zeros(10, dtype=bool)
    new[5] = True
    for users in (1, 2, 8):  # read one, two or all sequences at a time
        targets, sources = neighbour_pairs(split, new, users=users)
        assert sorted(zip(targets.tolist(), sources.tolist())) == [(5, 1), (5, 2)]  # not (5, 5) or across users


def _non_item(model):
    return {k: v for k, v in model.state_dict().items() if not k.startswith("embedding.")}


def test_rows_follow_raw_ids_across_renumbered_logs_and_the_network_is_copied(tmp_path, earlier, later):
    exp = build_experiment(load_config(None, _overrides(tmp_path, later, "warm")))
    before = exp.model.item_embeddings().detach().clone()
    old = load_run(earlier["plain"])
    done = warm_start(exp, old)
    assert (done.known, done.new, done.dropped, done.items) == (30, 5, 5, 35)
    assert done.parameters == len(_non_item(old.model)) > 0
    assert done.from_neighbours == 5
    assert "30 of 35 items by id, 5 new (5 from the known items clicked beside them)" in done.line()
    after, theirs = exp.model.item_embeddings().detach(), old.model.item_embeddings().detach()
    there = old.dataset.item_map
    raw_here = exp.dataset.catalogue_raw
    known = {i for i in range(1, exp.dataset.catalogue_size) if int(str(raw_here[i])[1:]) <= 35}
    beside = _clicked_beside(exp.split, known)
    moved = 0
    for i in range(1, exp.dataset.catalogue_size):
        raw = str(raw_here[i])
        if i in known:
            j = int(there.lookup([raw])[0])
            moved += j != i
            torch.testing.assert_close(after[i], theirs[j], rtol=0, atol=0, msg=raw)
        else:  # new to this log: the mean row of the known items clicked right before and after it
            assert beside[i], raw
            want = torch.stack([after[j] for j in beside[i]]).mean(0)
            torch.testing.assert_close(after[i], want, msg=raw)
            assert not torch.equal(after[i], before[i])
    assert moved > 20  # the logs number their items differently
    torch.testing.assert_close(after[0], torch.zeros_like(after[0]))  # padding stays 0
    for name, tensor in _non_item(old.model).items():
        torch.testing.assert_close(_non_item(exp.model)[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model.num_interests=2", "model.num_interests is 4 there, 2 here"),
        ("model.dim=16", "model.dim is 8 there, 16 here"),
        ("model.name=sasrec", "model.name is 'comirec_sa' there, 'sasrec' here"),
    ],
)
def test_another_model_is_refused_naming_the_setting_and_both_values(tmp_path, earlier, later, setting, message):
    exp = build_experiment(load_config(None, _overrides(tmp_path, later, "warm", setting)))
    with pytest.raises(ConfigError, match=message) as err:
        warm_start(exp, load_run(earlier["plain"]))
    assert "\n" not in str(err.value)


def test_automatic_model_settings_follow_the_earlier_run(earlier):
    given = load_config(None, ["model.backend=torch"])  # model.dim and model.hidden automatic
    followed = follow_model(given, RunDir(earlier["plain"]).read_config())
    assert (followed.model.dim, followed.model.hidden) == (8, 32)
    assert given.model.dim == -1  # the config given is not changed
    assert followed.train.soft_readout_steps == 0  # the interests have formed: no readout warm-up
    chosen = load_config(None, ["model.backend=torch", "train.soft_readout_steps=300"])
    assert follow_model(chosen, RunDir(earlier["plain"]).read_config()).train.soft_readout_steps == 300


def test_feature_values_are_carried_by_name(tmp_path, earlier, later):
    items = _features(tmp_path / "items.csv", range(6, 45), extra="g9")  # value ids renumbered, a new value
    exp = build_experiment(load_config(None, _overrides(tmp_path, later, "warm", f"data.item_features={items}")))
    old = load_run(earlier["featured"])
    done = warm_start(exp, old)
    assert done.values == (("genre", 4, 5),)
    # i36..i40 were the earlier run's new items (features only), i41..i44 are this run's
    assert (done.known, done.new, done.dropped) == (35, 4, 5)
    rows = exp.model.embedding.table.weight
    for raw in ("i36", "i40"):  # the earlier run never read their id rows: they start at zero, as it read them
        assert not rows[int(exp.dataset.item_map.lookup([raw])[0])].any()
    mine, theirs = exp.model.embedding.features, old.model.embedding.features
    for value in ("g0", "g1", "g2", "g3"):
        here, there = list(mine.vocabs[0]).index(value), list(theirs.vocabs[0]).index(value)
        torch.testing.assert_close(mine.fields[0].weight[here], theirs.fields[0].weight[there], rtol=0, atol=0)


def test_cli_init_from_trains_records_the_start_and_starts_the_optimiser_fresh(tmp_path, earlier, later, capsys):
    args = ["train", "--init-from", earlier["plain"], "--quiet"]
    assert main(args + [f"--set={o}" for o in _overrides(tmp_path, later, "warm")]) == 0
    out = capsys.readouterr().out
    assert f"initialised from {earlier['plain']}: 30 of 35 items by id, 5 new (5 from" in out
    run = RunDir(tmp_path / "warm")
    origin = run.read_origin()
    assert origin is not None and (origin["run"], origin["known"], origin["new"]) == (earlier["plain"], 30, 5)
    assert RunDir(earlier["plain"]).read_origin() is None
    states = run.load_checkpoint()["optimizer"]["state"].values()
    assert {int(s["step"]) for s in states} == {10}  # this run's 10 steps, not the earlier run's on top
    assert run.load_checkpoint()["step"] == 10


def test_fit_takes_a_run_to_start_from(tmp_path, earlier, later):
    overrides = _overrides(tmp_path, later, "warm")[1:]  # the clicks come as the path
    run = fit(later, overrides=overrides, init_from=Run.load(earlier["plain"]), log=None)
    assert RunDir(run.path).read_origin()["run"] == earlier["plain"]


def test_init_from_with_resume_or_from_an_untrained_run_is_refused(tmp_path, earlier, later, capsys):
    assert main(["train", "--resume", earlier["plain"], "--init-from", earlier["plain"]]) == 2
    assert "--resume continues a run: use one" in capsys.readouterr().err
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    with pytest.raises(FileNotFoundError, match=f"--init-from: {untrained} is not a run directory"):
        train(load_config(None, _overrides(tmp_path, later, "warm")), init_from=untrained)
    assert not (tmp_path / "warm").exists()


def test_dry_run_checks_the_start_and_a_refused_start_leaves_no_run_directory(tmp_path, earlier, later, capsys):
    overrides = [f"--set={o}" for o in _overrides(tmp_path, later, "warm")]
    assert main(["train", "--dry-run", "--init-from", earlier["plain"], *overrides]) == 0
    assert "30 of 35 items by id, 5 new" in capsys.readouterr().out
    assert main(["train", "--init-from", earlier["plain"], *overrides, "--set=model.num_interests=2"]) == 2
    assert "model.num_interests is 4 there, 2 here" in capsys.readouterr().err
    assert not (tmp_path / "warm").exists()
