"""Options declared once: a tool's options dataclass is the single source of its API keywords, flags and help.

A tool declares each setting once, as a dataclass field made with :func:`option`; the flag spellings, choices
and help text live in the field's metadata::

    @dataclass
    class Int4Options(ToolOptions):
        TITLE = "INT4 options"  # the argparse group's title

        block_size: int = option(128, flags=("-b", "--block_size"), help="Weights per scale.")
        method: str = option("rtn", choices=("rtn", "awq", "gptq"), help="Algorithm.")
        nodes_to_exclude: Sequence[str] | None = option(None, flags=("-ne",), nargs="*", help="Regexes...")
        custom_rule: Any = option(None, api_only=True, help="A callable on onnx_ir.Node (API only).")

A field's flag is ``--<field name>`` (``--method`` above), or ``--no_<field name>`` for a bool that defaults to
True; ``flags`` is given only where the spelling differs (a short form, ModelOpt's or ONNX Runtime's name).
From that one declaration:

- :func:`add_arguments` adds one argparse group per class, one flag per field (``api_only`` fields get none);
- :func:`from_args` builds the options from parsed arguments. Every flag defaults to None in argparse and None
  means "not given": the dataclass default applies (as in Polygraphy), so defaults are written only once;
- :func:`args_doc` renders the ``Args:`` lines of an API docstring and :func:`signature_mismatches` checks a
  function (e.g. a ModelOpt-compatible signature) against the fields: same names, defaults and docs.

Flag types come from ``type=``, else from a scalar annotation (``int``, ``float``, ``str``, with or without
``| None``), else ``str``. A ``bool`` field's flag sets the opposite of its default (``--keep_io_types`` sets
True; ``--no_validate`` on a field defaulting to True sets False). ``nargs`` fields are stored as tuples; a
single string given to one through the API is taken as a one-item tuple.

Options shared by several tools are declared once in :mod:`onnxprec._arg_groups`.

This module is in the base layer: every tool's ``_options`` and ``_api`` import it, so it imports nothing from
onnxprec (but its errors, when one is raised) and nothing heavy.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import logging
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

__all__ = [
    "DEPRECATED_KEY",
    "ArgGroup",
    "OptionSpec",
    "ToolOptions",
    "add_arguments",
    "args_doc",
    "check_op_types",
    "check_patterns",
    "compile_patterns",
    "customize",
    "deprecated_alias",
    "fields_in",
    "first_match",
    "from_args",
    "log_level_during",
    "option",
    "option_fields",
    "options_from_call",
    "options_or_keywords",
    "parse_args_doc",
    "signature_mismatches",
]

_METADATA_KEY = "onnxprec.option"
_SCALAR_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}

T = TypeVar("T", bound="ToolOptions")


class OptionSpec(NamedTuple):
    """How one field appears on the command line and in docs (stored in the field's metadata).

    Attributes:
        help: The flag's help text (one or two sentences, no default: it is appended automatically).
        flags: The flag spellings, e.g. ``("-t", "--low_precision_type")``; empty for API-only fields and, until
            :func:`option_fields` reads the field, for a field whose flag is ``--<field name>`` (``--no_<field name>``
            for a bool that defaults to True).
        api_only: The field has no flag (e.g. a callable).
        choices: Allowed values of the flag.
        nargs: ``"*"`` or ``"+"`` for list flags (stored as tuples).
        type: Converts the flag's text; default from the annotation (int, float, str), else str.
        metavar: The value's name in ``--help``.
        doc: The API docstring text when it differs from ``help`` (e.g. it accepts more than text).
        group: Title of the argparse group when not the class's ``TITLE`` (e.g. "onnxprec extras").
    """

    help: str
    flags: tuple[str, ...] = ()
    api_only: bool = False
    choices: tuple[Any, ...] | None = None
    nargs: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    doc: str | None = None
    group: str | None = None

    @property
    def api_doc(self) -> str:
        """The text of this field in an API docstring's ``Args:``."""
        return self.doc if self.doc is not None else self.help


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    flags: Iterable[str] | None = None,
    api_only: bool = False,
    choices: Iterable[Any] | None = None,
    nargs: str | None = None,
    type: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    doc: str | None = None,
    group: str | None = None,
) -> Any:
    """Declares one option: a dataclass field whose metadata says how it appears as a flag and in docs.

    Args:
        default: The default (API and command line). Omit it for a required option (a required flag).
        help: What the option does, one or two sentences; the default is appended to the flag's help.
        flags: The flag spellings, when not ``--<field name>`` (``--no_<field name>`` for a bool defaulting to True).
        api_only: The option has no flag (a callable, an in-memory object...).
        choices: Allowed values.
        nargs: ``"*"`` or ``"+"`` for list options.
        type: Converts the flag's text (default: from the annotation, else str).
        metavar: The value's name in ``--help``.
        doc: API docstring text when it differs from ``help``.
        group: Title of the argparse group, when not the options class's ``TITLE``.

    Returns:
        A ``dataclasses.field`` (typed Any so that ``name: T = option(...)`` type-checks).

    Raises:
        TypeError: ``flags`` is empty, or given with ``api_only``, or the help text is empty.
    """
    flag_tuple = tuple(flags) if flags is not None else ()
    if flags is not None and (api_only or not flag_tuple):
        raise TypeError(
            "option() takes flags=(...) (at least one) for a flag other than --<field name>, or api_only=True for "
            "an option without a flag, not both."
        )
    if not help.strip():
        raise TypeError("option() needs a help text: every option is documented.")
    if nargs not in (None, "*", "+"):
        raise TypeError(f"option(nargs={nargs!r}) is not supported: use '*', '+' or None.")
    spec = OptionSpec(
        help=help,
        flags=flag_tuple,
        api_only=api_only,
        choices=tuple(choices) if choices is not None else None,
        nargs=nargs,
        type=type,
        metavar=metavar,
        doc=doc,
        group=group,
    )
    metadata = {_METADATA_KEY: spec}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, (list, dict, set)):
        raise TypeError(f"option() default {default!r} is mutable: use a tuple or None.")
    return dataclasses.field(default=default, metadata=metadata)


class ToolOptions:
    """Base of a tool's options dataclasses (decorate subclasses with ``@dataclass``).

    ``TITLE`` is the argparse group's title. ``__post_init__`` stores every ``nargs`` field as a tuple;
    a subclass that defines its own ``__post_init__`` calls ``super().__post_init__()`` first.
    """

    TITLE: ClassVar[str] = "options"

    def __post_init__(self) -> None:
        for f, spec in option_fields(type(self)):
            if spec.nargs is None:
                continue
            value = getattr(self, f.name)
            if isinstance(value, str):
                setattr(self, f.name, (value,))
            elif value is not None and not isinstance(value, tuple):
                setattr(self, f.name, tuple(value))


def option_fields(cls: type) -> list[tuple[dataclasses.Field[Any], OptionSpec]]:
    """The fields of an options dataclass with their specs, in declaration order.

    A spec's ``flags`` are filled in here where the declaration left them out: ``--<field name>``, or
    ``--no_<field name>`` for a bool that defaults to True (the flag turns it off).

    Raises:
        TypeError: ``cls`` is not a dataclass, or one of its init fields was not declared with :func:`option`.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass: decorate it with @dataclasses.dataclass.")
    result = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        spec = f.metadata.get(_METADATA_KEY)
        if not isinstance(spec, OptionSpec):
            raise TypeError(
                f"{cls.__name__}.{f.name} has no help or flags: declare it with onnxprec._options.option()."
            )
        if not spec.flags and not spec.api_only:
            off = _is_bool(f) and _default(f) is True
            spec = spec._replace(flags=(f"--no_{f.name}" if off else f"--{f.name}",))
        result.append((f, spec))
    return result


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _flag_type(f: dataclasses.Field[Any], spec: OptionSpec) -> Callable[[str], Any]:
    if spec.type is not None:
        return spec.type
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    annotation = re.sub(r"\s*\|\s*None$", "", annotation.strip())
    return _SCALAR_TYPES.get(annotation, str)


def _is_bool(f: dataclasses.Field[Any]) -> bool:
    return f.type in ("bool", bool)


def _show_default(value: Any) -> str | None:
    if value is None or value is False or value is True or value == () or value is dataclasses.MISSING:
        return None
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def _flag_help(f: dataclasses.Field[Any], spec: OptionSpec) -> str:
    shown = _show_default(_default(f))
    if shown is None or "default:" in spec.help:
        return spec.help
    if spec.help.endswith(")."):  # "... (inf: no reference run)." -> "... (inf: no reference run; default: 512)."
        return f"{spec.help[:-2]}; default: {shown})."
    return f"{spec.help.rstrip('.')} (default: {shown})."


@dataclasses.dataclass(frozen=True)
class ArgGroup:
    """An options class as one tool's command line shows it: some fields respelled or redescribed, some left out.

    Made by :func:`customize`; :func:`add_arguments` takes it wherever it takes a class, and :func:`from_args`
    reads it back with the class itself (a left-out field keeps its default).
    """

    cls: type
    specs: tuple[tuple[dataclasses.Field[Any], OptionSpec], ...]
    title: str | None = None


def customize(
    cls: type, *, omit: Iterable[str] = (), title: str | None = None, **changes: Mapping[str, Any]
) -> ArgGroup:
    """A shared options class with a tool's own spellings: ``customize(FileArgs, onnx_path={"flags": ("--input",)})``.

    Args:
        cls: An options dataclass.
        omit: Fields that get no flag in this tool.
        title: The argparse group's title, when not the class's ``TITLE``.
        **changes: Per field, the :class:`OptionSpec` attributes to replace (flags, help, metavar...).

    Returns:
        The group to pass to :func:`add_arguments`.

    Raises:
        TypeError: A name in ``changes`` or ``omit`` is not a field of ``cls``.
    """
    fields = option_fields(cls)
    unknown = (set(changes) | set(omit)) - {f.name for f, _ in fields}
    if unknown:
        raise TypeError(f"customize(): {sorted(unknown)} are not fields of {cls.__name__}.")
    skipped = set(omit)
    specs = tuple((f, spec._replace(**changes.get(f.name, {}))) for f, spec in fields if f.name not in skipped)
    return ArgGroup(cls, specs, title)


def add_arguments(parser: argparse.ArgumentParser, *classes: type | ArgGroup) -> None:
    """Adds the flags of options classes to ``parser``, one argument group per title.

    Groups are created in the order their titles first appear, so fields of several classes that name the
    same ``group`` (e.g. "onnxprec extras") share it. Every flag defaults to None (= the dataclass default).

    Args:
        parser: The parser (or subparser) of a tool.
        *classes: Options dataclasses whose fields were declared with :func:`option`, or shared ones as a
            tool spells them (:func:`customize`).
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    for item in classes:
        if isinstance(item, ArgGroup):
            cls, fields, class_title = item.cls, list(item.specs), item.title
        else:
            cls, fields, class_title = item, option_fields(item), None
        for f, spec in fields:
            if spec.api_only:
                continue
            title = spec.group or class_title or str(getattr(cls, "TITLE", ToolOptions.TITLE))
            group = groups.get(title)
            if group is None:
                group = groups[title] = parser.add_argument_group(title)
            kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": _flag_help(f, spec)}
            if _is_bool(f):
                kwargs["action"] = "store_false" if _default(f) is True else "store_true"
            else:
                kwargs["type"] = _flag_type(f, spec)
                if spec.nargs is not None:
                    kwargs["nargs"] = spec.nargs
                if spec.choices is not None:
                    kwargs["choices"] = spec.choices
                if spec.metavar is not None:
                    kwargs["metavar"] = spec.metavar
                if _default(f) is dataclasses.MISSING:
                    kwargs["required"] = True
            group.add_argument(*spec.flags, **kwargs)


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Builds ``cls`` from parsed arguments: flags not given (None) keep the dataclass default.

    Args:
        cls: An options dataclass whose flags were added with :func:`add_arguments`.
        args: The parsed arguments.

    Returns:
        The options, validated by the class's ``__post_init__``.
    """
    kwargs: dict[str, Any] = {}
    for f, spec in option_fields(cls):
        if spec.api_only:
            continue
        value = getattr(args, f.name, None)
        if value is not None:
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


def fields_in(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The items of ``values`` that are fields of ``cls``: ``cls(**fields_in(cls, locals()))`` in a wrapper."""
    names = {f.name for f, _ in option_fields(cls)}
    return {name: value for name, value in values.items() if name in names}


def options_from_call(cls: type[T], params: Mapping[str, Any], kwargs: Mapping[str, Any], what: str) -> T:
    """A tool's options from an API call: its named parameters plus ``**kwargs``, an unknown keyword refused.

    Args:
        cls: The options dataclass.
        params: The call's parameters that are fields (:func:`fields_in` of ``locals()``).
        kwargs: The other keywords; each must be a field of ``cls``.
        what: The tool as the error names it, e.g. ``"INT4"``.

    Raises:
        InvalidArgumentError: An unknown keyword (with the closest field's name), or an invalid value.
    """
    import difflib

    from onnxprec.errors import InvalidArgumentError

    known = {f.name for f, _ in option_fields(cls)}
    for name in kwargs:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise InvalidArgumentError(f"Unknown {what} option '{name}'.{hint}")
    return cls(**{**params, **kwargs})


def options_or_keywords(
    cls: type[T], options: T | None, kwargs: Mapping[str, Any], *, what: str, function: str,
    params: Mapping[str, Any] = {},
) -> T:  # fmt: skip
    """The options of an API call that takes them as one object or as keywords: ``options`` as given, or made from
    the call's ``params`` and keywords (:func:`options_from_call`), not both.

    Args:
        cls: The options dataclass.
        options: The settings as one object, or None.
        kwargs: The call's other keywords.
        what: The tool as the error names it, e.g. ``"INT4"``.
        function: The function as the error names it, e.g. ``"quantize_file"``.
        params: The call's parameters that are fields.

    Raises:
        InvalidArgumentError: Both were given, an unknown keyword (with the closest field's name), or a bad value.
    """
    if options is None:
        return options_from_call(cls, params, kwargs, what)
    if kwargs:
        from onnxprec.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{function} got both options= and {', '.join(sorted(kwargs))}=: pass the settings one way, "
            "e.g. dataclasses.replace(options, ...)."
        )
    return options


@contextlib.contextmanager
def log_level_during(level: str) -> Iterator[None]:
    """Sets the ``onnxprec`` logger's level for an API call (ModelOpt's ``log_level``); handlers are the caller's."""
    root = logging.getLogger("onnxprec")
    old = root.level
    root.setLevel(getattr(logging, level))
    try:
        yield
    finally:
        root.setLevel(old)


def args_doc(cls: type, names: Iterable[str] | None = None, *, indent: int = 8, width: int = 120) -> str:
    """Renders the ``Args:`` lines of a Google-style docstring from the fields' docs.

    Args:
        cls: An options dataclass.
        names: The fields to render, in this order (default: all, in declaration order).
        indent: Indentation of each ``name:`` line (8 inside a function's docstring).
        width: Line length to wrap to.

    Returns:
        The lines, to paste under ``Args:`` (continuation lines are indented 4 more).
    """
    import textwrap

    specs = {f.name: spec for f, spec in option_fields(cls)}
    lines = []
    for name in names if names is not None else specs:
        text = f"{name}: {specs[name].api_doc}"
        lines += textwrap.wrap(
            text, width=width, initial_indent=" " * indent, subsequent_indent=" " * (indent + 4), break_on_hyphens=False
        )
    return "\n".join(lines)


def parse_args_doc(docstring: str | None) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring as ``{name: text}`` (whitespace normalized)."""
    result: dict[str, str] = {}
    lines = inspect.cleandoc(docstring or "").splitlines()
    try:
        start = lines.index("Args:") + 1
    except ValueError:
        return result
    current: str | None = None
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break  # the next section (Returns:, Raises:...)
        m = re.match(r"^ {4}(\*{0,2}\w+)(?: \([^)]*\))?: ?(.*)$", line)
        if m:
            current = m.group(1)
            result[current] = m.group(2).strip()
        elif current is not None and line.strip():
            result[current] = f"{result[current]} {line.strip()}"
    return result


def signature_mismatches(function: Callable[..., Any], cls: type, *, skip: Iterable[str] = ()) -> list[str]:
    """Where a function's parameters disagree with an options class (empty when they agree).

    Checks that every parameter (except ``skip``) is a field of ``cls`` with the same default, and that the
    function's docstring documents it with the field's doc text, word for word.

    Args:
        function: A function that forwards its parameters to ``cls`` (e.g. a ModelOpt-compatible wrapper).
        cls: The options dataclass.
        skip: Parameters that are not options (e.g. the input model).

    Returns:
        One line per problem, saying how to fix it.
    """
    problems = []
    specs = {f.name: (f, spec) for f, spec in option_fields(cls)}
    documented = parse_args_doc(function.__doc__)
    skipped = set(skip)
    for name, param in inspect.signature(function).parameters.items():
        if name in skipped or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in specs:
            problems.append(f"parameter '{name}' of {function.__name__} is not a field of {cls.__name__}: add it.")
            continue
        f, spec = specs[name]
        default = _default(f)
        if param.default is inspect.Parameter.empty or param.default != default:
            problems.append(
                f"parameter '{name}' of {function.__name__} defaults to {param.default!r} but "
                f"{cls.__name__}.{name} to {default!r}: make them equal."
            )
        want = " ".join(spec.api_doc.split())
        if documented.get(name) != want:
            problems.append(
                f"the docstring of {function.__name__} documents '{name}' as {documented.get(name)!r}; "
                f"write the field's doc instead: {want!r}."
            )
    return problems


def compile_patterns(patterns: Iterable[str] | None, what: str) -> list[re.Pattern[str]]:
    """Compiles the regexes of an option (``nodes_to_exclude``...); a bad one is an error that names the option.

    Raises:
        InvalidArgumentError: A pattern is not a valid regular expression.
    """
    from onnxprec.errors import InvalidArgumentError

    compiled = []
    for pattern in patterns or ():
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise InvalidArgumentError(f"Invalid regular expression '{pattern}' in {what}: {e}.") from e
    return compiled


def first_match(patterns: Iterable[re.Pattern[str]], names: Iterable[str]) -> str | None:
    """The first of ``patterns`` that matches one of ``names`` by the rule every tool follows (``re.match``, from
    the start of a name, as ModelOpt: :data:`onnxprec._arg_groups.MATCH_RULE`), or None."""
    names = [name for name in names if name]
    return next((p.pattern for p in patterns if any(p.match(name) for name in names)), None)


def _few(names: Sequence[str], count: int = 3) -> str:
    shown = ", ".join(f"'{name}'" for name in names[:count])
    return shown + (f" and {len(names) - count} more" if len(names) > count else "")


def check_patterns(
    patterns: Sequence[re.Pattern[str]],
    what: str,
    names: Collection[str],
    others: Mapping[str, str] | None = None,
    selected: str = "node",
    nodes: Collection[str] | None = None,
) -> list[str]:
    """Warns about each pattern of the option ``what`` that matches (``re.match``) none of ``names``, or fewer of them
    than ``re.search`` does (the rule INT4 and INT8 had before): a pattern that selects nothing is a mistake the
    user cannot see in the output.

    Args:
        patterns: The option's compiled patterns.
        what: The option, e.g. ``"nodes_to_exclude"``.
        names: What the tool matches the patterns against (node names, and output or weight names where it does).
        others: Name -> op type of the model's other nodes, which the tool does not select: a pattern that matches
            only those is said to (compare's advice naming a Transpose before a Conv, say).
        selected: What ``names`` name, e.g. ``"layer INT8 quantizes (Conv, MatMul, Gemm)"``.
        nodes: The node names among ``names``, of which a warning names the closest (default: all of ``names``).

    Returns:
        The warnings, one per such pattern (each also logged).
    """
    import difflib

    ordered = sorted(names)
    warnings = []
    for pattern in patterns:
        matched = [name for name in ordered if pattern.match(name)]
        searched = [name for name in ordered if pattern.search(name)]
        text = f"{what} pattern '{pattern.pattern}'"
        if matched and len(searched) == len(matched):
            continue
        if matched:
            text += (
                f" matches {len(matched)} names from their start (re.match), {len(searched)} anywhere (re.search, "
                f"INT4 and INT8's rule before): not {_few([n for n in searched if n not in matched])}; write "
                f"'.*{pattern.pattern}' to match inside names"
            )
        elif searched:
            text += (
                f" matches no {selected} (names match from their start: re.match, as ModelOpt); anywhere in a name "
                f"(re.search, INT4 and INT8's rule before) it would match {_few(searched)}: write '.*{pattern.pattern}'"
            )
        else:
            other = sorted(name for name in (others or {}) if pattern.match(name))
            text += f" matches no {selected}"
            if other:
                ops = sorted({(others or {})[name] for name in other})
                text += f"; it matches {_few(other)} ({', '.join(ops)}), which this tool does not select"
            bare = re.sub(r"[\\^$]|\.\*", "", pattern.pattern)
            close = difflib.get_close_matches(bare, sorted(nodes) if nodes is not None else ordered, n=3, cutoff=0.0)
            text += f"; closest: {_few(close)}" if close else ""
        warnings.append(text)
        logging.getLogger(__name__).warning("%s.", text)
    return warnings


def check_op_types(op_types: Iterable[str] | None, what: str, present: Collection[str]) -> list[str]:
    """Warns about each op type of the option ``what`` that no node of the model has (``present``: its op types),
    naming the closest it has.

    Returns:
        The warnings (each also logged).
    """
    import difflib

    warnings = []
    for op in op_types or ():
        if op not in present:
            close = difflib.get_close_matches(op, sorted(present), n=3, cutoff=0.0)
            warnings.append(f"{what} op type '{op}' matches no node of the model" + (
                f"; closest: {_few(close)}" if close else ""))  # fmt: skip
            logging.getLogger(__name__).warning("%s.", warnings[-1])
    return warnings


DEPRECATED_KEY = "_onnxprec_deprecated"
"""The attribute of parsed arguments that lists ``(old, new)`` for each deprecated spelling given."""


class _DeprecatedAlias(argparse.Action):
    """Stores the value as the new flag would, and records the old spelling for a one-line warning."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        if getattr(namespace, DEPRECATED_KEY, None) is None:
            setattr(namespace, DEPRECATED_KEY, [])
        getattr(namespace, DEPRECATED_KEY).append((option_string, self.new))


def deprecated_alias(parser: argparse.ArgumentParser, flag: str, dest: str, new: str) -> None:
    """Accepts ``flag`` as a hidden alias of ``new`` (stored in ``dest``), kept for one release.

    The command line warns once, in one line, for each old spelling given (:data:`DEPRECATED_KEY`).

    Args:
        parser: The tool's parser, after :func:`add_arguments`.
        flag: The old spelling, e.g. ``--json``.
        dest: The field it sets, e.g. ``report_json``.
        new: The spelling to use instead, e.g. ``--report_json``.
    """
    parser.add_argument(
        flag, dest=dest, default=None, metavar="PATH", help=argparse.SUPPRESS, action=_DeprecatedAlias, new=new
    )
