/**
 * The kernel → Lab contract, read in one place (its Python twin is
 * torch_adapter/jupyter/schema.py; the table is in docs/jupyter.md).
 *
 * After each cell that ran aten ops the kernel sends one payload twice: as a
 * display output under {@link MIME} and as the data of a comm it opens (target
 * {@link COMM_TARGET}) and closes at once. Pure: no JupyterLab imports.
 */

export const MIME = 'application/vnd.torch-adapter.routing+json';
export const COMM_TARGET = 'torch_adapter';
export const SCHEMA = 'torch-adapter.cell-routing';
/** `%adapter` status, sent when the target, policy or observation changes. */
export const STATUS_SCHEMA = 'torch-adapter.status';
/**
 * The newest payload version this extension knows. Version 2 added the routes
 * `yours` (a `register_fallback` implementation, on the device) and `refused`
 * (the policy raised instead of falling back) and `top_yours`/`top_refused`;
 * a version-1 payload (saved in an older notebook) reads with those at zero.
 */
export const VERSION = 2;
/** The cell-metadata key under which the opt-in summary is kept. */
export const METADATA_KEY = 'torch_adapter';

/** The routes, in the order the views show them (torch_adapter/routing/wording.py). */
export type Route = 'native' | 'composite' | 'yours' | 'fallback' | 'refused';
export const ROUTES: readonly Route[] = ['native', 'composite', 'yours', 'fallback', 'refused'];
/** Routes every payload version has; the others read as 0 when absent (version 1). */
const REQUIRED: readonly Route[] = ['native', 'composite', 'fallback'];

export interface IRouteCounts {
  native: number;
  composite: number;
  /** Calls your `register_fallback` implementation ran, on the device (nothing copied). */
  yours: number;
  /** Calls that ran on the CPU (inputs copied there, results back). */
  fallback: number;
  /** Calls the fallback policy refused (`error`, `deny`): they raised. */
  refused: number;
}

/** All-zero counts. */
export function zeroCounts(): IRouteCounts {
  return { native: 0, composite: 0, yours: 0, fallback: 0, refused: 0 };
}

export interface ISessionTotals extends IRouteCounts {
  cells: number;
}

export interface IFallbackOp {
  op: string;
  calls: number;
  reason: string;
  /** The reason's stable code ("TA-F001": docs/reasons.md); '' or absent from a kernel that sends none. */
  code?: string;
  site: string | null;
}

/** Calls a simulated target's real backend refuses for their dtype: a finding kind, not a route. */
export interface IDtypeFinding {
  op: string;
  dtype: string;
  calls: number;
  message: string;
  site: string | null;
}

export interface IDtypes {
  /** False: the profile has no dtype data, so nothing was judged (`note` says why). */
  judged: boolean;
  note: string;
  calls: number;
  findings: IDtypeFinding[];
}

/** What torch.compile compiled in the cell (its ops are not in `counts`). */
export interface ICompiled {
  /** "compiled: 1 graph (f, cell [3], line 2), 0 graph breaks; ops inside compiled code are not counted per op" */
  line: string;
  /** Graph breaks with their lines, recompiles, failures. */
  details: string[];
  graphs: number;
  graph_breaks: number;
  recompiles: number;
  failures: number;
}

/** One cell's routing: schema `torch-adapter.cell-routing`, version 1. */
export interface IRoutingPayload {
  schema: string;
  version: number;
  cell_id: string | null;
  execution_count: number | null;
  target: string;
  simulated: boolean;
  /** The target is the project's emulated device (a real out-of-tree device on this machine). */
  emulated: boolean;
  policy: string;
  /** Op calls of this cell per route. */
  counts: IRouteCounts;
  /** Distinct ops of this cell per route. */
  ops: IRouteCounts;
  /** Route `fallback`: ran on the CPU (most calls first). */
  top_fallbacks: IFallbackOp[];
  /** Route `yours`: ran your register_fallback implementation. */
  top_yours: IFallbackOp[];
  /** Route `refused`: the policy raised. */
  top_refused: IFallbackOp[];
  wall_ms: number | null;
  op_time_ms: number | null;
  bytes_copied: number;
  /** Kernel totals since `%load_ext torch_adapter` (null when absent). */
  session: ISessionTotals | null;
  /** The `%load_ext` that sent it (one id per load; null or absent from an older kernel). */
  session_id?: string | null;
  /** Simulated targets only (null or absent otherwise). */
  dtypes?: IDtypes | null;
  /** Only where torch.compile compiled in the cell. */
  compiled?: ICompiled | null;
}

export type ParseResult =
  | { ok: true; payload: IRoutingPayload; warning: string | null }
  | { ok: false; error: string };

type Dict = { [key: string]: unknown };

function isDict(value: unknown): value is Dict {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0;
}

function describe(value: unknown): string {
  if (value === null) {
    return 'null';
  }
  if (Array.isArray(value)) {
    return 'an array';
  }
  const text = JSON.stringify(value);
  const shown = text === undefined ? String(value) : text;
  return `${shown.length > 40 ? shown.slice(0, 40) + '…' : shown} (${typeof value})`;
}

function readCounts(value: unknown, key: string): IRouteCounts | string {
  if (!isDict(value)) {
    return `"${key}": expected an object like {"native": 412, "composite": 37, "fallback": 3}; got ${describe(value)}`;
  }
  const counts = zeroCounts();
  for (const route of ROUTES) {
    const n = value[route];
    if (isCount(n)) {
      counts[route] = n;
    } else if (REQUIRED.includes(route) || n !== undefined) {
      return `"${key}.${route}": expected a count >= 0; got ${describe(n)}`;
    }
  }
  return counts;
}

function readSession(value: unknown): ISessionTotals | null {
  if (!isDict(value) || !isCount(value.cells)) {
    return null;
  }
  const counts = readCounts(value, 'session');
  return typeof counts === 'string' ? null : { cells: value.cells, ...counts };
}

function readFallbacks(value: unknown): IFallbackOp[] {
  if (!Array.isArray(value)) {
    return [];
  }
  return value.filter(isDict).map(item => ({
    op: String(item.op ?? '?'),
    calls: isCount(item.calls) ? item.calls : 0,
    reason: typeof item.reason === 'string' ? item.reason : '',
    site: typeof item.site === 'string' ? item.site : null,
    ...(typeof item.code === 'string' && item.code ? { code: item.code } : {})
  }));
}

function readDtypes(value: unknown): IDtypes | null {
  if (!isDict(value)) {
    return null;
  }
  const findings = Array.isArray(value.findings) ? value.findings.filter(isDict) : [];
  return {
    judged: value.judged !== false,
    note: typeof value.note === 'string' ? value.note : '',
    calls: isCount(value.calls) ? value.calls : 0,
    findings: findings.map(item => ({
      op: String(item.op ?? '?'),
      dtype: String(item.dtype ?? '?'),
      calls: isCount(item.calls) ? item.calls : 0,
      message: typeof item.message === 'string' ? item.message : '',
      site: typeof item.site === 'string' ? item.site : null
    }))
  };
}

function readCompiled(value: unknown): ICompiled | null {
  if (!isDict(value) || typeof value.line !== 'string') {
    return null;
  }
  return {
    line: value.line,
    details: Array.isArray(value.details) ? value.details.filter((d): d is string => typeof d === 'string') : [],
    graphs: isCount(value.graphs) ? value.graphs : 0,
    graph_breaks: isCount(value.graph_breaks) ? value.graph_breaks : 0,
    recompiles: isCount(value.recompiles) ? value.recompiles : 0,
    failures: isCount(value.failures) ? value.failures : 0
  };
}

function numberOrNull(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

/**
 * Validate a payload from a comm message, a display output or cell metadata.
 *
 * Required: `schema` (exactly {@link SCHEMA}), an integer `version` >= 1, a
 * string `target` and `counts`. A newer version is read for its version-1
 * fields and flagged with a warning; missing optional fields get neutral
 * defaults, so an older or newer kernel still shows a badge.
 */
export function parsePayload(data: unknown): ParseResult {
  if (!isDict(data)) {
    return { ok: false, error: `expected a routing payload object; got ${describe(data)}` };
  }
  if (data.schema !== SCHEMA) {
    return { ok: false, error: `"schema": expected "${SCHEMA}"; got ${describe(data.schema)}` };
  }
  const version = data.version;
  if (typeof version !== 'number' || !Number.isInteger(version) || version < 1) {
    return { ok: false, error: `"version": expected an integer >= 1; got ${describe(version)}` };
  }
  if (typeof data.target !== 'string' || !data.target) {
    return { ok: false, error: `"target": expected a target name like "mps"; got ${describe(data.target)}` };
  }
  const counts = readCounts(data.counts, 'counts');
  if (typeof counts === 'string') {
    return { ok: false, error: counts };
  }
  const ops = readCounts(data.ops, 'ops');
  const payload: IRoutingPayload = {
    schema: SCHEMA,
    version,
    cell_id: typeof data.cell_id === 'string' && data.cell_id ? data.cell_id : null,
    execution_count: typeof data.execution_count === 'number' ? data.execution_count : null,
    target: data.target,
    simulated: data.simulated === true,
    emulated: data.emulated === true,
    policy: typeof data.policy === 'string' ? data.policy : 'allow',
    counts,
    ops: typeof ops === 'string' ? zeroCounts() : ops,
    top_fallbacks: readFallbacks(data.top_fallbacks),
    top_yours: readFallbacks(data.top_yours),
    top_refused: readFallbacks(data.top_refused),
    wall_ms: numberOrNull(data.wall_ms),
    op_time_ms: numberOrNull(data.op_time_ms),
    bytes_copied: isCount(data.bytes_copied) ? data.bytes_copied : 0,
    session: readSession(data.session),
    session_id: typeof data.session_id === 'string' && data.session_id ? data.session_id : null
  };
  const dtypes = readDtypes(data.dtypes);
  if (dtypes) {
    payload.dtypes = dtypes; // optional: only simulated targets send it
  }
  const compiled = readCompiled(data.compiled);
  if (compiled) {
    payload.compiled = compiled; // optional: only cells in which torch.compile compiled
  }
  const warning =
    version > VERSION
      ? `payload version ${version} is newer than this extension's (${VERSION}): showing the version-${VERSION} fields; upgrade the extension with the torch-adapter package`
      : null;
  return { ok: true, payload, warning };
}

/** The compact summary kept in cell metadata when the setting asks for it. */
export function metadataSummary(payload: IRoutingPayload): IRoutingPayload {
  // Small (at most five fallback entries) and read back by the same parser.
  // The session totals are dropped: they describe a kernel that will be gone.
  return { ...payload, session: null, session_id: null };
}

/** The kernel's `%adapter` status (schema {@link STATUS_SCHEMA}). */
export interface IKernelStatus extends IRouteCounts {
  /** The target name (`mps`), never a label: the front end words it (targetLabel). */
  target: string | null;
  simulated: boolean;
  emulated: boolean;
  policy: string | null;
  observing: boolean;
  /** The extension is loaded in the kernel (`%load_ext torch_adapter`). */
  loaded: boolean;
  cells: number;
  /** The current `%load_ext`'s id (null or absent: not loaded, or an older kernel). */
  session_id?: string | null;
}

/** The status of a kernel where the extension is not loaded (a new or restarted kernel). */
export function notLoaded(): IKernelStatus {
  return {
    target: null,
    simulated: false,
    emulated: false,
    policy: null,
    observing: false,
    loaded: false,
    cells: 0,
    session_id: null,
    ...zeroCounts()
  };
}

/**
 * Read `%adapter` status (a comm message, or the `status` of the kernel's
 * front-end state). Pure; null when it is not a status.
 */
export function parseStatus(data: unknown): IKernelStatus | null {
  if (!isDict(data) || data.schema !== STATUS_SCHEMA) {
    return null;
  }
  const num = (v: unknown): number => (isCount(v) ? v : 0);
  const counts = zeroCounts();
  for (const route of ROUTES) {
    counts[route] = num(data[route]);
  }
  return {
    target: typeof data.target === 'string' && data.target ? data.target : null,
    simulated: data.simulated === true,
    emulated: data.emulated === true,
    policy: typeof data.policy === 'string' ? data.policy : null,
    observing: data.observing !== false,
    // Version 1 had no `loaded`: only a loaded extension sent a status then.
    loaded: data.loaded !== false,
    cells: num(data.cells),
    session_id: typeof data.session_id === 'string' && data.session_id ? data.session_id : null,
    ...counts
  };
}

/** What the kernel sends: a cell's routing, or a status change. */
export type KernelMessageData =
  | { kind: 'routing'; result: ParseResult }
  | { kind: 'status'; status: IKernelStatus };

export function classify(data: unknown): KernelMessageData {
  const status = parseStatus(data);
  return status ? { kind: 'status', status } : { kind: 'routing', result: parsePayload(data) };
}
