"""Read videos for a model's video processor, turning bad videos into named outcomes.

A row's `videos` are {"bytes", "path"} dicts, like its `images`. Two steps, each usable alone:

    video_metadata(video)          frames, fps, width and height from the container's header (no
                                   frame is decoded): what weighing reads
    decode_frames(video, indices)  the frames at `indices`, RGB, [T, H, W, 3] uint8: only the
                                   frames the processor samples are converted

A file that does not open, has no video stream or no frame count raises BadVideo with its reason
from mmdp.drop_reasons.

The decoder is PyAV (the `video` extra): transformers' own `load_video` defaults to it
(transformers/video_utils.py:677, `backend="pyav"`) and reads its metadata the way
`video_metadata` does (video_utils.py:499-510); its wheels bundle FFmpeg, so it decodes (and
mmdp.data.synthetic_videos encodes) offline on a bare machine. torchcodec, which a video
processor's `fetch_videos` prefers (video_processing_utils.py:566), needs the system's FFmpeg
libraries, which neither this machine nor CI has.
"""

import io

import numpy as np

from mmdp.drop_reasons import UNDECODABLE_VIDEO
from mmdp.errors import require_extra


class BadVideo(Exception):
    """A video that cannot be used; `reason` is one of mmdp.drop_reasons."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def require_av():
    """PyAV, or one sentence naming the extra that installs it (mmdp.errors.MissingExtra)."""
    return require_extra("av", "video", "a row with a video (PyAV)")


def open_container(video):
    """An open PyAV container of a {"bytes", "path"} video (close it after use)."""
    av = require_av()
    if isinstance(video, dict) and video.get("bytes") is not None:
        source = io.BytesIO(video["bytes"])
    elif isinstance(video, dict) and video.get("path"):
        source = video["path"]
    else:
        raise BadVideo(UNDECODABLE_VIDEO, f"no video data in {type(video).__name__}")
    try:
        return av.open(source)
    except (av.FFmpegError, OSError, ValueError) as error:
        raise BadVideo(UNDECODABLE_VIDEO, f"{error.__class__.__name__}: {error}") from error


def video_metadata(video):
    """The container's frames, fps, width and height, as transformers' PyAV reader reads them
    (video_utils.py:499-510), without decoding a frame: a transformers VideoMetadata."""
    # imported here: transformers.video_utils imports torchvision (seconds), which only rows
    # with videos need
    from transformers.video_utils import VideoMetadata

    with open_container(video) as container:
        if not container.streams.video:
            raise BadVideo(UNDECODABLE_VIDEO, "no video stream")
        stream = container.streams.video[0]
        frames, rate = int(stream.frames), stream.average_rate
        if frames <= 0 or not rate:
            raise BadVideo(UNDECODABLE_VIDEO, f"{frames} frames at {rate} fps in the header")
        return VideoMetadata(
            total_num_frames=frames,
            fps=float(rate),
            duration=float(frames / rate),
            width=stream.width,
            height=stream.height,
            video_backend="pyav",
        )


def decode_frames(video, indices) -> np.ndarray:
    """The frames at `indices`, RGB, [T, H, W, 3] uint8; BadVideo if the stream ends or breaks
    before the last of them."""
    av = require_av()
    wanted = set(int(i) for i in indices)
    frames = {}
    with open_container(video) as container:
        try:
            for i, frame in enumerate(container.decode(video=0)):
                if i in wanted:
                    frames[i] = frame.to_ndarray(format="rgb24")
                if len(frames) == len(wanted):
                    break
        except (av.FFmpegError, ValueError) as error:
            raise BadVideo(UNDECODABLE_VIDEO, f"{error.__class__.__name__}: {error}") from error
    if len(frames) != len(wanted):
        raise BadVideo(UNDECODABLE_VIDEO, f"{len(frames)} of {len(wanted)} frames decoded")
    return np.stack([frames[int(i)] for i in indices])
