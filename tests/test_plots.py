from mmdp.report.plots import plot_padding, waste


def test_padding_figure_lists_every_element_in_its_legend():
    fig = plot_padding([3, 6, 2], width=8, title="Naive Padding: 54% padding", limit=8)
    ax = fig.axes[0]
    assert ax.get_title() == "Naive Padding: 54% padding"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "max length (8)",
        "real tokens",
        "padding",
    ]
    assert [round(bar.get_width()) for bar in ax.patches] == [3, 6, 2, 5, 2, 6]


def test_waste_is_the_padding_share():
    assert waste([3, 6, 2], 8) == 1 - 11 / 24
    assert waste([], 8) == 0.0


def test_pack_figure_shows_items_and_unused_room():
    from mmdp.report.plots import plot_packs

    fig = plot_packs([[6, 2], [5, 3]], max_length=10, title="Knapsack toy, binpack")
    ax = fig.axes[0]
    assert ax.get_title() == "Knapsack toy, binpack"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["item (its length)", "unused room", "max length (10)"]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["6", "2", "80% full", "5", "3", "80% full"]
