import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { readState, policyCode } from '../src/kernel';
import { classify, notLoaded, parsePayload, parseStatus, STATUS_SCHEMA } from '../src/schema';
import { keyOf, RoutingStore } from '../src/store';
import { counts, payload, totals } from './fixtures';

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
    store.add(payload({ cell_id: 'a', counts: counts(1, 0, 0) }));
    store.add(payload({ cell_id: 'a', counts: counts(2, 0, 0) }));
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
    store.add(payload({ session: totals(1, 10, 1, 0) }));
    assert.deepEqual(store.totals(), totals(1, 10, 1, 0));
    store.setStatus({ target: 'cpu', simulated: false, emulated: false, policy: 'warn', observing: true, loaded: true, ...totals(1, 10, 1, 0) });
    assert.deepEqual(store.targetAndPolicy(), { target: 'cpu', policy: 'warn', loaded: true });
  });

  it('follows the target of whatever the kernel said last, worded one way', () => {
    const store = new RoutingStore();
    store.add(payload({ target: 'mps', simulated: true, session: totals(1, 1, 0, 0) }));
    assert.deepEqual(store.targetAndPolicy(), { target: 'mps (simulated)', policy: 'allow', loaded: true });
    // `%adapter target auto` runs no op: only its status message says the target changed.
    store.setStatus({ target: 'cpu', simulated: false, emulated: false, policy: 'allow', observing: true, loaded: true, ...totals(1, 1, 0, 0) });
    assert.equal(store.targetAndPolicy().target, 'cpu');
    store.add(payload({ cell_id: 'b', target: 'mps', simulated: true, session: totals(2, 2, 0, 0) }));
    assert.equal(store.targetAndPolicy().target, 'mps (simulated)');
  });

  it('rebuilds from stored outputs, which never replace a newer live payload', () => {
    const store = new RoutingStore();
    const old = payload({ cell_id: 'a', execution_count: 2, session: totals(1, 5, 0, 0) });
    const fresh = payload({ cell_id: 'a', execution_count: 9, session: totals(4, 50, 0, 0) });
    store.fromOutput('a', old);
    assert.equal(store.lookup('a', null)?.source, 'output');
    assert.deepEqual(store.totals(), totals(1, 5, 0, 0));
    store.add(fresh);
    store.fromOutput('a', old);
    assert.equal(store.lookup('a', null)?.payload.execution_count, 9);
    // A kernel restart: nothing counts any more, but every cell keeps its row (as its badge stays).
    store.fromOutput('b', payload({ cell_id: 'b' }));
    store.clearLive();
    assert.equal(store.lookup('a', null)?.source, 'output');
    assert.equal(store.lookup('a', null)?.payload.execution_count, 9);
    assert.equal(store.lookup('b', null)?.source, 'output');
    assert.equal(store.totals(), null);
  });

  it('keeps saved summaries out of the session and across a kernel restart', () => {
    const store = new RoutingStore();
    store.restore('saved', payload({ cell_id: 'saved', session: null }));
    assert.equal(store.totals(), null);
    store.add(payload({ cell_id: 'live' }));
    store.clearLive();
    assert.equal(store.lookup('live', null)?.source, 'output');
    assert.equal(store.lookup('saved', null)?.saved, true);
    assert.equal(store.latest, null);
    assert.deepEqual(store.targetAndPolicy(), { target: null, policy: null, loaded: null });
  });

  it("shows the kernel's state, never a stored output's (issue 23, point 4)", () => {
    const store = new RoutingStore();
    // A reloaded notebook whose outputs were made on simulated MPS, by a kernel that has
    // since unloaded the extension: the outputs fill the cell rows, not the target.
    store.fromOutput('a', payload({ cell_id: 'a', target: 'mps', simulated: true, policy: 'warn' }));
    assert.deepEqual(store.targetAndPolicy(), { target: null, policy: null, loaded: null });
    store.setStatus(notLoaded());
    assert.deepEqual(store.targetAndPolicy(), { target: null, policy: null, loaded: false });
    assert.equal(store.totals(), null);
    assert.equal(store.lookup('a', null)?.source, 'output');
    // `%adapter policy error`, then any cell whose outputs change: the policy stays "error".
    store.setStatus({ target: 'cpu', simulated: false, emulated: false, policy: 'error', observing: true, loaded: true, ...totals(1, 1, 0, 0) });
    store.fromOutput('a', payload({ cell_id: 'a', policy: 'warn' }));
    store.fromOutput('b', payload({ cell_id: 'b', policy: 'warn', session: totals(9, 1, 0, 0) }));
    assert.deepEqual(store.targetAndPolicy(), { target: 'cpu', policy: 'error', loaded: true });
  });

  it('counts only the current %load_ext: after unload and load, the old session drops out (issue 34)', () => {
    const store = new RoutingStore();
    const loaded = { target: 'cpu', simulated: false, emulated: false, policy: 'allow', observing: true, loaded: true };
    store.add(payload({ cell_id: 'a', session: totals(1, 50, 0, 0), session_id: 'one' }));
    store.add(payload({ cell_id: 'b', session: totals(3, 162, 0, 1), session_id: 'one' }));
    assert.deepEqual(store.totals(), totals(3, 162, 0, 1));
    // %unload_ext + %load_ext: the new session's status, then its first cell
    store.setStatus({ ...loaded, ...totals(0, 0, 0, 0), session_id: 'two' });
    assert.deepEqual(store.totals(), totals(0, 0, 0, 0));
    store.add(payload({ cell_id: 'c', session: totals(1, 54, 0, 1), session_id: 'two' }));
    assert.deepEqual(store.totals(), totals(1, 54, 0, 1));
    assert.equal(store.lookup('b', null)?.payload.session?.cells, 3); // the old cells keep their rows
    // a reload: the old session's outputs are read again, but do not count
    const reloaded = new RoutingStore();
    reloaded.fromOutput('b', payload({ cell_id: 'b', session: totals(3, 162, 0, 1), session_id: 'one' }));
    reloaded.setStatus({ ...loaded, ...totals(1, 54, 0, 1), session_id: 'two' });
    reloaded.fromOutput('c', payload({ cell_id: 'c', session: totals(1, 54, 0, 1), session_id: 'two' }));
    assert.deepEqual(reloaded.totals(), totals(1, 54, 0, 1));
  });

  it('reads the session id of payloads and statuses, absent from older kernels', () => {
    const p = parsePayload({ ...payload(), session_id: 'abc' });
    assert.ok(p.ok && p.payload.session_id === 'abc');
    const old = parsePayload({ ...payload(), session_id: undefined });
    assert.ok(old.ok && old.payload.session_id === null);
    assert.equal(parseStatus({ schema: STATUS_SCHEMA, version: 2, loaded: true, session_id: 'abc' })?.session_id, 'abc');
    assert.equal(notLoaded().session_id, null);
  });

  it('counts yours and refused apart, and reads a version-1 payload with them at zero', () => {
    const result = parsePayload({ ...payload(), version: 1, counts: { native: 1, composite: 2, fallback: 3 }, top_yours: undefined });
    assert.ok(result.ok && result.warning === null);
    assert.ok(result.ok && result.payload.counts.yours === 0 && result.payload.counts.refused === 0);
    assert.deepEqual(result.ok && result.payload.top_yours, []);
    const bad = parsePayload({ ...payload(), counts: { native: 1, composite: 2, fallback: 3, yours: -1 } });
    assert.ok(!bad.ok && /"counts.yours": expected a count >= 0/.test(bad.error));
  });

  it('never lets a saved summary replace a live one', () => {
    const store = new RoutingStore();
    store.add(payload({ cell_id: 'a', counts: counts(9, 0, 0) }));
    store.restore('a', payload({ cell_id: 'a', counts: counts(1, 0, 0) }));
    assert.equal(store.lookup('a', null)?.payload.counts.native, 9);
    assert.equal(store.lookup('a', null)?.saved, false);
  });
});

describe('kernel helpers', () => {
  it('reads the kernel state (status and payloads) from a user-expression result', () => {
    const status = { schema: STATUS_SCHEMA, version: 2, target: 'mps', simulated: true, policy: 'warn', observing: true, loaded: true, cells: 2, native: 5, composite: 1, yours: 1, fallback: 0, refused: 2 };
    const result = { status: 'ok', data: { 'application/json': { status, payloads: [payload(), { schema: 'other' }] } } };
    const state = readState(result);
    assert.deepEqual(state?.status, {
      target: 'mps',
      simulated: true,
      emulated: false,
      policy: 'warn',
      observing: true,
      loaded: true,
      session_id: null,
      ...totals(2, 5, 1, 0, 1, 2)
    });
    // A kernel without the extension says so (version 1 had no `loaded`: only a loaded one answered).
    assert.equal(parseStatus({ ...status, target: null, loaded: false })?.loaded, false);
    assert.equal(parseStatus({ ...status, version: 1, loaded: undefined })?.loaded, true);
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
