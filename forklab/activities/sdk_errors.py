"""The sentence to show of a provider SDK's error.

The SDKs wrap what went wrong: an upload fails as an exception group, a synchronous flush
raises its own error with the real one as its cause. The innermost one says what the
server answered; its first line, bounded, is what an operator needs.
"""

from __future__ import annotations


def innermost_sentence(exc: BaseException) -> str:
    """``Type: first line`` of the innermost cause of ``exc`` (at most 200 characters)."""
    while True:
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            break
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else 'no message'}"
