"""The readout activity: ask an OpenAI-compatible model for its claims about the evidence
packet, check them against the packet, and show them (or the deterministic claims) written
out by ForkLab in the report: a model writes no sentence of it. Every failure of the model
(no configuration, outage, timeout, refusal, garbage, an unfaithful claim) ends in the
deterministic readout, within ``timeout_seconds``.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio import activity

from forklab.activities.experiment.readout_http import AnswerTooLargeError, bounded_http_client
from forklab.activities.stores.artifacts import ArtifactStore
from forklab.contracts.experiment import AnalysisResult
from forklab.contracts.experiment_activities import WRITE_READOUT
from forklab.experiments.experiment.readout.check import check_readout
from forklab.experiments.experiment.readout.fallback import deterministic_readout
from forklab.experiments.experiment.readout.packet import EvidencePacket, evidence_packet
from forklab.experiments.experiment.readout.render import with_readout_html, with_readout_markdown
from forklab.experiments.experiment.readout.schema import ModelReadout, ReadoutSource, ShownReadout
from forklab.experiments.experiment.readout.write import written_readout
from forklab.experiments.experiment.report.model import Report

_INSTRUCTIONS = (
    "You read out a finished causal experiment from the evidence packet you are given. "
    "Give one claim per world that has a verdict, most important first: its name exactly "
    "as in the packet, its verdict exactly as in the packet, the direction its failure rate "
    "moved against the baseline (lowered when the success difference's interval lies above "
    "zero, raised when below, no_clear_change when it crosses zero), and the figures worth "
    "citing with their values exactly as in the packet."
)


class ReadoutConfig(BaseModel):
    """Where the model is (any OpenAI-compatible base URL) and how long it may take."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    api_key: str
    model: str
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)


class ReadoutActivities:
    def __init__(self, store: ArtifactStore, config: ReadoutConfig | None) -> None:
        self._store = store
        self._config = config

    async def _ask(self, config: ReadoutConfig, packet: EvidencePacket) -> ModelReadout | None:
        import openai  # see shown_readout

        async with (
            bounded_http_client(config.timeout_seconds) as http,
            openai.AsyncOpenAI(
                base_url=config.base_url,
                api_key=config.api_key,
                timeout=config.timeout_seconds,
                max_retries=0,  # one bounded attempt; the fallback is always there
                http_client=http,  # bounded in size too (readout_http)
            ) as client,
        ):
            answer = await client.chat.completions.parse(
                model=config.model,
                messages=[
                    {"role": "system", "content": _INSTRUCTIONS},
                    {"role": "user", "content": packet.model_dump_json()},
                ],
                response_format=ModelReadout,
                temperature=0,
            )
        return answer.choices[0].message.parsed if answer.choices else None

    async def shown_readout(self, packet: EvidencePacket) -> ShownReadout:
        config = self._config

        def fallback(why: str, problems: list[str] | None = None) -> ShownReadout:
            return ShownReadout(
                source=ReadoutSource.deterministic,
                why=why,
                model=config.model if config else None,
                readout=written_readout(deterministic_readout(packet), packet),
                problems=problems or [],
            )

        if config is None:
            return fallback("no model is configured (FORKLAB_READOUT_BASE_URL is not set)")
        # The SDK is imported on use, not with this module: the worker module is imported
        # inside Temporal's workflow sandbox (by modules that define workflows), where the
        # SDK's HTTP stack may not subclass the standard library's HTTP classes. And only
        # when a model is configured: importing it took ~1.2 s of CPU on the worker's event
        # loop at the end of every run on a worker that had not imported it yet.
        import openai

        try:
            answer = await asyncio.wait_for(self._ask(config, packet), config.timeout_seconds)
        except TimeoutError:
            return fallback(f"the model did not answer within {config.timeout_seconds:g} s")
        except AnswerTooLargeError as exc:
            return fallback(str(exc))
        except openai.APITimeoutError:
            return fallback(f"the model did not answer within {config.timeout_seconds:g} s")
        except openai.APIStatusError as exc:
            return fallback(f"the model call failed with HTTP {exc.status_code}")
        except openai.OpenAIError as exc:
            return fallback(f"the model call failed ({type(exc).__name__})")
        except (ValidationError, ValueError) as exc:
            return fallback(f"the model's answer is not a readout ({type(exc).__name__})")
        if answer is None:
            return fallback("the model gave no readout (refusal or empty answer)")
        problems = check_readout(answer, packet)
        if problems:
            return fallback("the model's claims did not match the evidence", problems)
        return ShownReadout(
            source=ReadoutSource.model,
            why="every world, direction, verdict and figure it claims is the evidence packet's",
            model=config.model,
            readout=written_readout(answer, packet),
        )

    @activity.defn(name=WRITE_READOUT.name)
    async def write_readout(self, analysis: AnalysisResult) -> AnalysisResult:
        """Add the readout section to the report's Markdown and HTML; new digests back."""
        store = self._store
        report_json = await asyncio.to_thread(store.get_json, analysis.report_digest)
        shown = await self.shown_readout(evidence_packet(Report.model_validate(report_json)))
        markdown = (await asyncio.to_thread(store.get_bytes, analysis.markdown_digest)).decode()
        page = (await asyncio.to_thread(store.get_bytes, analysis.html_digest)).decode()
        md = with_readout_markdown(markdown, shown).encode()
        html = with_readout_html(page, shown).encode()
        return analysis.model_copy(
            update={
                "markdown_digest": await asyncio.to_thread(store.put_bytes, md),
                "html_digest": await asyncio.to_thread(store.put_bytes, html),
                "readout": shown.source.value,
                "readout_why": shown.why,
            }
        )
