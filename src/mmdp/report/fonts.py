"""Text in any script: the figures draw a row's Chinese, Japanese and Korean characters too.

matplotlib's default fonts (DejaVu) have no CJK glyphs: such text comes out as empty boxes, with
a warning "Glyph ... missing from font(s) DejaVu Sans Mono". `families_for(text, family)` is the
font family list to draw `text` in: `family` alone when its font has every character of the text
(nothing else is loaded), else `family` and then a Noto Sans CJK face, which matplotlib (3.6 and
later) falls back to for the characters the first font lacks. Noto Sans CJK (SIL Open Font
License) ships in the noto-cjk-sans-otc package, one 19 MB file: it is registered with
matplotlib's font manager the first time a text needs it, and read from disk (no network).

    >>> families_for("Which bar is highest?", "monospace")
    ['monospace']
    >>> families_for("哪个柱子最高？", "monospace")
    ['monospace', 'Noto Sans Mono CJK SC']
    >>> families_for("どの棒が一番高い？")
    ['sans-serif', 'Noto Sans CJK JP']
"""

import functools

from matplotlib import font_manager, ft2font

# The face for a text: the Japanese one when it has kana, the Korean one when it has Hangul, else
# the Simplified Chinese one (the Han characters the three share take each region's forms).
KANA = ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9F))
HANGUL = ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7FF))


def families_for(text: str, family: str = "sans-serif") -> list[str]:
    """[family], or [family, a Noto Sans CJK face] when `family`'s font lacks a character of
    `text` (the monospaced face for "monospace"). Without the font package, [family]: the
    characters are drawn as boxes and matplotlib warns, as before."""
    if set(text) <= characters_of(family):
        return [family]
    region = "JP" if in_ranges(text, KANA) else "KR" if in_ranges(text, HANGUL) else "SC"
    faces = cjk_faces()
    wanted = f"Noto Sans{' Mono' if family == 'monospace' else ''} CJK {region}"
    if wanted in faces:
        return [family, wanted]
    return [family, *sorted(faces)[:1]]  # matplotlib < 3.10 registers a collection's first face


@functools.cache
def characters_of(family: str) -> frozenset[str]:
    """The characters the font matplotlib picks for `family` has glyphs for (and whitespace)."""
    path = font_manager.findfont(font_manager.FontProperties(family=[family]))
    codes = ft2font.FT2Font(path).get_charmap()
    return frozenset(map(chr, codes)) | frozenset("\n\t ")


@functools.cache
def cjk_faces() -> frozenset[str]:
    """The family names of the Noto Sans CJK faces, registered with matplotlib on the first call;
    none when noto-cjk-sans-otc is not installed."""
    try:
        from noto_cjk_sans_otc import FONT_PATH
    except ImportError:
        return frozenset()
    path = str(FONT_PATH)
    font_manager.fontManager.addfont(path)
    return frozenset(font.name for font in font_manager.fontManager.ttflist if font.fname == path)


def in_ranges(text: str, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= ord(c) <= high for c in text for low, high in ranges)
