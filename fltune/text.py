"""Wording the commands' lines share."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n noun`` with the noun plural unless n is 1: "1 round", "500 rounds"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
