/**
 * Pure renderings of routing payloads: badge text, colour level, tooltip and
 * totals. Everything the badge, the side panel and the MIME renderer show is
 * computed here (and unit-tested in test/format.test.ts).
 */

import { IFallbackOp, IRouteCounts, IRoutingPayload, ISessionTotals, Route, ROUTES, zeroCounts } from './schema';

/** How a badge is coloured: `refused` and `fallback` are the alarming ones. */
export type Level = 'native' | 'composite' | 'fallback' | 'refused';

/** The word after a count in a pill ("3 CPU"); routing/wording.py's SHORT. */
export const SHORT: Readonly<Record<Route, string>> = {
  native: 'native',
  composite: 'composite',
  yours: 'yours',
  fallback: 'CPU',
  refused: 'refused'
};

/** The words in a sentence; routing/wording.py's LONG. */
export const LONG: Readonly<Record<Route, string>> = {
  native: 'native',
  composite: 'composite',
  yours: 'your implementation',
  fallback: 'CPU fallback',
  refused: 'refused'
};

/** The routes a count line always shows; `yours` and `refused` only when non-zero. */
function shown(counts: IRouteCounts): Route[] {
  return ROUTES.filter(r => r === 'native' || r === 'composite' || r === 'fallback' || counts[r] > 0);
}

/** 412 → "412", 12345 → "12.3k", 2500000 → "2.5M". */
export function formatCount(n: number): string {
  const value = Math.max(0, Math.round(n));
  if (value < 10_000) {
    return String(value);
  }
  if (value < 1_000_000) {
    return `${trim(value / 1_000)}k`;
  }
  return `${trim(value / 1_000_000)}M`;
}

function trim(x: number): string {
  return (x < 100 ? x.toFixed(1) : x.toFixed(0)).replace(/\.0$/, '');
}

/** 12345 → "12,345" (tooltips show exact numbers). */
export function formatExact(n: number): string {
  return String(Math.max(0, Math.round(n))).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = Math.max(0, bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

export function formatMs(ms: number | null): string {
  if (ms === null) {
    return '?';
  }
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

/**
 * "412 native · 37 composite · 3 CPU" (op calls; compact, or exact with
 * separators), with "· 2 yours" and "· 1 refused" where there are any.
 */
export function badgeText(counts: IRouteCounts, exact = false): string {
  const routes = shown(counts);
  // One format per line: where any count needs "k"/"M", every count of 1,000 or more takes it too
  // ("11.4k native · 5.2k composite · 3 CPU", never "11.4k native · 5189 composite").
  const compact = !exact && routes.some(r => counts[r] >= 10_000);
  const f = compact ? (n: number) => (n >= 1_000 ? compactCount(n) : formatExact(n)) : formatExact;
  return routes.map(r => `${f(counts[r])} ${SHORT[r]}`).join(' · ');
}

/** 1234 → "1.2k", 12345 → "12.3k", 2500000 → "2.5M" (for counts of 1,000 or more). */
function compactCount(n: number): string {
  const value = Math.max(0, Math.round(n));
  return value < 1_000_000 ? `${trim(value / 1_000)}k` : `${trim(value / 1_000_000)}M`;
}

/** " · compiled 1 graph" / " · compiled 2 graphs, 1 break" where torch.compile compiled in the cell, else "". */
export function compiledText(payload: Pick<IRoutingPayload, 'compiled'>): string {
  const c = payload.compiled;
  if (!c) {
    return '';
  }
  const parts = [`compiled ${c.graphs} ${c.graphs === 1 ? 'graph' : 'graphs'}`];
  if (c.graph_breaks) {
    parts.push(`${c.graph_breaks} ${c.graph_breaks === 1 ? 'break' : 'breaks'}`);
  }
  if (c.failures) {
    parts.push(`${c.failures} failed`);
  }
  return ` · ${parts.join(', ')}`;
}

/** " · 2 dtype refused" / " · dtypes not judged" (simulated targets), else "". */
export function dtypeText(payload: Pick<IRoutingPayload, 'dtypes'>): string {
  const d = payload.dtypes;
  if (!d) {
    return '';
  }
  if (d.calls > 0) {
    return ` · ${formatExact(d.calls)} dtype refused`;
  }
  return d.judged ? '' : ' · dtypes not judged';
}

/** Coloured when the policy refused an op or something fell back to the CPU; composite is worth a hint. */
export function badgeLevel(counts: IRouteCounts): Level {
  if (counts.refused > 0) {
    return 'refused';
  }
  if (counts.fallback > 0) {
    return 'fallback';
  }
  return counts.composite > 0 ? 'composite' : 'native';
}

/** "mps (simulated)", "npu (emulated)" or "cpu". */
export function targetLabel(
  payload: Pick<IRoutingPayload, 'target' | 'simulated'> & { emulated?: boolean }
): string {
  if (payload.simulated) {
    return `${payload.target} (simulated)`;
  }
  return payload.emulated ? `${payload.target} (emulated)` : payload.target;
}

/** A reason led by its stable code: "TA-F001 no MPS kernel and no decomposition; …" (docs/reasons.md). */
export function codedReason(fb: { reason: string; code?: string }): string {
  return fb.code ? `${fb.code} ${fb.reason}` : fb.reason;
}

/** One line per fallback op shown under a badge: op, calls, site (reason apart). */
export function fallbackLine(fb: { op: string; calls: number; site: string | null }): string {
  return `${fb.op} ×${formatExact(fb.calls)}${fb.site ? ` at ${fb.site}` : ''}`;
}

function listOps(lines: string[], title: string, ops: IFallbackOp[], top: number): void {
  const shownOps = ops.slice(0, Math.max(0, top));
  if (!shownOps.length) {
    return;
  }
  lines.push(title);
  for (const fb of shownOps) {
    const where = fb.site ? ` at ${fb.site}` : '';
    const why = fb.reason ? ` — ${codedReason(fb)}` : '';
    lines.push(`  ${fb.op} ×${formatExact(fb.calls)}${where}${why}`);
  }
  if (ops.length > shownOps.length) {
    lines.push(`  … and ${ops.length - shownOps.length} more`);
  }
}

/** The badge's tooltip: target, exact counts, the ops refused, fallen back and yours, with reasons; costs. */
export function tooltipText(payload: IRoutingPayload, topFallbacks = 5): string {
  const c = payload.counts;
  const o = payload.ops;
  const lines = [
    `torch_adapter · target ${targetLabel(payload)} · policy ${payload.policy}`,
    `Op calls: ${shown(c)
      .map(r => `${formatExact(c[r])} ${LONG[r]}`)
      .join(', ')}`,
    `Distinct ops: ${shown(o)
      .map(r => `${o[r]} ${LONG[r]}`)
      .join(', ')}`
  ];
  listOps(lines, `Refused by the fallback policy (${payload.policy}): the call raised`, payload.top_refused, topFallbacks);
  listOps(lines, 'Fell back to the CPU (most calls first):', payload.top_fallbacks, topFallbacks);
  listOps(lines, 'Ran your register_fallback implementation, on the device (nothing copied):', payload.top_yours, topFallbacks);
  if (!payload.top_fallbacks.length) {
    lines.push(
      c.fallback > 0 ? 'Some ops fell back to the CPU (run %%adapter_trace for the table).' : 'Nothing fell back to the CPU.'
    );
  }
  const d = payload.dtypes;
  if (d && d.findings.length) {
    lines.push(`Refused by a real ${payload.target} for their dtype:`);
    for (const f of d.findings) {
      const where = f.site ? ` at ${f.site}` : '';
      lines.push(`  dtype ${f.dtype} not on ${payload.target}: ${f.op} ×${formatExact(f.calls)}${where} — ${f.message}`);
    }
  } else if (d && !d.judged) {
    lines.push(`Dtypes not judged: ${d.note}`);
  }
  if (payload.compiled) {
    lines.push(payload.compiled.line, ...payload.compiled.details.map(d => d.trim()));
  }
  const costs = [`cell ${formatMs(payload.wall_ms)}`];
  if (payload.op_time_ms !== null) {
    // The ops' self times are summed over every thread that ran them (autograd's, DataLoader's, the
    // script's own): the sum can exceed the cell's wall time, and then says so instead of contradicting it.
    const over = payload.wall_ms !== null && payload.op_time_ms > payload.wall_ms;
    costs.push(`traced ops ${formatMs(payload.op_time_ms)}${over ? ' (summed over threads: more than the cell\'s time)' : ''}`);
  }
  if (payload.bytes_copied > 0) {
    costs.push(`${formatBytes(payload.bytes_copied)} copied to/from the CPU`);
  }
  lines.push(costs.join(' · '));
  return lines.join('\n');
}

/** Sum of op calls over payloads (one per cell), with the number of cells. */
export function sumCounts(payloads: Iterable<IRoutingPayload>): ISessionTotals {
  const totals: ISessionTotals = { cells: 0, ...zeroCounts() };
  for (const p of payloads) {
    totals.cells += 1;
    for (const route of ROUTES) {
      totals[route] += p.counts[route];
    }
  }
  return totals;
}

/**
 * The kernel's session totals as the front end knows them: the `session`
 * field of the payload that counted most cells (the kernel's counter only
 * grows until it restarts; ties go to the later payload). Without any
 * `session` field, the sum of the payloads received.
 */
export function sessionTotals(payloads: readonly IRoutingPayload[]): ISessionTotals {
  let best: ISessionTotals | null = null;
  for (const p of payloads) {
    if (p.session && (best === null || p.session.cells >= best.cells)) {
      best = p.session;
    }
  }
  return best ? { ...best } : sumCounts(payloads);
}

/** "3 cells · 1,900 native · 80 composite · 5 CPU" (exact numbers). */
export function totalsText(totals: ISessionTotals): string {
  const cells = `${formatExact(totals.cells)} ${totals.cells === 1 ? 'cell' : 'cells'}`;
  return `${cells} · ${badgeText(totals, true)}`;
}

/** The share of op calls per route, in percent (0 when nothing ran). */
export function shares(counts: IRouteCounts): IRouteCounts {
  const total = ROUTES.reduce((sum, r) => sum + counts[r], 0);
  const out = zeroCounts();
  if (total > 0) {
    for (const route of ROUTES) {
      out[route] = (100 * counts[route]) / total;
    }
  }
  return out;
}
