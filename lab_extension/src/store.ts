/**
 * What one notebook's kernel has reported: the latest payload per cell, keyed
 * by the cell model id (which survives cell moves and windowed rendering), or
 * by execution count where the kernel had no cell id. No DOM, no JupyterLab:
 * unit-tested in test/store.test.ts.
 */

import { ISignal, Signal } from '@lumino/signaling';

import { sessionTotals, targetLabel } from './format';
import { IKernelStatus, IRoutingPayload, ISessionTotals, ROUTES, zeroCounts } from './schema';

export type { IKernelStatus } from './schema';

/** Where an entry came from. */
export type Source = 'kernel' | 'output' | 'saved';

export interface IEntry {
  /** The cell model id, or `#<execution count>` when the kernel sent no id. */
  key: string;
  payload: IRoutingPayload;
  /** Read back from cell metadata, not received from this kernel. */
  saved: boolean;
  /** The kernel (comm or state request), the cell's stored output, or its metadata. */
  source: Source;
}

/** The store key of a payload. */
export function keyOf(payload: Pick<IRoutingPayload, 'cell_id' | 'execution_count'>): string | null {
  if (payload.cell_id) {
    return payload.cell_id;
  }
  return payload.execution_count === null ? null : `#${payload.execution_count}`;
}

export class RoutingStore {
  /** Emits the key that changed, or null when everything did. */
  get changed(): ISignal<this, string | null> {
    return this._changed;
  }

  /** The latest payload the kernel sent (comm or state request; never a stored output). */
  get latest(): IRoutingPayload | null {
    return this._latest;
  }

  get status(): IKernelStatus | null {
    return this._status;
  }

  /** Record a cell's payload from the kernel; returns its key (null: unkeyable). */
  add(payload: IRoutingPayload): string | null {
    const key = keyOf(payload);
    if (key === null) {
      return null;
    }
    this._follow(payload.session_id ?? null);
    this._entries.set(key, { key, payload, saved: false, source: 'kernel' });
    this._noteLive(payload, true);
    this._changed.emit(key);
    return key;
  }

  /**
   * The kernel's current `%load_ext` (its id, from a status or a payload it sent): a new one
   * (`%unload_ext` + `%load_ext` in one kernel) drops the older session's payloads from the
   * totals. Their cells keep their rows and badges: they tell what those cells did.
   */
  private _follow(sid: string | null): void {
    if (sid === null || sid === this._sid) {
      return;
    }
    this._sid = sid;
    this._live = this._live.filter(p => (p.session_id ?? null) === sid);
    if (this._latest && (this._latest.session_id ?? null) !== sid) {
      this._latest = null;
    }
  }

  /** A payload counts for the totals when it is the current session's (or nothing says which). */
  private _current(payload: IRoutingPayload): boolean {
    const sid = payload.session_id ?? null;
    return this._sid === null || sid === null || sid === this._sid;
  }

  /**
   * A payload read from a cell's stored output (a reopened or reloaded
   * notebook). It is what the cell shows, so it counts like a live one, but
   * never replaces a newer payload the kernel sent for the same cell.
   */
  fromOutput(cellId: string, payload: IRoutingPayload): void {
    const current = this._entries.get(cellId);
    if (current && !current.saved && newer(current.payload, payload)) {
      return;
    }
    if (current && current.payload === payload) {
      return;
    }
    this._entries.set(cellId, { key: cellId, payload, saved: false, source: 'output' });
    if (this._current(payload)) {
      this._noteLive(payload, false);
    }
    this._changed.emit(cellId);
  }

  /** A summary read back from a cell's metadata (does not count for the session). */
  restore(cellId: string, payload: IRoutingPayload): void {
    const current = this._entries.get(cellId);
    if (current && !current.saved) {
      return;
    }
    this._entries.set(cellId, { key: cellId, payload, saved: true, source: 'saved' });
    this._changed.emit(cellId);
  }

  /** The entry for a cell: by model id, else by its execution count. */
  lookup(cellId: string, executionCount: number | null): IEntry | null {
    const byId = this._entries.get(cellId);
    if (byId) {
      return byId;
    }
    if (executionCount === null) {
      return null;
    }
    return this._entries.get(`#${executionCount}`) ?? null;
  }

  /** Forget a cell's entry (it is running again). */
  forget(cellId: string, executionCount: number | null): void {
    let removed = this._entries.delete(cellId);
    if (executionCount !== null) {
      removed = this._entries.delete(`#${executionCount}`) || removed;
    }
    if (removed) {
      this._changed.emit(cellId);
    }
  }

  /**
   * The kernel restarted or changed: nothing it reported counts for the totals any more; the
   * cells' rows stay (each tells what its cell did, as its badge does), as stored outputs.
   */
  clearLive(): void {
    for (const [key, entry] of this._entries) {
      if (entry.source === 'kernel') {
        this._entries.set(key, { ...entry, source: 'output' });
      }
    }
    this._live = [];
    this._latest = null;
    this._status = null;
    this._sid = null;
    this._changed.emit(null);
  }

  setStatus(status: IKernelStatus | null): void {
    if (status && status.loaded) {
      this._follow(status.session_id ?? null);
    }
    this._status = status;
    this._statusSeq = ++this._seq;
    this._changed.emit(null);
  }

  entries(): IEntry[] {
    return [...this._entries.values()];
  }

  /**
   * The kernel's target and policy as it last said: its status (sent after
   * any cell that changed them, at `%load_ext` and `%unload_ext`, and
   * answered on request) or a payload it sent, whichever came last. A stored
   * output never counts (it tells what a cell did once, not what the kernel
   * is now). `loaded`: false when the kernel said the extension is not loaded,
   * null when it has said nothing yet. The target is worded one way
   * everywhere: targetLabel ("mps (simulated)").
   */
  targetAndPolicy(): { target: string | null; policy: string | null; loaded: boolean | null } {
    const s = this._status;
    const p = this._latest;
    if (s && (!p || this._statusSeq > this._latestSeq)) {
      if (!s.loaded) {
        return { target: null, policy: null, loaded: false };
      }
      return {
        target: s.target === null ? null : targetLabel({ target: s.target, simulated: s.simulated, emulated: s.emulated }),
        policy: s.policy,
        loaded: true
      };
    }
    if (p) {
      return { target: targetLabel(p), policy: p.policy, loaded: true };
    }
    return { target: null, policy: null, loaded: null };
  }

  /**
   * The kernel's session totals: from `%adapter` status when it is newer than
   * the payloads, else from the payloads' `session` fields; null before any.
   */
  totals(): ISessionTotals | null {
    const s = this._status;
    if (s && !s.loaded && (!this._latest || this._statusSeq > this._latestSeq)) {
      return null; // no session in the kernel: nothing to total
    }
    const fromPayloads = this._live.length ? sessionTotals(this._live) : null;
    if (s && (fromPayloads === null || s.cells >= fromPayloads.cells)) {
      const totals: ISessionTotals = { cells: s.cells, ...zeroCounts() };
      for (const route of ROUTES) {
        totals[route] = s[route];
      }
      return totals;
    }
    return fromPayloads;
  }

  private _noteLive(payload: IRoutingPayload, fromKernel: boolean): void {
    this._live.push(payload);
    if (fromKernel && (!this._latest || !newer(this._latest, payload))) {
      this._latest = payload;
      this._latestSeq = ++this._seq;
    }
  }

  private _sid: string | null = null;
  private _entries = new Map<string, IEntry>();
  private _live: IRoutingPayload[] = [];
  private _latest: IRoutingPayload | null = null;
  private _status: IKernelStatus | null = null;
  private _seq = 0;
  private _latestSeq = 0;
  private _statusSeq = 0;
  private _changed = new Signal<this, string | null>(this);
}

/** `a` was published after `b` (the kernel's cell counter only grows). */
function newer(a: IRoutingPayload, b: IRoutingPayload): boolean {
  const ca = a.session?.cells ?? null;
  const cb = b.session?.cells ?? null;
  if (ca !== null && cb !== null) {
    return ca > cb;
  }
  return (a.execution_count ?? -1) > (b.execution_count ?? -1);
}
