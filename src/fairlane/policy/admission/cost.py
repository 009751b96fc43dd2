"""What a job is expected to cost: estimates, work units, learned costs, reservations.

The sections Cost, Learned cost, Reservation and Charge in cost mode of the admission
contract (``docs/contracts/admission.md``): an :class:`Estimate` priced in units by
:class:`Coefficients`; the :class:`LearnedCost` of one (tenant, workflow, model), quick
to rise and slow to fall; the reservation ``max(declared, learned) *
safety_multiplier`` and its bound (:func:`too_wide`); and the charge in a tenant's fair
share when tenants are charged by cost (:func:`charge_milli`).
The store's twins are ``learn_costs`` and ``charge_mu`` in ``lua/admission.lua``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from fairlane.policy.admission.units import check_count, check_number

__all__ = [
    "MAX_TOKENS",
    "MAX_TOOL_CALLS",
    "MAX_TOOL_SECONDS",
    "MIN_CHARGE_MILLI",
    "Coefficients",
    "Estimate",
    "EstimationSettings",
    "LearnedCost",
    "charge_milli",
    "reservation_units",
    "too_wide",
    "work_units",
]

MAX_TOKENS = 10**9
MAX_TOOL_CALLS = 10**6
MAX_TOOL_SECONDS = 10**7


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Units per 1k tokens, per tool call and per tool second; per-model token multipliers."""

    per_1k_tokens: float = 1.0
    per_tool_call: float = 0.25
    per_tool_second: float = 0.1
    models: Mapping[str, float] = field(default_factory=dict)
    """A model's multiplier on the token part; a model not listed multiplies by 1."""

    def __post_init__(self) -> None:
        for label in ("per_1k_tokens", "per_tool_call", "per_tool_second"):
            check_number(label, getattr(self, label))
        if not isinstance(self.models, Mapping):
            raise TypeError(
                f"models must be a mapping of model name to multiplier: {self.models!r}"
            )
        for name, multiplier in self.models.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"model names must be non-empty strings, got {name!r}")
            check_number(f"models[{name!r}]", multiplier)
        # A private read-only copy: the caller's dict may change, these coefficients may not.
        frozen = MappingProxyType({name: float(m) for name, m in self.models.items()})
        object.__setattr__(self, "models", frozen)

    def __hash__(self) -> int:
        return hash(
            (
                self.per_1k_tokens,
                self.per_tool_call,
                self.per_tool_second,
                tuple(sorted(self.models.items())),
            )
        )

    def multiplier(self, model: str | None) -> float:
        return self.models.get(model, 1.0) if model is not None else 1.0


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a caller declares a job will use; ``units`` prices it."""

    input_tokens: int = 0
    max_output_tokens: int = 0
    tool_calls: int = 0
    tool_seconds: float = 0.0
    model: str | None = None
    workflow: str | None = None

    def __post_init__(self) -> None:
        check_count("input_tokens", self.input_tokens, high=MAX_TOKENS)
        check_count("max_output_tokens", self.max_output_tokens, high=MAX_TOKENS)
        check_count("tool_calls", self.tool_calls, high=MAX_TOOL_CALLS)
        check_number("tool_seconds", self.tool_seconds, high=MAX_TOOL_SECONDS)
        for label in ("model", "workflow"):
            value = getattr(self, label)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{label} must be a non-empty string or None, got {value!r}")

    def units(self, coefficients: Coefficients) -> float:
        return work_units(
            coefficients,
            tokens=self.input_tokens + self.max_output_tokens,
            tool_calls=self.tool_calls,
            tool_seconds=self.tool_seconds,
            model=self.model,
        )


def work_units(
    coefficients: Coefficients,
    *,
    tokens: int,
    tool_calls: int,
    tool_seconds: float,
    model: str | None = None,
) -> float:
    """The price of work in units: what an estimate declares and what usage reports."""
    return (
        tokens / 1000 * coefficients.multiplier(model) * coefficients.per_1k_tokens
        + tool_calls * coefficients.per_tool_call
        + tool_seconds * coefficients.per_tool_second
    )


#: The least a job is charged in its tenant's fair share, in milli-units, so that jobs
#: too cheap to measure are still shared fairly by count.
MIN_CHARGE_MILLI = 1


def charge_milli(declared_milli: int | None, learned_milli: float | None) -> float:
    """What dispatch charges a job's tenant when tenants are charged by cost (the store's
    ``charge_mu``): what its kind was learned to cost, or what the caller declared if
    more; a job nobody knows anything about is charged the least, and corrected by
    what it used when it ends (``fairqueue`` rule 4) -- so guesses never outweigh
    measurements, and a refund never puts a tenant ahead of the present."""
    charge = 0.0 if declared_milli is None else float(declared_milli)
    if learned_milli is not None:
        charge = max(charge, learned_milli)
    return max(float(MIN_CHARGE_MILLI), charge)


@dataclass(frozen=True, slots=True)
class EstimationSettings:
    """Bounds of a reservation and how the learned cost moves."""

    max_reservation_units: float = 40.0
    """A request reserving more is refused (``too_wide``)."""
    update_window: int = 500
    """The learned cost falls by ``2 / (update_window + 1)`` of the gap per cheaper job."""
    safety_multiplier: float = 1.25
    """A reservation is the larger of declared and learned cost, times this (>= 1)."""
    default_units: float = 1.0
    """The cost of a job that declares no estimate."""

    def __post_init__(self) -> None:
        check_number("max_reservation_units", self.max_reservation_units)
        check_count("update_window", self.update_window, low=1)
        check_number("safety_multiplier", self.safety_multiplier, low=1.0)
        check_number("default_units", self.default_units)

    @property
    def alpha(self) -> float:
        return 2 / (self.update_window + 1)


class LearnedCost:
    """A bounded moving estimate of one (tenant, workflow, model)'s actual units per job.

    The first sample is taken as is. A sample above the mean moves it half way up
    (``mean += 0.5 * (sample - mean)``); one below moves it by ``alpha = 2 /
    (update_window + 1)`` of the gap (``mean += alpha * (sample - mean)``). Rising fast
    and decaying slowly means under-declaring does not pay: after ``k`` jobs of a
    constant true cost ``x`` from a mean ``m0 < x`` the gap is exactly ``(x - m0) /
    2**k``, so the mean is within ``eps`` of ``x`` after ``ceil(log2((x - m0) / eps))``
    jobs (10 jobs: under 0.1 % of the gap). A lone expensive job raises the mean by half
    its excess, and it takes about ``0.35 * update_window`` cheap jobs to halve that.
    The state is two numbers (``mean``, ``samples``), kept by the store in a hash.
    """

    __slots__ = ("_mean", "alpha", "samples")

    def __init__(self, update_window: int = 500, *, mean: float = 0.0, samples: int = 0) -> None:
        check_count("update_window", update_window, low=1)
        check_count("samples", samples)
        check_number("mean", mean)
        self.alpha = 2 / (update_window + 1)
        self.samples = samples
        self._mean = float(mean)

    def observe(self, units: float) -> float:
        """Fold in one job's actual units; returns the new mean."""
        sample = check_number("units", units)
        if self.samples == 0:
            self._mean = sample
        else:
            rate = 0.5 if sample > self._mean else self.alpha
            self._mean += rate * (sample - self._mean)
        self.samples += 1
        return self._mean

    @property
    def value(self) -> float | None:
        """The learned units per job, or None before the first sample."""
        return self._mean if self.samples else None

    @property
    def state(self) -> tuple[float, int]:
        """``(mean, samples)``: everything the store keeps."""
        return self._mean, self.samples


def reservation_units(
    declared: float, learned: float | None, settings: EstimationSettings
) -> float:
    """``max(declared, learned) * safety_multiplier``: the caller cannot under-declare."""
    check_number("declared", declared)
    base = max(declared, check_number("learned", learned) if learned is not None else 0.0)
    return base * settings.safety_multiplier


def too_wide(units: float, settings: EstimationSettings) -> bool:
    """Whether a reservation of ``units`` is more than any one job may reserve."""
    return units > settings.max_reservation_units
