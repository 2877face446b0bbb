"""Would torchvision's decoder make the stage-5 loader's images faster than Pillow?

    uv run bench/bench_decoders.py --rows 600 --repeats 7               # seconds
    uv run bench/bench_decoders.py --rows 600 --repeats 7 --image-format jpeg

Decoding alone, on every image of --rows rows of the embedded dataset that both decode (PNGs as
embedded, or each re-encoded as a JPEG of quality 90 with --image-format jpeg), alternating,
--repeats times, one thread: Pillow as mmdp.data.images decodes (Image.open, load: the PIL image
the processors take) against torchvision.io.decode_image (libjpeg-turbo / libpng), its CHW
tensor alone and turned into that PIL image (channels last, one copy). It prints a line with
the images and their formats, and one table: the median ms an image of each, and torchvision's
median ratio to Pillow's time.
"""

import argparse
import io
import statistics
import time
import warnings
from collections import Counter

import numpy as np
import torch
from loader_epochs import IMAGE_FORMAT_HELP, IMAGE_FORMATS, embedded_rows
from PIL import Image


def decoders(rows, repeats: int) -> None:
    """Decoding alone, ms an image: Pillow as mmdp.data.images decodes (Image.open, load: the
    PIL image the processors take) against torchvision.io.decode_image, its CHW tensor alone and
    turned into that PIL image (channels last, one copy), on the rows' images that all decode,
    alternating; medians of each repeat's time and of its ratio to Pillow's."""
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_image as torchvision_decode

    def pillow(data: bytes):
        image = Image.open(io.BytesIO(data))
        image.load()
        return image

    def torchvision(data: bytes):
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return torchvision_decode(encoded, mode=ImageReadMode.RGB)

    def torchvision_to_pil(data: bytes):
        Image.open(io.BytesIO(data))  # decode_image reads the header (size, mode, EXIF) first
        pixels = torchvision(data).numpy().transpose(1, 2, 0)
        return Image.fromarray(np.ascontiguousarray(pixels), "RGB")

    warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29 deprecates its decoders
    torch.set_num_threads(1)
    images, formats = [], Counter()
    for row in rows:
        for cell in row["images"] or []:
            try:
                pillow(cell["bytes"]), torchvision(cell["bytes"])
            except Exception:  # noqa: BLE001 (a broken image of the dataset: left out)
                continue
            images.append(cell["bytes"])
            formats[Image.open(io.BytesIO(cell["bytes"])).format] += 1
    times = {pillow: [], torchvision: [], torchvision_to_pil: []}
    for _ in range(repeats):
        for decode, spent in times.items():
            start = time.perf_counter()
            for data in images:
                decode(data)
            spent.append((time.perf_counter() - start) / len(images) * 1e3)

    def ratio(decode) -> float:
        return statistics.median(t / p for t, p in zip(times[decode], times[pillow]))

    kinds = ", ".join(f"{n} {name}" for name, n in formats.most_common())
    print(f"\nDecoding alone, one thread, {len(images)} images ({kinds}), ms an image, median:\n")
    print("| Pillow (open, load) | torchvision, CHW tensor | torchvision, as a PIL image |")
    print("| ---: | ---: | ---: |")
    ms = {decode: statistics.median(spent) for decode, spent in times.items()}
    print(
        f"| {ms[pillow]:.2f} | {ms[torchvision]:.2f} ({ratio(torchvision):.2f}x the time) | "
        f"{ms[torchvision_to_pil]:.2f} ({ratio(torchvision_to_pil):.2f}x) |"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000, help="rows of the embedded dataset")
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs of each")
    parser.add_argument(
        "--image-format", choices=IMAGE_FORMATS, default="png", help=IMAGE_FORMAT_HELP
    )
    args = parser.parse_args()
    decoders(embedded_rows(args.rows, args.image_format), args.repeats)


if __name__ == "__main__":
    main()
