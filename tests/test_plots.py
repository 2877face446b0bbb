"""Every figure helper on tiny fake inputs: its title, and what its legend (or its labels) lists."""

import importlib.util

import pytest
import torch
from conftest import REPO
from PIL import Image

from mmdp.batch import collate_packs, layout_pack
from mmdp.packing.weights import Budgets
from mmdp.report.model_plots import plot_learning_curves, plot_pack_samples, plot_strategies
from mmdp.report.plots import (
    plot_packs,
    plot_padding,
    plot_padding_side_by_side,
    plot_sample,
    waste,
)


def example(name: str):
    """An example script as a module (its main not run): the figure helpers of its one figure,
    which live in it (examples/group_by_length.py's plot_grouped, pack_planned's
    plot_model_budgets)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def legend_labels(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def tick_labels(ax) -> list[str]:
    return [label.get_text() for label in ax.get_xticklabels()]


def test_sample_figure_shows_each_image_and_the_conversation():
    images = [Image.new("RGB", (8, 6)), Image.new("RGB", (4, 4))]
    texts = [{"user": "What colour is it?", "assistant": "Black."}]
    fig = plot_sample(images, texts, "Sample 0 of ai2d")
    assert fig._suptitle.get_text() == "Sample 0 of ai2d"
    assert [ax.get_title() for ax in fig.axes] == [
        "image 1 of 2 (8x6)",
        "image 2 of 2 (4x4)",
        "conversation",
    ]
    assert fig.axes[2].texts[0].get_text() == "User: What colour is it?\nAssistant: Black.\n"
    assert all(ax.get_legend() is None for ax in fig.axes)  # nothing to tell apart


def test_sample_figure_says_when_a_sample_has_no_image():
    fig = plot_sample([], [{"user": "Hi", "assistant": "Hello"}], "Sample 1")
    assert fig._suptitle.get_text() == "Sample 1"
    assert fig.axes[0].texts[0].get_text() == "(no image)"


def test_padding_figure_lists_every_element_in_its_legend():
    fig = plot_padding([3, 6, 2], width=8, title="Naive Padding: 54% padding", limit=8)
    ax = fig.axes[0]
    assert ax.get_title() == "Naive Padding: 54% padding"
    assert legend_labels(ax) == ["max length (8)", "real tokens", "padding"]
    assert [round(bar.get_width()) for bar in ax.patches] == [3, 6, 2, 5, 2, 6]


def test_padding_side_by_side_titles_each_panel_and_lists_its_elements():
    fig = plot_padding_side_by_side(
        {"lengths": [3, 6, 2], "width": 6, "title": "Naive: 39% padding"},
        {"lengths": [8, 7], "width": 8, "title": "Packed: 6% padding", "limit": 8},
        "Stage 5 against stage 2",
    )
    left, right = fig.axes
    assert fig._suptitle.get_text() == "Stage 5 against stage 2"
    assert (left.get_title(), right.get_title()) == ("Naive: 39% padding", "Packed: 6% padding")
    assert legend_labels(left) == ["real tokens", "padding"]
    assert legend_labels(right) == ["max length (8)", "real tokens", "padding"]


def test_waste_is_the_padding_share():
    assert waste([3, 6, 2], 8) == 1 - 11 / 24
    assert waste([], 8) == 0.0


def fake_sample(row: int, input_ids: list[int], images: int) -> dict:
    return {
        "row": row,
        "input_ids": torch.tensor(input_ids),
        "labels": torch.tensor(input_ids),
        "pixel_values": torch.zeros(images, 3, 8, 8),
        "image_count": images,
        "patches": images,
        "converted": {},
    }


def test_pack_samples_figure_names_samples_images_and_padding():
    image = 9  # the image token
    # pack 1: A (an image and 2 text tokens) and B (4 text tokens), 1 padding; pack 2: C (an
    # image and 4 text tokens), 3 padding
    packs = [
        [fake_sample(0, [image, 1, 2], 1), fake_sample(1, [3, 4, 5, 6], 0)],
        [fake_sample(2, [image, 1, 2, 3, 4], 1)],
    ]
    batch = collate_packs(
        [{**layout_pack(p, 8, 0), "batch_index": 0, "dropped": {}} for p in packs]
    )
    fig = plot_pack_samples(batch, image_token_id=image, title="Packed batch: 2 packs")
    ax = fig.axes[0]
    assert ax.get_title() == "Packed batch: 2 packs"
    assert legend_labels(ax) == [
        "a sample (one colour each)",
        "image tokens (64 per image)",
        "padding",
    ]
    assert [text.get_text() for text in ax.texts] == ["2 samples, 1 image", "1 sample, 1 image"]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["pack 1", "pack 2"]


def test_pack_figure_shows_items_and_unused_room():
    fig = plot_packs([[6, 2], [5, 3]], max_length=10, title="Knapsack toy, binpack")
    ax = fig.axes[0]
    assert ax.get_title() == "Knapsack toy, binpack"
    assert legend_labels(ax) == ["item (its length)", "unused room", "max length (10)"]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["6", "2", "80% full", "5", "3", "80% full"]


def test_learning_curves_name_every_strategy_in_each_panel():
    names = ("naive", "images_first_bfd")
    eval_loss = {
        "naive": [[3.0, 2.5, 2.0], [3.2, 2.7, 2.2]],
        "images_first_bfd": [[3.0, 2.4, 1.9], [3.2, 2.6, 2.1]],
    }
    eval_steps = {"naive": [[0, 1, 2], [0, 1, 2]], "images_first_bfd": [[0, 1, 3], [0, 1, 3]]}
    training = {
        "naive": [([8, 16], [2.9, 2.4]), ([8, 16], [3.1, 2.6])],
        "images_first_bfd": [([6, 11, 16], [2.9, 2.5, 2.2]), ([5, 11, 16], [3.1, 2.7, 2.3])],
    }
    fig = plot_learning_curves([0, 8, 16], eval_loss, eval_steps, training, "Same learning?")
    held_out, per_step, train = fig.axes
    assert fig._suptitle.get_text() == "Same learning?"
    assert [ax.get_title() for ax in fig.axes] == [
        "held-out loss against samples seen",
        "the same held-out losses against optimizer steps",
        "training loss of each step",
    ]
    assert legend_labels(held_out) == [f"{n} (mean, min-max over 2 runs)" for n in names]
    assert legend_labels(per_step) == [f"{n} (one line per run)" for n in names]
    assert legend_labels(train) == [f"{n} (one line per run)" for n in names]
    # naive's line is the mean of its two runs: (3.0 + 3.2) / 2, ...
    assert held_out.lines[0].get_ydata().tolist() == pytest.approx([3.1, 2.6, 2.1])


def test_strategies_figure_names_every_strategy_on_each_panel():
    results = {
        "naive": {
            "utilization": 0.4,
            "batches": 25,
            "dropped": {},
            "per_row": {"tokens": [100, 200], "images": [1, 0]},
        },
        "binpack": {
            "utilization": 0.975,
            "batches": 7,
            "dropped": {"too_long": 2},
            "per_row": {"tokens": [500, 490], "images": [3, 4]},
        },
    }
    fig = plot_strategies(results, "Every strategy on one epoch")
    fig.canvas.draw()  # tick labels are filled in when the figure is drawn
    utilization, batches, tokens, images = fig.axes
    assert fig._suptitle.get_text() == "Every strategy on one epoch"
    assert [ax.get_title() for ax in fig.axes] == [
        "utilization: real tokens / computed tokens",
        "batches per epoch (and samples dropped)",
        "real tokens per row (padded row or pack): median, quartiles, min-max",
        "images per row (padded row or pack): median, quartiles, min-max",
    ]
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "% of computed tokens",
        "batches",
        "real tokens",
        "images",
    ]
    # the strategies are named once, level, under the last panel: no legend, no overlap
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert tick_labels(images) == ["naive", "binpack"]
    assert all(label.get_rotation() == 0 for label in images.get_xticklabels())
    assert not any(label.get_visible() for label in utilization.get_xticklabels())
    assert [t.get_text() for t in utilization.texts] == ["40.0%", "97.5%"]
    assert [t.get_text() for t in batches.texts] == ["25 (0 dropped)", "7 (2 dropped)"]


def test_strategies_names_do_not_overlap_at_the_readmes_width():
    """Every strategy of stage 6, with its longest names: their labels' boxes are apart."""
    names = ["naive", "constrained", "greedy", "binpack", "bfd", "images_first_bfd"]
    names.append("balanced_greedy")
    row = {"utilization": 0.9, "batches": 62, "dropped": {"too_long": 16}}
    results = {n: {**row, "per_row": {"tokens": [500, 490], "images": [3, 4]}} for n in names}
    fig = plot_strategies(results, "Every strategy on one epoch")
    fig.draw_without_rendering()  # where each label lands
    for ax in fig.axes:
        boxes = [label.get_window_extent() for label in ax.get_xticklabels()]
        boxes += [text.get_window_extent() for text in ax.texts]
        boxes = [box for box in boxes if box.width]
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


@pytest.mark.parametrize(
    "figure",
    [
        "padding",
        "side_by_side",
        "packs",
        "learning_curves",
        "strategies",
        "grouped",
        "model_budgets",
    ],
)
def test_every_figure_fits_the_readmes_width_and_labels_its_axes(figure):
    """At most 10 inches wide (1,100 px saved at 110 dpi, read at about 900): panels stack."""
    eval_loss = {"naive": [[3.0, 2.0]], "binpack": [[3.0, 1.9]]}
    row = {"utilization": 0.9, "batches": 7, "dropped": {}}
    per_row = {"tokens": [500, 490], "images": [3, 4]}
    fig = {
        "padding": lambda: plot_padding([3, 6, 2], width=8, title="t", limit=8),
        "side_by_side": lambda: plot_padding_side_by_side(
            {"lengths": [3, 6], "width": 6, "title": "a"},
            {"lengths": [8, 7], "width": 8, "title": "b"},
            "t",
        ),
        "packs": lambda: plot_packs([[6, 2], [5, 3]], max_length=10, title="t"),
        "learning_curves": lambda: plot_learning_curves(
            [0, 8],
            eval_loss,
            {"naive": [[0, 1]], "binpack": [[0, 1]]},
            {n: [([8], [2.5])] for n in eval_loss},
            "t",
        ),
        "strategies": lambda: plot_strategies(
            {n: {**row, "per_row": per_row} for n in ("naive", "binpack")}, "t"
        ),
        "grouped": lambda: example("group_by_length").plot_grouped(
            {"lengths": [3, 6], "width": 6, "title": "a", "limit": 8},
            {
                name: {"real_tokens": 9, "computed_tokens": c, "padded_tokens": [[c // 2]] * 2}
                for name, c in (("naive", 12), ("modality_length", 10))
            },
            "t",
        ),
        "model_budgets": lambda: example("pack_planned").plot_model_budgets(
            {"tiny": [64], "qwen2_5_vl": [49, 256]},
            [500, 512],
            [900, 1000],
            model="qwen2_5_vl",
            budgets=Budgets(max_length=512, max_patches=1024),
        ),
    }[figure]()
    assert fig.get_size_inches()[0] <= 10
    for ax in fig.axes:
        assert ax.get_title()
        # its own x label, or the one of the panel below whose axis it shares
        assert any(a.get_xlabel() for a in ax.get_shared_x_axes().get_siblings(ax))
        assert ax.get_ylabel() or ax.get_yticklabels()  # or the rows' names ("row 1")
