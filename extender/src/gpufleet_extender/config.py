"""Settings of the extender: one pydantic-settings class, read from a file and the environment.

Sources, highest priority first:

1. environment variables (``GPU_UTIL_THRESHOLD=0.7``), names as in the table of README.md;
2. the ``--config`` file (YAML or JSON mapping with the same keys, any case);
3. the defaults below.

``load_settings()`` turns every problem (unreadable file, unknown key, bad value) into one
``SettingsError`` whose message lists what is wrong; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import json
import math
import os
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from gpufleet_extender.scoring import Strategy as ScoringStrategy  # spread | pack | auto, described there

# The CLI hands ``--config`` to get_settings() through this variable, so a worker started by uvicorn
# (or a test) sees the same file.
CONFIG_FILE_ENV = "GPUFLEET_EXTENDER_CONFIG"


class SettingsError(ValueError):
    """Settings cannot be used; the message is meant for a person."""


class MetricsSourceKind(StrEnum):
    PROMETHEUS = "prometheus"
    FILE = "file"


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


Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class Settings(BaseSettings):
    """Every tunable of the extender. Field names are the environment variable names."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="forbid", frozen=True)

    PROMETHEUS_URL: str = "http://127.0.0.1:9090"
    PROMETHEUS_TIMEOUT_SECONDS: float = Field(2.0, gt=0, le=60)
    # The dcgm series are read only from this scrape job and namespace (the labels Prometheus gives the exporter's
    # targets); empty: any. Pinned, an exporter that someone else runs (a tenant's, under its own job or in its own
    # namespace) cannot feed the extender. See docs/tenants.md for keeping those labels honest.
    EXPORTER_JOB: str = ""
    EXPORTER_NAMESPACE: str = ""
    GPU_UTIL_THRESHOLD: Annotated[float, Field(gt=0.0, le=1.0)] = 0.8
    MEM_UTIL_THRESHOLD: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    WEIGHT_GPU_UTIL: Fraction = 0.7
    WEIGHT_MEM_UTIL: Fraction = 0.3
    METRICS_SOURCE: MetricsSourceKind = MetricsSourceKind.PROMETHEUS
    METRICS_FILE: Path | None = None
    METRICS_REFRESH_SECONDS: float = Field(5.0, gt=0, le=3600)
    # 0 turns staleness off (a static METRICS_FILE stays valid for ever).
    METRICS_MAX_AGE_SECONDS: float = Field(30.0, ge=0)
    # Samples dated further ahead than this (some clock is wrong) are not trusted: the node counts as without metrics.
    METRICS_MAX_CLOCK_SKEW_SECONDS: float = Field(5.0, ge=0)
    ON_MISSING_METRICS: MissingMetricsPolicy = MissingMetricsPolicy.ALLOW
    # dcgm-exporter names the host label `Hostname` in released images and `hostname` in newer ones.
    NODE_NAME_LABELS: Annotated[tuple[str, ...], NoDecode] = ("Hostname", "hostname")
    MAX_BODY_BYTES: int = Field(4 * 1024 * 1024, ge=1024)
    # FailedNodes reasons end up in the pod's FailedScheduling event, which the pod's tenant reads: "generic" keeps
    # other pools' node names and loads out of it.
    FILTER_REASONS: FilterReasons = FilterReasons.DETAILED
    TENANT_LABEL: str = "gpufleet.io/tenant"
    TENANT_POOLS: bool = True
    KUBE_API: KubeApiMode = KubeApiMode.AUTO
    # An assumed (recently bound) pod stops counting after this long even if no sample covered it.
    INFLIGHT_MAX_SECONDS: float = Field(120.0, gt=0)
    SCORING_STRATEGY: ScoringStrategy = ScoringStrategy.SPREAD
    PACK_TARGET_UTIL: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.6
    # auto packs while the fleet's mean load of a resource is below AUTO_PACK_BELOW and spreads once it is above
    # AUTO_PACK_BELOW + AUTO_HYSTERESIS; in between it keeps its mode, so it does not flap at the boundary.
    AUTO_PACK_BELOW: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.4
    AUTO_HYSTERESIS: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1

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
            raise ValueError(f"must start with http:// or https:// (got {value!r})")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        total = self.WEIGHT_GPU_UTIL + self.WEIGHT_MEM_UTIL
        # The score is 10 x (1 - load); load stays in 0..1 only when the weights add up to 1.
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(
                f"WEIGHT_GPU_UTIL + WEIGHT_MEM_UTIL must be 1.0 (got {self.WEIGHT_GPU_UTIL} + "
                f"{self.WEIGHT_MEM_UTIL} = {total:g})"
            )
        if self.SCORING_STRATEGY is not ScoringStrategy.SPREAD:
            self._check_packing()
        if self.METRICS_SOURCE is MetricsSourceKind.FILE and self.METRICS_FILE is None:
            raise ValueError("METRICS_SOURCE=file needs METRICS_FILE (a Prometheus text exposition file)")
        return self

    def _check_packing(self) -> None:
        # Packing aims below the filter's threshold: a target at or above it would rank highest the nodes
        # the filter is about to refuse. Checked only when a packing strategy is on, so spread users who
        # lower GPU_UTIL_THRESHOLD are not refused over a setting they do not use.
        if self.PACK_TARGET_UTIL >= self.GPU_UTIL_THRESHOLD:
            raise ValueError(
                f"PACK_TARGET_UTIL ({self.PACK_TARGET_UTIL:g}) must be below GPU_UTIL_THRESHOLD "
                f"({self.GPU_UTIL_THRESHOLD:g}) with SCORING_STRATEGY={self.SCORING_STRATEGY}"
            )
        if self.SCORING_STRATEGY is ScoringStrategy.AUTO and self.AUTO_PACK_BELOW + self.AUTO_HYSTERESIS >= 1.0:
            raise ValueError(
                f"AUTO_PACK_BELOW + AUTO_HYSTERESIS must be below 1 (got {self.AUTO_PACK_BELOW:g} + "
                f"{self.AUTO_HYSTERESIS:g}): auto would never spread"
            )

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


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from an optional file plus the environment; raise SettingsError when invalid."""
    values = read_config_file(config_file) if config_file else {}
    values.update({key.upper(): value for key, value in overrides.items()})
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "settings"
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = "unknown setting"
            problems.append(f"  {where}: {message}")
        raise SettingsError("invalid extender settings:\n" + "\n".join(problems)) from None


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (file named by $GPUFLEET_EXTENDER_CONFIG plus env); tests build their own."""
    return load_settings(os.environ.get(CONFIG_FILE_ENV) or None)
