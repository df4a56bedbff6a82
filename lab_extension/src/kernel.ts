/**
 * The few things the extension asks of a kernel, on demand only (never after
 * each cell): switch the fallback policy, read `%adapter` status.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';

import { IKernelStatus } from './store';

export const POLICIES = ['allow', 'warn', 'error'] as const;
export type Policy = (typeof POLICIES)[number];

/** A user expression that answers `%adapter` status as JSON. */
const STATUS_EXPRESSION =
  "__import__('IPython').display.JSON(get_ipython().run_line_magic('adapter', ''))";

export class KernelRequestError extends Error {}

/** The kernel status from a user-expression result (pure; null when unreadable). */
export function readStatus(result: unknown): IKernelStatus | null {
  if (typeof result !== 'object' || result === null) {
    return null;
  }
  const r = result as { status?: string; data?: { [mime: string]: unknown } };
  const data = r.status === 'ok' ? r.data?.['application/json'] : undefined;
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const d = data as { [key: string]: unknown };
  const num = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
  return {
    target: typeof d.target === 'string' ? d.target : null,
    policy: typeof d.policy === 'string' ? d.policy : null,
    observing: d.observing !== false,
    cells: num(d.cells),
    native: num(d.native),
    composite: num(d.composite),
    fallback: num(d.fallback)
  };
}

/**
 * Run `code` silently (no output, no history, no execution count, and IPython
 * runs no cell callbacks, so no routing payload) and read `%adapter` status
 * afterwards. Rejects with a KernelRequestError whose message says what to do.
 */
export async function runSilently(kernel: Kernel.IKernelConnection, code: string): Promise<IKernelStatus> {
  const future = kernel.requestExecute(
    { code, silent: true, store_history: false, user_expressions: { status: STATUS_EXPRESSION } },
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
  const status = readStatus(content.user_expressions?.status);
  if (status === null) {
    throw new KernelRequestError(
      'torch_adapter: the kernel did not answer `%adapter` status. ' +
        'Run `%load_ext torch_adapter` in a cell first.'
    );
  }
  return status;
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
