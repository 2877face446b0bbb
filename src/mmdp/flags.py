"""The scripts' flags, made from the settings dataclasses a script composes: a flag a field
(`num_rows` is --num-rows), its type, default and help taken from the field, and the parsed flags
given back as those dataclasses. The library declares its settings (DataSettings, PackingConfig,
TrainingSettings...) and never reads a flag: only the scripts and the CLIs (mmdp.prepare,
mmdp.check_ddp) import this module. No torch here: stage 4 parses with it too.

    @dataclasses.dataclass(frozen=True)
    class Stage2Settings:
        data: DataSettings = DataSettings(num_rows=config.DEFAULT_NUM_ROWS)  # --dataset, ...
        loader: LoaderSettings = LoaderSettings()  # --tokenizer, --num-workers, --metrics-json
        batch_size: int = setting(config.BATCH_SIZE, "samples per padded batch", min=1)

    settings = parse_flags(Stage2Settings, __doc__)  # settings.data.num_rows, settings.batch_size

A field whose type is a dataclass brings its own fields' flags, named as they are (no prefix), its
default the values they default to in this script. A field is declared with mmdp.config.setting
(its default, its help, and what its flag takes, as the field's metadata):

    help     what the field holds; --help adds "(default: X)"
    shown    how --help shows the field's own default: what None means ("every row")...
    min      the smallest number it takes; above, below: bounds it must be strictly within
    choices  the values it takes (a Literal annotation names them too); a function that returns
             them is called when the flags are made (names that live beside torch)
    parse    a function from the flag's text to the value, for what is not a plain type (it
             raises mmdp.errors.UserError or ValueError: the flag's one-sentence error)
    metavar  how --help names the value
    flags    on a dataclass field: which of its fields become flags (default: all of them; the
             others keep their default); its shown: {field: how --help shows its default}
A field without a default is a required flag; a bool is a switch (--lora sets it).
"""

import argparse
import dataclasses
import json
import operator
import os
import types
import typing

from mmdp import config
from mmdp.config import setting

TOP = types.MappingProxyType({})  # the settings a script parses: every field a flag


def parse_flags(settings: type, doc: str, argv=None, *, prog: str | None = None):
    """The flags of the dataclass `settings` parsed from `argv` (default: the command line), as
    a `settings` value; `doc` (the script's docstring) gives --help its description. A value the
    dataclass refuses (its ValueError) is the flag's error: one sentence and exit status 2."""
    parser = argparse.ArgumentParser(prog=prog, description=description(doc))
    add_flags(parser, settings)
    values = parser.parse_args(argv)
    try:
        return settings_from(values, settings)
    except ValueError as error:
        parser.error(str(error))


def add_flags(parser: argparse.ArgumentParser, settings: type, defaults=None, outer=TOP) -> None:
    """A flag for each field of the dataclass `settings`, its default the field's value in
    `defaults` (a `settings` value) or its own; `outer`: the metadata of the field that holds
    these settings (its "flags", which fields become flags, and its "shown")."""
    for field in dataclasses.fields(settings):
        default = default_of(field, defaults)
        if dataclasses.is_dataclass(field.type):
            add_flags(parser, field.type, default, field.metadata)
        elif field.name in outer.get("flags", [field.name]):
            shown = outer.get("shown", {}).get(field.name)
            parser.add_argument(flag_name(field), **flag_options(field, default, shown))


def settings_from(values: argparse.Namespace, settings: type, defaults=None, outer=TOP):
    """The `settings` value of the parsed flags (add_flags' of the same dataclass)."""
    fields = {}
    for field in dataclasses.fields(settings):
        default = default_of(field, defaults)
        if dataclasses.is_dataclass(field.type):
            fields[field.name] = settings_from(values, field.type, default, field.metadata)
        elif field.name in outer.get("flags", [field.name]):
            fields[field.name] = getattr(values, field.name)
        else:
            fields[field.name] = default
    return settings(**fields)


def flag_values(settings) -> argparse.Namespace:
    """A settings value as its flags hold it, one attribute a flag (what print_settings prints)."""
    values = argparse.Namespace()
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(field.type):
            vars(values).update(vars(flag_values(value)))
        else:
            setattr(values, field.name, value)
    return values


def command_line(settings, outer=TOP) -> list[str]:
    """The flags that give a CLI of these settings (one that parses them) these values: a field
    that is None or False is left to its default."""
    words = []
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(field.type):
            words += command_line(value, field.metadata)
        elif field.name not in outer.get("flags", [field.name]) or value is None or value is False:
            continue
        elif value is True:
            words.append(flag_name(field))
        else:
            words += [
                flag_name(field),
                json.dumps(value) if isinstance(value, dict) else str(value),
            ]
    return words


def default_of(field: dataclasses.Field, defaults):
    if defaults is not None:
        return getattr(defaults, field.name)
    if field.default is dataclasses.MISSING and dataclasses.is_dataclass(field.type):
        return None  # settings with no default of their own: their fields' defaults
    return field.default


def flag_name(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def flag_options(field: dataclasses.Field, default, shown=None) -> dict:
    """add_argument's keywords for a field: its type, default, choices and help (`shown`: how
    it shows the default, when the script says)."""
    meta, kind = field.metadata, not_optional(field.type)
    if shown is None:
        shown = meta.get("shown", default) if default == field.default else default
    if shown is None or shown is False or shown is dataclasses.MISSING:
        help = meta["help"]
    else:
        help = f"{meta['help']} (default: {f'{shown:,}' if type(shown) is int else shown})"
    options = {"help": help}
    if default is dataclasses.MISSING:
        options["required"] = True
    else:
        options["default"] = default
    if kind is bool:
        return {**options, "action": "store_true"}
    options["metavar"] = meta.get("metavar")
    choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None
    choices = meta.get("choices", choices)
    if choices is not None:
        options["choices"] = choices() if callable(choices) else choices
    if "parse" in meta:
        options["type"] = parsed_by(meta["parse"], flag_name(field))
    elif kind in (int, float):
        bounds = {key: meta[key] for key in ("min", "above", "below") if key in meta}
        options["type"] = number(kind, **bounds)
    return options


def not_optional(kind):
    """`int | None` -> int."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        (kind,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    return kind


def number(kind: type, *, min=None, above=None, below=None):
    """An argparse type: a number of `kind` (int: a whole number) within the bounds given, or
    one sentence and exit status 2.

    >>> number(float, min=0, below=1)("1.5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be at least 0 and below 1, got 1.5
    """
    bounds = [
        (f"{words} {bound}", bound, holds)
        for words, bound, holds in [
            ("at least", min, operator.ge),
            ("above", above, operator.gt),
            ("below", below, operator.lt),
        ]
        if bound is not None
    ]

    def read(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not all(holds(value, bound) for _, bound, holds in bounds):
            within = " and ".join(words for words, _, _ in bounds)
            raise argparse.ArgumentTypeError(f"must be {within}, got {text}")
        return value

    read.__name__ = kind.__name__  # what argparse calls the type in its own messages
    return read


positive_int = number(int, min=1)


def parsed_by(parse, flag: str):
    """An argparse type of a library's parse function: its error, without the flag's name and
    text that argparse prints before it anyway."""
    from mmdp.errors import UserError

    def read(text: str):
        try:
            return parse(text)
        except (UserError, ValueError) as error:
            raise argparse.ArgumentTypeError(
                str(error).removeprefix(f"{flag} {text!r}: ")
            ) from None

    read.__name__ = parse.__name__
    return read


def description(doc: str) -> str:
    """A script's --help description: the first paragraph of its docstring, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


# What several scripts take beside the library's settings -----------------------------------------


@dataclasses.dataclass(frozen=True)
class LoaderSettings:
    """How a script that runs an epoch through a DataLoader tokenizes, loads and reports
    (stages 2, 3 and 5, examples/)."""

    tokenizer: str | None = setting(
        None, "tokenizer name or path", shown="the SmolLM2 tokenizer shipped in the repo"
    )
    num_workers: int = setting(min(2, os.cpu_count() or 1), "DataLoader worker processes", min=0)
    metrics_json: str | None = setting(None, "write the epoch report as JSON to this path")


@dataclasses.dataclass(frozen=True)
class EpochSettings:
    """Which epoch a packing run goes through, and what it keeps of it."""

    epoch: int = setting(0, "which epoch's shuffle", min=0)
    save_batch: str | None = setting(None, "torch.save the first collated batch to this path")


# How --help shows the budgets that a packing run leaves to the model family (a PackingConfig
# default of None there, resolved by mmdp.packing.packing_config.default_config).
FAMILY_BUDGETS = {"max_length": "the model family's", "max_patches": "the model family's"}


@dataclasses.dataclass(frozen=True)
class Figures:
    """Where a stage saves its figures."""

    out_dir: str = setting(str(config.ASSETS_DIR), "where figures go", shown="assets/")
