"""A command's options, declared once: each is a field of the command's settings dataclass.

As SGLang's ``ServerArgs``: the settings a command runs with are one dataclass, and the field of a
setting a person may give carries its flag, its help and the argparse details (`option`); its
default is the field's. `add_options` adds those flags to a parser in the fields' order (each to
its argument group), and `options_from` builds the settings from the parsed namespace, after the
run configuration file (``--config``, hsextract.config_file) has filled in the flags it holds. So
a setting is spelled in one place, and its flag, its config key, its default and the value the
command runs with cannot drift apart.

A field without `option` is not a flag: the command derives it (from the model, say) or a caller
sets it. A flag given no value, or one whose argparse default is None, leaves the field at its own
default. A field may also be a whole settings class of its own (``option(nested=CaptureConfig)``):
its flags stand at the field's place, and the field holds the settings built from them.
"""

from __future__ import annotations

import argparse
import builtins  # `type` is a field of Option
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass
from typing import Any

_OPTION = "hsextract.option"
_FIELD_DEFAULT: Any = object()  # the parser's default is the field's


@dataclass(frozen=True)
class Option:
    """How one field is given on the command line."""

    help: str | None = None
    flag: str = ""  # "" = --<the field's name with dashes>
    aliases: tuple[str, ...] = ()  # older spellings of the flag, still accepted
    positional: bool = False  # an argument without a flag (the field's name), e.g. ``HOST ...``
    dest: str = ""  # the namespace's (and the config file's) key; "" = argparse's, from the flag
    group: str = ""  # the argument group's title; "" = the parser's own options
    exclusive: str = ""  # the flags that share a name here may not be given together (``--link | --move``)
    type: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    metavar: str | None = None
    nargs: str | int | None = None
    action: str | builtins.type[argparse.Action] | None = None  # "store_true", "append", argparse.BooleanOptionalAction
    # The parser's default where it is not the field's: None where "not given" means the field's own
    # default (an option whose help names a default the parser cannot hold: "one per core").
    parser_default: Any = _FIELD_DEFAULT
    convert: Callable[[Any], Any] | None = None  # the flag's value -> the field's (a path, a parsed size)
    # Whether the command needs it (from a flag or the config file): None = a field without a default;
    # True for one that has a default for other callers, False for one the command derives when not given.
    required: bool | None = None
    nested: builtins.type | None = None  # a settings class whose flags stand here (the field holds its settings)

    def flag_of(self, name: str) -> str:
        """The flag of the field `name` (a positional argument's name)."""
        if self.positional:
            return name
        return self.flag or f"--{name.replace('_', '-')}"

    def key(self, name: str) -> str:
        """Where argparse puts its value, and the config file's key: the flag's name with
        underscores, unless `dest` says."""
        return self.dest or self.flag_of(name).removeprefix("--").replace("-", "_")


def option(default: Any = MISSING, *, default_factory: Any = MISSING, like: Option | None = None, **how: Any) -> Any:
    """A dataclass field that is also a flag: ``max_in_flight: int = option(64, help="...")``.

    `how` holds `Option`'s fields (help, flag, group, type, choices...); `like` is a flag several
    commands share, declared once where it belongs (`how` may still set its group). A field without a
    default is required by the command; ``required=True`` marks one that has a default for other
    callers."""
    spec = dataclasses.replace(like, **how) if like is not None else Option(**how)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_OPTION: spec})


def options_of(cls: type) -> list[tuple[dataclasses.Field[Any], Option]]:
    """The fields of `cls` that are flags, in their order, each with its `Option`."""
    return [(f, f.metadata[_OPTION]) for f in dataclasses.fields(cls) if _OPTION in f.metadata]


def default_of(cls: type, name: str) -> Any:
    """The default of the field `name` of `cls`: the value a command runs with when not told."""
    return _field_default(next(f for f in dataclasses.fields(cls) if f.name == name))


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _flat(cls: type) -> list[tuple[dataclasses.Field[Any], Option]]:
    """`options_of` with the fields of every nested settings class in its place."""
    flat = []
    for f, opt in options_of(cls):
        flat += _flat(opt.nested) if opt.nested is not None else [(f, opt)]
    return flat


def add_options(parser: argparse.ArgumentParser, cls: type) -> dict[str, Any]:
    """Add every flag of the settings class `cls` to `parser`, in the fields' order; the argument
    groups made for them, by title (a command may add a flag of its own to one)."""
    groups: dict[tuple[str, str], Any] = {}
    for f, opt in _flat(cls):
        flags = [opt.flag_of(f.name), *opt.aliases]
        _container(parser, groups, opt).add_argument(*flags, **_argument_kwargs(f, opt))
    return {title: group for (title, exclusive), group in groups.items() if not exclusive}


def _container(parser: argparse.ArgumentParser, groups: dict[tuple[str, str], Any], opt: Option) -> Any:
    """Where the flag goes: the parser, its argument group, or the mutually exclusive group in either."""
    target: Any = parser
    if opt.group:
        if (opt.group, "") not in groups:
            groups[opt.group, ""] = parser.add_argument_group(opt.group)
        target = groups[opt.group, ""]
    if opt.exclusive:
        if (opt.group, opt.exclusive) not in groups:
            groups[opt.group, opt.exclusive] = target.add_mutually_exclusive_group()
        target = groups[opt.group, opt.exclusive]
    return target


def _argument_kwargs(f: dataclasses.Field[Any], opt: Option) -> dict[str, Any]:
    """`argparse.ArgumentParser.add_argument`'s keywords for the field `f`."""
    kwargs: dict[str, Any] = {"help": opt.help}
    if opt.dest and not opt.positional:
        kwargs["dest"] = opt.dest
    if opt.action:
        kwargs["action"] = opt.action
    if opt.action not in ("store_true", "store_false"):
        for key in ("type", "choices", "metavar", "nargs"):
            if getattr(opt, key) is not None:
                kwargs[key] = getattr(opt, key)
    kwargs["default"] = _parser_default(f, opt)
    return kwargs


def _needed(f: dataclasses.Field[Any], opt: Option) -> bool:
    if opt.required is not None:
        return opt.required
    return f.default is MISSING and f.default_factory is MISSING


def required_keys(cls: type) -> list[str]:
    """The namespace keys (and config file keys) of the flags the command needs."""
    return [opt.key(f.name) for f, opt in _flat(cls) if _needed(f, opt)]


def _parser_default(f: dataclasses.Field[Any], opt: Option) -> Any:
    """What argparse holds for a flag not given: the field's default, but nothing for a flag the
    command needs (its field's default is for callers that build the settings themselves)."""
    if opt.parser_default is not _FIELD_DEFAULT:
        return opt.parser_default
    return None if opt.required else _field_default(f)


def missing_options(cls: type, args: argparse.Namespace) -> list[str]:
    """The flags of `cls` the command needs that were given neither on the command line nor in the
    config file, e.g. ``["--dump-dir", "--format"]``."""
    return [
        opt.flag_of(f.name) for f, opt in _flat(cls) if _needed(f, opt) and not getattr(args, opt.key(f.name), None)
    ]


def options_from(cls: type, args: object, **given: Any) -> Any:
    """The settings `cls` from the parsed flags (or another command's settings: a flag it lacks leaves
    the field at its default); `given` sets fields the command derived itself (and wins over a flag of
    the same field). A nested settings class not given is built from the flags alone."""
    values: dict[str, Any] = {}
    for f, opt in options_of(cls):
        if f.name in given or not f.init:
            continue
        if opt.nested is not None:
            values[f.name] = options_from(opt.nested, args)
            continue
        value = getattr(args, opt.key(f.name), None)
        if value is None:
            continue  # not given: the field's default
        values[f.name] = opt.convert(value) if opt.convert is not None else value
    return cls(**values, **given)
