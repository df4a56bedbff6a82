"""``torch-adapter report merge FILE… [--output job.json]``: one report for a multi-node job.

FILE: each node's ``torch-adapter run --report-json F torchrun …`` (form B) or each rank's
``torchrun … -m torch_adapter run --report-json rank-{rank}.json`` (form A), copied to one place
(or written to a shared folder). Prints one row per rank and per node, the ranks that did not run
adapted and the suspected stragglers (launch/job.py); ``--output`` writes the job report (schema
``torch-adapter.job-report``, docs/launchers.md). Exit codes: 0 every rank ran adapted; 4 some rank
did not (named, with its node); 2 a file that is not a report, or an output that cannot be written.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["register", "merge"]


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="reports of several runs: `report merge` one job's node/rank reports into one",
                       description=__doc__.split("\n\n")[0])
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    m = verbs.add_parser("merge", help="one job report from each node's (or rank's) --report-json",
                         description=__doc__.split("\n\n")[1])
    m.add_argument("files", nargs="+", metavar="FILE", help="a node's or a rank's --report-json")
    m.add_argument("--output", "-o", metavar="PATH", help="write the job report (JSON) to PATH")
    m.add_argument("--json", action="store_true", help="print the job report as JSON instead of the tables")
    m.set_defaults(func=merge)


def merge(args: Any) -> int:
    from ..core.command import EXIT_USAGE
    from ..core.safe_io import check_output, write_text
    from ..launch.job import EXIT_UNADAPTED, MergeError, merge_files, render

    if args.output:
        check_output(args.output, call="torch-adapter report merge --output")  # before reading anything
    try:
        job = merge_files(args.files)
    except MergeError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    if args.output:
        write_text(args.output, json.dumps(job, indent=1), call="torch-adapter report merge --output")
    if args.json:
        print(json.dumps(job, indent=1))
    else:
        from rich.console import Console

        render(job, Console(width=None if sys.stdout.isatty() else 140))
    return EXIT_UNADAPTED if job["unadapted"] else 0
