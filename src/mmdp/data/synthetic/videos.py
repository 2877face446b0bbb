"""A synthetic video task, made in code: a shape moves across the frame; which way, and what is it?

Rows have the_cauldron's columns plus `videos` (a list of {"bytes", "path"} MP4 clips, encoded
with PyAV's bundled FFmpeg):

    images: []    videos: [clip]    texts: [{"user", "assistant", "source": "video"}]

Clips differ in length (4 to 24 frames), frame rate (2 to 24 fps) and size (32 to 128 px a side,
even: the encoder's YUV 4:2:0 needs it), so a family's video cost varies as it would on real data.
Every answer is correct by construction: it is written from the same motion that is drawn.

Row i depends only on (seed, i). These rows are kept out of the default (TinyVLM) dataset, whose
batches must not change; mmdp.data.reading.sources mixes them in for the families that take video.
"""

import io
import random
from fractions import Fraction

import numpy as np
from PIL import Image, ImageDraw

from mmdp.data.synthetic.rows import BACKGROUND, COLOURS, SHAPES, draw_shape
from mmdp.data.videos import require_av

FRAMES = (4, 6, 8, 12, 16, 24)
FPS = (2, 4, 8, 10, 24)
SIDES = (32, 48, 64, 96, 128)
# where the shape starts and ends, as fractions of the frame, by the answer's words
MOTIONS = {
    "left to right": ((0.2, 0.5), (0.8, 0.5)),
    "right to left": ((0.8, 0.5), (0.2, 0.5)),
    "top to bottom": ((0.5, 0.2), (0.5, 0.8)),
    "bottom to top": ((0.5, 0.8), (0.5, 0.2)),
}


def generate_video_row(index: int, seed: int = 0) -> dict:
    """Row `index` of the synthetic video task: {"images": [], "videos": [clip], "texts": [...]}."""
    rng = random.Random(f"mmdp-synthetic-video-{seed}-{index}")
    shape, colour, motion = rng.choice(SHAPES), rng.choice(list(COLOURS)), rng.choice(list(MOTIONS))
    frames, fps = rng.choice(FRAMES), rng.choice(FPS)
    width, height = rng.choice(SIDES), rng.choice(SIDES)
    clip = moving_shape(shape, colour, motion, frames, width, height)
    seconds = frames / fps
    turns = [
        (f"Which way does the {colour} {shape} move?", f"It moves from {motion}."),
        ("How long is the clip?", f"About {seconds:.1f} seconds ({frames} frames at {fps} fps)."),
    ]
    return {
        "images": [],
        "videos": [{"bytes": encode_mp4(clip, fps), "path": None}],
        "texts": [{"user": u, "assistant": a, "source": "video"} for u, a in turns],
    }


def moving_shape(
    shape: str, colour: str, motion: str, frames: int, width: int, height: int
) -> np.ndarray:
    """[frames, height, width, 3] uint8: the shape drawn at evenly spaced points of its path."""
    (x0, y0), (x1, y1) = MOTIONS[motion]
    half = min(width, height) * 0.15
    clip = []
    for k in range(frames):
        t = k / max(frames - 1, 1)
        cx, cy = (x0 + (x1 - x0) * t) * width, (y0 + (y1 - y0) * t) * height
        image = Image.new("RGB", (width, height), BACKGROUND)
        draw_shape(ImageDraw.Draw(image), shape, colour, (cx, cy), half)
        clip.append(np.asarray(image))
    return np.stack(clip)


def encode_mp4(clip: np.ndarray, fps: int) -> bytes:
    """An MP4 (MPEG-4 Part 2 video, in PyAV's bundled FFmpeg) of `clip` at `fps`; its header
    gives the exact frame count and rate (mmdp.data.videos.video_metadata)."""
    return encode_clip(clip, fps, "mp4", "mpeg4", options={"qscale": "2"})


# Containers whose header counts no frames (mmdp.data.videos counts their packets), and a codec
# of each that PyAV's bundled FFmpeg writes.
NO_FRAME_COUNT = {"webm": "libvpx-vp9", "matroska": "libx264"}


def encode_clip(
    clip: np.ndarray, fps: int, container: str = "webm", codec: str | None = None, options=None
) -> bytes:
    """`clip` in a container: MP4 (encode_mp4), or another, as video datasets often hold them
    (WebM: VP8 or VP9; Matroska: H.264, MPEG-4...), whose header holds no frame count."""
    av = require_av()
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec or NO_FRAME_COUNT[container], rate=Fraction(fps))
        stream.height, stream.width = clip.shape[1:3]
        stream.pix_fmt = "yuv420p"
        if options is not None:
            stream.options = options
        for frame in clip:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return buffer.getvalue()
