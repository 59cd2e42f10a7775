"""The HTML sink (report.html, bench.html and their SVG charts): data goes into a page only through :func:`h`, which
fills mhaexport's own markup (a constant template) with values escaped by markupsafe — Flask's and Jinja2's
escaper, ``Markup.format`` — after each is made shown text (:func:`mhaexport.core.untrusted.shown`: no control
character) or a number through the one formatter (:func:`mhaexport.core.numbers.number`). Only markup made here is
:class:`~markupsafe.Markup`; anything else is escaped wherever it lands, so a name, a message or a figure from a folder
or a report can never become an element, an attribute or a URL (``tests/test_sinks.py`` holds the renderers to it)."""

from __future__ import annotations

from markupsafe import Markup, escape

from mhaexport.core.numbers import is_real, number
from mhaexport.core.untrusted import shown


def as_text(value: object) -> str:
    """Text from a report (a folder's names, a message) as plain text for HTML: each line through the one escaping
    function for shown text (:func:`mhaexport.core.untrusted.shown`), a number through the one formatter. Markup
    escaping is :func:`h`'s: every value it puts in a page is escaped there unless it is :class:`Markup` already."""
    if is_real(value):
        return number(value, "d" if isinstance(value, int) else ".4g")
    return "\n".join(shown(line) for line in str(value).split("\n"))


def h(template: str, *args: object, **kwargs: object) -> Markup:
    """The HTML sink: ``template`` (mhaexport's own markup, a constant) with ``{}`` fields filled by ``args`` /
    ``kwargs``, each escaped by markupsafe (``Markup.format``) after :func:`text` unless it is :class:`Markup` made
    here — so data can never become an element, an attribute or a URL of the page."""
    def value(v: object) -> object:
        return v if isinstance(v, Markup) else as_text(v)

    return Markup(template).format(*map(value, args), **{k: value(v) for k, v in kwargs.items()})


def join(parts, sep: str = "") -> Markup:
    """``parts`` joined as markup (each escaped unless Markup)."""
    return Markup(sep).join(p if isinstance(p, Markup) else escape(as_text(p)) for p in parts)


def e(value: object) -> Markup:
    """One value as HTML text (escaped)."""
    return escape(as_text(value))
