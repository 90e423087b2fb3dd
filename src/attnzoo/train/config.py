"""Training configuration: a dataclass loaded from a YAML file or a preset, plus ``--key=value`` overrides.

Every key, type and choice is checked before anything is built; errors list the valid choices.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from attnzoo.train.optim import OPTIMIZERS
from attnzoo.train.schedules import SCHEDULES

__all__ = [
    "TrainConfig",
    "ConfigError",
    "ConfigTypeError",
    "load_config",
    "apply_overrides",
    "parse_overrides",
    "list_presets",
    "preset_path",
    "RESUME_MUTABLE_KEYS",
]


class ConfigError(ValueError):
    """A bad configuration: unknown key, invalid choice or value."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value of the wrong type."""


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved as ``config.yaml`` in the run directory)."""

    #: task name (``attnzoo presets`` / ``attnzoo.data.list_tasks()``) and its options
    task: str = "digits"
    task_options: dict = field(default_factory=dict)
    #: model name for ``attnzoo.create_model`` and overrides passed to it
    model: str = ""
    model_options: dict = field(default_factory=dict)
    #: shortcut for ``model_options.attention`` (any registered mechanism)
    attention: str | None = None
    description: str = ""

    steps: int = 1000
    #: global batch size (split evenly over the processes of a distributed run)
    batch_size: int = 64
    optimizer: Literal["adamw", "lion"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05
    beta1: float = 0.9
    beta2: float = 0.999
    schedule: Literal["cosine", "linear", "inverse_sqrt", "constant"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    #: max global gradient norm; 0 disables clipping
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    #: language models: pack each batch's windows into one row, cut at document starts (``--pack``; see
    #: :func:`attnzoo.data.tasks.pack_task`)
    pack: bool = False

    #: ``auto`` = bf16 autocast on CUDA (fp16 + loss scaling where bf16 is unsupported), off on CPU
    amp: Literal["auto", "off", "bf16", "fp16"] = "auto"
    compile: bool = False
    device: str = "auto"
    seed: int = 0

    eval_every: int = 200
    #: 0 evaluates on the whole validation set
    eval_batches: int = 0
    #: validation batches of the evaluations before the last step (a learning curve's cheaper points); 0: as
    #: ``eval_batches``. The last step's evaluation, the run's result, always uses ``eval_batches``.
    curve_eval_batches: int = 0
    eval_batch_size: int | None = None
    log_every: int = 10
    #: best-checkpoint selection: every ``select_every`` steps and at the last, score the task's selection split
    #: (``Task.select``, held out apart from ``val``) and keep the weights where ``select_metric`` was best
    #: (``best_model/``, ``final.json``'s ``best``, checkpointed so resume is exact); 0: off
    select_every: int = 0
    select_metric: str = "loss"
    select_mode: Literal["min", "max"] = "min"
    #: batches of the selection split per score; 0: all of it
    select_batches: int = 0
    ckpt_every: int = 500
    keep_checkpoints: int = 2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved_model_options(self) -> dict[str, Any]:
        opts = dict(self.model_options)
        if self.attention is not None:
            opts["attention"] = self.attention
        return opts

    def validate(self) -> "TrainConfig":
        """Check value ranges and choices (types are checked when the config is built)."""
        from attnzoo.data.tasks import list_tasks

        tasks = list_tasks()
        if self.task not in tasks:
            raise ConfigError(f"unknown task {self.task!r}; valid tasks: {sorted(tasks)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer={self.optimizer!r} is not supported; valid choices: {list(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r} is not supported; valid choices: {list(SCHEDULES)}")
        for k in ("steps", "batch_size", "eval_every", "log_every", "ckpt_every", "keep_checkpoints"):
            if getattr(self, k) < 1:
                raise ConfigError(f"{k} must be >= 1, got {getattr(self, k)}")
        for k in ("warmup_steps", "eval_batches", "curve_eval_batches", "select_every", "select_batches"):
            if getattr(self, k) < 0:
                raise ConfigError(f"{k} must be >= 0, got {getattr(self, k)}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise ConfigError("grad_clip and weight_decay must be >= 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError(f"beta1 and beta2 must lie in [0, 1), got {self.beta1}, {self.beta2}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing}")
        if self.pack:
            from attnzoo.data.tasks import task_kind

            if task_kind(self.task) != "causal_lm":
                raise ConfigError(
                    f"pack=True packs language-model documents; task {self.task!r} is a {task_kind(self.task)} task "
                    "(valid: a causal_lm task such as shakespeare_char or char_lm, or pack=False)"
                )
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise ConfigError(f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if not self.model:
            raise ConfigError(
                "no model given: set model: NAME in the config or pass --model=NAME (attnzoo models lists them)"
            )
        return self


#: keys that may change when a run is resumed (they don't change the computation of past steps)
RESUME_MUTABLE_KEYS = (
    "steps",
    "eval_every",
    "curve_eval_batches",
    "log_every",
    "ckpt_every",
    "keep_checkpoints",
    "description",
)

_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def _type_name(hint) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    args = typing.get_args(hint)
    if args:
        return " or ".join(_type_name(a) for a in args)
    return "null" if hint is type(None) else hint.__name__


def _coerce(key: str, value: Any, hint) -> Any:
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not supported; valid choices: {list(choices)}")
        return value
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for h in typing.get_args(hint):
            try:
                return _coerce(key, value, h)
            except ConfigError:
                pass
        raise ConfigTypeError(f"{key}={value!r} has type {type(value).__name__}; expected {_type_name(hint)}")
    if hint is type(None):
        if value is None:
            return None
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is dict:
        if isinstance(value, dict):
            return value
    raise ConfigTypeError(f"{key}={value!r} has type {type(value).__name__}; expected {_type_name(hint)}")


def _unknown_key(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(_FIELDS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}; valid keys: {sorted(_FIELDS)}")


def from_dict(d: dict[str, Any]) -> TrainConfig:
    """Build a config from a mapping, checking every key and type."""
    if not isinstance(d, dict):
        raise ConfigError(f"a config must be a mapping of keys to values, got {type(d).__name__}")
    kwargs = {}
    for k, v in d.items():
        if k not in _FIELDS:
            raise _unknown_key(k)
        kwargs[k] = _coerce(k, v, _HINTS[k])
    return TrainConfig(**kwargs)


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key (plain PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                break
            if dup:
                raise ConfigError(
                    f"duplicated key {key!r} (lines {seen[key] + 1} and {key_node.start_mark.line + 1}"
                    f"{' of ' + self.name if self.name and not self.name.startswith('<') else ''}): each key may "
                    f"appear once; delete one of them"
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path, text: str | None = None) -> Any:
    """Parse a YAML file safely: no duplicated keys, UTF-8 only, errors name the file and line."""
    name = str(path)
    if text is None:
        try:
            raw = Path(path).read_bytes() if not hasattr(path, "read_bytes") else path.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read config file {name}: {e.strerror or e}") from e
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"config file {name} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                f"save it as UTF-8"
            ) from e
    loader = _UniqueKeyLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    except ConfigError:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {name} is not valid YAML{where}: {problem}") from e
    finally:
        loader.dispose()


def _presets_dir():
    return resources.files("attnzoo.train") / "presets"


def list_presets() -> dict[str, str]:
    """``{preset name: description}`` for the YAML presets shipped in ``attnzoo/train/presets``."""
    out = {}
    for f in sorted(_presets_dir().iterdir(), key=lambda p: p.name):
        if f.name.endswith(".yaml"):
            data = read_yaml(f) or {}
            out[f.name[: -len(".yaml")]] = data.get("description", "")
    return out


def preset_path(name: str):
    f = _presets_dir() / f"{name}.yaml"
    if not f.is_file():
        raise ConfigError(f"unknown preset {name!r} (and no such YAML file); valid presets: {sorted(list_presets())}")
    return f


def load_config(source: str | Path | dict | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Config from a YAML path, a preset name, a dict or ``None`` (defaults), then ``overrides`` (dotted keys)."""
    if source is None:
        base: dict[str, Any] = {}
    elif isinstance(source, dict):
        base = copy.deepcopy(source)
    else:
        s = str(source)
        p = Path(s)
        if p.suffix in (".yaml", ".yml") or "/" in s:
            if not p.is_file():
                raise ConfigError(f"config file {p} does not exist" + (" (it is a directory)" if p.is_dir() else ""))
            base = read_yaml(p)
        else:
            base = read_yaml(preset_path(s))
        if base is None:
            base = {}
        if not isinstance(base, dict):
            raise ConfigError(f"config {s} must be a YAML mapping of keys to values, got a {type(base).__name__}")
    cfg = from_dict(base)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    return cfg


def apply_overrides(cfg: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """Apply ``{"lr": 0.1, "model_options.attention": "tssa", ...}``; dotted keys address option dicts."""
    d = cfg.to_dict()
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if head not in _FIELDS:
            raise _unknown_key(head)
        if rest:
            if _HINTS[head] is not dict:
                raise ConfigError(
                    f"{head!r} is not an options mapping; dotted keys work on: "
                    f"{[k for k in _FIELDS if _HINTS[k] is dict]}"
                )
            d[head] = {**d[head], rest: value}
        else:
            d[head] = value
    return from_dict(d)


def _takes_text(key: str) -> bool:
    """Whether top-level field ``key`` holds words (a ``str`` or a ``Literal`` of strings), not a boolean."""
    hint = _HINTS.get(key)
    if hint is str:
        return True
    return typing.get_origin(hint) is Literal and all(isinstance(a, str) for a in typing.get_args(hint))


def parse_overrides(args: list[str], bool_keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``["--lr=1e-3", "--steps", "10", "--compile"]`` -> ``{"lr": 0.001, "steps": 10, "compile": True}``.

    Values are parsed as YAML scalars (numbers, booleans, null, lists); a bare ``--flag`` is ``True``.
    """
    bool_keys = bool_keys if bool_keys is not None else tuple(k for k, h in _HINTS.items() if h is bool)
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"unexpected argument {a!r}: overrides are written --key=value")
        key, eq, raw = a[2:].partition("=")
        if not eq:
            if key in bool_keys and (i + 1 >= len(args) or args[i + 1].startswith("--")):
                raw = "true"
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
                raw = args[i]
            else:
                raise ConfigError(f"override --{key} has no value; write --{key}=VALUE")
        key = key.replace("-", "_")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, bool) and _takes_text(key):
            # YAML 1.1 reads off/on/yes/no as booleans; a field of words (e.g. amp: "off") means the word
            value = raw
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in ".eE") and value.strip() else value
            except ValueError:
                pass
        out[key] = value
        i += 1
    return out
