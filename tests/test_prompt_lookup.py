from ngspec.drafters.prompt_lookup import lookup_chain


def test_longest_ngram_most_recent_match():
    tokens = [1, 2, 3, 10, 11, 5, 2, 3, 20, 21, 22, 7, 2, 3]
    assert lookup_chain(tokens, 3, 2) == [20, 21]  # "2 3" last seen before "20 21"
    # the copy reaches the end of the context and goes on at the match's distance (10 tokens)
    assert lookup_chain(tokens, 3, 10) == [20, 21, 22, 7, 2, 3, 20, 21, 22, 7]


def test_short_loops_continue_periodically():
    # period 1: the last match of "7 7" is one token back; the loop goes on for the whole chain
    assert lookup_chain([1, 7, 7, 7], 2, 5) == [7, 7, 7, 7, 7]
    # period 2, matched on the longest n-gram that has an earlier occurrence
    assert lookup_chain([9, 4, 5, 4, 5, 4], 3, 5) == [5, 4, 5, 4, 5]
    # a chain that ends inside the context is not extended
    assert lookup_chain([3, 1, 2, 8, 9, 1, 2], 2, 2) == [8, 9]


def test_prefers_longer_ngram_over_recent_short_one():
    tokens = [1, 2, 3, 40, 9, 3, 50, 1, 2, 3]
    assert lookup_chain(tokens, 3, 1) == [40]


def test_no_match():
    assert lookup_chain([1, 2, 3], 3, 5) == []
    assert lookup_chain([4], 3, 5) == []
