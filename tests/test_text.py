"""Counts in messages agree in number with their noun."""

from recsys.text import count


def test_a_count_agrees_with_its_noun():
    assert count(1, "user") == "1 user"
    assert count(0, "user") == "0 users"
    assert count(1_234_567, "click") == "1,234,567 clicks"
    assert count(1, "process", "processes") == "1 process"
    assert count(3, "process", "processes") == "3 processes"
