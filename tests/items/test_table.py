"""The item table: lookups masked by length, the dense form's step protocol, the forms' registry."""

import pytest
import torch

from recsys.items import FORMS, ItemTable, RowUpdates


def test_lookups_are_zero_at_padded_positions_and_the_padding_row_starts_at_zero():
    table = ItemTable(10, 4)
    assert table.weight[0].abs().max() == 0 and (table.num_items, table.dim) == (10, 4)
    seq = torch.tensor([[3, 4, 9, 9], [5, 0, 0, 0]])
    out = table(seq, torch.tensor([2, 1]))
    torch.testing.assert_close(out[0, :2], table.weight[[3, 4]])
    assert out[0, 2:].abs().max() == 0 and out[1, 1:].abs().max() == 0


def test_init_normal_draws_every_row_but_padding():
    table = ItemTable(500, 8)
    table.init_normal(0.02)
    assert (table.all()[0] == 0).all()
    assert abs(table.all()[1:].std().item() - 0.02) < 0.002


def test_the_dense_form_is_the_table_itself_and_its_step_protocol_changes_nothing():
    table = ItemTable(9, 4)
    same = table.trained_as("dense", RowUpdates(lr=0.1), "table.weight")
    assert same is table and table.table.weight.requires_grad  # the model's optimiser trains its rows
    ids = (torch.tensor([[1, 2]]), torch.tensor([3]))
    with table.step_rows(*ids) as given:
        assert all(a is b for a, b in zip(given, ids))
    assert table.collect() == [] and table.train_state() == {}
    before = table.all().clone()
    with table.scored():
        table.update()
        table.scale_lr(0.5)
        table.reset_average()
    assert torch.equal(table.all(), before)


def test_an_unknown_form_is_refused_naming_the_known_ones():
    assert {"dense", "sparse", "sharded"} <= set(FORMS)
    with pytest.raises(ValueError, match="train.item_updates: unknown form 'columns'.*dense"):
        ItemTable(9, 4).trained_as("columns", RowUpdates(lr=0.1), "table.weight")


def test_a_catalogue_without_items_is_refused():
    with pytest.raises(ValueError, match="num_items must be >= 2"):
        ItemTable(1, 4)


@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_start_as_means_reads_every_source_before_any_row_changes(chunk):
    table = ItemTable(6, 3)
    before = table.table.weight.detach().clone()
    # item 4 reads 1, 2 and 2; item 5 reads 4 (whose old row is read, not its new mean)
    started = table.start_as_means(torch.tensor([4, 4, 5, 4]), torch.tensor([1, 2, 4, 2]), chunk=chunk)
    after = table.table.weight.detach()
    assert started == 2
    torch.testing.assert_close(after[4], (before[1] + 2 * before[2]) / 3)
    torch.testing.assert_close(after[5], before[4])
    torch.testing.assert_close(after[:4], before[:4], rtol=0, atol=0)  # no other row moves
    assert table.start_as_means(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)) == 0
    with pytest.raises(ValueError, match="targets"):
        table.start_as_means(torch.tensor([4]), torch.tensor([1, 2]))
