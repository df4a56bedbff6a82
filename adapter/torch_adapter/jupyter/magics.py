"""The ``%adapter`` family of magics. Each docstring is that magic's manual (``%adapter?``)."""

from __future__ import annotations

import html
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring


__all__ = ["AdapterMagics", "parse_configs", "CONFIG_HELP"]

CONFIG_HELP = ("plain (no adapter), redirect (redirect only, no observation), adapted (redirect + per-cell "
               "observation), NAME-sim (simulated target NAME, e.g. mps-sim, npu-sim), or a target name (cpu, npu, ...)")


def parse_configs(text: str) -> list[str]:
    """``"plain,adapted,mps-sim"`` → a validated list (UsageError on a bad name)."""
    from ..routing.target import KNOWN

    configs = [c.strip() for c in text.split(",") if c.strip()]
    if not configs:
        raise UsageError(f"--configs: expected a comma-separated list of {CONFIG_HELP}; got {text!r}")
    for c in configs:
        base = c[:-4] if c.endswith("-sim") else c
        if c not in ("plain", "redirect", "adapted") and base not in KNOWN:
            raise UsageError(f"--configs: unknown configuration {c!r}; expected {CONFIG_HELP}")
    if len(set(configs)) != len(configs):
        raise UsageError(f"--configs: {text!r} names a configuration twice")
    return configs


@magics_class
class AdapterMagics(Magics):
    def __init__(self, shell: Any, router: Any) -> None:
        super().__init__(shell)
        self.router = router

    # -- %adapter -----------------------------------------------------------------------
    @magic_arguments()
    @argument("action", nargs="?", default="status",
              help="status (default) | target | policy | observe | dtypes | redirects | fix")
    @argument("value", nargs="?", help="the target name, the policy (allow|warn|error), on|off, or raise|record|off")
    @argument("--simulate", action="store_true", help="with `target`: simulate the target on this machine")
    @argument("--emulate", action="store_true",
              help="with `target`: execute on the emulated device (npu), a real device of the project's own")
    @line_magic
    def adapter(self, line: str = "") -> Any:
        """Show or change the adapter in this kernel.

        ``%adapter``                          target, policy, cells observed, session totals
        ``%adapter target NAME [--simulate | --emulate]`` switch target (auto, cpu, cuda, npu, xpu, mps, ...);
                                              ``npu --emulate``: the emulated npu device
        ``%adapter policy allow|warn|error``  fallback policy for ops the target lacks
        ``%adapter observe on|off``           pause or resume per-cell routing reports
        ``%adapter dtypes raise|record|off``  simulated targets: a dtype the real one refuses raises its
                                              error, is recorded (every call listed), or is not checked
        ``%adapter fix [--apply]``            the last cell's fallbacks and refusals as a verified patch
                                              of the cell (jupyter/fixing.py); --apply: the next input
        ``%adapter redirects``                the migration log: every rewritten call once per site, its
                                              source line, class (same/changed/dummy) and code
        """
        if line.split()[:1] == ["fix"]:  # its own options: jupyter/fixing.py
            from .fixing import fix_magic

            fix_magic(self.shell, self.router, line.strip()[3:])
            return None
        args = parse_argstring(self.adapter, line)
        from ..errors import AdapterError, did_you_mean
        from ..session import configure

        if args.action == "status":
            return self.router.status()
        if args.action == "target":
            if not args.value:
                raise UsageError("%adapter target: expected a target name, e.g. `%adapter target mps --simulate`")
            from ..session import switch

            if not args.emulate:
                _check_target(args.value, args.simulate)
            try:  # the session before is suspended, not closed: `%adapter target` back to it resumes it
                with self.router.unobserved():  # the ops switching runs (target probes) are not the cell's
                    session = switch(args.value, simulate=args.simulate, emulate=args.emulate)
            except AdapterError as exc:
                raise UsageError(str(exc)) from None
            self.router.target, self.router.simulate = args.value, args.simulate
            self.router.emulate = args.emulate
            self.router.session_log.target = session.target.name  # the router's log follows the target
            self.router.session_log.simulated = session.target.simulated
            self.router.session_log.emulated = session.target.emulated
            return self._changed(f"torch_adapter: target {session.target.label}")
        if args.action == "redirects":
            from ..session import current
            from .migration_view import MigrationView

            session = current()
            if session is None:
                raise UsageError("%adapter redirects: expected an installed adapter, got none "
                                 "(%load_ext torch_adapter installs it)")
            return MigrationView(session.redirect_log, session.target.label)
        if args.action == "policy":
            _one_of("%adapter policy", args.value, ("allow", "warn", "error"))
            configure(fallback=args.value)
            return self._changed(f"torch_adapter: fallback policy {args.value}")
        if args.action == "observe":
            _one_of("%adapter observe", args.value, ("on", "off"))
            self.router.observing = args.value == "on"
            return self._changed(f"torch_adapter: per-cell routing {'on' if self.router.observing else 'off'}")
        if args.action == "dtypes":
            _one_of("%adapter dtypes", args.value, ("raise", "record", "off"))
            configure(dtype_check=args.value)
            return self._changed(f"torch_adapter: dtype check {args.value}")
        raise UsageError(f"%adapter: unknown action {args.action!r}"
                         f"{did_you_mean(args.action, ('status', 'target', 'policy', 'observe', 'dtypes', 'redirects', 'fix'))}"
                         "; expected status, target, policy, observe, dtypes, redirects or fix (see %adapter?)")

    def _changed(self, message: str) -> None:
        """Say what changed (a line of text, not a quoted string) and tell the front end."""
        print(message)
        self.router.publish_status()

    # -- %%adapter_trace ---------------------------------------------------------------
    @magic_arguments()
    @argument("--limit", type=int, default=None, help="show at most this many rows")
    @cell_magic
    def adapter_trace(self, line: str, cell: str) -> None:
        """Run the cell and show its full per-op routing table.

        Columns: op, route, calls, self time, bytes copied to/from the CPU, reason, first
        user call site. The RoutingLog is stored as ``_adapter_log`` in the namespace.
        """
        args = parse_argstring(self.adapter_trace, line)
        from ..routing.trace import trace

        with trace(use_observer=False) as log:  # the recorder knows call sites
            self._exec(cell)
        self.shell.user_ns["_adapter_log"] = log
        from IPython.display import display

        # No application/json: JupyterLab would render it first, as a JSON tree (the data is _adapter_log).
        display({"text/plain": log.render(limit=args.limit), "text/html": _log_html(log, args.limit)}, raw=True)

    def _exec(self, cell: str) -> None:
        exec(self._compile(cell), self.shell.user_ns)

    def _compile(self, cell: str) -> Any:
        """Compile like IPython does, so tracebacks and call sites name the cell; the body is
        compiled one line down, so its line numbers are the cell's (line 1 is ``%%magic``)."""
        code = "\n" + self.shell.transform_cell(cell)
        name = self.shell.compile.cache(code, self.shell.execution_count, raw_code=cell)
        return compile(code, name, "exec")

    # -- %%adapter_compare -----------------------------------------------------------------
    @magic_arguments()
    @argument("--configs", default="redirect,adapted", help=f"comma-separated: {CONFIG_HELP}")
    @argument("-n", type=int, default=5, help="at least this many timed runs per configuration (interleaved)")
    @argument("--warmup", type=int, default=1, help="untimed runs per configuration first")
    @argument("--min-time", type=float, default=1.0,
              help="more rounds until the timed runs add up to this many seconds (at most 200 rounds)")
    @cell_magic
    def adapter_compare(self, line: str, cell: str) -> None:
        """Run the cell body under several configurations and compare throughput.

        Rounds are interleaved (A B C, B C A, ...; the order rotates) after warm-up, at least
        ``-n`` rounds and ``--min-time`` seconds of timed runs; the first configuration that
        runs is the baseline. Shows throughput kept per configuration (the median, its 95 %
        bootstrap interval, absolute times, run counts, stalled runs) with a verdict only where
        the runs resolve one ("not resolved" otherwise), and stores the rows of
        :func:`torch_adapter.jupyter.compare.compare` as ``_adapter_compare``.
        """
        args = parse_argstring(self.adapter_compare, line)
        if args.n < 1 or args.warmup < 0 or args.min_time < 0:
            raise UsageError("%%adapter_compare: expected -n >= 1, --warmup >= 0 and --min-time >= 0; got "
                             f"-n {args.n} --warmup {args.warmup} --min-time {args.min_time}")
        configs = parse_configs(args.configs)
        from .compare import compare

        code = self._compile(cell)
        result = compare(lambda: exec(code, self.shell.user_ns), configs, n=args.n, warmup=args.warmup,
                         min_time_s=args.min_time, router=self.router)
        self.shell.user_ns["_adapter_compare"] = result
        _show_comparison(result)

    # -- %adapter_inspector ------------------------------------------------------------------
    @line_magic
    def adapter_inspector(self, line: str = "") -> Any:
        """Open the RoutingInspector: a chart of op calls per cell by route (a plotly figure
        with a static image: it stays in a saved notebook), then the live controls — a
        sortable/filterable op table, an op's reason and call sites on selection. It updates
        once per cell and starts with every cell reported so far; it is kept as
        ``_adapter_inspector``. A newer one, or ``%unload_ext``, closes the controls (their
        output says so); the chart keeps its last state."""
        try:
            from torch_adapter_widgets import RoutingInspector
        except ImportError as exc:
            raise UsageError(f"%adapter_inspector needs the widgets extra: pip install 'torch-adapter[widgets]' ({exc})")

        previous = self.shell.user_ns.get("_adapter_inspector")
        if isinstance(previous, RoutingInspector):  # one live inspector: the earlier one's chart stays as it was
            previous.close("a newer %adapter_inspector replaced them")
        inspector = RoutingInspector.attach(self.router, variable="_adapter_inspector")
        self.shell.user_ns["_adapter_inspector"] = inspector
        # Two outputs, each with a display handle: the chart, updated after each cell (front ends and
        # nbclient follow display updates), and the controls, replaced by a line when they close.
        inspector.show()

    # -- %adapter_check ----------------------------------------------------------------------
    @magic_arguments()
    @argument("path", help="a file or folder to scan")
    @argument("--target", default="any", help="the target to check against (default any)")
    @line_magic
    def adapter_check(self, line: str) -> Any:
        """Scan PATH for CUDA-specific code and show the compatibility report inline."""
        args = parse_argstring(self.adapter_check, line)
        import os

        from .. import check

        if not os.path.exists(args.path):
            raise UsageError(f"%adapter_check: expected a file or folder to scan; got {args.path!r} (no such path)")
        report = check.scan(args.path, target=args.target)
        from IPython.display import display

        page = check.render_html(report)
        counts: dict[str, int] = {}
        for f in report.findings:
            counts[f.severity] = counts.get(f.severity, 0) + 1
        text = f"torch-adapter check {args.path}: {len(report.findings)} findings " + \
            ", ".join(f"{n} {sev}" for sev, n in sorted(counts.items()))
        display({"text/plain": text,
                 "text/html": f'<iframe style="width:100%;height:600px;border:1px solid #ddd" '
                              f'srcdoc="{html.escape(page, quote=True)}"></iframe>'}, raw=True)
        return report


def _one_of(what: str, value: str, choices: tuple[str, ...]) -> None:
    """A UsageError in the magic's words unless ``value`` is one of ``choices`` (with a did-you-mean)."""
    from ..errors import did_you_mean

    if value not in choices:
        allowed = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        raise UsageError(f"{what}: expected {allowed}; got {value!r}{did_you_mean(value, choices)}")


def _check_target(value: str, simulate: bool) -> None:
    """``%adapter target VALUE``: a name this kernel can switch to, or a UsageError in the
    magic's words, with a did-you-mean (difflib) and the ``--simulate`` way to preview a
    target this machine lacks. Paths (``.toml`` profiles) are left to the switch."""
    import difflib

    from ..errors import format_error
    from ..routing.target import KNOWN, detect

    from ..routing.profiles import VARIANTS

    name = value.strip().lower()
    if name in ("auto", "host") or name.endswith(".toml") or "/" in name or (simulate and name in VARIANTS):
        return
    present = [t.name for t in detect() if t.present]
    here = f"this machine has {', '.join(present)}"
    if name not in KNOWN:
        names = ["auto", *KNOWN, *VARIANTS]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        if close:
            guess = close[0]
            fix = f"did you mean `%adapter target {guess}`?"
            if guess not in present and guess != "auto":
                fix += f" This machine has no {guess}: `%adapter target {guess} --simulate` previews it here"
        else:
            fix = (f"name one of {', '.join(names)} ({here}); `%adapter target NAME --simulate` previews "
                   "one this machine lacks, or a profile: `%adapter target my_accel.toml --simulate`")
        raise UsageError(format_error(
            f"%adapter target {value}", f"a target name ({', '.join(names)}) or a profile .toml",
            repr(value), why="that is not a backend torch_adapter knows", fix=fix))
    if name not in present and not simulate:
        raise UsageError(format_error(
            f"%adapter target {value}", f"a target present on this machine ({here})",
            f"{name!r}, which is absent", why="running on a target needs its device",
            fix=f"preview {name} on this machine: `%adapter target {name} --simulate`"
                f" (ops routed as on {name}, computed here); or `%adapter target auto`"))


# The trace table fits a notebook's output (~900 px): long op names and reasons wrap, the
# user's line leads the call-site cell and the library line it went through follows, smaller.
_WRAP = "overflow-wrap:anywhere;word-break:break-word"
_COLUMNS = (("op", "left", f"max-width:24em;{_WRAP}"), ("route", "left", ""), ("calls", "right", ""),
            ("self ms", "right", ""), ("copied", "right", ""), ("first call site", "left", f"max-width:16em;{_WRAP}"),
            ("reason", "left", f"max-width:28em;{_WRAP}"))


def _site_html(site: Any) -> str:
    from ..core.callsite import library_text, site_text

    user, via = site_text(site, library=False), library_text(site)
    return html.escape(user) + (f"<br><small style='color:#666'>via {html.escape(via)}</small>" if via else "")


def _log_html(log: Any, limit: int | None) -> str:
    from ..routing.log import _fmt_bytes, counts_text, tree_prefix
    from ..routing.wording import COLORS

    records = log.tree()
    shown = records[:limit] if limit else records
    head = "".join(f"<th style='text-align:{a}'>{h}</th>" for h, a, _ in _COLUMNS)

    def row(depth: int, r: Any) -> str:
        indent = html.escape(tree_prefix(depth)).replace(" ", "&nbsp;")  # kept where the cell wraps
        cells = (f"<code>{indent}{html.escape(r.op)}</code>",
                 f"<span style='color:{COLORS[r.route]}'>{r.route}</span>", f"{r.calls:,}",
                 f"{r.self_time_ns / 1e6:.2f}", _fmt_bytes(r.bytes_copied) if r.bytes_copied else "",
                 _site_html(r.site), html.escape(r.reason))
        return f"<tr data-route='{r.route}' data-depth='{depth}'>" + "".join(
            f"<td style='text-align:{a};{style}'>{c}</td>" for c, (_, a, style) in zip(cells, _COLUMNS)) + "</tr>"

    body = "".join(row(depth, r) for depth, r in shown)
    body += "".join(  # dtype findings: their own kind, never a route
        "<tr data-route='dtype'>" + "".join(f"<td style='text-align:{a};{style}'>{c}</td>" for c, (_, a, style) in zip((
            f"<code>{html.escape(f['op'])}</code>", f"<span style='color:#6a1b9a'>dtype {html.escape(f['dtype'])}</span>",
            f"{f['calls']:,}", "", "", _site_html(f["site"]),
            f"dtype {html.escape(f['dtype'])} not on {html.escape(log.target)}: {html.escape(f['message'])}"),
            _COLUMNS)) + "</tr>"
        for f in log.dtype_table())
    more = (f"<div>{len(records) - len(shown)} more entries: <code>_adapter_log.table()</code> has them all</div>"
            if len(records) > len(shown) else "")
    s = log.summary()
    from ..routing.log import target_label

    target = target_label(log.target or "?", log.simulated, getattr(log, "emulated", False))
    return (f"<div class='torch-adapter-trace'><b>Routing on {html.escape(target)}</b>: {html.escape(counts_text(s))} "
            f"calls · {_fmt_bytes(log.bytes_copied)} copied"
            f"<table style='max-width:100%'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}</div>")


def _show_comparison(result: dict[str, Any]) -> None:
    from IPython.display import display

    try:
        from torch_adapter_widgets import ThroughputComparison
    except ImportError:
        lines = [f"{k:>12}: could not run: {v['error']}" if v.get("error") else
                 f"{k:>12}: kept {v['kept'] * 100:5.0f} % ({v['kept_low'] * 100:.0f}-{v['kept_high'] * 100:.0f})  "
                 f"median {v['median_s'] * 1e3:.3g} ms of {v['n']} runs  {v['verdict']}" for k, v in result.items()]
        display({"text/plain": "\n".join(lines)}, raw=True)
        return
    view = ThroughputComparison(result)
    display(view.chart_bundle(), raw=True)  # the chart (JupyterLab draws only the chart of a bundle with one)
    display(view.table_bundle(), raw=True)  # and its numbers
