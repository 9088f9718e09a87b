"""The data converter of ForkLab's experiment workers and clients: pydantic's, reading
every JSON payload with the shared strict reader first.

pydantic's JSON parser, like Python's, reads ``NaN``, ``Infinity`` and ``1e999``; a
workflow input or an activity argument holding one (anyone who can start a workflow can
send one, e.g. ``temporal workflow start --input``) reached the worker as a float no
canonical JSON can hold, and left it as ``null``. Here such a payload, or one nested deeper
than ``strict_json.MAX_DEPTH``, fails what decodes it at once with a non-retryable
``BadInput`` error naming the reason: a workflow whose input it is fails (it does not
retry its task for ever), an activity fails without a retry. Payloads ForkLab writes
never hold one (pydantic writes ``null`` for a non-finite float).
"""

from __future__ import annotations

from typing import Any

import temporalio.api.common.v1
from pydantic_core import to_json
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)
from temporalio.exceptions import ApplicationError

from forklab.contracts.errors import ExperimentErrorType
from forklab.runtime import strict_json


class StrictJSONPayloadConverter(PydanticJSONPlainPayloadConverter):
    """``json/plain`` payloads through ``strict_json`` before pydantic reads them; written
    with ``null`` for a non-finite float anywhere (pydantic does so in a model's fields,
    but writes ``NaN`` in a plain dict or list), so what one worker writes another reads."""

    def to_payload(self, value: Any) -> temporalio.api.common.v1.Payload | None:
        return temporalio.api.common.v1.Payload(
            metadata={"encoding": self.encoding.encode()},
            data=to_json(value, inf_nan_mode="null"),
        )

    def from_payload(
        self, payload: temporalio.api.common.v1.Payload, type_hint: type | None = None
    ) -> Any:
        try:
            strict_json.loads(payload.data, "a JSON payload")
        except strict_json.StrictJsonError as exc:
            raise ApplicationError(
                f"{exc}; refused before decoding",
                type=ExperimentErrorType.bad_input,
                non_retryable=True,
            ) from None
        return super().from_payload(payload, type_hint)


class StrictPayloadConverter(CompositePayloadConverter):
    """Temporal's default encodings, with :class:`StrictJSONPayloadConverter` for JSON."""

    def __init__(self) -> None:
        strict = StrictJSONPayloadConverter()
        super().__init__(
            *(
                strict if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


strict_data_converter = DataConverter(payload_converter_class=StrictPayloadConverter)
