import { IRouteCounts, IRoutingPayload, ISessionTotals } from '../src/schema';

/** Route counts; yours and refused default to 0 (as a version-1 payload reads). */
export function counts(native: number, composite: number, fallback: number, yours = 0, refused = 0): IRouteCounts {
  return { native, composite, yours, fallback, refused };
}

export function totals(cells: number, native: number, composite: number, fallback: number, yours = 0, refused = 0): ISessionTotals {
  return { cells, ...counts(native, composite, fallback, yours, refused) };
}

/** A version-2 payload like torch_adapter/jupyter/schema.py builds. */
export function payload(overrides: Partial<IRoutingPayload> = {}): IRoutingPayload {
  return {
    schema: 'torch-adapter.cell-routing',
    version: 2,
    cell_id: 'cell-a',
    execution_count: 3,
    target: 'mps',
    simulated: true,
    emulated: false,
    policy: 'allow',
    counts: counts(412, 37, 3),
    ops: counts(40, 5, 1),
    top_fallbacks: [{ op: 'aten::nonzero', calls: 3, reason: 'no MPS kernel and no decomposition', site: 'train.py:12' }],
    top_yours: [],
    top_refused: [],
    wall_ms: 12.5,
    op_time_ms: 8.1,
    bytes_copied: 2048,
    session: totals(3, 900, 80, 5),
    session_id: null,
    ...overrides
  };
}
