/**
 * Pure renderings of routing payloads: badge text, colour level, tooltip and
 * totals. Everything the badge, the side panel and the MIME renderer show is
 * computed here (and unit-tested in test/format.test.ts).
 */

import { IRouteCounts, IRoutingPayload, ISessionTotals } from './schema';

/** How a badge is coloured: `fallback` is the only alarming one. */
export type Level = 'native' | 'composite' | 'fallback';

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

/** "412 native · 37 composite · 3 CPU" (op calls; compact, or exact with separators). */
export function badgeText(counts: IRouteCounts, exact = false): string {
  const f = exact ? formatExact : formatCount;
  return `${f(counts.native)} native · ${f(counts.composite)} composite · ${f(counts.fallback)} CPU`;
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

/** Coloured when something fell back to the CPU; composite is worth a hint. */
export function badgeLevel(counts: IRouteCounts): Level {
  if (counts.fallback > 0) {
    return 'fallback';
  }
  return counts.composite > 0 ? 'composite' : 'native';
}

/** "mps (simulated)" or "cpu". */
export function targetLabel(payload: Pick<IRoutingPayload, 'target' | 'simulated'>): string {
  return payload.simulated ? `${payload.target} (simulated)` : payload.target;
}

/** One line per fallback op shown under a badge: op, calls, site (reason apart). */
export function fallbackLine(fb: { op: string; calls: number; site: string | null }): string {
  return `${fb.op} ×${formatExact(fb.calls)}${fb.site ? ` at ${fb.site}` : ''}`;
}

/** The badge's tooltip: target, exact counts, top fallback ops with reasons, costs. */
export function tooltipText(payload: IRoutingPayload, topFallbacks = 5): string {
  const c = payload.counts;
  const o = payload.ops;
  const lines = [
    `torch_adapter · target ${targetLabel(payload)} · policy ${payload.policy}`,
    `Op calls: ${formatExact(c.native)} native, ${formatExact(c.composite)} composite, ` +
      `${formatExact(c.fallback)} CPU fallback`,
    `Distinct ops: ${o.native} native, ${o.composite} composite, ${o.fallback} fallback`
  ];
  const shown = payload.top_fallbacks.slice(0, Math.max(0, topFallbacks));
  if (shown.length) {
    lines.push('Fell back to the CPU (most calls first):');
    for (const fb of shown) {
      const where = fb.site ? ` at ${fb.site}` : '';
      const why = fb.reason ? ` — ${fb.reason}` : '';
      lines.push(`  ${fb.op} ×${formatExact(fb.calls)}${where}${why}`);
    }
    const hidden = payload.top_fallbacks.length - shown.length;
    if (hidden > 0) {
      lines.push(`  … and ${hidden} more`);
    }
  } else if (c.fallback > 0) {
    lines.push('Some ops fell back to the CPU (run %%adapter_trace for the table).');
  } else {
    lines.push('Nothing fell back to the CPU.');
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
  const costs = [`cell ${formatMs(payload.wall_ms)}`];
  if (payload.op_time_ms !== null) {
    costs.push(`traced ops ${formatMs(payload.op_time_ms)}`);
  }
  if (payload.bytes_copied > 0) {
    costs.push(`${formatBytes(payload.bytes_copied)} copied to/from the CPU`);
  }
  lines.push(costs.join(' · '));
  return lines.join('\n');
}

/** Sum of op calls over payloads (one per cell), with the number of cells. */
export function sumCounts(payloads: Iterable<IRoutingPayload>): ISessionTotals {
  const totals: ISessionTotals = { cells: 0, native: 0, composite: 0, fallback: 0 };
  for (const p of payloads) {
    totals.cells += 1;
    totals.native += p.counts.native;
    totals.composite += p.counts.composite;
    totals.fallback += p.counts.fallback;
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
  const total = counts.native + counts.composite + counts.fallback;
  if (total === 0) {
    return { native: 0, composite: 0, fallback: 0 };
  }
  return {
    native: (100 * counts.native) / total,
    composite: (100 * counts.composite) / total,
    fallback: (100 * counts.fallback) / total
  };
}
