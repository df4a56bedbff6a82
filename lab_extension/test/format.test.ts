import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  badgeLevel,
  badgeText,
  dtypeText,
  formatBytes,
  formatCount,
  formatExact,
  sessionTotals,
  shares,
  sumCounts,
  fallbackLine,
  targetLabel,
  tooltipText,
  totalsText
} from '../src/format';
import { payload } from './fixtures';

describe('badge text', () => {
  it('reads like the kernel text', () => {
    assert.equal(badgeText({ native: 412, composite: 37, fallback: 3 }), '412 native · 37 composite · 3 CPU');
  });

  it('is compact for large counts, exact on request', () => {
    assert.equal(formatCount(9_999), '9999');
    assert.equal(formatCount(12_345), '12.3k');
    assert.equal(formatCount(123_456), '123k');
    assert.equal(formatCount(2_500_000), '2.5M');
    assert.equal(formatCount(10_000), '10k');
    assert.equal(badgeText({ native: 12_345, composite: 0, fallback: 0 }), '12.3k native · 0 composite · 0 CPU');
    assert.equal(badgeText({ native: 12_345, composite: 0, fallback: 0 }, true), '12,345 native · 0 composite · 0 CPU');
    assert.equal(formatExact(1_234_567), '1,234,567');
  });
});

describe('badge colour', () => {
  it('is the fallback colour as soon as one op call fell back', () => {
    assert.equal(badgeLevel({ native: 1000, composite: 50, fallback: 1 }), 'fallback');
  });

  it('hints at composite routes, and is plain otherwise', () => {
    assert.equal(badgeLevel({ native: 10, composite: 1, fallback: 0 }), 'composite');
    assert.equal(badgeLevel({ native: 10, composite: 0, fallback: 0 }), 'native');
    assert.equal(badgeLevel({ native: 0, composite: 0, fallback: 0 }), 'native');
  });
});

describe('tooltip', () => {
  it('lists target, exact counts, the top fallback ops with reasons and the costs', () => {
    assert.equal(
      tooltipText(payload({ counts: { native: 41_200, composite: 37, fallback: 3 } })),
      [
        'torch_adapter · target mps (simulated) · policy allow',
        'Op calls: 41,200 native, 37 composite, 3 CPU fallback',
        'Distinct ops: 40 native, 5 composite, 1 fallback',
        'Fell back to the CPU (most calls first):',
        '  aten::nonzero ×3 at train.py:12 — no MPS kernel and no decomposition',
        'cell 12.5 ms · traced ops 8.1 ms · 2.0 KiB copied to/from the CPU'
      ].join('\n')
    );
  });

  it('shows at most the requested number of fallback ops', () => {
    const fallbacks = ['a', 'b', 'c'].map(op => ({ op: `aten::${op}`, calls: 1, reason: '', site: null }));
    const text = tooltipText(payload({ top_fallbacks: fallbacks }), 2);
    assert.match(text, /aten::a ×1\n {2}aten::b ×1\n {2}… and 1 more/);
    assert.doesNotMatch(text, /aten::c/);
  });

  it('says when nothing fell back', () => {
    const text = tooltipText(
      payload({ simulated: false, target: 'cpu', counts: { native: 5, composite: 0, fallback: 0 }, top_fallbacks: [], bytes_copied: 0 })
    );
    assert.match(text, /^torch_adapter · target cpu · policy allow\n/);
    assert.match(text, /\nNothing fell back to the CPU\.\n/);
    assert.doesNotMatch(text, /copied/);
  });

  it('shows dtype findings as their own kind, and a profile without dtype data as not judged', () => {
    const finding = { op: 'aten::empty.memory_format', dtype: 'float64', calls: 2, message: 'Cannot convert', site: 'cell [4], line 1' };
    const refused = payload({ dtypes: { judged: true, note: '', calls: 2, findings: [finding] } });
    assert.equal(dtypeText(refused), ' · 2 dtype refused');
    assert.match(tooltipText(refused), /\n {2}dtype float64 not on mps: aten::empty\.memory_format ×2 at cell \[4\], line 1 — Cannot convert/);
    const unjudged = payload({ target: 'npu', dtypes: { judged: false, note: 'no dtype data', calls: 0, findings: [] } });
    assert.equal(dtypeText(unjudged), ' · dtypes not judged');
    assert.match(tooltipText(unjudged), /\nDtypes not judged: no dtype data/);
    assert.equal(dtypeText(payload()), '');
  });

  it('writes a fallback line with its cell-relative site', () => {
    assert.equal(fallbackLine({ op: 'aten::mode', calls: 1234, site: 'cell [11], line 6' }), 'aten::mode ×1,234 at cell [11], line 6');
    assert.equal(fallbackLine({ op: 'aten::mode', calls: 1, site: null }), 'aten::mode ×1');
  });

  it('formats sizes and labels', () => {
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(3 * 1024 * 1024), '3.0 MiB');
    assert.equal(targetLabel({ target: 'npu', simulated: false }), 'npu');
  });
});

describe('totals', () => {
  const a = payload({ cell_id: 'a', counts: { native: 10, composite: 2, fallback: 1 }, session: { cells: 1, native: 10, composite: 2, fallback: 1 } });
  const b = payload({ cell_id: 'b', counts: { native: 5, composite: 0, fallback: 0 }, session: { cells: 2, native: 15, composite: 2, fallback: 1 } });

  it('sums the cells received', () => {
    assert.deepEqual(sumCounts([a, b]), { cells: 2, native: 15, composite: 2, fallback: 1 });
    assert.deepEqual(sumCounts([]), { cells: 0, native: 0, composite: 0, fallback: 0 });
  });

  it("takes the kernel's session totals from the payload that counted most cells", () => {
    assert.deepEqual(sessionTotals([b, a]), { cells: 2, native: 15, composite: 2, fallback: 1 });
    // A cell run twice: the kernel counts both runs, the per-cell list shows one.
    const again = payload({ cell_id: 'a', session: { cells: 3, native: 25, composite: 4, fallback: 2 } });
    assert.deepEqual(sessionTotals([a, b, again]), { cells: 3, native: 25, composite: 4, fallback: 2 });
  });

  it('falls back to the sum without session fields', () => {
    assert.deepEqual(sessionTotals([{ ...a, session: null }, { ...b, session: null }]), sumCounts([a, b]));
  });

  it('reads as text with exact numbers', () => {
    assert.equal(totalsText({ cells: 1, native: 12_345, composite: 0, fallback: 2 }), '1 cell · 12,345 native · 0 composite · 2 CPU');
    assert.equal(totalsText({ cells: 3, native: 1, composite: 2, fallback: 3 }), '3 cells · 1 native · 2 composite · 3 CPU');
  });

  it('splits shares in percent', () => {
    assert.deepEqual(shares({ native: 3, composite: 1, fallback: 0 }), { native: 75, composite: 25, fallback: 0 });
    assert.deepEqual(shares({ native: 0, composite: 0, fallback: 0 }), { native: 0, composite: 0, fallback: 0 });
  });
});
