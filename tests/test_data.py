import socket
import time

import numpy as np
import pytest
from conftest import image_cell
from datasets import Dataset
from PIL import Image

from mmdp import config
from mmdp.data.reading.sources import FEATURES, load_vqa_dataset
from mmdp.data.synthetic.rows import BACKGROUND, COLOURS, GRID, generate_row
from mmdp.errors import UserError


def test_rows_are_deterministic_by_seed_and_index():
    a, b = generate_row(7, seed=0), generate_row(7, seed=0)
    assert a["texts"] == b["texts"]
    assert [np.asarray(i).tobytes() for i in a["images"]] == [
        np.asarray(i).tobytes() for i in b["images"]
    ]
    others = [generate_row(7, seed=s)["texts"] for s in range(1, 6)]
    assert any(t != a["texts"] for t in others)


def test_mixture_has_many_tasks_and_a_long_tail(tokenizer):
    from mmdp.data.conversation import count_tokens_batch

    rows = [generate_row(i) for i in range(400)]
    sources = {turn["source"] for row in rows for turn in row["texts"]}
    assert {"count", "colour", "chart", "diagram", "describe", "compare", "multiturn"} <= sources
    assert {len(row["images"]) for row in rows} >= {0, 1, 2, 3}
    assert max(len(row["texts"]) for row in rows) >= 4
    texts, images = [r["texts"] for r in rows], [len(r["images"]) for r in rows]
    lengths, _ = count_tokens_batch(texts, images, tokenizer, config.IMAGE_TOKEN_LENGTH)
    lengths = np.array(lengths)
    # long-tailed: the longest rows are several times the median, so naive padding wastes a lot
    assert np.percentile(lengths, 99) > 3 * np.median(lengths)
    batches = lengths[:400].reshape(-1, 8)
    naive_waste = 1 - batches.sum() / (batches.max(axis=1).sum() * 8)
    assert 0.4 < naive_waste < 0.7


def cells_with_shapes(image: Image.Image):
    """Classify what is drawn in each grid cell from the pixels alone: (shape, colour name)."""
    pixels = np.asarray(image)
    cell = image.width / GRID
    found = []
    for r in range(GRID):
        for c in range(GRID):
            block = pixels[int(r * cell) : int((r + 1) * cell), int(c * cell) : int((c + 1) * cell)]
            ink = (block != BACKGROUND).any(axis=2)
            if not ink.any():
                continue
            ys, xs = ink.nonzero()
            fill = ink.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
            shape = "square" if fill > 0.95 else "circle" if fill > 0.65 else "triangle"
            colour = next(n for n, rgb in COLOURS.items() if (block[ys[0], xs[0]] == rgb).all())
            found.append((shape, colour))
    return found


def test_count_and_colour_answers_match_the_pixels():
    checked = 0
    for index in range(300):
        row = generate_row(index)
        turn = row["texts"][0]
        if turn["source"] == "count":
            shapes = cells_with_shapes(row["images"][0])
            shape = next(s for s in ("circle", "square", "triangle") if s in turn["user"])
            expected = sum(s == shape for s, _ in shapes)
            assert turn["assistant"] in (
                str(expected),
                *[f"There {v} {expected} {shape}{p}." for v, p in (("is", ""), ("are", "s"))],
            )
            checked += 1
        elif (
            turn["source"] == "colour"
            and turn["user"].startswith("What colour is the ")
            and "shape in" not in turn["user"]
        ):
            shapes = cells_with_shapes(row["images"][0])
            shape = turn["user"].removeprefix("What colour is the ").rstrip("?")
            colours = [c for s, c in shapes if s == shape]
            assert len(colours) == 1 and turn["assistant"] == colours[0].capitalize() + "."
            checked += 1
    assert checked > 50


def test_synthetic_dataset_is_cached_and_reloaded_fast():
    first = load_vqa_dataset(num_rows=100)
    start = time.perf_counter()
    second = load_vqa_dataset(num_rows=100)
    assert time.perf_counter() - start < 1.0
    assert len(first) == len(second) == 100
    assert first[5]["texts"] == second[5]["texts"] == generate_row(5)["texts"]
    # images stay encoded until a stage decodes them
    assert isinstance(second[5]["images"][0]["bytes"], bytes) or not second[5]["images"]


def small_local_dataset():
    rows = [generate_row(i) for i in range(6)]
    return Dataset.from_list(
        [
            {
                "images": [image_cell(i) for i in r["images"]],
                "texts": r["texts"],
            }
            for r in rows
        ],
        features=FEATURES,
    )


def test_local_save_to_disk_directory_loads(tmp_path):
    small_local_dataset().save_to_disk(str(tmp_path / "local"))
    loaded = load_vqa_dataset(str(tmp_path / "local"))
    assert len(loaded) == 6 and loaded[2]["texts"] == generate_row(2)["texts"]


def test_local_parquet_files_load(tmp_path):
    small_local_dataset().to_parquet(str(tmp_path / "part-0.parquet"))
    for path in (tmp_path / "part-0.parquet", tmp_path):
        loaded = load_vqa_dataset(str(path), num_rows=4)
        assert len(loaded) == 4 and loaded[3]["texts"] == generate_row(3)["texts"]


def test_local_data_in_another_schema_is_a_clear_error(tmp_path):
    Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(UserError, match="images, texts"):
        load_vqa_dataset(str(tmp_path / "other"))


OFFLINE_HUB = ["--dataset", "HuggingFaceM4/the_cauldron", "--subset", "ai2d"]


def said_offline_in_one_sentence(status: int, stderr: str) -> None:
    assert status == 2
    assert "Traceback" not in stderr
    message = stderr.strip().splitlines()[-1]
    assert message.startswith("error: could not load dataset 'HuggingFaceM4/the_cauldron'")
    assert "run without --dataset to use the embedded synthetic dataset" in message


def test_hub_dataset_offline_fails_with_one_sentence(run_main, monkeypatch):
    """Stage 1 with HF_HUB_OFFLINE=1, in this process: huggingface_hub and datasets read the
    variable once, at import (huggingface_hub/constants.py:194, datasets/config.py:217), so
    their copies are set too; no socket may open. The slow test below sets the variable before
    a new process starts."""
    import datasets
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("offline: nothing may connect")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    status, _, err = run_main("01_check_dataset.py", *OFFLINE_HUB)
    said_offline_in_one_sentence(status, err)


@pytest.mark.slow  # a new process that imports torch, datasets and transformers
def test_hub_dataset_offline_fails_with_one_sentence_in_a_new_process(run_script):
    result = run_script("01_check_dataset.py", *OFFLINE_HUB, env={"HF_HUB_OFFLINE": "1"})
    said_offline_in_one_sentence(result.returncode, result.stderr)


def test_unreachable_hub_fails_fast_without_retries(monkeypatch):
    import mmdp.data.hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(mmdp.data.hub, "hub_offline_reason", lambda timeout=3.0: "cannot connect")
    start = time.perf_counter()
    with pytest.raises(UserError, match="out of reach"):
        load_vqa_dataset("HuggingFaceM4/the_cauldron", "ai2d")
    with pytest.raises(UserError, match="SmolLM2 tokenizer shipped in the repo"):
        from mmdp.data.tokenizer import get_tokenizer

        get_tokenizer("HuggingFaceTB/SmolLM2-360M-Instruct")
    assert time.perf_counter() - start < 5


def test_local_tokenizer_path_loads(tmp_path, tokenizer):
    from mmdp.data.tokenizer import get_tokenizer

    tokenizer.save_pretrained(tmp_path / "tok")
    other = get_tokenizer(str(tmp_path / "tok"))
    assert other("a red circle")["input_ids"] == tokenizer("a red circle")["input_ids"]
    assert other.image_token_id == tokenizer.image_token_id
