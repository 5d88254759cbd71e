"""The result every checker returns: a verdict, explained anomalies, and statistics.

``valid`` is ``True`` when the history was checked and nothing is wrong, ``False`` when
at least one anomaly was found, and ``"unknown"`` when the history held nothing the
checker could judge (no completed read, say), so that an empty run never passes as a
proof.  ``anomalies`` maps a kind (``G1c``, ``lost-append``, ``wrong-total``, ...) to
explanations written for people, each enough on its own to see why the history is
impossible.  ``observations`` has the same shape for things worth reporting that the
guarantees allow, such as a torn basic read; they never make a result invalid.

Explanations are capped per kind (``max_examples``) so that a systematic bug does not
produce megabytes of text; ``stats["anomaly_counts"]`` always has the full counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Validity = bool | Literal["unknown"]

DEFAULT_MAX_EXAMPLES = 100


@dataclass(slots=True)
class CheckResult:
    """A checker's verdict on one history; JSON-serializable through ``to_json``."""

    checker: str
    valid: Validity
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    observations: dict[str, list[str]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "checker": self.checker,
            "valid": self.valid,
            "anomalies": {k: list(v) for k, v in self.anomalies.items()},
            "observations": {k: list(v) for k, v in self.observations.items()},
            "stats": self.stats,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> CheckResult:
        valid = record["valid"]
        if valid not in (True, False, "unknown"):
            raise ValueError(f"valid must be true, false or 'unknown', not {valid!r}")
        return cls(
            checker=str(record["checker"]),
            valid=valid,
            anomalies={k: list(v) for k, v in record.get("anomalies", {}).items()},
            observations={k: list(v) for k, v in record.get("observations", {}).items()},
            stats=dict(record.get("stats", {})),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True, default=str)

    def render(self) -> str:
        """A report for people: the verdict first, then each kind with its explanations."""
        counts = self.stats.get("anomaly_counts", {})
        if self.valid is True:
            verdict = "VALID"
        elif self.valid is False:
            total = sum(counts.get(k, len(v)) for k, v in self.anomalies.items())
            kinds = len(self.anomalies)
            verdict = (
                f"INVALID ({total} {'anomaly' if total == 1 else 'anomalies'} of {kinds} "
                f"{'kind' if kinds == 1 else 'kinds'})"
            )
        else:
            verdict = "UNKNOWN (nothing in the history could be checked)"
        lines = [f"{self.checker}: {verdict}"]
        _render_section(lines, "anomalies", self.anomalies, counts)
        _render_section(
            lines,
            "observations (allowed by the guarantees, not failures)",
            self.observations,
            self.stats.get("observation_counts", {}),
        )
        plain = {k: v for k, v in self.stats.items() if not isinstance(v, dict | list)}
        if plain:
            lines.append("stats: " + " ".join(f"{k}={v}" for k, v in sorted(plain.items())))
        return "\n".join(lines)


def _render_section(
    lines: list[str], title: str, kinds: dict[str, list[str]], counts: dict[str, int]
) -> None:
    if not kinds:
        return
    lines.append(f"{title}:")
    for kind in sorted(kinds):
        explanations = kinds[kind]
        total = counts.get(kind, len(explanations))
        shown = "" if total == len(explanations) else f", first {len(explanations)} shown"
        lines.append(f"  {kind} ({total}{shown}):")
        for explanation in explanations:
            first, *rest = explanation.splitlines() or [""]
            lines.append(f"    - {first}")
            lines.extend(f"      {line}" for line in rest)


class Findings:
    """Collects anomalies and observations while a checker runs, counting past the cap."""

    __slots__ = (
        "_anomalies",
        "_anomaly_counts",
        "_observation_counts",
        "_observations",
        "max_examples",
    )

    def __init__(self, max_examples: int = DEFAULT_MAX_EXAMPLES) -> None:
        self.max_examples = max_examples
        self._anomalies: dict[str, list[str]] = {}
        self._anomaly_counts: dict[str, int] = {}
        self._observations: dict[str, list[str]] = {}
        self._observation_counts: dict[str, int] = {}

    def anomaly(self, kind: str, explanation: str) -> None:
        """Record something the guarantees forbid; the result becomes invalid."""
        _add(self._anomalies, self._anomaly_counts, kind, explanation, self.max_examples)

    def observation(self, kind: str, explanation: str) -> None:
        """Record something allowed but worth showing; it never fails the run."""
        _add(self._observations, self._observation_counts, kind, explanation, self.max_examples)

    def result(self, checker: str, stats: dict[str, Any], checked_anything: bool) -> CheckResult:
        valid: Validity
        if self._anomalies:
            valid = False
        elif checked_anything:
            valid = True
        else:
            valid = "unknown"
        stats = dict(stats)
        stats["anomaly_counts"] = dict(self._anomaly_counts)
        stats["observation_counts"] = dict(self._observation_counts)
        return CheckResult(checker, valid, self._anomalies, self._observations, stats)


def _add(
    kinds: dict[str, list[str]], counts: dict[str, int], kind: str, text: str, cap: int
) -> None:
    counts[kind] = counts.get(kind, 0) + 1
    examples = kinds.setdefault(kind, [])
    if len(examples) < cap:
        examples.append(text)
