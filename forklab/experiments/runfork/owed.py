"""What a fork still owes its prefix, named for the error that fails a fork which never
takes it.

A fork hands over, in the parent's order, its inherited calls' results and the signals,
updates, timer fires and child outcomes the parent received between them
(``call_match``, ``prefix_messages``). A fork whose code never asks for one of them (a
changed build, a path an intervention opened) would wait for it for ever; the fork
interceptor fails it instead, with one of these sentences: the kind, what it was, and the
step it came after.

Pure: the interceptor's stall watch and its end-of-run check call in.
"""

from __future__ import annotations

from forklab.experiments.runfork.prefix_messages import MessageKind, PrefixMessage
from forklab.experiments.runfork.steps import Step

_OTHER_PATH = "its code took another path before the fork point"


def _what(msg: PrefixMessage) -> str:
    name = msg.name[:100]
    if msg.kind is MessageKind.timer:
        return f"timer of {name}"
    if msg.kind is MessageKind.child:
        return f"child workflow {name} ({(msg.child_id or '')[:100]})"
    if msg.kind is MessageKind.sent_signal:
        return f"signal {name!r} to {(msg.child_id or '')[:100]}"
    return f"{msg.kind.value} {name!r}"


def message_not_taken(msg: PrefixMessage) -> str:
    """A due timer fire, child outcome or acknowledgement of a signal sent that the fork
    never asked for (it started no timer of that duration, not its k-th child of that
    type, or did not make its k-th send of that name), with nothing left to wait for."""
    if msg.kind is MessageKind.timer:
        happened, asked = "fired", "started no timer of that duration"
    elif msg.kind is MessageKind.sent_signal:
        happened = "was acknowledged"
        asked = f"did not send its signal #{msg.ordinal or 1} of that name"
    else:
        happened, asked = "closed", f"did not start its child #{msg.ordinal or 1} of that type"
    return (
        f"after step {msg.position} the parent's {_what(msg)} {happened}, and the fork "
        f"{asked} and has nothing left to wait for without it: {_OTHER_PATH}"
    )


def finished_owing(next_step: Step | None, owed_steps: int, msg: PrefixMessage | None) -> str:
    """Why a fork that ended (completed, failed as its code chose, continued-as-new)
    before its fork point is no continuation of its parent: the first thing it owed in the
    parent's order (``next_step``: the first inherited call it never made; ``msg``: the
    first message it was never handed), and how many calls besides."""
    if msg is not None and (next_step is None or msg.position < next_step.index):
        return (
            f"the fork ended before the parent's {_what(msg)} (after step {msg.position}) "
            f"was handed over to it: {_OTHER_PATH}"
        )
    assert next_step is not None
    more = f", and {owed_steps - 1} more inherited calls" if owed_steps > 1 else ""
    return (
        f"the fork ended without making step {next_step.index} "
        f"({next_step.activity_type[:100]}), which it inherited{more}: {_OTHER_PATH}"
    )


def signal_not_inherited(name: str, target: str) -> str:
    """A signal an exact fork sends another workflow while it still owes its prefix
    something, which is not one the parent sent there (those are not sent again): it
    would reach its target before the fork point."""
    return (
        f"the fork sends signal {name[:100]!r} to {target[:100]}, which the parent had not "
        f"sent by then: {_OTHER_PATH}"
    )


def child_not_inherited(workflow_type: str, child_id: str) -> str:
    """A child an exact fork starts while it still owes its prefix something: every child
    the parent started inside an exact prefix closed there and is served, so this one is
    not the parent's, and would run live before the fork point."""
    return (
        f"the fork starts child workflow {workflow_type[:100]} ({child_id[:100]}), which "
        f"the parent had not started by then: {_OTHER_PATH}"
    )
