/**
 * The few things the extension asks of a kernel, on demand only (never after
 * each cell): switch the fallback policy, read `%adapter` status.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';

import { IKernelStatus, IRoutingPayload, parsePayload, parseStatus } from './schema';

export const POLICIES = ['allow', 'warn', 'error'] as const;
export type Policy = (typeof POLICIES)[number];

/**
 * A user expression that answers the kernel's front-end state as JSON:
 * `%adapter` status and every cell's payload (torch_adapter.jupyter.extension.front_end_state).
 */
const STATE_EXPRESSION =
  "__import__('IPython').display.JSON(__import__('torch_adapter.jupyter.extension', fromlist=['_']).front_end_state())";

export class KernelRequestError extends Error {}

/** What a reloaded front end rebuilds its view from. */
export interface IKernelState {
  status: IKernelStatus;
  /** Every payload the kernel published, oldest first. */
  payloads: IRoutingPayload[];
}

/** The kernel state from a user-expression result (pure; null when unreadable). */
export function readState(result: unknown): IKernelState | null {
  if (typeof result !== 'object' || result === null) {
    return null;
  }
  const r = result as { status?: string; data?: { [mime: string]: unknown } };
  const data = r.status === 'ok' ? r.data?.['application/json'] : undefined;
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const d = data as { status?: unknown; payloads?: unknown };
  const status = parseStatus(d.status);
  if (status === null) {
    return null;
  }
  const payloads: IRoutingPayload[] = [];
  for (const item of Array.isArray(d.payloads) ? d.payloads : []) {
    const parsed = parsePayload(item);
    if (parsed.ok) {
      payloads.push(parsed.payload);
    }
  }
  return { status, payloads };
}

/**
 * Run `code` silently (no output, no history, no execution count, and IPython
 * runs no cell callbacks, so no routing payload) and read `%adapter` status
 * afterwards (with every payload). Rejects with a KernelRequestError whose message says what to do.
 */
export async function runSilently(kernel: Kernel.IKernelConnection, code: string): Promise<IKernelState> {
  const future = kernel.requestExecute(
    { code, silent: true, store_history: false, user_expressions: { state: STATE_EXPRESSION } },
    true
  );
  const reply = (await future.done) as KernelMessage.IExecuteReplyMsg;
  const content = reply.content;
  if (content.status !== 'ok') {
    const detail = content.status === 'error' ? `${content.ename}: ${content.evalue}` : content.status;
    throw new KernelRequestError(
      `torch_adapter: running \`${code}\` in the kernel failed (${detail}). ` +
        'Is the extension loaded? Run `%load_ext torch_adapter` in a cell first.'
    );
  }
  const state = readState(content.user_expressions?.state);
  if (state === null) {
    throw new KernelRequestError(
      'torch_adapter: the kernel did not answer `%adapter` status. ' +
        'Run `%load_ext torch_adapter` in a cell first.'
    );
  }
  return state;
}

/** `%adapter policy X`, validated here so a typo never reaches the kernel. */
export function policyCode(policy: string): string {
  if (!(POLICIES as readonly string[]).includes(policy)) {
    throw new KernelRequestError(
      `torch_adapter: expected a fallback policy of ${POLICIES.join(', ')}; got ${JSON.stringify(policy)}`
    );
  }
  return `%adapter policy ${policy}`;
}
