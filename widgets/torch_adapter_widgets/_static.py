"""Charts that last, shared by the views: a plotly figure as its JSON mime bundle and a static PNG of it.

JupyterLab draws ``application/vnd.plotly.v1+json`` with the extension the plotly wheel installs (offline,
in an untrusted notebook, after a reopen with no kernel); ``nbconvert --to html`` and GitHub show
``text/html`` instead, so the PNG (plotly's kaleido with a Chrome it finds, every wait bounded) goes into
the same output's html, once. Where there is no PNG, the html says why (:func:`static_png_why`).
"""

from __future__ import annotations

import base64
import html
import os
from typing import Any

__all__ = ["PLOTLY_MIME", "image_html", "plotly_json", "static_png", "static_png_why"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def plotly_json(fig: Any) -> dict[str, Any]:
    """The figure as plotly's mime bundle value (no plotly logo in the mode bar)."""
    return {**fig.to_plotly_json(), "config": {"displaylogo": False}}


def image_html(png: bytes | None, alt: str, missing: str) -> str:
    """``png`` as an inline ``<img>``; without one, ``missing`` in bold and why there is no image (when
    this kernel knows why)."""
    if png:
        return (f"<img alt='{html.escape(alt, quote=True)}' style='max-width:100%' "
                f"src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'/>")
    out = f"<b>{missing}</b>"
    why = static_png_why()
    if why:
        out += f" <i class='torch-adapter-no-image'>(no static image: {html.escape(why)})</i>"
    return out


class _StaticCharts:
    """plotly's kaleido (a Chrome it drives) on a thread of its own, one browser for the kernel's life
    (~3 s once, then ~0.2 s a chart), every wait bounded.

    Why not ``plotly.io.to_image``: it goes through kaleido's sync server, whose caller waits on a queue
    with no timeout — a Chrome that fails to start (seen under a loaded CI run: the server's thread
    died, nobody answered) hung the cell for good. Here a start that takes over :attr:`START_S`, or a
    chart over :attr:`RENDER_S`, gives up: the cell goes on without the image (the plotly JSON and the
    table still show), ``why`` says what happened, and the kernel does not try again."""

    START_S = 30.0
    RENDER_S = 15.0

    def __init__(self) -> None:
        self.loop: Any = None
        self.browser: Any = None
        self.why: str | None = None  # why there are no static charts in this kernel

    def png(self, fig: Any) -> bytes | None:
        if os.environ.get("TORCH_ADAPTER_STATIC_CHARTS", "1") == "0":
            return None
        if self.why is not None:
            return None
        try:
            import kaleido  # noqa: F401  (plotly's image engine)
        except ImportError:
            self.why = "kaleido is not installed (pip install 'torch_adapter[widgets]')"
            return None
        try:
            if self.browser is None:
                self._start()
            layout = fig.layout
            opts = {"format": "png", "width": layout.width or 700, "height": layout.height or 500, "scale": 1}
            return _palette(self._bounded(self.browser.calc_fig(fig.to_dict(), opts), self.RENDER_S + 5,
                                          f"kaleido's Chrome drew no chart in {self.RENDER_S:.0f} s"))
        except Exception as exc:  # no Chrome, a browser that did not start: the JSON and the table still show
            self._give_up(str(exc) if isinstance(exc, TimeoutError) else f"kaleido could not draw: "
                          f"{type(exc).__name__}" + (f": {str(exc).splitlines()[0][:200]}" if str(exc) else ""))
            return None

    def _start(self) -> None:
        import asyncio
        import atexit
        import threading

        import logging

        import kaleido

        # kaleido's Chrome driver logs its own troubles (a Chrome that exits: "Wait expired, Browser is
        # being closed by watchdog.") — with no handler configured, Python prints them to stderr, which in
        # a kernel is the user's cell (seen in CI under load). They are ours to report, once, in ``why``.
        for name in ("choreographer", "kaleido"):
            chatty = logging.getLogger(name)
            if not chatty.handlers and not logging.getLogger().handlers:
                chatty.addHandler(logging.NullHandler())
                chatty.propagate = False

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="torch_adapter: static charts", daemon=True).start()

        async def open_browser() -> Any:
            browser = kaleido.Kaleido(n=1, timeout=self.RENDER_S)
            await browser.open()
            return browser

        self.browser = self._bounded(open_browser(), self.START_S,
                                     f"kaleido's Chrome did not start in {self.START_S:.0f} s")
        atexit.register(self.stop)

    def _bounded(self, coro: Any, seconds: float, message: str) -> Any:
        """``coro``'s result, run on the charts' loop; TimeoutError(``message``) past ``seconds``."""
        import asyncio
        import concurrent.futures

        job = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return job.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            job.cancel()
            raise TimeoutError(message) from None

    def _give_up(self, why: str) -> None:
        self.why = why
        self.stop()

    def stop(self) -> None:
        """Close the browser (bounded: at most 5 s) and the thread's loop."""
        import asyncio

        loop, browser, self.browser = self.loop, self.browser, None
        if loop is None:
            return
        if browser is not None:
            try:
                asyncio.run_coroutine_threadsafe(browser.close(), loop).result(timeout=5)
            except Exception:  # a browser that will not close is left to the OS at exit
                pass
        loop.call_soon_threadsafe(loop.stop)
        self.loop = None


_CHARTS = _StaticCharts()


def _palette(png: bytes) -> bytes:
    """``png`` with at most 64 colours (Pillow, where it is installed; else as drawn): a chart of flat
    colours and text loses nothing visible and takes about a fifth of the bytes (a 60-bar inspector
    chart: 29 kB drawn, 6 kB so), which is what keeps a saved chart's output under 50 kB."""
    try:
        import io

        from PIL import Image
    except ImportError:
        return png
    try:
        out = io.BytesIO()
        fast = getattr(getattr(Image, "Quantize", None), "FASTOCTREE", 2)  # ~15 ms a chart (median cut: ~50)
        Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=64, method=fast).save(out, format="PNG", optimize=True)
    except Exception:  # an image Pillow cannot read: the one drawn
        return png
    small = out.getvalue()
    return small if len(small) < len(png) else png


def static_png(fig: Any) -> bytes | None:
    """The chart as a PNG (kaleido with a Chrome it finds, bounded in time: :class:`_StaticCharts`), or
    None where there is none (``TORCH_ADAPTER_STATIC_CHARTS=0`` turns it off; :func:`static_png_why`
    says why not); never an error for the cell."""
    return _CHARTS.png(fig)


def static_png_why() -> str | None:
    """Why this kernel draws no static charts (None: it does, or has not tried)."""
    return _CHARTS.why
