"""ComiRec's preprocessing (recsys.data.comirec_preprocess) against a plain per-click
transcription of the rules in its docstring, on random clicks with ties and repeats."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest

from recsys.data.comirec_preprocess import comirec_categories, comirec_filter, write_comirec


def reference(clicks: list[tuple[str, str, float]], size: int = 5, seed: int = 1230):
    """The rules one click at a time, with dicts and Python's sort, as ComiRec's script works."""
    per_user, counts = defaultdict(list), defaultdict(int)
    for user, item, t in clicks:
        counts[item] += 1
        per_user[user].append((item, t))
    ranked = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
    item_id = {item: n + 1 for n, (item, c) in enumerate(ranked) if c >= size}
    users = [u for u, seq in per_user.items() if sum(i in item_id for i, _ in seq) >= size]
    rng = random.Random(seed)
    rng.shuffle(users)
    rows = []
    for uid, user in enumerate(users):
        kept = [(i, t) for i, t in sorted(per_user[user], key=lambda it: it[1]) if i in item_id]
        rows += [(uid, item_id[i], pos) for pos, (i, _) in enumerate(kept)]
    return users, list(item_id), rows


def reference_categories(pairs: list[tuple[str, str]], item_id: dict[str, int]):
    cate_id, item_cate = {}, {}
    for item, cate in pairs:
        if item in item_id:
            cate_id.setdefault(cate, len(cate_id) + 1)
            item_cate[item_id[item]] = cate_id[cate]
    return list(cate_id), item_cate


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_rules_one_click_at_a_time(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    users = [f"u{x}" for x in rng.integers(0, 300, n)]
    items = [f"i{x}" for x in rng.zipf(1.3, n) % 400]
    times = rng.integers(0, 50, n).astype(float)  # many equal times: file order must break the ties
    clicks = list(zip(users, items, times))
    ref_users, ref_items, ref_rows = reference(clicks)
    data = comirec_filter(np.array(users, dtype=object), np.array(items, dtype=object), times)
    assert len(ref_users) > 20 and len(ref_items) > 20  # the filters leave something to compare
    assert data.user_raw.tolist() == ref_users
    assert data.item_raw.tolist() == ref_items
    assert list(map(tuple, data.clicks[["user", "item", "position"]].to_numpy().tolist())) == ref_rows

    pairs = [(f"i{x}", f"c{x % 7 + rng.integers(0, 2)}") for x in rng.integers(0, 400, 2000)]
    ref_cates, ref_item_cate = reference_categories(pairs, {item: n + 1 for n, item in enumerate(ref_items)})
    cates, item_cate = comirec_categories(
        np.array([p[0] for p in pairs], dtype=object), np.array([p[1] for p in pairs], dtype=object), data.item_raw
    )
    assert cates.tolist() == ref_cates
    assert list(item_cate.items()) == list(ref_item_cate.items())


def test_written_files_follow_comirecs_layout(tmp_path):
    clicks = [(f"u{u}", f"i{(u + k) % 6}", float(k)) for u in range(20) for k in range(7)]
    users, items, times = (np.array(col, dtype=object) for col in zip(*clicks))
    data = comirec_filter(users, items, times.astype(float))
    cates, item_cate = comirec_categories(
        items, np.array([f"c{int(i[1:]) % 2}" for i in items], dtype=object), data.item_raw
    )
    counts = write_comirec(data, cates, item_cate, tmp_path / "comirec", tmp_path / "maps", "book")
    assert counts == {
        "users": 20,
        "items": 6,
        "clicks": 140,
        "categories": 2,
        "train_users": 16,
        "valid_users": 2,
        "test_users": 2,
    }
    train = (tmp_path / "comirec" / "book_train.txt").read_text().splitlines()
    assert len(train) == 16 * 7 and train[0].startswith("0,")
    assert [line.split(",")[2] for line in train[:7]] == [str(p) for p in range(7)]
    test = (tmp_path / "comirec" / "book_test.txt").read_text().splitlines()
    assert {int(line.split(",")[0]) for line in test} == {18, 19}
    user_map = (tmp_path / "maps" / "book_user_map.txt").read_text().splitlines()
    assert user_map[0] == f"{data.user_raw[0]},0" and len(user_map) == 20
    assert (tmp_path / "maps" / "book_item_map.txt").read_text().splitlines()[0] == f"{data.item_raw[0]},1"
    assert len((tmp_path / "comirec" / "book_item_cate.txt").read_text().splitlines()) == 6
