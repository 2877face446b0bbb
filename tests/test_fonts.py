"""Text in any script (mmdp.report.fonts): stage 1's figure of a Chinese, Japanese or Korean row
draws its characters in a Noto Sans CJK face (no "Glyph ... missing" warning), loaded only when a
text needs it; without the font package, matplotlib's warning comes back (the negative control)."""

import io
import sys
import warnings

import pytest
from matplotlib import font_manager

from mmdp.report import fonts
from mmdp.report.plots import plot_sample

ROWS = {  # a row in each language, and the face its text is drawn in
    "chinese": ({"user": "这张图片里有什么？", "assistant": "一个红色的圆形。"}, "SC"),
    "japanese": ({"user": "この画像には何がありますか？", "assistant": "赤い丸です。"}, "JP"),
    "korean": ({"user": "이 이미지에 무엇이 있습니까?", "assistant": "빨간 원입니다."}, "KR"),
}


@pytest.fixture(autouse=True)
def fresh_fonts():
    """Each test finds the font package as it is now (and leaves no stale answer behind)."""
    fonts.cjk_faces.cache_clear()
    yield
    fonts.cjk_faces.cache_clear()


def missing_glyphs(fig) -> list[str]:
    """matplotlib's "Glyph ... missing from font(s)" warnings when the figure is drawn."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(io.BytesIO(), format="png", dpi=30)
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


@pytest.mark.parametrize("language", ROWS)
def test_a_cjk_row_is_drawn_in_a_cjk_font(language):
    turn, region = ROWS[language]
    fig = plot_sample([], [turn], title=f"Dataset sample: row 0 ({turn['user']})")
    assert missing_glyphs(fig) == []
    conversation = fig.axes[1].texts[0]
    face = f"Noto Sans Mono CJK {region}"
    assert conversation.get_fontfamily() == ["monospace", face]
    assert fig._suptitle.get_fontfamily() == ["sans-serif", f"Noto Sans CJK {region}"]
    drawn_with = font_manager.findfont(
        font_manager.FontProperties(family=[face]), fallback_to_default=False
    )
    assert drawn_with.endswith("NotoSansCJK-Regular.ttc")


def test_latin_text_loads_no_cjk_font():
    fig = plot_sample([], [{"user": "What colour is it?", "assistant": "Red."}], title="row 0")
    assert fig.axes[1].texts[0].get_fontfamily() == ["monospace"]
    assert missing_glyphs(fig) == []
    assert fonts.cjk_faces.cache_info().misses == 0  # the 19 MB font never opened


def test_without_the_font_package_the_boxes_come_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "noto_cjk_sans_otc", None)  # import fails: not installed
    fig = plot_sample([], [ROWS["chinese"][0]], title="row 0")
    assert fig.axes[1].texts[0].get_fontfamily() == ["monospace"]
    assert any("DejaVu Sans Mono" in message for message in missing_glyphs(fig))
