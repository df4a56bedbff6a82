import { IRoutingPayload } from '../src/schema';

/** A version-1 payload like torch_adapter/jupyter/schema.py builds. */
export function payload(overrides: Partial<IRoutingPayload> = {}): IRoutingPayload {
  return {
    schema: 'torch-adapter.cell-routing',
    version: 1,
    cell_id: 'cell-a',
    execution_count: 3,
    target: 'mps',
    simulated: true,
    policy: 'allow',
    counts: { native: 412, composite: 37, fallback: 3 },
    ops: { native: 40, composite: 5, fallback: 1 },
    top_fallbacks: [{ op: 'aten::nonzero', calls: 3, reason: 'no MPS kernel and no decomposition', site: 'train.py:12' }],
    wall_ms: 12.5,
    op_time_ms: 8.1,
    bytes_copied: 2048,
    session: { cells: 3, native: 900, composite: 80, fallback: 5 },
    ...overrides
  };
}
