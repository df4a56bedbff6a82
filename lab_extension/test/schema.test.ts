import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { metadataSummary, parsePayload, VERSION } from '../src/schema';
import { counts, payload } from './fixtures';

function error(data: unknown): string {
  const result = parsePayload(data);
  assert.equal(result.ok, false);
  return result.ok ? '' : result.error;
}

describe('parsePayload', () => {
  it('reads a version-2 payload as is', () => {
    const p = payload();
    const result = parsePayload(JSON.parse(JSON.stringify(p)));
    assert.deepEqual(result, { ok: true, payload: p, warning: null });
  });

  it('keeps what compiled, and reads a malformed entry as nothing compiled', () => {
    const compiled = { line: 'compiled: 1 graph (f, cell [3], line 2), 0 graph breaks', details: [], graphs: 1, graph_breaks: 0, recompiles: 0, failures: 0 };
    const read = parsePayload({ ...payload(), compiled });
    assert.ok(read.ok && read.payload.compiled);
    assert.deepEqual(read.ok ? read.payload.compiled : null, compiled);
    const malformed = parsePayload({ ...payload(), compiled: { graphs: 'many' } });
    assert.ok(malformed.ok && malformed.payload.compiled === undefined);
  });

  it('names the key, the expectation and what it got', () => {
    assert.equal(error(null), 'expected a routing payload object; got null');
    assert.equal(error([1]), 'expected a routing payload object; got an array');
    assert.equal(
      error({ ...payload(), schema: 'other' }),
      '"schema": expected "torch-adapter.cell-routing"; got "other" (string)'
    );
    assert.equal(error({ ...payload(), version: 0 }), '"version": expected an integer >= 1; got 0 (number)');
    assert.equal(error({ ...payload(), version: '1' }), '"version": expected an integer >= 1; got "1" (string)');
    assert.equal(
      error({ ...payload(), target: '' }),
      '"target": expected a target name like "mps"; got "" (string)'
    );
    assert.equal(
      error({ ...payload(), counts: { native: 1, composite: -1, fallback: 0 } }),
      '"counts.composite": expected a count >= 0; got -1 (number)'
    );
    assert.match(error({ ...payload(), counts: 'many' }), /^"counts": expected an object like/);
  });

  it('reads a newer version for its version-2 fields, with a warning', () => {
    const result = parsePayload({ ...payload(), version: VERSION + 1, extra: { new: true } });
    assert.ok(result.ok);
    if (result.ok) {
      assert.equal(result.payload.version, 3);
      assert.deepEqual(result.payload.counts, counts(412, 37, 3));
      assert.match(result.warning ?? '', /payload version 3 is newer than this extension's \(2\)/);
    }
  });

  it('gives missing optional fields neutral defaults', () => {
    const result = parsePayload({
      schema: 'torch-adapter.cell-routing',
      version: 1,
      target: 'cpu',
      counts: { native: 5, composite: 0, fallback: 0 }
    });
    assert.ok(result.ok);
    if (result.ok) {
      const p = result.payload;
      assert.equal(p.cell_id, null);
      assert.equal(p.execution_count, null);
      assert.equal(p.simulated, false);
      assert.equal(p.policy, 'allow');
      assert.deepEqual(p.ops, counts(0, 0, 0));
      assert.deepEqual(p.top_fallbacks, []);
      assert.deepEqual(p.top_refused, []);
      assert.equal(p.wall_ms, null);
      assert.equal(p.session, null);
    }
  });

  it('drops malformed fallback entries and session totals instead of failing', () => {
    const result = parsePayload({
      ...payload(),
      top_fallbacks: [{ op: 'aten::a', calls: 'x' }, 7, null],
      session: { cells: 'three' }
    });
    assert.ok(result.ok);
    if (result.ok) {
      assert.deepEqual(result.payload.top_fallbacks, [{ op: 'aten::a', calls: 0, reason: '', site: null }]);
      assert.equal(result.payload.session, null);
    }
  });
});

describe('metadataSummary', () => {
  it('keeps the cell fields, drops the session totals, and parses back', () => {
    const kept = metadataSummary(payload());
    assert.equal(kept.session, null);
    const back = parsePayload(JSON.parse(JSON.stringify(kept)));
    assert.ok(back.ok);
    if (back.ok) {
      assert.deepEqual(back.payload, kept);
    }
  });
});
