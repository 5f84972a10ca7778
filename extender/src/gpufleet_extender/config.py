"""Settings of the extender: one pydantic-settings class, read from a file and the environment.

Sources, highest priority first:

1. environment variables (``GPU_UTIL_THRESHOLD=0.7``), names as in the table of README.md;
2. the ``--config`` file (YAML or JSON mapping with the same keys, any case);
3. the defaults below.

``load_settings()`` turns every problem (unreadable file, unknown key, bad value, and the rules between
settings, such as the weights adding up to 1) into one ``SettingsError`` whose message lists all of them at once;
the CLI prints it and exits with code 2. ``check_settings()`` applies the same validation to a mapping alone,
without the environment: ``gpufleet-extender check-config`` is how the gpu_extender role checks the ConfigMap it is
about to deploy, so a value the pod would refuse fails the play with the pod's message.

The decision settings' defaults, ranges and choices are the settings contract's (``settings_contract.json``, which
GPUScore and the roles are checked against): written once, there.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from decimal import Decimal
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, get_args

import yaml
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from gpufleet_extender.errors import ExtenderError
from gpufleet_extender.scoring import Strategy as ScoringStrategy  # spread | pack | auto, described there
from gpufleet_extender.settings_contract import MIG_RESOURCE_PREFIX, REMOVED, WHOLE_GPU_RESOURCE
from gpufleet_extender.settings_contract import SETTINGS as _SETTINGS
from gpufleet_extender.settings_contract import bounds as _bounds
from gpufleet_extender.settings_contract import default as _default

# The CLI hands ``--config`` to get_settings() through this variable, so a worker started by uvicorn
# (or a test) sees the same file.
CONFIG_FILE_ENV = "GPUFLEET_EXTENDER_CONFIG"


class SettingsError(ExtenderError, ValueError):
    """Settings cannot be used; the message is meant for a person."""


def go_number(value: float) -> str:
    """A number as Go's %g writes it (the GPUScore plugin's messages say the same): the shortest digits that read
    back to the same double, in exponent form below 1e-4 and from 1e6 (0.5, 1, 1e-05, 1.5e+06, +Inf)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    _sign, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()  # repr: the shortest digits that read back
    assert isinstance(exponent, int)  # finite
    digits = "".join(map(str, digit_tuple)).lstrip("0")
    significant = digits.rstrip("0")
    point = len(significant) + exponent + len(digits) - len(significant)  # the decimal point, after `point` digits
    if -4 <= point - 1 < 6:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{significant}"
        if point >= len(significant):
            return sign + significant + "0" * (point - len(significant))
        return f"{sign}{significant[:point]}.{significant[point:]}"
    rest = f".{significant[1:]}" if len(significant) > 1 else ""
    return f"{sign}{significant[0]}{rest}e{'+' if point - 1 >= 0 else '-'}{abs(point - 1):02d}"


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """A string as Go's %q writes it (strconv.Quote): double quotes, backslash escapes, printable text as it is."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


class MetricsSourceKind(StrEnum):
    PROMETHEUS = "prometheus"  # queried every METRICS_REFRESH_SECONDS
    PUSH = "push"  # Prometheus' remote write to the receiver on REMOTE_WRITE_ADDRESS (remote_write.py)
    FILE = "file"  # the lab's exposition file; the extender's only, so not in the settings contract (LAB_ONLY_CHOICES)


# Values the extender takes beyond the settings contract's choices: the lab's, which GPUScore has no use for.
LAB_ONLY_CHOICES = {"METRICS_SOURCE": (MetricsSourceKind.FILE.value,)}


class MissingMetricsPolicy(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class FilterReasons(StrEnum):
    DETAILED = "detailed"  # node names, loads and pools in each reason (a single-tenant cluster, debugging)
    GENERIC = "generic"  # one sentence per outcome; the details go to the extender's log


class KubeApiMode(StrEnum):
    AUTO = "auto"  # in-cluster when running in a pod, else $KUBECONFIG or ~/.kube/config when present
    OFF = "off"
    IN_CLUSTER = "in-cluster"
    KUBECONFIG = "kubeconfig"


# Replicas per device of a time-sliced resource: 1 to this (the contract's range of SHARED_RESOURCES' values).
MAX_REPLICAS = int(_SETTINGS["SHARED_RESOURCES"].max or 0)


class Settings(BaseSettings):
    """Every tunable of the extender. Field names are the environment variable names."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="forbid", frozen=True)

    PROMETHEUS_URL: str = _default("PROMETHEUS_URL")
    PROMETHEUS_TIMEOUT_SECONDS: Annotated[float, _bounds("PROMETHEUS_TIMEOUT_SECONDS")] = _default(
        "PROMETHEUS_TIMEOUT_SECONDS"
    )
    # https: Prometheus' certificate is checked against this PEM CA bundle only (unset: the system's CAs). A
    # pinned CA keeps a Service that captures the address (spec.externalIPs) from answering with fake load.
    PROMETHEUS_CA_FILE: Path | None = _default("PROMETHEUS_CA_FILE")
    # Bearer token sent with every query, read from this file at each refresh (a rotated token is picked up).
    PROMETHEUS_TOKEN_FILE: Path | None = _default("PROMETHEUS_TOKEN_FILE")
    # The dcgm series are read only from this scrape job and namespace (the labels Prometheus gives the exporter's
    # targets); empty: any. Pinned, an exporter that someone else runs (a tenant's, under its own job or in its own
    # namespace) cannot feed the extender. See docs/tenants.md for keeping those labels honest.
    EXPORTER_JOB: str = _default("EXPORTER_JOB")
    EXPORTER_NAMESPACE: str = _default("EXPORTER_NAMESPACE")
    GPU_UTIL_THRESHOLD: Annotated[float, _bounds("GPU_UTIL_THRESHOLD")] = _default("GPU_UTIL_THRESHOLD")
    MEM_UTIL_THRESHOLD: Annotated[float, _bounds("MEM_UTIL_THRESHOLD")] = _default("MEM_UTIL_THRESHOLD")
    WEIGHT_GPU_UTIL: Annotated[float, _bounds("WEIGHT_GPU_UTIL")] = _default("WEIGHT_GPU_UTIL")
    WEIGHT_MEM_UTIL: Annotated[float, _bounds("WEIGHT_MEM_UTIL")] = _default("WEIGHT_MEM_UTIL")
    METRICS_SOURCE: MetricsSourceKind = MetricsSourceKind(_default("METRICS_SOURCE"))
    METRICS_FILE: Path | None = None
    # push: the remote-write receiver's own listener (host:port, no host: every interface), apart from the port
    # kube-scheduler calls; the bearer token senders must present (re-read when the file changes); https with the
    # certificate and key pair (neither: plain http).
    REMOTE_WRITE_ADDRESS: str = _default("REMOTE_WRITE_ADDRESS")
    REMOTE_WRITE_TOKEN_FILE: Path | None = _default("REMOTE_WRITE_TOKEN_FILE")
    REMOTE_WRITE_CERT_FILE: Path | None = _default("REMOTE_WRITE_CERT_FILE")
    REMOTE_WRITE_KEY_FILE: Path | None = _default("REMOTE_WRITE_KEY_FILE")
    METRICS_REFRESH_SECONDS: Annotated[float, _bounds("METRICS_REFRESH_SECONDS")] = _default("METRICS_REFRESH_SECONDS")
    # 0 turns staleness off (a static METRICS_FILE stays valid for ever).
    METRICS_MAX_AGE_SECONDS: Annotated[float, _bounds("METRICS_MAX_AGE_SECONDS")] = _default("METRICS_MAX_AGE_SECONDS")
    # Samples dated further ahead than this (some clock is wrong) are not trusted: the node counts as without metrics.
    METRICS_MAX_CLOCK_SKEW_SECONDS: Annotated[float, _bounds("METRICS_MAX_CLOCK_SKEW_SECONDS")] = _default(
        "METRICS_MAX_CLOCK_SKEW_SECONDS"
    )
    ON_MISSING_METRICS: MissingMetricsPolicy = MissingMetricsPolicy(_default("ON_MISSING_METRICS"))
    # dcgm-exporter names the host label `Hostname` in released images and `hostname` in newer ones.
    NODE_NAME_LABELS: Annotated[tuple[str, ...], NoDecode] = tuple(_default("NODE_NAME_LABELS"))
    MAX_BODY_BYTES: int = Field(4 * 1024 * 1024, ge=1024)
    # FailedNodes reasons end up in the pod's FailedScheduling event, which the pod's tenant reads: "generic" keeps
    # other pools' node names and loads out of it.
    FILTER_REASONS: FilterReasons = FilterReasons.DETAILED
    TENANT_LABEL: str = _default("TENANT_LABEL")
    TENANT_POOLS: bool = _default("TENANT_POOLS")
    KUBE_API: KubeApiMode = KubeApiMode.AUTO
    # An assumed (recently bound) pod stops counting after this long even if no sample covered it.
    INFLIGHT_MAX_SECONDS: Annotated[float, _bounds("INFLIGHT_MAX_SECONDS")] = _default("INFLIGHT_MAX_SECONDS")
    SCORING_STRATEGY: ScoringStrategy = ScoringStrategy(_default("SCORING_STRATEGY"))
    PACK_TARGET_UTIL: Annotated[float, _bounds("PACK_TARGET_UTIL")] = _default("PACK_TARGET_UTIL")
    # auto packs while the fleet's mean load of a resource is below AUTO_PACK_BELOW and spreads once it is above
    # AUTO_PACK_BELOW + AUTO_HYSTERESIS; in between it keeps its mode, so it does not flap at the boundary.
    AUTO_PACK_BELOW: Annotated[float, _bounds("AUTO_PACK_BELOW")] = _default("AUTO_PACK_BELOW")
    AUTO_HYSTERESIS: Annotated[float, _bounds("AUTO_HYSTERESIS")] = _default("AUTO_HYSTERESIS")
    # Time-sliced resources and their replicas per device, as the device plugin's sharing config says (JSON in
    # the environment: {"nvidia.com/mig-1g.10gb": 4}); the gpu_extender role renders it from the pools' sharing.
    SHARED_RESOURCES: dict[str, Annotated[int, Field(ge=1, le=MAX_REPLICAS)]] = Field(
        default_factory=lambda: _default("SHARED_RESOURCES")
    )
    # spread: how much the load of a node's other devices lowers an exclusive resource's score (0 = off).
    INTERFERENCE_WEIGHT: Annotated[float, _bounds("INTERFERENCE_WEIGHT")] = _default("INTERFERENCE_WEIGHT")
    # Time-sliced resources: the share of a device's memory (DCGM_FI_DEV_FB_FREE over FB_USED + FB_FREE) that must be
    # free on every device the device plugin may hand the pod, so that a new replica does not run out of memory
    # (0 = off).
    SHARED_MEM_FREE_MIN: Annotated[float, _bounds("SHARED_MEM_FREE_MIN")] = _default("SHARED_MEM_FREE_MIN")

    @field_validator("SHARED_RESOURCES", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        # The environment's JSON text, also where it comes as a plain value: a ConfigMap's data checked by
        # check-config, a config file that copies the environment's form.
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f'is not JSON ({exc.msg}); write it as {{"nvidia.com/mig-1g.10gb": 4}}') from None
        return value

    @field_validator("SHARED_RESOURCES")
    @classmethod
    def _gpu_resources(cls, value: dict[str, int]) -> dict[str, int]:
        wrong = sorted(
            name for name in value if name != WHOLE_GPU_RESOURCE and not name.startswith(MIG_RESOURCE_PREFIX)
        )
        if wrong:
            names = f"{WHOLE_GPU_RESOURCE} or {MIG_RESOURCE_PREFIX}<profile>"
            raise ValueError(f"names {names} resources, got {', '.join(wrong)}")
        return value

    @field_validator("NODE_NAME_LABELS", mode="before")
    @classmethod
    def _split_labels(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("NODE_NAME_LABELS")
    @classmethod
    def _labels_not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("needs at least one label name, e.g. Hostname,hostname")
        return value

    @field_validator("PROMETHEUS_URL")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https:// (got {go_quote(value)})")
        return value.rstrip("/")

    @field_validator("REMOTE_WRITE_ADDRESS")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        host_port(value)
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler: Callable[[Any], Settings]) -> Settings:
        """Field errors and the rules between settings, all in one ValidationError.

        Pydantic skips model rules once a field fails; here the rules still run over the fields that are valid, so
        a person fixing the file sees every problem in one go, not one per restart.
        """
        try:
            settings = handler(data)
        except ValidationError as exc:
            errors: list[Any] = [_rebuildable(e) for e in exc.errors()]
            bad = {str(e["loc"][0]) for e in errors if e["loc"]}
            rule_errors = [_rule_error(p) for p in rule_problems(valid_rule_fields(data, bad))]
            raise ValidationError.from_exception_data(exc.title, errors + rule_errors) from None
        problems = rule_problems(settings.model_dump())
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, [_rule_error(p) for p in problems])
        return settings

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The config file arrives as init kwargs; the environment must win over it.
        return env_settings, init_settings


# The rules between settings. Each names the fields it reads; it is checked whenever those fields are valid. `name`
# says a setting as the reader knows it: the extender's setting, or the GPUScore plugin's argument (plugin_args.py).
Name = Callable[[str], str]


def _setting_name(setting: str) -> str:
    return setting


def _weights_add_up(v: Mapping[str, Any], name: Name) -> str | None:
    total = v["WEIGHT_GPU_UTIL"] + v["WEIGHT_MEM_UTIL"]
    # The score is 10 x (1 - load); load stays in 0..1 only when the weights add up to 1.
    if math.isclose(total, 1.0, abs_tol=1e-6):
        return None
    gpu, mem = go_number(v["WEIGHT_GPU_UTIL"]), go_number(v["WEIGHT_MEM_UTIL"])
    return f"{name('WEIGHT_GPU_UTIL')} + {name('WEIGHT_MEM_UTIL')} must be 1.0 (got {gpu} + {mem} = {total:g})"


def _pack_below_threshold(v: Mapping[str, Any], name: Name) -> str | None:
    # Packing aims below the filter's threshold: a target at or above it would rank highest the nodes the filter is
    # about to refuse. Checked only when a packing strategy is on, so spread users who lower GPU_UTIL_THRESHOLD are
    # not refused over a setting they do not use.
    if v["SCORING_STRATEGY"] == ScoringStrategy.SPREAD or v["PACK_TARGET_UTIL"] < v["GPU_UTIL_THRESHOLD"]:
        return None
    return (
        f"{name('PACK_TARGET_UTIL')} ({go_number(v['PACK_TARGET_UTIL'])}) must be below {name('GPU_UTIL_THRESHOLD')} "
        f"({go_number(v['GPU_UTIL_THRESHOLD'])}) with {name('SCORING_STRATEGY')}={v['SCORING_STRATEGY']}"
    )


def _auto_can_spread(v: Mapping[str, Any], name: Name) -> str | None:
    if v["SCORING_STRATEGY"] != ScoringStrategy.AUTO or v["AUTO_PACK_BELOW"] + v["AUTO_HYSTERESIS"] < 1.0:
        return None
    return (
        f"{name('AUTO_PACK_BELOW')} + {name('AUTO_HYSTERESIS')} must be below 1 (got {go_number(v['AUTO_PACK_BELOW'])}"
        f" + {go_number(v['AUTO_HYSTERESIS'])}): auto would never spread"
    )


def _file_source_has_file(v: Mapping[str, Any], name: Name) -> str | None:
    if v["METRICS_SOURCE"] == MetricsSourceKind.FILE and v["METRICS_FILE"] is None:
        return f"{name('METRICS_SOURCE')}=file needs {name('METRICS_FILE')} (a Prometheus text exposition file)"
    return None


def _push_needs_token(v: Mapping[str, Any], name: Name) -> str | None:
    if v["METRICS_SOURCE"] == MetricsSourceKind.PUSH and v["REMOTE_WRITE_TOKEN_FILE"] is None:
        return (
            f"{name('METRICS_SOURCE')} push needs {name('REMOTE_WRITE_TOKEN_FILE')} (the bearer token remote-write "
            "senders must present)"
        )
    return None


def _tls_pair(v: Mapping[str, Any], name: Name) -> str | None:
    if (v["REMOTE_WRITE_CERT_FILE"] is None) == (v["REMOTE_WRITE_KEY_FILE"] is None):
        return None
    return (
        f"{name('REMOTE_WRITE_CERT_FILE')} and {name('REMOTE_WRITE_KEY_FILE')} go together (both for https, neither "
        "for http)"
    )


def host_port(address: str) -> tuple[str, int]:
    """REMOTE_WRITE_ADDRESS as (host, port): ``host:port``, ``[v6]:port`` or ``:port`` (host "": every interface).
    Raises ValueError with the same words as GPUScore's remoteWriteAddress check."""
    host, sep, port = address.rpartition(":")
    if not sep or (":" in host and not (host.startswith("[") and host.endswith("]"))):
        raise ValueError(f"must be host:port or :port (got {go_quote(address)})")
    host = host.removeprefix("[").removesuffix("]")
    if not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"port must be a number in [1, 65535] (got {go_quote(port)})")
    if any(char in host for char in "/ "):
        raise ValueError(f"host {go_quote(host)} is no host name or address")
    return host, int(port)


def _ca_needs_https(v: Mapping[str, Any], name: Name) -> str | None:
    if v["PROMETHEUS_CA_FILE"] is not None and not str(v["PROMETHEUS_URL"]).startswith("https://"):
        url = go_quote(v["PROMETHEUS_URL"])
        return f"{name('PROMETHEUS_CA_FILE')} needs an https:// {name('PROMETHEUS_URL')} (got {url})"
    return None


RULES: tuple[tuple[tuple[str, ...], Callable[[Mapping[str, Any], Name], str | None]], ...] = (
    (("WEIGHT_GPU_UTIL", "WEIGHT_MEM_UTIL"), _weights_add_up),
    (("SCORING_STRATEGY", "PACK_TARGET_UTIL", "GPU_UTIL_THRESHOLD"), _pack_below_threshold),
    (("SCORING_STRATEGY", "AUTO_PACK_BELOW", "AUTO_HYSTERESIS"), _auto_can_spread),
    (("METRICS_SOURCE", "METRICS_FILE"), _file_source_has_file),
    (("PROMETHEUS_URL", "PROMETHEUS_CA_FILE"), _ca_needs_https),
    (("METRICS_SOURCE", "REMOTE_WRITE_TOKEN_FILE"), _push_needs_token),
    (("REMOTE_WRITE_CERT_FILE", "REMOTE_WRITE_KEY_FILE"), _tls_pair),
)


def rule_problems(values: Mapping[str, Any], name: Name = _setting_name) -> list[str]:
    """The rules between settings that `values` (validated values by field name) break; rules missing a field are
    skipped (that field has an error of its own)."""
    problems = []
    for fields, rule in RULES:
        if all(field in values for field in fields):
            problem = rule(values, name)
            if problem:
                problems.append(problem)
    return problems


_CORE_ERROR_TYPES = frozenset(get_args(core_schema.ErrorType))


def _rebuildable(error: Any) -> Any:
    """An error ValidationError.from_exception_data can raise again: pydantic's own custom errors (a Path field given
    a number: path_type) are not core error types, so they go back as custom errors with their message."""
    if error["type"] in _CORE_ERROR_TYPES:
        return error
    return {"type": PydanticCustomError(error["type"], error["msg"]), "loc": error["loc"], "input": error["input"]}


def _rule_error(problem: str) -> InitErrorDetails:
    return {"type": PydanticCustomError("settings_rule", problem), "loc": (), "input": None}


def valid_rule_fields(data: Any, bad: set[str]) -> dict[str, Any]:
    """The fields the rules read that validate on their own (given, else their default), by name."""
    given = {str(k).upper(): v for k, v in data.items()} if isinstance(data, Mapping) else {}
    values: dict[str, Any] = {}
    for name in {field for fields, _rule in RULES for field in fields} - bad:
        info = Settings.model_fields[name]
        if name not in given:
            values[name] = info.get_default(call_default_factory=True)
            continue
        try:
            values[name] = TypeAdapter(info.rebuild_annotation()).validate_python(given[name])
        except ValidationError:
            continue
    return values


class MappingOnlySettings(Settings):
    """Settings from the given mapping alone, no environment: a ConfigMap checked before it is deployed, the
    conformance vectors (their output must not depend on the environment)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or JSON mapping of settings; keys are the environment variable names, any case."""
    file_path = Path(path)
    try:
        text = file_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read config file {file_path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if file_path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(
            f"config file {file_path} is not valid {file_path.suffix.lstrip('.') or 'YAML'}: {exc}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {file_path} must hold a mapping of settings, not {type(data).__name__}")
    return {str(key).upper(): value for key, value in data.items()}


def _settings_error(exc: ValidationError) -> SettingsError:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "settings"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            # A setting taken once gets what replaced it (the contract's "removed"), not "unknown setting".
            message = REMOVED[where.upper()][1] if where.upper() in REMOVED else "unknown setting"
        problems.append(f"  {where}: {message}")
    return SettingsError("invalid extender settings:\n" + "\n".join(problems))


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from an optional file plus the environment; raise SettingsError listing every problem."""
    values = read_config_file(config_file) if config_file else {}
    # The environment source reads the fields alone: a removed setting still exported must be refused all the same.
    values.update({key.upper(): value for key, value in os.environ.items() if key.upper() in REMOVED})
    values.update({key.upper(): value for key, value in overrides.items()})
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise _settings_error(exc) from None


def check_settings(values: Mapping[str, Any]) -> Settings:
    """Validate a mapping of settings alone, as the extender would at start with exactly these variables set.

    The environment of the caller is not read: this is the check of a ConfigMap before it is deployed.
    """
    try:
        return MappingOnlySettings(**{str(key).upper(): value for key, value in values.items()})
    except ValidationError as exc:
        raise _settings_error(exc) from None


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (file named by $GPUFLEET_EXTENDER_CONFIG plus env); tests build their own."""
    return load_settings(os.environ.get(CONFIG_FILE_ENV) or None)
