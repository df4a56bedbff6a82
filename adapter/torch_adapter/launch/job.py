"""One report for a whole multi-process job: every rank on every node, whether it ran adapted,
what it routed how, and the ranks that did something the others did not (suspected stragglers).

A node's ``torch-adapter run --report-json node0.json torchrun …`` (form B) holds its own ranks
(``processes``, and ``job``: this module over them); a rank's ``torchrun … -m torch_adapter run
--report-json rank-{rank}.json`` (form A) holds one (``process``). ``torch-adapter report merge
FILE… --output job.json`` reads any mix of them and writes one job report (schema
``torch-adapter.job-report``, docs/launchers.md "One report for the job").

Why a merge of files, not the c10d store: the files exist without a live job (a rank that died, a
node whose agent left first, a launcher that is not torchrun: mpiexec, srun), need no port or
rendezvous of the adapter's own, and a node whose ranks ran without the adapter is still seen — by
the rank its node's launcher expected and nobody announced; copying them to one place (or a shared
folder) is the job script's last line. The per-rank facts are pure data here: no torch, no session.

A rank **did not run adapted** when its node's launcher started it (the launcher's own count:
``--nproc-per-node``, ``-n``; else the local world size the other ranks saw) but no adapted process
announced that local rank, or when the job's world size names a rank no file holds. That is an error
(``EXIT_UNADAPTED``), never a silent plain run.

A **suspected straggler** is a rank whose calls of an op on a route differ from what most ranks did
(the majority; on a tie the smaller count, so the rank that did more is the one named) — CPU
fallbacks and refused ops first, with the op and the user's line: a rank that falls back where the
others do not waits on host copies while the others wait on it at the next collective.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .hang import job_findings, render_lines

__all__ = ["SCHEMA", "VERSION", "EXIT_UNADAPTED", "rank_entry", "build", "merge_files", "render", "expected_local",
           "expected_tasks", "missing_in_job", "MergeError"]

SCHEMA, VERSION = "torch-adapter.job-report", 1
EXIT_UNADAPTED = 4  # the job ran, but some rank did not run adapted (docs/cli.md, exit codes)
_SLOW = ("refused", "fallback")  # the routes a straggler is looked for on first
_SHOWN_PER_RANK = 5


class MergeError(Exception):
    """A file ``report merge`` cannot read as a node or rank report (its message says which, and why)."""


def rank_entry(record: dict[str, Any]) -> dict[str, Any]:
    """One rank's facts from a child's record (launch/child_report.py) or this process's own."""
    routing = record.get("routing") or {}
    ops: dict[tuple[str, str], dict[str, Any]] = {}
    for row in routing.get("ops", []):
        key = (row["op"], row["route"])
        one = ops.setdefault(key, {"op": row["op"], "route": row["route"], "calls": 0, "sites": [],
                                   "code": row.get("code", ""), "self_ms": 0.0, "bytes_copied": 0})
        one["calls"] += int(row.get("calls", 0))
        one["self_ms"] += float(row.get("self_time_ms", 0.0))
        one["bytes_copied"] += int(row.get("bytes_copied", 0))
        site = site_text(row.get("site"))
        if site and site not in one["sites"]:
            one["sites"].append(site)
    launch = record.get("launch") or {}
    return {
        "rank": record.get("rank"), "world_size": record.get("world_size"),
        "local_rank": launch.get("local_rank"), "local_world_size": launch.get("local_world_size"),
        "node": launch.get("node"), "node_rank": launch.get("node_rank"), "launcher": launch.get("launcher"),
        "pid": record.get("pid"), "state": record.get("state"), "adapted": True,
        "target": record.get("target"), "seconds": record.get("seconds"),
        "routes": routing.get("summary"),
        "op_ms": round(sum(o["self_ms"] for o in ops.values()), 3),
        "bytes_copied": sum(o["bytes_copied"] for o in ops.values()),
        "fallbacks": [{k: o[k] for k in ("op", "route", "calls", "code", "sites")}
                      for o in sorted(ops.values(), key=lambda o: (-o["calls"], o["op"])) if o["route"] in _SLOW],
        "op_calls": {f"{o['route']} {o['op']}": o["calls"] for o in ops.values()},
        "sites": {f"{o['route']} {o['op']}": o["sites"][:3] for o in ops.values() if o["sites"]},
        **({"hang": record["hang"]} if record.get("hang") else {}),  # launch/hang.py: a collective that hung
    }


def site_text(site: Any) -> str | None:
    """A routing-log row's site (``{"file", "line", "function"}``) as reports show it: ``train.py:17``."""
    if isinstance(site, dict):
        from ..core.callsite import site_text as _text  # a file under the working directory relative to it

        try:
            return _text(site) or None
        except Exception:  # noqa: BLE001 - a site from another version's report: its own words
            return f"{site.get('file', '?')}:{site.get('line', '?')}"
    return str(site) if site else None


def expected_local(argv: list[str]) -> int | None:
    """How many ranks the launcher command ``argv`` starts on this node, from its own arguments
    (torchrun's ``--nproc-per-node N``, mpiexec's ``-n N``, srun's ``--ntasks-per-node N`` or ``-n`` over
    ``-N``); None when they do not say or the launcher decides itself (accelerate, deepspeed: the ranks'
    local world size is used then)."""
    import os

    name = os.path.basename(argv[0]) if argv else ""
    args = argv[1:]

    def value(*flags: str) -> str | None:
        for i, tok in enumerate(args):
            for flag in flags:
                if tok == flag and i + 1 < len(args):
                    return args[i + 1]
                if tok.startswith(flag + "="):
                    return tok.split("=", 1)[1]
        return None

    def number(text: str | None) -> int | None:
        return int(text) if text and text.isdigit() else None

    if name == "torchrun":
        return number(value("--nproc-per-node", "--nproc_per_node"))
    if name in ("mpiexec", "mpirun", "orterun"):
        return number(value("-n", "-np", "--np", "-c", "--n"))
    if name == "srun":
        tasks, nodes, per_node = _srun_counts(args)
        if per_node is not None:
            return per_node
        return tasks // nodes if tasks is not None and nodes and tasks % nodes == 0 else None
    return None  # accelerate starts one process without --multi_gpu on a CPU machine; deepspeed counts GPUs


def _srun_counts(args: list[str]) -> tuple[int | None, int | None, int | None]:
    """srun's ``-n``/``--ntasks``, ``-N``/``--nodes`` (a plain count, not a range) and ``--ntasks-per-node``,
    in any of its spellings (``-n 4``, ``-n4``, ``--ntasks=4``); None for what they do not say."""
    def value(short: str | None, *long: str) -> int | None:
        for i, tok in enumerate(args):
            got = None
            if tok in long or tok == short:
                got = args[i + 1] if i + 1 < len(args) else None
            elif short and tok.startswith(short) and not tok.startswith("--"):
                got = tok[len(short):]
            else:
                got = next((tok.split("=", 1)[1] for flag in long if tok.startswith(flag + "=")), None)
            if got is not None:
                return int(got) if got.isdigit() else None
        return None

    return (value("-n", "--ntasks"), value("-N", "--nodes"), value(None, "--ntasks-per-node"))


def expected_tasks(argv: list[str]) -> int | None:
    """How many ranks a launcher that starts the whole job at once (``srun``: every node's tasks from this
    one command) starts in all, from its arguments (``-n 4``; ``-N 2 --ntasks-per-node 2``); None otherwise."""
    import os

    if not argv or os.path.basename(argv[0]) != "srun":
        return None
    tasks, nodes, per_node = _srun_counts(argv[1:])
    if tasks is not None:
        return tasks
    return nodes * per_node if nodes is not None and per_node is not None else None


def missing_in_job(ranks: list[dict[str, Any]], expected: int | None, launcher: str) -> list[dict[str, Any]]:
    """The global ranks a whole-job launcher (srun) started that no adapted process announced: ``expected``
    from its arguments, else the world size the ranks saw. Where the announced ranks lie in blocks (rank =
    node rank × tasks per node + local rank: SLURM's default distribution), a missing rank's node and local
    rank are named from them."""
    worlds = {r.get("world_size") for r in ranks} - {None}
    size = expected or (max(worlds) if worlds else None)
    if not size:
        return []
    seen = {r["rank"] for r in ranks if r.get("rank") is not None}
    counts = {r.get("local_world_size") for r in ranks} - {None}
    per_node = counts.pop() if len(counts) == 1 else None
    blocks = per_node is not None and all(
        r.get("rank") is not None and r.get("node_rank") is not None and r.get("local_rank") is not None
        and divmod(r["rank"], per_node) == (r["node_rank"], r["local_rank"]) for r in ranks)
    names = {r["node_rank"]: r.get("node") for r in ranks if r.get("node_rank") is not None}
    out = []
    for rank in sorted(set(range(size)) - seen):
        node_rank, local = divmod(rank, per_node) if blocks and per_node else (None, None)
        node = names.get(node_rank)
        where = f" on {node_label(node, node_rank)}" if node_rank is not None else ""
        out.append({"rank": rank, "world_size": size, "local_rank": local, "node": node, "node_rank": node_rank,
                    "launcher": launcher, "adapted": False,
                    "why": f"{launcher} started {size} task(s){where}; rank {rank} never announced itself as adapted "
                           f"(no TORCH_ADAPTER_AUTOINSTALL in its environment, an interpreter without torch_adapter, "
                           f"or it died before Python started)"})
    return out


def _node_key(entry: dict[str, Any]) -> tuple[Any, Any]:
    return (entry.get("node_rank") if entry.get("node_rank") is not None else -1, entry.get("node") or "?")


def node_label(node: str | None, node_rank: int | None) -> str:
    """``node1 (node rank 1)``; ``node ?`` for a rank no node's report holds."""
    name = node or "node ?"
    return f"{name} (node rank {node_rank})" if node_rank is not None else name


def rank_label(entry: dict[str, Any]) -> str:
    """``rank 3 (node1, node rank 1, local rank 1)``."""
    who = f"rank {entry['rank']}" if entry.get("rank") is not None else f"pid {entry.get('pid')}"
    where = [entry.get("node") or "node ?"]
    if entry.get("node_rank") is not None:
        where.append(f"node rank {entry['node_rank']}")
    if entry.get("local_rank") is not None:
        where.append(f"local rank {entry['local_rank']}")
    return f"{who} ({', '.join(where)})"


def missing_on_node(ranks: list[dict[str, Any]], expected: int | None, node: str,
                    launcher: str) -> list[dict[str, Any]]:
    """The local ranks a node's launcher started that no adapted process announced."""
    seen = {r["local_rank"] for r in ranks if r.get("local_rank") is not None}
    size = expected or max((r.get("local_world_size") or 0 for r in ranks), default=0) or None
    if size is None:
        return []
    node_ranks = {r.get("node_rank") for r in ranks} - {None}
    node_rank = node_ranks.pop() if len(node_ranks) == 1 else None
    worlds = {r.get("world_size") for r in ranks} - {None}
    out = []
    for local in sorted(set(range(size)) - seen):
        rank = node_rank * size + local if node_rank is not None else None  # torchrun's homogeneous assignment
        out.append({"rank": rank, "world_size": worlds.pop() if len(worlds) == 1 else None, "local_rank": local,
                    "node": node, "node_rank": node_rank, "launcher": launcher, "adapted": False,
                    "why": f"{launcher} on {node_label(node, node_rank)} started {size} rank(s); local rank {local} "
                           f"never announced itself as adapted (no TORCH_ADAPTER_AUTOINSTALL in its environment, "
                           f"an interpreter without torch_adapter, or it died before Python started)"})
    return out


def build(ranks: list[dict[str, Any]], unadapted: list[dict[str, Any]] | None = None,
          sources: list[str] | None = None, *, whole_job: bool = True) -> dict[str, Any]:
    """The job report over every rank's entry (and the ranks known to have run unadapted).
    ``whole_job``: every rank of the world size should be here (a merge); False for one node's ranks."""
    ranks = sorted(ranks, key=lambda r: (r.get("rank") is None, r.get("rank") or 0, _node_key(r), r.get("pid") or 0))
    unadapted = list(unadapted or [])
    worlds = [r.get("world_size") for r in ranks + unadapted if r.get("world_size")]
    world = max(worlds) if worlds else None
    have = {r["rank"] for r in ranks if r.get("rank") is not None}
    named = {u.get("rank") for u in unadapted}
    absent = [rank for rank in range(world or 0) if rank not in have and rank not in named] if whole_job else []
    unnamed = [u for u in unadapted if u.get("rank") is None]  # a node's missing local rank, global rank unknown
    if len(unnamed) == len(absent) == 1:
        unnamed[0]["rank"], absent = absent[0], []
    elif unnamed and absent:
        for u in unnamed:
            u["why"] += f" (the job's ranks without a report: {', '.join(map(str, absent))})"
        absent = []
    for rank in absent:
        unadapted.append({"rank": rank, "world_size": world, "adapted": False, "node": None, "node_rank": None,
                          "local_rank": None,
                          "why": f"the job has {world} ranks and no report holds rank {rank}: it did not run "
                                 f"adapted, or its node's report was not given to the merge"})
    duplicates = sorted(r for r, n in Counter(r.get("rank") for r in ranks if r.get("rank") is not None).items() if n > 1)
    nodes: dict[tuple[Any, Any], dict[str, Any]] = {}
    for r in ranks + unadapted:
        key = _node_key(r)
        n = nodes.setdefault(key, {"node": r.get("node"), "node_rank": r.get("node_rank"), "ranks": [],
                                   "unadapted": [], "routes": Counter(), "fallback_calls": 0, "bytes_copied": 0,
                                   "seconds": None, "op_ms": 0.0})
        if not r.get("adapted", True):
            n["unadapted"].append(r.get("rank") if r.get("rank") is not None else f"local {r.get('local_rank')}")
            continue
        n["ranks"].append(r.get("rank"))
        n["routes"].update(r.get("routes") or {})
        n["fallback_calls"] += sum(f["calls"] for f in r.get("fallbacks", []))
        n["bytes_copied"] += r.get("bytes_copied") or 0
        n["op_ms"] = round(n["op_ms"] + (r.get("op_ms") or 0.0), 3)
        if r.get("seconds") is not None:
            n["seconds"] = max(n["seconds"] or 0.0, r["seconds"])
    node_rows = [{**n, "label": node_label(n["node"], n["node_rank"]), "routes": dict(n["routes"])}
                 for _, n in sorted(nodes.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]
    total: Counter = Counter()
    for r in ranks:
        total.update(r.get("routes") or {})
    return {"schema": SCHEMA, "version": VERSION, "world_size": world, "ok": not unadapted, "whole_job": whole_job,
            "ranks": [{**r, "label": rank_label(r)} for r in ranks],
            "unadapted": [{**u, "label": rank_label(u) if u.get("rank") is not None or u.get("node") else
                           f"rank {u.get('rank')}"} for u in unadapted],
            "duplicate_ranks": duplicates,
            "nodes": node_rows, "routes": dict(total), "stragglers": stragglers(ranks),
            **({"hang": hang} if (hang := job_findings(ranks + unadapted)) else {}),
            **({"sources": sources} if sources else {})}


def _majority(values: list[int]) -> int:
    counts = Counter(values)
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)  # a tie: the smaller, so the rank that did more is named


def stragglers(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks whose calls of an op on a route differ from most ranks' — fallbacks and refusals first."""
    rows = [r for r in ranks if r.get("routes") is not None]
    if len(rows) < 2:
        return []
    keys = sorted({k for r in rows for k in r.get("op_calls", {})},
                  key=lambda k: (k.split(" ", 1)[0] not in _SLOW, k))
    found: dict[int, list[dict[str, Any]]] = {}
    for key in keys:
        values = [r.get("op_calls", {}).get(key, 0) for r in rows]
        usual = _majority(values)
        route, op = key.split(" ", 1)
        sites = next((r["sites"][key] for r in rows if key in r.get("sites", {})), [])
        for i, (r, v) in enumerate(zip(rows, values)):
            if v != usual:
                own = r.get("sites", {}).get(key, [])
                found.setdefault(i, []).append({"op": op, "route": route, "calls": v, "usual_calls": usual,
                                                "site": (own or sites or [None])[0]})
    out = []
    for i, diffs in sorted(found.items(), key=lambda kv: (kv[1][0]["route"] not in _SLOW, rows[kv[0]].get("rank") or 0)):
        r = rows[i]
        slow = [d for d in diffs if d["route"] in _SLOW]
        first = (slow or diffs)[0]
        why = (f"{first['route']} {first['op']}: {first['calls']} call(s) where most ranks made {first['usual_calls']}"
               + (f", at {first['site']}" if first["site"] else ""))
        out.append({"rank": r.get("rank"), "node": r.get("node"), "node_rank": r.get("node_rank"),
                    "label": rank_label(r), "op": first["op"], "route": first["route"], "site": first["site"],
                    "calls": first["calls"], "usual_calls": first["usual_calls"], "why": why,
                    "differences": diffs[:_SHOWN_PER_RANK], "more_differences": max(0, len(diffs) - _SHOWN_PER_RANK)})
    return out


def _entries_of(payload: dict[str, Any], path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rank entries, unadapted entries) of one file: a node report, a rank report or a job report."""
    if payload.get("schema") == SCHEMA:
        return list(payload.get("ranks", [])), [u for u in payload.get("unadapted", []) if u.get("local_rank") is not None]
    if isinstance(payload.get("job"), dict):
        job = payload["job"]
        return list(job.get("ranks", [])), [u for u in job.get("unadapted", []) if u.get("local_rank") is not None]
    if isinstance(payload.get("process"), dict):
        return [payload["process"]], []
    raise MergeError(f"torch-adapter report merge: expected a node's or a rank's --report-json (or a job report), "
                     f"got {path!r}, which has no 'job' or 'process' entry. Why: only a run under a launcher "
                     f"records its ranks. Fix: give the files of `torch-adapter run --report-json F torchrun ...` "
                     f"(one per node) or of `torchrun ... -m torch_adapter run --report-json rank-{{rank}}.json` "
                     f"(one per rank)")


def merge_files(paths: list[str]) -> dict[str, Any]:
    """The job report over node / rank report files (MergeError for one that is not one)."""
    ranks: list[dict[str, Any]] = []
    unadapted: list[dict[str, Any]] = []
    seen: set[tuple[Any, Any]] = set()
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                payload = json.load(fh)
        except OSError as exc:
            raise MergeError(f"torch-adapter report merge: expected a readable report file, got {path!r}: "
                             f"{exc.strerror}. Fix: check the path (each node writes its own --report-json)") from None
        except ValueError as exc:
            raise MergeError(f"torch-adapter report merge: expected JSON, got {path!r}: {exc}. Why: a report "
                             f"still being written, or another file. Fix: merge after every node has ended") from None
        if not isinstance(payload, dict):
            raise MergeError(f"torch-adapter report merge: expected a JSON object, got {type(payload).__name__} "
                             f"in {path!r}. Fix: give the files --report-json wrote")
        got, missing = _entries_of(payload, path)
        for r in got:
            key = (r.get("node"), r.get("pid"))
            if key not in seen:  # one file given twice, or a job report merged with its own nodes
                seen.add(key)
                ranks.append({k: v for k, v in r.items() if k != "label"})
        unadapted += [{k: v for k, v in u.items() if k != "label"} for u in missing]
    return build(ranks, unadapted, sources=list(paths))


def _bytes(n: int | None) -> str:
    from ..routing.wording import format_bytes

    return format_bytes(n or 0)


def render(job: dict[str, Any], console: Any, *, title: str = "torch_adapter job") -> None:
    """The job on the terminal: one row per rank and per node, then the unadapted ranks and the stragglers."""
    from rich.table import Table

    ranks, nodes = job["ranks"], job["nodes"]
    world = job.get("world_size")
    table = Table(title=f"{title}: {len(ranks)} adapted rank(s)" + (f" of {world}" if world else "")
                  + f" on {len(nodes)} node(s)", title_justify="left")
    for col, justify in (("rank", "right"), ("node", "left"), ("local", "right"), ("adapted", "left"),
                         ("native", "right"), ("composite", "right"), ("fallback", "right"), ("refused", "right"),
                         ("copied", "right"), ("op ms", "right"), ("s", "right")):
        table.add_column(col, justify=justify)
    flagged = {s["rank"] for s in job["stragglers"]}
    for r in ranks + job["unadapted"]:
        routes = r.get("routes") or {}
        adapted = r.get("adapted", True)
        mark = "[red]NO[/red]" if not adapted else ("yes, [yellow]straggler?[/yellow]" if r.get("rank") in flagged
                                                    else "yes")
        table.add_row(str(r.get("rank", "?")), node_label(r.get("node"), r.get("node_rank")),
                      "" if r.get("local_rank") is None else str(r["local_rank"]), mark,
                      *(str(routes.get(k, "")) if adapted else "" for k in ("native", "composite", "fallback", "refused")),
                      _bytes(r.get("bytes_copied")) if adapted else "", f"{r.get('op_ms') or 0:.1f}" if adapted else "",
                      f"{r['seconds']:.1f}" if r.get("seconds") is not None else "")
    console.print(table)
    if len(nodes) > 1:
        per_node = Table(title="per node", title_justify="left")
        for col in ("node", "ranks", "native", "composite", "fallback", "copied", "slowest s"):
            per_node.add_column(col)
        for n in nodes:
            per_node.add_row(n["label"], ", ".join(map(str, n["ranks"])) + (
                f" (not adapted: {', '.join(map(str, n['unadapted']))})" if n["unadapted"] else ""),
                *(str(n["routes"].get(k, 0)) for k in ("native", "composite", "fallback")),
                _bytes(n["bytes_copied"]), f"{n['seconds']:.1f}" if n["seconds"] is not None else "")
        console.print(per_node)
    for s in job["stragglers"]:
        console.print(f"[yellow]suspected straggler[/yellow]: {s['label']}: {s['why']}", highlight=False)
        for d in s["differences"][1:]:
            console.print(f"    also {d['route']} {d['op']}: {d['calls']} call(s), most made {d['usual_calls']}"
                          + (f" ({d['site']})" if d["site"] else ""), highlight=False)
    for line in render_lines(job.get("hang")):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for d in job.get("duplicate_ranks", []):
        console.print(f"[red]rank {d} appears in more than one report[/red] (a file from another run?)")
    for u in job["unadapted"]:
        console.print(f"[red]error[/red]: {u['label']} did not run adapted: {u['why']}", highlight=False)
    if job["unadapted"]:
        console.print("Fix: keep TORCH_ADAPTER_AUTOINSTALL in every rank's environment (an MPI launcher across "
                      "hosts: `mpiexec -x TORCH_ADAPTER_AUTOINSTALL`), or launch `-m torch_adapter run` as each "
                      "rank's program", highlight=False)
