"""Headless Chromium for the report tests: screenshots, the rendered DOM, and a network probe.

Chromium (Debian's ``chromium``; .ci/setup-chromium.sh installs it) runs with a fresh
profile, every background service off, and all its traffic sent to :class:`NetworkProbe`,
a local proxy that accepts connections and counts them: a page that fetches anything
(http, https, or a host name resolved through the proxy) shows up as a connection.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--no-pings",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=OptimizationHints,MediaRouter,Translate,NetworkTimeServiceQuerying",
    "--proxy-bypass-list=<-loopback>",  # loopback too goes through the probe
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
BROWSER_SERVICES = (".google.com", ".googleapis.com", ".gvt1.com")
"""Domains Chromium itself calls whatever the page (seen: update.googleapis.com,
accounts.google.com, clients2.google.com; no flag turns them off): their requests are
the browser's, not the page's, and are not counted. Web fonts are the page's."""
PAGE_SERVICES = ("fonts.googleapis.com",)


def browser_service(host: str) -> bool:
    """Whether a request to ``host`` is Chromium's own (updater, sign-in, time)."""
    return host.endswith(BROWSER_SERVICES) and host not in PAGE_SERVICES


def chromium() -> str:
    """The chromium executable, or fail (a skip would hide the browser checks)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "chromium is not installed: run .ci/setup-chromium.sh (apt-get install chromium)"
        )
    return found


class NetworkProbe:
    """A proxy on 127.0.0.1 that accepts every connection, records it and closes it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.requests: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    self.requests.append(conn.recv(4096).decode("latin-1"))
                except OSError:
                    self.requests.append("")

    def page_requests(self) -> list[str]:
        """Request lines of every connection but Chromium's own services'."""
        lines = [r.split("\r\n")[0] for r in self.requests]
        return [line for line in lines if not browser_service(host_of(line))]

    def __enter__(self) -> NetworkProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()


def host_of(request_line: str) -> str:
    """The host a proxy request line asks for (``CONNECT h:443`` or ``GET http://h/…``)."""
    parts = request_line.split()
    target = parts[1] if len(parts) > 1 else ""
    return target.split("://")[-1].split("/")[0].rsplit(":", 1)[0]


def run_chromium(page: Path, *args: str, probe: NetworkProbe) -> subprocess.CompletedProcess:
    """Open ``page`` (a local file) in headless Chromium with a throw-away profile."""
    with tempfile.TemporaryDirectory() as profile:
        command = [
            chromium(),
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--proxy-server=http://127.0.0.1:{probe.port}",
            *args,
            page.resolve().as_uri(),
        ]
        return subprocess.run(command, capture_output=True, timeout=120, check=True)


def render(page: Path, png: Path, width: int = 1000, height: int = 2400) -> tuple[str, list[str]]:
    """(rendered DOM, the requests the page made) and a screenshot of ``page`` in ``png``."""
    with NetworkProbe() as probe:
        run_chromium(page, f"--screenshot={png}", f"--window-size={width},{height}", probe=probe)
        dom = run_chromium(page, "--dump-dom", "--virtual-time-budget=2000", probe=probe)
    return dom.stdout.decode(), probe.page_requests()


VOID = {"meta", "br", "img", "input", "link", "hr", "source", "wbr", "area", "base", "col"}


class Dom(HTMLParser):
    """The rendered DOM's text by element id, table cells by table id, and SVG counts."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.stack: list[tuple[str, str]] = []
        self.text_by_id: dict[str, str] = {}
        self.cells: dict[str, list[list[str]]] = {}
        self.svg_shapes: dict[str, int] = {}
        self.sections: list[str] = []
        self.visible: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        given = {k: v or "" for k, v in attrs}
        self.attributes += [(k, v) for k, v in given.items()]
        if tag == "section":
            self.sections.append(given.get("id", ""))
        if tag in ("rect", "line", "polyline", "circle") and self._inside("svg"):
            self.svg_shapes[tag] = self.svg_shapes.get(tag, 0) + 1
        if tag == "tr" and self._table():
            self.cells.setdefault(self._table(), []).append([])
        if tag in ("td", "th") and self._table():
            self.cells[self._table()][-1].append("")
        if tag not in VOID:
            self.stack.append((tag, given.get("id", "")))

    def handle_endtag(self, tag: str) -> None:
        if any(t == tag for t, _ in self.stack):
            while self.stack.pop()[0] != tag:
                pass

    def handle_data(self, data: str) -> None:
        if self._inside("style") or self._inside("title") and not self._inside("svg"):
            return
        self.visible.append(data)
        for _, ident in self.stack:
            if ident:
                self.text_by_id[ident] = self.text_by_id.get(ident, "") + data
        if self._inside("td") or self._inside("th"):
            table = self._table()
            if table and self.cells.get(table):
                self.cells[table][-1][-1] += data

    def _inside(self, tag: str) -> bool:
        return any(t == tag for t, _ in self.stack)

    def _table(self) -> str:
        ids = [ident for tag, ident in self.stack if tag == "table"]
        return ids[-1] if ids else ""


def colour_pixels(png: Path, rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    """How many pixels of ``png`` are within ``tolerance`` of the colour ``rgb``."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=int)
    return int(np.all(np.abs(pixels - np.array(rgb)) <= tolerance, axis=-1).sum())
