"""One home for a run's settings (issue 60): the scripts' flags are made from the settings
dataclasses they compose (mmdp.flags.parse_flags), each data and packing field is declared once,
no library module imports the flags layer, and --seed is one type in every CLI."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from conftest import REPO

from mmdp.config import setting
from mmdp.data.reading.settings import DataSettings
from mmdp.flags import FAMILY_BUDGETS, LoaderSettings, command_line, flag_values, parse_flags
from mmdp.packing.packing_config import PackingConfig, default_config
from mmdp.training.ddp import DdpSettings

SRC = REPO / "src" / "mmdp"


@dataclasses.dataclass(frozen=True)
class Run:
    """A script's settings: the library's, composed, and its own beside them."""

    out: str = setting(help="where it writes")
    data: DataSettings = DataSettings(num_rows=2000)
    packing: PackingConfig = setting(
        PackingConfig(max_length=None), flags=("max_length", "strategy"), shown=FAMILY_BUDGETS
    )
    loader: LoaderSettings = LoaderSettings()
    lr: float = setting(1e-3, "learning rate", above=0)
    lora: bool = setting(False, "train adapters")


def test_the_flags_give_back_the_settings_they_are_made_of():
    run = parse_flags(Run, "", ["--out", "x", "--num-rows", "5", "--strategy", "bfd", "--lora"])
    assert run == Run(
        out="x",
        data=DataSettings(num_rows=5),
        packing=PackingConfig(max_length=None, strategy="bfd"),
        lora=True,
    )
    # a field the script does not take as a flag keeps its default; flags made of no field: none
    assert parse_flags(Run, "", ["--out", "x"]).packing.buffer_size == 4096
    for unknown in (["--buffer-size", "8"], ["--max-patches", "4"]):
        with pytest.raises(SystemExit) as exited:
            parse_flags(Run, "", ["--out", "x", *unknown])
        assert exited.value.code == 2
    # left to the model family: default_config resolves what the flags leave None
    qwen = type("Family", (), {"default_max_length": 2048, "default_max_patches": 8192})
    config = default_config(qwen, **parse_flags(Run, "", ["--out", "x"]).packing.settings())
    assert (config.max_length, config.max_patches) == (2048, 8192)
    given = parse_flags(Run, "", ["--out", "x", "--max-length", "512"]).packing.settings()
    assert default_config(qwen, **given).max_length == 512


def test_help_shows_each_default_once_as_the_script_has_it(capsys):
    with pytest.raises(SystemExit):
        parse_flags(Run, "A run.\n\nMore.", ["--help"])
    help = " ".join(capsys.readouterr().out.split())
    assert help.startswith("usage:") and "A run. options:" in help  # the first paragraph only
    assert "rows of the dataset to read (default: 2,000)" in help  # the script's, not None's
    assert "(default: the embedded synthetic dataset)" in help  # what None means
    assert "token budget of a pack, and its padded length (default: the model family's)" in help
    assert "learning rate (default: 0.001)" in help
    assert "train adapters (default" not in help  # a switch


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--num-rows", "0"], "argument --num-rows: must be at least 1, got 0"),
        (["--num-rows", "x"], "argument --num-rows: must be a whole number, got 'x'"),
        (["--lr", "0"], "argument --lr: must be above 0, got 0"),
        (["--columns", "{conv: conversations}"], "argument --columns: not JSON"),
        (["--format", "csv"], "argument --format: invalid choice: 'csv'"),
        (["--strategy", "wrap"], "argument --strategy: invalid choice: 'wrap'"),
        ([], "the following arguments are required: --out"),
    ],
)
def test_an_impossible_value_is_one_sentence_and_status_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_flags(Run, "", ["--out", "x", *argv] if argv else [])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err.strip().splitlines()[-1]


@dataclasses.dataclass(frozen=True)
class Items:
    """Stage 4's items: each flag valid alone, not together."""

    start: int = setting(1, "first item", min=1)
    end: int = setting(25, "one past the last item", min=1)

    def __post_init__(self):
        if self.start >= self.end:
            raise ValueError(f"--start ({self.start}) must be below --end ({self.end})")


def test_a_value_the_settings_refuse_is_the_flags_error(capsys):
    assert parse_flags(Items, "", ["--start", "3"]) == Items(start=3)
    with pytest.raises(SystemExit) as exited:
        parse_flags(Items, "", ["--start", "30"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().endswith("error: --start (30) must be below --end (25)")


def test_another_cli_is_given_the_same_settings_by_its_flags():
    """Stage 6 launches `python -m mmdp.check_ddp` with its rows (command_line): parsed there,
    they are the settings it was given; a field that is not a flag there is not passed."""
    data = DataSettings("rows.jsonl", split="test", num_rows=10, columns={"conv": "conversations"})
    ddp = DdpSettings(data=data, packing=PackingConfig(max_length=256, packs_per_batch=2))
    words = command_line(ddp)
    assert parse_flags(DdpSettings, "", words) == ddp
    assert words[words.index("--columns") + 1] == json.dumps({"conv": "conversations"})
    strategy = dataclasses.replace(ddp, packing=dataclasses.replace(ddp.packing, strategy="bfd"))
    assert command_line(strategy) == words  # DdpSettings has no --strategy
    # flag_values: one attribute a flag, what print_settings prints
    assert vars(flag_values(ddp))["num_rows"] == 10 and "data" not in vars(flag_values(ddp))


# One declaration a field, no library module that reads a flag ------------------------------------


def settings_fields(tree: ast.Module) -> dict[str, set[str]]:
    """{class name: its annotated fields} of every settings dataclass (...Settings, ...Config)."""
    return {
        node.name: {f.target.id for f in node.body if isinstance(f, ast.AnnAssign)}
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name.endswith(("Settings", "Config"))
    }


def redeclared(sources: dict[str, str], home: type, fields: set[str]) -> list[str]:
    """The settings classes, other than `home`, that declare one of `fields` again."""
    return [
        f"{where}: {name} declares {sorted(declared & fields)}"
        for where, source in sources.items()
        for name, declared in settings_fields(ast.parse(source)).items()
        if name != home.__name__ and declared & fields
    ]


def sources(*folders: Path) -> dict[str, str]:
    paths = [p for folder in folders for p in folder.glob("**/*.py")]
    return {str(p.relative_to(REPO)): p.read_text() for p in paths}


SCRIPTS = [REPO / "examples", *REPO.glob("0[1-6]_*.py")]
# The rows: declared once, in DataSettings, in the package and in every script. A pack: once, in
# PackingConfig; a script may have a max_length of its own (stage 3's padded length), and a run
# its seed (its data order and initial weights), beside the packing's.
HOMES = {
    DataSettings: ({f.name for f in dataclasses.fields(DataSettings)}, [SRC, *SCRIPTS]),
    PackingConfig: ({f.name for f in dataclasses.fields(PackingConfig)} - {"seed"}, [SRC]),
}


@pytest.mark.parametrize("home", HOMES, ids=lambda home: home.__name__)
def test_each_data_and_packing_field_is_declared_in_one_settings_class(home):
    fields, where = HOMES[home]
    files = {}
    for folder in where:
        files |= sources(folder) if folder.is_dir() else {folder.name: folder.read_text()}
    assert redeclared(files, home, fields) == []
    # negative control: the re-declaration the issue found (TrainingSettings' own)
    again = "class TrainingSettings:\n    num_rows: int\n    max_length: int\n    seed: int"
    declared = sorted({"num_rows", "max_length"} & fields)
    assert redeclared({"made_up.py": again}, home, fields) == [
        f"made_up.py: TrainingSettings declares {declared}"
    ]


# the flags layer itself, and the CLIs: `python -m mmdp.prepare`, `python -m mmdp.check_ddp`
CLIS = {"flags.py", "prepare.py", "check_ddp.py"}


def reads_flags(source: str) -> list[str]:
    """Where a module imports mmdp.flags or calls add_argument, anywhere in it (a library
    module's `__main__` block too: its command line belongs in a CLI module)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (
            node.module == "mmdp.flags"
            or (node.module == "mmdp" and any(a.name == "flags" for a in node.names))
        ):
            found.append(f"line {node.lineno}: imports mmdp.flags")
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            found.append(f"line {node.lineno}: add_argument")
    return found


def test_no_library_module_imports_the_flags_layer_or_adds_a_flag():
    wrong = {
        str(path.relative_to(SRC)): reads_flags(path.read_text())
        for path in SRC.rglob("*.py")
        if path.name not in CLIS or path.parent != SRC
    }
    assert {path: found for path, found in wrong.items() if found} == {}
    # negative control: what training/ddp.py and report/epoch.py did before issue 60
    before = (
        "from mmdp.flags import display_path\n\ndef f(parser):\n    parser.add_argument('--x')\n"
    )
    assert reads_flags(before) == ["line 1: imports mmdp.flags", "line 4: add_argument"]
    main = 'if __name__ == "__main__":\n    from mmdp.flags import parse_flags\n'
    assert reads_flags(main) == ["line 2: imports mmdp.flags"]  # a library module's CLI block


# --seed, one type everywhere -------------------------------------------------------------------

SEEDED = [
    "01_check_dataset.py",
    "02_naive_pad_dataloader.py",
    "03_constrained_pad_dataloader.py",
    "05_knapsack_multimodal.py",
    "06_packing_pays_off.py",
    "examples/group_by_length.py",
    "examples/pack_mixture.py",
    "examples/pack_planned.py",
    "examples/pack_prepared.py",
    "examples/pack_streaming.py",
    "examples/trainer.py",
    "examples/accelerate_loop.py",
    "examples/torchrun.py",
    "src/mmdp/check_ddp.py",
]


@pytest.mark.parametrize("script", SEEDED)
def test_seed_is_a_whole_number_of_0_or_more_in_every_cli(script, run_main):
    status, _, err = run_main(script, "--seed", "-1")
    assert status == 2
    assert err.strip().splitlines()[-1].endswith("argument --seed: must be at least 0, got -1")
