"""The data converter of ForkLab's agent workers and their clients: the OpenAI Agents
plugin's, reading a workflow's own messages strictly.

A workflow's own messages (its input, a signal's or an update's argument, a memo value, a
query's argument, a child's result) come from whoever may start or message it. The
plugin's converter reads them leniently: where a value fails validation it hands the
workflow the raw JSON (a ``str`` where the handler expects a model), and it re-reads that
JSON with Python's ``json``, which a payload nested a few thousand levels deep ends in a
``RecursionError``. Either way the workflow task fails, and Temporal retries it for ever:
the run is wedged, open and stuck.

Here, where Temporal decodes such a message (its ``WorkflowSerializationContext``: in the
worker, and in a client reading a workflow's result or an update's answer), a
``json/plain`` payload is refused if it is larger than :data:`MAX_PAYLOAD_BYTES`, not
JSON, nested deeper than ``strict_json.MAX_DEPTH`` levels or holding
``NaN``/``Infinity``/``1e999`` anywhere (the path named), and then if it does not
validate as the type asked for. The lenient reading stays only for the OpenAI Agents
SDK's own types (:func:`drifts`), whose response models drift from the live API, which
is why the plugin reads leniently. A refusal is a non-retryable ``payload_refused``
``ApplicationError``, one sentence naming the type and the reason, and the SDK routes it:

- a workflow input, a memo value or a child's result: the run fails at once (never its
  workflow task);
- a signal: dropped by the SDK, which logs it with the signal's name, the workflow id and
  the sentence (the signal stays in the history); the run goes on, and a signal of the
  right shape sent later is taken;
- an update: rejected before its validator runs (the run goes on, nothing in history).

An activity's input and result (``ActivitySerializationContext``) keep the plugin's
reading: a workflow writes the input, and a decoding failure there fails the activity,
retried by its policy, not a workflow task; ``ForkLabPlugin(strict_payloads=True)``
refuses a non-finite input without a retry.

The plugin accepts no other converter (in this SDK it checks the client's wrapped
converter, not the class, so even a subclass of its own is refused):
:class:`StrictAgentsPlugin` puts this one in place after the plugin has configured the
client or the replayer.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import typing
from typing import Any, NoReturn, Self

import temporalio.api.common.v1
from pydantic import ValidationError
from temporalio.client import ClientConfig
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, ToJsonOptions
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.exceptions import ApplicationError
from temporalio.openai_agents import OpenAIAgentsPlugin, OpenAIPayloadConverter
from temporalio.worker import ReplayerConfig

from forklab.contracts.errors import ForkErrorType
from forklab.experiments.validation_text import first_error
from forklab.runtime import strict_json

#: The most bytes of JSON a workflow on an agent worker reads as one payload. ForkLab's
#: workflows pass small messages (anything large goes to the artifact store as a digest);
#: Temporal's own blob limit (2 MB by default) is the server's, this one the worker's.
MAX_PAYLOAD_BYTES = 1 << 20

#: The packages whose types keep the plugin's lenient reading.
_LENIENT_PACKAGES = frozenset({"agents", "openai"})


def drifts(hint: Any) -> bool:
    """Whether ``hint`` is (or holds) a type of the OpenAI Agents SDK or OpenAI's client,
    which the plugin reads leniently because the live API drifts from them."""
    module = getattr(hint, "__module__", None) or ""
    if module.split(".")[0] in _LENIENT_PACKAGES:
        return True
    return any(drifts(arg) for arg in typing.get_args(hint))


def _name(hint: Any) -> str:
    if hint is None or hint is Any:
        return "a JSON payload"
    return f"a {getattr(hint, '__name__', None) or str(hint)[:80]} payload"


def _refuse(message: str) -> NoReturn:
    raise ApplicationError(
        f"{message}; refused: an agent worker's workflows read JSON of at most "
        f"{MAX_PAYLOAD_BYTES} bytes, nested at most {strict_json.MAX_DEPTH} levels, with "
        "finite numbers, in the shape they ask for",
        type=ForkErrorType.payload_refused,
        non_retryable=True,
    ) from None


class StrictAgentJSONPayloadConverter(EncodingPayloadConverter, WithSerializationContext):
    """``json/plain`` as the OpenAI Agents plugin writes and reads it, read strictly where
    Temporal decodes a workflow's own messages (module docstring)."""

    def __init__(self, lenient: EncodingPayloadConverter) -> None:
        self._lenient = lenient
        self._strict = PydanticJSONPlainPayloadConverter(ToJsonOptions(exclude_unset=True))
        self._strictly = False

    @property
    def encoding(self) -> str:
        return self._lenient.encoding

    def with_context(self, context: SerializationContext) -> Self:
        """Strict for a workflow's own messages (``WorkflowSerializationContext``); an
        activity's input and result (``ActivitySerializationContext``) keep the plugin's
        reading."""
        strictly = isinstance(context, WorkflowSerializationContext)
        if strictly == self._strictly:
            return self
        twin = copy.copy(self)
        twin._strictly = strictly
        return twin

    def to_payload(self, value: Any) -> temporalio.api.common.v1.Payload | None:
        return self._lenient.to_payload(value)

    def from_payload(
        self, payload: temporalio.api.common.v1.Payload, type_hint: type | None = None
    ) -> Any:
        if not self._strictly:
            return self._lenient.from_payload(payload, type_hint)
        return self.read(payload, type_hint)

    def read(self, payload: temporalio.api.common.v1.Payload, type_hint: type | None) -> Any:
        """``payload`` as ``type_hint``, read strictly (what a workflow gets); a
        non-retryable ``payload_refused`` error naming the type and the reason otherwise."""
        what = _name(type_hint)
        if len(payload.data) > MAX_PAYLOAD_BYTES:
            _refuse(f"{what}: {len(payload.data)} bytes")
        try:
            # Python's reader, so that a non-finite number is refused with its path below
            strict_json.check_finite(json.loads(payload.data), what)
        except RecursionError:
            _refuse(f"{what}: nested deeper than {strict_json.MAX_DEPTH} levels")
        except strict_json.StrictJsonError as exc:
            _refuse(str(exc))
        except ValueError as exc:  # not JSON, not UTF-8, an integer past 4300 digits
            _refuse(f"{what}: not JSON ({str(exc)[:120]})")
        if type_hint is not None and drifts(type_hint):
            return self._lenient.from_payload(payload, type_hint)
        try:
            return self._strict.from_payload(payload, type_hint)
        except ValidationError as exc:
            _refuse(f"{what} does not validate ({first_error(exc)})")


class StrictAgentPayloadConverter(OpenAIPayloadConverter):
    """The OpenAI Agents plugin's encodings, with :class:`StrictAgentJSONPayloadConverter`
    for JSON."""

    def __init__(self) -> None:
        super().__init__()
        CompositePayloadConverter.__init__(
            self,
            *(
                StrictAgentJSONPayloadConverter(c) if c.encoding == "json/plain" else c
                for c in self.converters.values()
            ),
        )


def strict_agent_converter(converter: DataConverter) -> DataConverter:
    """``converter`` (the plugin's) reading payloads with :class:`StrictAgentPayloadConverter`."""
    return dataclasses.replace(converter, payload_converter_class=StrictAgentPayloadConverter)


class StrictAgentsPlugin(OpenAIAgentsPlugin):
    """The OpenAI Agents plugin, its clients and replayers reading payloads strictly."""

    def configure_client(self, config: ClientConfig) -> ClientConfig:
        converter = config.get("data_converter")
        if (
            converter is not None
            and converter.payload_converter_class is StrictAgentPayloadConverter
        ):
            # configured before (a client made from this client's config): the plugin
            # would refuse its own converter's subclass, so it starts from the default again
            config["data_converter"] = dataclasses.replace(
                converter, payload_converter_class=DefaultPayloadConverter
            )
        config = super().configure_client(config)
        config["data_converter"] = strict_agent_converter(config["data_converter"])
        return config

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        config = super().configure_replayer(config)
        config["data_converter"] = strict_agent_converter(config["data_converter"])
        return config
