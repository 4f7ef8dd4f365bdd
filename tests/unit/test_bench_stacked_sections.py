"""bench.stacked rewrites its report section by section: a part skipped this time keeps the
section of its last run, in its place; the parts that ran replace theirs."""
from bench.stacked import merge_sections

OLD = "# Report (old title)\n\n## A\nold a\n\n## B\nold b\n\n## C\nold c\n"


def test_a_section_that_ran_replaces_its_old_self_and_the_others_stay_in_place():
    new = "# Report (new title)\n\n## B\nnew b\n"
    assert merge_sections(OLD, new) == "# Report (new title)\n\n## A\nold a\n\n## B\nnew b\n\n## C\nold c\n"


def test_a_new_section_is_added_and_a_first_report_is_the_new_one():
    new = "# T\n\n## C\nnew c\n\n## D\nnew d\n"
    assert merge_sections(OLD, new) == "# T\n\n## A\nold a\n\n## B\nold b\n\n## C\nnew c\n\n## D\nnew d\n"
    assert merge_sections("", new) == new
