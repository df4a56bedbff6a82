/**
 * What one notebook's kernel has reported: the latest payload per cell, keyed
 * by the cell model id (which survives cell moves and windowed rendering), or
 * by execution count where the kernel had no cell id. No DOM, no JupyterLab:
 * unit-tested in test/store.test.ts.
 */

import { ISignal, Signal } from '@lumino/signaling';

import { sessionTotals } from './format';
import { IRoutingPayload, ISessionTotals } from './schema';

/** The kernel's answer to `%adapter` (status), read on demand. */
export interface IKernelStatus {
  target: string | null;
  policy: string | null;
  observing: boolean;
  cells: number;
  native: number;
  composite: number;
  fallback: number;
}

export interface IEntry {
  /** The cell model id, or `#<execution count>` when the kernel sent no id. */
  key: string;
  payload: IRoutingPayload;
  /** Read back from cell metadata, not received from this kernel. */
  saved: boolean;
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

  /** The latest payload received from the kernel (target, policy, session). */
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
    this._entries.set(key, { key, payload, saved: false });
    this._live.push(payload);
    this._latest = payload;
    this._changed.emit(key);
    return key;
  }

  /** A summary read back from a cell's metadata (does not count for the session). */
  restore(cellId: string, payload: IRoutingPayload): void {
    const current = this._entries.get(cellId);
    if (current && !current.saved) {
      return;
    }
    this._entries.set(cellId, { key: cellId, payload, saved: true });
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

  /** The kernel restarted or changed: drop what it reported, keep saved summaries. */
  clearLive(): void {
    for (const [key, entry] of this._entries) {
      if (!entry.saved) {
        this._entries.delete(key);
      }
    }
    this._live = [];
    this._latest = null;
    this._status = null;
    this._changed.emit(null);
  }

  setStatus(status: IKernelStatus | null): void {
    this._status = status;
    this._changed.emit(null);
  }

  entries(): IEntry[] {
    return [...this._entries.values()];
  }

  /** Target and policy as last reported (status beats an older payload). */
  targetAndPolicy(): { target: string | null; policy: string | null } {
    if (this._status) {
      return { target: this._status.target, policy: this._status.policy };
    }
    if (this._latest) {
      const p = this._latest;
      return { target: p.simulated ? `${p.target} (simulated)` : p.target, policy: p.policy };
    }
    return { target: null, policy: null };
  }

  /**
   * The kernel's session totals: from `%adapter` status when it is newer than
   * the payloads, else from the payloads' `session` fields; null before any.
   */
  totals(): ISessionTotals | null {
    const fromPayloads = this._live.length ? sessionTotals(this._live) : null;
    const s = this._status;
    if (s && (fromPayloads === null || s.cells >= fromPayloads.cells)) {
      return { cells: s.cells, native: s.native, composite: s.composite, fallback: s.fallback };
    }
    return fromPayloads;
  }

  private _entries = new Map<string, IEntry>();
  private _live: IRoutingPayload[] = [];
  private _latest: IRoutingPayload | null = null;
  private _status: IKernelStatus | null = null;
  private _changed = new Signal<this, string | null>(this);
}
