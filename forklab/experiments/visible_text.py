"""Text made safe to show.

What ForkLab prints, or writes into a report, can carry text from untrusted places: a
spec's hypothesis and intervention names, a workload's error messages, the approval
messages anyone who reaches the Temporal server may send (a refused one is recorded with
the name it gave), an agent's output, names the server reports. A terminal acts on the
control characters in such text (move the cursor, erase or rewrite a line, set the
window title), which would let it forge what an operator or an approver reads, e.g. a
refused approval shown as accepted; bidirectional-override characters reorder what a
reader sees in a terminal, an editor or a browser. ``visible`` writes each of them as a
``\\uXXXX`` escape: the text stays readable and can no longer act, and inside a JSON
string the escape stands for the same character, so JSON output keeps its meaning.
"""

from __future__ import annotations

#: Kept as they are: line breaks and tabs lay out text and do nothing else.
_KEPT = frozenset("\n\t")

#: C0 controls (ESC, CR, BEL, backspace ...), DEL, C1 controls (a terminal may take
#: U+009B as ESC [), and the Unicode characters that reorder bidirectional text.
_ACTING = (
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
)

_ESCAPES = {code: f"\\u{code:04x}" for code in _ACTING if chr(code) not in _KEPT}


def visible(text: str) -> str:
    """``text`` with every control or bidirectional-override character (but line breaks
    and tabs) written as a ``\\uXXXX`` escape."""
    return text.translate(_ESCAPES)
