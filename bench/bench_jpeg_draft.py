"""How much time does JPEG draft decoding save TinyVLM's `load_image`?

    uv run bench/bench_jpeg_draft.py                      # ~1 min
    uv run bench/bench_jpeg_draft.py --repeats 1

`load_image` of JPEGs 2x and 4x TinyVLM's image side (20 different ones of each, gradients with
some grain, quality 90) against the full decode resized (what it did before draft decoding),
alternating, --repeats times, in this process and one thread as in a DataLoader worker. It prints
one table: for each JPEG side, the median ms an image of each, the speed-up, and the mean absolute
difference of the two tensors in levels of 255.
"""

import argparse
import io
import statistics
import time

import numpy as np
import torch
from PIL import Image

from mmdp import config
from mmdp.data.images import decode_image, load_image


def jpeg_cells(side: int, count: int) -> list[dict]:
    """`count` different JPEGs of side x side pixels: gradients with some grain, quality 90."""
    generator = np.random.default_rng(side)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    cells = []
    for _ in range(count):
        pixels = (ramp[None, :, None] + ramp[:, None, None]) / 2 + generator.normal(
            0, 4, (side, side, 3)
        )
        buffer = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        cells.append({"bytes": buffer.getvalue(), "path": None})
    return cells


def full_decode(cell, size: int) -> torch.Tensor:
    """load_image as it was before draft decoding: the full decode, resized."""
    pil = decode_image(cell)[0].resize((size, size), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).float().div_(255)


def jpeg_draft(size: int, repeats: int) -> None:
    """One thread, as in a DataLoader worker: on a busy machine torch's threads contend."""
    torch.set_num_threads(1)
    print(
        f"\nJPEG draft decoding, one process and thread, ms an image to a {size}x{size} tensor, median:\n"
    )
    print("| JPEG side | full decode + resize | load_image (draft) | speed-up | mean abs diff |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for side in (2 * size, 4 * size):
        cells = jpeg_cells(side, 20)
        full, draft = [], []
        for _ in range(repeats):
            for runs, decode in ((full, full_decode), (draft, lambda c, s: load_image(c, s)[0])):
                start = time.perf_counter()
                for cell in cells:
                    decode(cell, size)
                runs.append((time.perf_counter() - start) / len(cells) * 1e3)
        diff = statistics.mean(
            (full_decode(c, size) - load_image(c, size)[0]).abs().mean().item() * 255 for c in cells
        )
        f, d = statistics.median(full), statistics.median(draft)
        print(f"| {side} | {f:.2f} | {d:.2f} | {f / d:.2f}x | {diff:.2f} levels |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs of each")
    args = parser.parse_args()
    jpeg_draft(config.IMAGE_SIZE, args.repeats)


if __name__ == "__main__":
    main()
