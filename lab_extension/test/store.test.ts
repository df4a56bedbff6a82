import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { readState, policyCode } from '../src/kernel';
import { classify, parseStatus, STATUS_SCHEMA } from '../src/schema';
import { keyOf, RoutingStore } from '../src/store';
import { payload } from './fixtures';

describe('RoutingStore', () => {
  it('keys payloads by cell id, else by execution count', () => {
    assert.equal(keyOf({ cell_id: 'x', execution_count: 4 }), 'x');
    assert.equal(keyOf({ cell_id: null, execution_count: 4 }), '#4');
    assert.equal(keyOf({ cell_id: null, execution_count: null }), null);
  });

  it('keeps the latest payload per cell and finds cells by id or count', () => {
    const store = new RoutingStore();
    const changed: (string | null)[] = [];
    store.changed.connect((_, key) => changed.push(key));
    store.add(payload({ cell_id: 'a', counts: { native: 1, composite: 0, fallback: 0 } }));
    store.add(payload({ cell_id: 'a', counts: { native: 2, composite: 0, fallback: 0 } }));
    store.add(payload({ cell_id: null, execution_count: 7 }));
    assert.deepEqual(changed, ['a', 'a', '#7']);
    assert.equal(store.lookup('a', null)?.payload.counts.native, 2);
    assert.equal(store.lookup('other-id', 7)?.key, '#7');
    assert.equal(store.lookup('other-id', 8), null);
    assert.equal(store.entries().length, 2);
  });

  it('forgets a cell that runs again', () => {
    const store = new RoutingStore();
    store.add(payload({ cell_id: 'a' }));
    store.forget('a', 3);
    assert.equal(store.lookup('a', 3), null);
  });

  it('takes session totals from the payloads, and from %adapter status when newer', () => {
    const store = new RoutingStore();
    assert.equal(store.totals(), null);
    store.add(payload({ session: { cells: 1, native: 10, composite: 1, fallback: 0 } }));
    assert.deepEqual(store.totals(), { cells: 1, native: 10, composite: 1, fallback: 0 });
    store.setStatus({ target: 'cpu', simulated: false, policy: 'warn', observing: true, cells: 1, native: 10, composite: 1, fallback: 0 });
    assert.deepEqual(store.targetAndPolicy(), { target: 'cpu', policy: 'warn' });
  });

  it('follows the target of whatever the kernel said last, worded one way', () => {
    const store = new RoutingStore();
    store.add(payload({ target: 'mps', simulated: true, session: { cells: 1, native: 1, composite: 0, fallback: 0 } }));
    assert.deepEqual(store.targetAndPolicy(), { target: 'mps (simulated)', policy: 'allow' });
    // `%adapter target auto` runs no op: only its status message says the target changed.
    store.setStatus({ target: 'cpu', simulated: false, policy: 'allow', observing: true, cells: 1, native: 1, composite: 0, fallback: 0 });
    assert.equal(store.targetAndPolicy().target, 'cpu');
    store.add(payload({ cell_id: 'b', target: 'mps', simulated: true, session: { cells: 2, native: 2, composite: 0, fallback: 0 } }));
    assert.equal(store.targetAndPolicy().target, 'mps (simulated)');
  });

  it('rebuilds from stored outputs, which never replace a newer live payload', () => {
    const store = new RoutingStore();
    const old = payload({ cell_id: 'a', execution_count: 2, session: { cells: 1, native: 5, composite: 0, fallback: 0 } });
    const fresh = payload({ cell_id: 'a', execution_count: 9, session: { cells: 4, native: 50, composite: 0, fallback: 0 } });
    store.fromOutput('a', old);
    assert.equal(store.lookup('a', null)?.source, 'output');
    assert.deepEqual(store.totals(), { cells: 1, native: 5, composite: 0, fallback: 0 });
    store.add(fresh);
    store.fromOutput('a', old);
    assert.equal(store.lookup('a', null)?.payload.execution_count, 9);
    // A kernel restart drops what the old kernel sent, not what the cells show.
    store.fromOutput('b', payload({ cell_id: 'b' }));
    store.clearLive();
    assert.equal(store.lookup('a', null), null);
    assert.equal(store.lookup('b', null)?.source, 'output');
  });

  it('keeps saved summaries out of the session and across a kernel restart', () => {
    const store = new RoutingStore();
    store.restore('saved', payload({ cell_id: 'saved', session: null }));
    assert.equal(store.totals(), null);
    store.add(payload({ cell_id: 'live' }));
    store.clearLive();
    assert.equal(store.lookup('live', null), null);
    assert.equal(store.lookup('saved', null)?.saved, true);
    assert.equal(store.latest, null);
    assert.deepEqual(store.targetAndPolicy(), { target: null, policy: null });
  });

  it('never lets a saved summary replace a live one', () => {
    const store = new RoutingStore();
    store.add(payload({ cell_id: 'a', counts: { native: 9, composite: 0, fallback: 0 } }));
    store.restore('a', payload({ cell_id: 'a', counts: { native: 1, composite: 0, fallback: 0 } }));
    assert.equal(store.lookup('a', null)?.payload.counts.native, 9);
    assert.equal(store.lookup('a', null)?.saved, false);
  });
});

describe('kernel helpers', () => {
  it('reads the kernel state (status and payloads) from a user-expression result', () => {
    const status = { schema: STATUS_SCHEMA, version: 1, target: 'mps', simulated: true, policy: 'warn', observing: true, cells: 2, native: 5, composite: 1, fallback: 0 };
    const result = { status: 'ok', data: { 'application/json': { status, payloads: [payload(), { schema: 'other' }] } } };
    const state = readState(result);
    assert.deepEqual(state?.status, {
      target: 'mps',
      simulated: true,
      policy: 'warn',
      observing: true,
      cells: 2,
      native: 5,
      composite: 1,
      fallback: 0
    });
    assert.equal(state?.payloads.length, 1); // the unreadable one is left out
    assert.equal(readState({ status: 'error', ename: 'RuntimeError' }), null);
    assert.equal(readState(undefined), null);
    assert.equal(readState({ status: 'ok', data: { 'application/json': { status: { target: 'cpu' } } } }), null);
  });

  it('tells a status message from a routing payload', () => {
    assert.equal(classify({ schema: STATUS_SCHEMA, target: 'cpu' }).kind, 'status');
    const routing = classify(payload());
    assert.ok(routing.kind === 'routing' && routing.result.ok);
    assert.equal(parseStatus(payload()), null);
  });

  it('validates the policy before it reaches the kernel', () => {
    assert.equal(policyCode('warn'), '%adapter policy warn');
    assert.throws(() => policyCode('strict'), /expected a fallback policy of allow, warn, error; got "strict"/);
  });
});
