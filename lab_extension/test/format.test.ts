import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  badgeLevel,
  badgeText,
  compiledText,
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
import { counts, payload, totals } from './fixtures';

describe('badge text', () => {
  it('reads like the kernel text', () => {
    assert.equal(badgeText(counts(412, 37, 3)), '412 native · 37 composite · 3 CPU');
  });

  it('is compact for large counts, exact on request', () => {
    assert.equal(formatCount(9_999), '9999');
    assert.equal(formatCount(12_345), '12.3k');
    assert.equal(formatCount(123_456), '123k');
    assert.equal(formatCount(2_500_000), '2.5M');
    assert.equal(formatCount(10_000), '10k');
    assert.equal(badgeText(counts(12_345, 0, 0)), '12.3k native · 0 composite · 0 CPU');
    assert.equal(badgeText(counts(12_345, 0, 0), true), '12,345 native · 0 composite · 0 CPU');
    // one format per line (issue 34: "11.4k" beside "5189")
    assert.equal(badgeText(counts(11_400, 5_189, 3)), '11.4k native · 5.2k composite · 3 CPU');
    assert.equal(badgeText(counts(5_189, 37, 3)), '5,189 native · 37 composite · 3 CPU');
    assert.equal(formatExact(1_234_567), '1,234,567');
  });
});

describe('yours and refused', () => {
  it('are counted in the pill only when there are any', () => {
    assert.equal(badgeText(counts(4, 2, 0, 1, 0)), '4 native · 2 composite · 1 yours · 0 CPU');
    assert.equal(badgeText(counts(4, 2, 0, 0, 1)), '4 native · 2 composite · 0 CPU · 1 refused');
    assert.equal(badgeLevel(counts(4, 0, 0, 1, 0)), 'native'); // on the device, nothing copied
    assert.equal(badgeLevel(counts(4, 0, 3, 0, 1)), 'refused');
  });

  it('are told apart in the tooltip: refused is no fallback, yours ran on the device', () => {
    const site = 'cell [16], line 1';
    const refused = tooltipText(
      payload({
        policy: 'error',
        counts: counts(5, 1, 0, 0, 1),
        ops: counts(2, 1, 0, 0, 1),
        top_fallbacks: [],
        top_refused: [{ op: 'aten::_pdist_forward', calls: 1, reason: 'refused: the fallback policy is "error"', site }],
        bytes_copied: 0
      })
    );
    assert.match(refused, /\nRefused by the fallback policy \(error\): the call raised\n {2}aten::_pdist_forward ×1 at cell \[16\], line 1/);
    assert.match(refused, /\nNothing fell back to the CPU\.\n/);
    assert.doesNotMatch(refused, /Fell back/);
    assert.match(refused, /Op calls: 5 native, 1 composite, 0 CPU fallback, 1 refused/);
    const yours = tooltipText(
      payload({
        counts: counts(5, 1, 0, 1),
        top_fallbacks: [],
        top_yours: [{ op: 'aten::_pdist_forward', calls: 1, reason: 'your register_fallback implementation', site }],
        bytes_copied: 0
      })
    );
    assert.match(yours, /Ran your register_fallback implementation, on the device \(nothing copied\):\n {2}aten::_pdist_forward ×1/);
    assert.match(yours, /Op calls: 5 native, 1 composite, 1 your implementation, 0 CPU fallback/);
    assert.doesNotMatch(yours, /Fell back/);
  });
});

describe('badge colour', () => {
  it('is the fallback colour as soon as one op call fell back', () => {
    assert.equal(badgeLevel(counts(1000, 50, 1)), 'fallback');
  });

  it('hints at composite routes, and is plain otherwise', () => {
    assert.equal(badgeLevel(counts(10, 1, 0)), 'composite');
    assert.equal(badgeLevel(counts(10, 0, 0)), 'native');
    assert.equal(badgeLevel(counts(0, 0, 0)), 'native');
  });
});

describe('tooltip', () => {
  it('lists target, exact counts, the top fallback ops with reasons and the costs', () => {
    assert.equal(
      tooltipText(payload({ counts: counts(41_200, 37, 3) })),
      [
        'torch_adapter · target mps (simulated) · policy allow',
        'Op calls: 41,200 native, 37 composite, 3 CPU fallback',
        'Distinct ops: 40 native, 5 composite, 1 CPU fallback',
        'Fell back to the CPU (most calls first):',
        '  aten::nonzero ×3 at train.py:12 — no MPS kernel and no decomposition',
        'cell 12.5 ms · traced ops 8.1 ms · 2.0 KiB copied to/from the CPU'
      ].join('\n')
    );
  });

  it('leads each reason with its stable code when the kernel sends one (issue 36)', () => {
    const top_fallbacks = [{ op: 'aten::nonzero', calls: 3, reason: 'no MPS kernel and no decomposition', code: 'TA-F001', site: 'train.py:12' }];
    assert.match(tooltipText(payload({ top_fallbacks })), /aten::nonzero ×3 at train\.py:12 — TA-F001 no MPS kernel and no decomposition/);
  });

  it('never shows traced op time above the cell time without saying why (issue 34)', () => {
    const text = tooltipText(payload({ wall_ms: 10, op_time_ms: 14 }));
    assert.match(text, /cell 10\.0 ms · traced ops 14\.0 ms \(summed over threads: more than the cell's time\)/);
  });

  it('shows at most the requested number of fallback ops', () => {
    const fallbacks = ['a', 'b', 'c'].map(op => ({ op: `aten::${op}`, calls: 1, reason: '', site: null }));
    const text = tooltipText(payload({ top_fallbacks: fallbacks }), 2);
    assert.match(text, /aten::a ×1\n {2}aten::b ×1\n {2}… and 1 more/);
    assert.doesNotMatch(text, /aten::c/);
  });

  it('says when nothing fell back', () => {
    const text = tooltipText(
      payload({ simulated: false, target: 'cpu', counts: counts(5, 0, 0), top_fallbacks: [], bytes_copied: 0 })
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

  it('says what torch.compile compiled in the cell, in the pill and its tooltip', () => {
    const line = 'compiled: 1 graph (f, cell [3], line 2), 1 graph break; ops inside compiled code are not counted per op';
    const compiled = payload({
      compiled: { line, details: ['  graph break at cell [3], line 4: print()'], graphs: 2, graph_breaks: 1, recompiles: 0, failures: 0 }
    });
    assert.equal(compiledText(compiled), ' · compiled 2 graphs, 1 break');
    assert.ok(tooltipText(compiled).includes(`\n${line}\ngraph break at cell [3], line 4: print()\n`));
    assert.equal(compiledText(payload()), '');
    assert.doesNotMatch(tooltipText(payload()), /compiled/);
  });

  it('writes a fallback line with its cell-relative site', () => {
    assert.equal(fallbackLine({ op: 'aten::mode', calls: 1234, site: 'cell [11], line 6' }), 'aten::mode ×1,234 at cell [11], line 6');
    assert.equal(fallbackLine({ op: 'aten::mode', calls: 1, site: null }), 'aten::mode ×1');
  });

  it('formats sizes and labels', () => {
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(3 * 1024 * 1024), '3.0 MiB');
    assert.equal(targetLabel({ target: 'npu', simulated: false }), 'npu');
    assert.equal(targetLabel({ target: 'npu', simulated: false, emulated: true }), 'npu (emulated)');
  });
});

describe('totals', () => {
  const a = payload({ cell_id: 'a', counts: counts(10, 2, 1), session: totals(1, 10, 2, 1) });
  const b = payload({ cell_id: 'b', counts: counts(5, 0, 0), session: totals(2, 15, 2, 1) });

  it('sums the cells received', () => {
    assert.deepEqual(sumCounts([a, b]), totals(2, 15, 2, 1));
    assert.deepEqual(sumCounts([]), totals(0, 0, 0, 0));
  });

  it("takes the kernel's session totals from the payload that counted most cells", () => {
    assert.deepEqual(sessionTotals([b, a]), totals(2, 15, 2, 1));
    // A cell run twice: the kernel counts both runs, the per-cell list shows one.
    const again = payload({ cell_id: 'a', session: totals(3, 25, 4, 2) });
    assert.deepEqual(sessionTotals([a, b, again]), totals(3, 25, 4, 2));
  });

  it('falls back to the sum without session fields', () => {
    assert.deepEqual(sessionTotals([{ ...a, session: null }, { ...b, session: null }]), sumCounts([a, b]));
  });

  it('reads as text with exact numbers', () => {
    assert.equal(totalsText(totals(1, 12_345, 0, 2)), '1 cell · 12,345 native · 0 composite · 2 CPU');
    assert.equal(totalsText(totals(3, 1, 2, 3)), '3 cells · 1 native · 2 composite · 3 CPU');
  });

  it('splits shares in percent', () => {
    assert.deepEqual(shares(counts(3, 1, 0)), counts(75, 25, 0));
    assert.deepEqual(shares(counts(0, 0, 0)), counts(0, 0, 0));
  });
});
