"""Why a row is left out of an epoch: every reason under one name, in one place.

Every loader counts the rows it drops by these reasons, so that an epoch report always adds up:
samples + sum(dropped.values()) == rows read. A new reason belongs here, nowhere else.
"""

# The conversation cannot be tokenized (mmdp.data.conversation).
NO_TEXTS = "no_texts"  # the row has no conversation
EMPTY_REPLY = "empty_reply"  # an assistant reply is empty: nothing to learn from
IMAGE_TOKEN_IN_TEXT = "image_token_in_text"  # the text holds <|image|> itself: images would shift
# The <image>/<video> tags of the user turns are not one per image/video file of the row
# (mmdp.data.conversation.placed_at_tags): where would the extra file, or the extra tag, go?
MEDIA_TAG_MISMATCH = "media_tag_mismatch"

# An image cannot be used (mmdp.data.images); found when the image is decoded.
UNDECODABLE_IMAGE = "undecodable_image"
IMAGE_TOO_LARGE = "image_too_large"  # over config.MAX_IMAGE_PIXELS, read from the header
# The model's processor refuses the image's width and height (Qwen-VL: an aspect ratio over 200).
IMAGE_SIZE_REFUSED = "image_size_refused"

# A remote image or video (s3://, gs://, hf://, https://) that still failed to read after
# mmdp.data.files.READ_ATTEMPTS tries: the network or the store, not the file (a missing file is
# undecodable, as a missing local one is).
UNREACHABLE_FILE = "unreachable_file"

# A video cannot be used (mmdp.data.videos): its container does not open or decode, or the model's
# processor refuses it (Qwen3-VL: fewer frames than its temporal patch), or the family takes no video.
UNDECODABLE_VIDEO = "undecodable_video"
VIDEO_REFUSED = "video_refused"
# A row with audio (an <audio> tag in a user turn: mmdp.data.conversation): Gemma 4 takes audio,
# but mmdp packs images and videos only, so far.
AUDIO_REFUSED = "audio_refused"

# Over a budget (stages 3, 5 and 6).
TOO_LONG = "too_long"  # more tokens than max_length
TOO_MANY_IMAGES = "too_many_images"  # more images than max_images
TOO_MANY_PATCHES = "too_many_patches"  # more vision-encoder patches than max_patches

# Left out by stage 3's modality-grouped batches so that every rank yields the same number of
# batches (DDP would hang); stage 5 leaves none out: a rank short of a batch gets a filler.
LEFT_OUT_TO_EQUALISE_RANKS = "left_out_to_equalise_ranks"

# Read from a stream by one rank but not yielded, because another rank's share ran out first and
# every rank stops at the same step (mmdp.loading.streaming): the batch in hand and
# the rest of its buffer.
HELD_WHEN_RANKS_STOPPED = "held_when_ranks_stopped"

# Not chosen for this epoch by a mixture of sources (mmdp.data.mixture): its source had more
# than its share.
LEFT_OUT_BY_MIXTURE = "left_out_by_mixture"

# Every reason, in the order reports list them. A row's reason is stored as its position in this
# tuple (mmdp.planning.planner keeps millions of them as one byte each); 0 means "not
# dropped".
REASONS = (
    None,
    NO_TEXTS,
    EMPTY_REPLY,
    IMAGE_TOKEN_IN_TEXT,
    UNDECODABLE_IMAGE,
    IMAGE_TOO_LARGE,
    TOO_LONG,
    TOO_MANY_IMAGES,
    LEFT_OUT_TO_EQUALISE_RANKS,
    HELD_WHEN_RANKS_STOPPED,
    TOO_MANY_PATCHES,
    IMAGE_SIZE_REFUSED,
    LEFT_OUT_BY_MIXTURE,
    UNDECODABLE_VIDEO,
    VIDEO_REFUSED,
    MEDIA_TAG_MISMATCH,
    UNREACHABLE_FILE,
    AUDIO_REFUSED,
)
CODE = {reason: code for code, reason in enumerate(REASONS)}


class BadRow(Exception):
    """A row that cannot be used, and why: `reason` is one of the reasons above. Its conversation
    (mmdp.data.conversation.BadConversation), an image (BadImage) or a video (BadVideo)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
