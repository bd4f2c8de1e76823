"""multi_turn.tokenization_sanity_check_mode's comparison (agent/sanity.py): where a sample's text differs from its
whole conversation through the chat template, and which differences each mode reports."""

import pytest

from rlrig.trainer.agent.sanity import Diff, diffs, reported, with_context


@pytest.mark.parametrize(
    "full, ours, found",
    [
        ("a<t>b</t>c<e>", "a<t>b</t>c<e>", []),
        ("a<t>b</t>c<e>\n", "a<t>b</t>c<e>", []),  # what the template writes after the last token: not trained on
        ("a<t>b</t>c<e>\n", "a<t>b</t>c", []),  # a last turn the response length cut
        ("a\n\nb", "a\nb", [Diff((2, 3), (2, 2), "\n", "")]),
        ("ab", "a b", [Diff((1, 1), (1, 2), "", " ")]),
        ("think: x. answer", "answer", [Diff((0, 10), (0, 0), "think: x. ", "")]),  # past reasoning dropped
        ("abcd", "abXd", [Diff((2, 3), (2, 3), "c", "X")]),
    ],
)
def test_diffs_are_where_the_texts_part_bar_the_templates_tail(full, ours, found):
    assert diffs(full, ours) == found


@pytest.mark.parametrize(
    "found, strict, ignore_strippable",
    [
        ([], False, False),
        ([Diff((1, 2), (1, 1), "\n", "")], True, False),
        ([Diff((1, 1), (1, 2), "", " \t")], True, False),
        ([Diff((1, 2), (1, 1), "\n", ""), Diff((5, 6), (4, 5), "c", "X")], True, True),
    ],
)
def test_ignore_strippable_reports_only_differences_with_more_than_whitespace(found, strict, ignore_strippable):
    assert reported(found, "strict") == strict
    assert reported(found, "ignore_strippable") == ignore_strippable


def test_a_difference_is_shown_with_ten_characters_either_side_as_verl():
    full, ours = "0123456789abcdefghij<sep>0123456789abcdefghij", "0123456789abcdefghij0123456789abcdefghij"
    (d,) = diffs(full, ours)
    shown = with_context(d, full, ours)
    assert shown.full_chunk == "abcdefghij<sep>0123456789" and shown.ours_chunk == "abcdefghij0123456789"
    assert str(shown).startswith("idx 20:25 -> 20:20 | full_prompt_chunk: 'abcdefghij<sep>0123456789'")
