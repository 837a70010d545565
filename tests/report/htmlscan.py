"""Parse a report into what a reader sees: figures with their bars, images, audio, tagged values."""
from __future__ import annotations

import base64
from collections import defaultdict
from html.parser import HTMLParser


VOID = ("img", "meta", "br", "line", "input", "link")


class ReportScan(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.figures: dict[str, dict] = {}
        self.images: list[dict] = []
        self.audio: list[dict] = []
        self.tags: dict[str, dict[str, dict]] = defaultdict(dict)  # data-* name -> value -> attrs
        self.elements: list[str] = []
        self.urls: list[str] = []
        self.text: dict[tuple[str, str], str] = {}  # (data-* name, value) -> text inside that element
        self._svg: str | None = None
        self._open: list[tuple[str, str] | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append(tag)
        for k in ("src", "href"):
            if k in a:
                self.urls.append(a[k])
        if tag == "svg" and "data-figure" in a:
            self._svg = a["data-figure"]
            self.figures[self._svg] = {"bars": {}, "lines": {}}
        elif tag == "rect" and self._svg and "data-key" in a:
            self.figures[self._svg]["bars"][a["data-key"]] = float(a["data-value"])
        elif tag == "line" and self._svg and "data-line" in a:
            self.figures[self._svg]["lines"][a["data-line"]] = float(a["data-value"])
        elif tag == "img":
            self.images.append(a)
        elif tag == "audio":
            self.audio.append(a)
        tagged = None
        for k, v in a.items():
            if k.startswith("data-") and k not in ("data-figure", "data-key", "data-value", "data-line") and v is not None:
                self.tags[k[5:]][v] = a
                tagged = tagged or (k[5:], v)
        if tag not in VOID:
            self._open.append(tagged)
            if tagged:
                self.text[tagged] = ""

    def handle_data(self, data):
        for t in self._open:
            if t:
                self.text[t] += data

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg = None
        if tag not in VOID and self._open:
            self._open.pop()


def scan(html: str) -> ReportScan:
    s = ReportScan()
    s.feed(html)
    s.close()
    return s


def data_uri_bytes(uri: str, mime: str) -> bytes:
    head, _, payload = uri.partition(",")
    assert head == f"data:{mime};base64", head
    return base64.b64decode(payload)
