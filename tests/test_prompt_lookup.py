from ngspec.drafters.prompt_lookup import lookup_chain


def test_longest_ngram_most_recent_match():
    tokens = [1, 2, 3, 10, 11, 5, 2, 3, 20, 21, 22, 7, 2, 3]
    assert lookup_chain(tokens, 3, 2) == [20, 21]  # "2 3" last seen before "20 21"
    assert lookup_chain(tokens, 3, 10) == [20, 21, 22, 7, 2, 3]


def test_prefers_longer_ngram_over_recent_short_one():
    tokens = [1, 2, 3, 40, 9, 3, 50, 1, 2, 3]
    assert lookup_chain(tokens, 3, 1) == [40]


def test_no_match():
    assert lookup_chain([1, 2, 3], 3, 5) == []
    assert lookup_chain([4], 3, 5) == []
