"""Is a model's readout faithful to the packet? Every world it names must be a packet
world, every verdict that world's verdict, every number one the packet holds (as written,
to the precision written, or as a percentage), and it must not ask for compute.

The check is deliberately strict: a readout it rejects costs nothing (the deterministic
readout is shown instead), a readout it wrongly accepts puts a claim in the report that
the evidence does not make.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from forklab.experiments.experiment.readout.packet import EvidencePacket, hypothesis_supported
from forklab.experiments.experiment.readout.schema import ModelReadout
from forklab.experiments.experiment.results import CheckKind

_NUMBER = re.compile(r"(?<![\w.])[-+−]?(\d+(?:\.\d+)?)(?:[eE]([-+]?\d+))?(%?)")
_CODE = re.compile(r"`([^`]*)`")
_SMALL = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
]
_WORLD_COUNT = re.compile(rf"\b(\d+|{'|'.join(_SMALL)})\s+(?:[a-z-]+\s+)?worlds?\b", re.IGNORECASE)
_VERDICT_WORDS = ("supported", "refuted", "inconclusive", "invalid")
_HYPOTHESIS = re.compile(r"\bhypothes[ie]s\b", re.IGNORECASE)
_EXPERIMENT = re.compile(r"\bexperiment\b", re.IGNORECASE)
_NOT_SUPPORTED = re.compile(r"\b(not|never)\s+(\w+\s+)?supported\b", re.IGNORECASE)
_COMPUTE = re.compile(
    r"\b(re-?run|rerunning|more (episodes|worlds|compute|budget)|additional "
    r"(episodes|worlds|compute|budget|sandboxes)|increase the budget|approve|authori[sz]e)\b",
    re.IGNORECASE,
)


def _packet_strings(packet: EvidencePacket) -> list[str]:
    names = [w.name for w in packet.worlds] + [c.name for c in packet.checks]
    return sorted(set(names), key=len, reverse=True)


def packet_numbers(packet: EvidencePacket) -> list[float]:
    """Every number the packet states, plus the counts a reader derives at a glance
    (how many worlds, checks passed and failed in all and of each kind, worlds per
    verdict)."""
    found: list[float] = []

    def walk(value: object) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int | float):
            found.append(float(value))
        elif isinstance(value, str):
            found.extend(float(m.group(1)) for m in _NUMBER.finditer(value))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(packet.model_dump(mode="json"))
    found += [len(packet.worlds), len(packet.comparisons)]
    for kind in (None, *CheckKind):
        checks = [c for c in packet.checks if kind is None or c.kind is kind]
        found += [len(checks), sum(c.passed for c in checks), sum(not c.passed for c in checks)]
    found += [sum(v.verdict == word for v in packet.verdicts) for word in _VERDICT_WORDS]
    found += [w.episodes - w.failures for w in packet.worlds]
    return found


def world_counts(packet: EvidencePacket) -> set[int]:
    """How many worlds a sentence may say there are: all of them, or those of one role,
    status or verdict."""
    counts = {len(packet.worlds), len(packet.verdicts), len(packet.comparisons)}
    for attr in ("role", "status"):
        values = [getattr(w, attr) for w in packet.worlds]
        counts |= {values.count(v) for v in values}
    verdicts = [v.verdict for v in packet.verdicts]
    counts |= {verdicts.count(v) for v in verdicts}
    return counts


def _matches(token: re.Match[str], numbers: Iterable[float]) -> bool:
    """The token equals a packet number to the precision it is written in."""
    digits, exponent, percent = token.group(1), token.group(2), token.group(3)
    decimals = len(digits.partition(".")[2])
    scale = 10.0 ** int(exponent) if exponent else 1.0
    value = float(digits) * scale
    half_ulp = 0.5 * 10.0**-decimals * scale + 1e-12
    for n in numbers:
        candidates = [abs(n), abs(n) * 100.0] if percent else [abs(n)]
        if any(math.isclose(value, c, abs_tol=half_ulp) for c in candidates):
            return True
    return False


def _texts(readout: ModelReadout) -> list[str]:
    return [readout.summary, *(f.statement for f in readout.findings), *readout.caveats]


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.;!?])\s+", text) if s.strip()]


def check_readout(readout: ModelReadout, packet: EvidencePacket) -> list[str]:
    """What the readout claims that the packet does not hold; empty when faithful."""
    verdicts = {v.world: v.verdict for v in packet.verdicts}
    worlds = {w.name for w in packet.worlds}
    names = _packet_strings(packet)
    numbers = packet_numbers(packet)
    counts = world_counts(packet)
    hypothesis = hypothesis_supported(packet)
    problems: list[str] = []
    for f in readout.findings:
        if f.world not in worlds:
            problems.append(f"names world {f.world!r}, which the packet does not hold")
        elif f.world not in verdicts:
            problems.append(f"gives world {f.world!r} a verdict; the packet gives it none")
        elif f.verdict.value != verdicts[f.world]:
            problems.append(
                f"says {f.world} is {f.verdict.value}; the packet says {verdicts[f.world]}"
            )
    for text in _texts(readout):
        for code in _CODE.findall(text):
            if code not in worlds and code not in names:
                problems.append(f"names `{code}`, which is no world or check of the packet")
        for said in _WORLD_COUNT.findall(text):
            n = int(said) if said.isdigit() else _SMALL.index(said.lower())
            if n not in counts:
                problems.append(f"speaks of {n} worlds; the packet holds {len(worlds)}")
        if _COMPUTE.search(text):
            problems.append(f"asks for compute or approval: {text[:80]!r}")
        for sentence in _sentences(text):
            problems += _sentence_problems(sentence, names, verdicts, numbers, hypothesis)
    return list(dict.fromkeys(problems))


def _unattached_verdict(sentence: str, said: list[str], hypothesis: bool | None) -> list[str]:
    """A verdict word in a sentence that names no judged world: only a true statement about
    the hypothesis may use one ("It is supported." after naming a world in the sentence
    before would pass for that world's verdict)."""
    if said == ["invalid"] and _EXPERIMENT.search(sentence):  # "The experiment is invalid."
        return [] if hypothesis is None else ["calls the experiment invalid; the packet's is valid"]
    if not _HYPOTHESIS.search(sentence):
        return [f"says {'/'.join(said)} without naming the one world it judges: {sentence[:80]!r}"]
    negated = bool(_NOT_SUPPORTED.search(sentence))
    if hypothesis is None:
        fits = said == ["invalid"]
    else:
        fits = said == ["supported"] and negated != hypothesis
    if fits:
        return []
    truth = {None: "not judged (invalid)", True: "supported", False: "not supported"}[hypothesis]
    return [f"judges the hypothesis {'/'.join(said)}; the packet says it is {truth}"]


def _sentence_problems(
    sentence: str,
    names: list[str],
    verdicts: dict[str, str],
    numbers: list[float],
    hypothesis: bool | None,
) -> list[str]:
    problems = []
    mentioned = []
    stripped = sentence
    for name in names:  # longest first, so "retry" does not match inside "retry-jitter"
        pattern = re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")
        if pattern.search(stripped):
            mentioned.append(name)
            stripped = pattern.sub(" ", stripped)
    said = [w for w in _VERDICT_WORDS if re.search(rf"\b{w}\b", stripped, re.IGNORECASE)]
    judged = [m for m in mentioned if m in verdicts]
    if len(judged) == 1 and said and said != [verdicts[judged[0]]]:
        problems.append(
            f"calls {judged[0]} {'/'.join(said)}; the packet says {verdicts[judged[0]]}"
        )
    elif len(judged) > 1 and said and set(said) != {verdicts[m] for m in judged}:
        problems.append(
            f"calls {', '.join(judged)} {'/'.join(said)}; the packet says "
            + ", ".join(f"{m} {verdicts[m]}" for m in judged)
        )
    elif not judged and said:
        problems += _unattached_verdict(sentence, said, hypothesis)
    for token in _NUMBER.finditer(stripped):
        if not _matches(token, numbers):
            problems.append(f"states {token.group(0).strip()}, a number the packet does not hold")
    return problems
