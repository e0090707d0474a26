"""Markup filter (engines/text/markup.py): nothing of an LLM's markdown, HTML or emoji is
spoken; the words stay; lines become pauses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.text import TextFrontEnd, strip_markup

MARKDOWN_CASES = [
    ("**Hello** _world_", "Hello world"),
    ("Email **john.miller@example.com** now", "Email john.miller@example.com now"),
    ("Use the `reset` button", "Use the reset button"),
    ("snake_case and 2*3 stay", "snake_case and 2*3 stay"),
    ("~~old~~ new price", "old new price"),
    ("## Opening hours\nMon-Fri", "Opening hours. Mon-Fri"),
    ("# Title #", "Title."),
    ("- Bread\n- Milk\n- Eggs", "Bread, Milk, Eggs"),
    ("* one\n+ two\n• three", "one, two, three"),
    ("1. Open the app\n2. Tap **Login**", "Open the app, Tap Login"),
    ("1. Mai ist frei", "1. Mai ist frei"),  # a German date, not a list
    ("See [our site](https://x.example/a) now", "See our site now"),
    ("![a map](https://x.example/map.png) here", "a map here"),
    ("<https://example.com>", "https://example.com"),
    ("> quoted **text**", "quoted text"),
    ("> > nested quote", "nested quote"),
    ("| Day | Hours |\n|---|---|\n| Mon | 8-17 |", "Day, Hours, Mon, 8-17"),
    ("Text\n\n---\n\nMore", "Text, More"),
    ("```\ncode line\n```", "code line"),
    ("<b>bold</b> &amp; more", "bold & more"),
    ("Great 👍", "Great"),
    ("See you 😀 tomorrow", "See you, tomorrow"),
    ("Thanks! 🙏🏽", "Thanks!"),
    ("I ❤️ it", "I, it"),
    ("Flags 🇩🇪 and 🇬🇧 here", "Flags, and, here"),
    ("- [x] done\n- [ ] open", "done, open"),
    ("***bold italic***", "bold italic"),
    ("__strong__ text", "strong text"),
]


@pytest.mark.parametrize(("written", "filtered"), MARKDOWN_CASES)
def test_markup_is_removed(written: str, filtered: str) -> None:
    assert strip_markup(written) == filtered


def test_markup_then_normaliser() -> None:
    fe = TextFrontEnd(ipa=False, lang="en")
    text = "## Your order\n- **Total:** $42.50\n- Delivery: Mon–Fri 😀"
    assert fe.speak(text).text == (
        "Your order. Total: forty-two dollars and fifty cents, Delivery: Monday to Friday"
    )


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(
            [
                "*",
                "**",
                "_",
                "`",
                "#",
                "> ",
                "- ",
                "1. ",
                "[",
                "]",
                "(",
                ")",
                "![",
                "](",
                "<b>",
                "</b>",
                "|",
                "---",
                "\n",
                "😀",
                "word",
                " ",
                "~~",
            ]
        ),
        max_size=60,
    )
)
def test_filter_never_raises_and_never_grows(parts: list[str]) -> None:
    text = "".join(parts)
    out = strip_markup(text)
    assert len(out) <= len(text) + text.count("\n") + 2
    assert "**" not in out and "`" not in out and "😀" not in out
