"""Numbers as words for LaTeX macro names, which hold no digits: 8 -> Eight, 1024 -> OneThousandTwentyFour."""

from __future__ import annotations

_ONES = [
    "Zero",
    "One",
    "Two",
    "Three",
    "Four",
    "Five",
    "Six",
    "Seven",
    "Eight",
    "Nine",
    "Ten",
    "Eleven",
    "Twelve",
    "Thirteen",
    "Fourteen",
    "Fifteen",
    "Sixteen",
    "Seventeen",
    "Eighteen",
    "Nineteen",
]
_TENS = ["_", "_", "Twenty", "Thirty", "Forty", "Fifty", "Sixty", "Seventy", "Eighty", "Ninety"]
_SCALES = ((1_000_000, "Million"), (1000, "Thousand"), (100, "Hundred"))


def spell(number: int) -> str:
    """CamelCase English words of a non-negative integer (below one billion)."""
    if number < 0 or number >= 1_000_000_000:
        raise ValueError(f"cannot spell {number} as a macro name (0 <= n < 1e9)")
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (_ONES[ones] if ones else "")
    for scale, word in _SCALES:
        if number >= scale:
            high, rest = divmod(number, scale)
            return spell(high) + word + (spell(rest) if rest else "")
    raise AssertionError(number)  # unreachable: every number >= 100 has a scale
