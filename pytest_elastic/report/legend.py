"""The markup of a drawing's legend, shared by the job page's timeline (``page``) and the
twin's curves (``twin_svg``): a row of items, each a swatch or a small SVG shape before its
label. Labels are HTML: the caller escapes what it did not write."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["legend", "shape_item", "swatch_item"]


def swatch_item(style: str, label: str) -> str:
    """An item whose mark is a colour swatch (``style``: its CSS)."""
    return f'<span><i class="sw" style="{style}"></i>{label}</span>'


def shape_item(shape: str, label: str) -> str:
    """An item whose mark is a 12x10 SVG (``shape``: its elements)."""
    return f'<span><svg width="12" height="10">{shape}</svg>{label}</span>'


def legend(items: Iterable[str], classes: str = "legend", ident: str | None = None) -> str:
    """The legend's ``div`` around its items."""
    attr = f' id="{ident}"' if ident is not None else ""
    return f'<div class="{classes}"{attr}>{"".join(items)}</div>'
