/**
 * The behaviour: per notebook, receive the kernel's routing comm messages,
 * keep them in a RoutingStore keyed by cell model id, and show them as cell
 * badges (and, opt-in, in cell metadata). Every connect has its disconnect in
 * dispose().
 */

import { Cell, CodeCell, ICodeCellModel } from '@jupyterlab/cells';
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';
import { PanelLayout, Widget } from '@lumino/widgets';

import { CellBadge } from './badge';
import { IKernelState, KernelRequestError, runSilently } from './kernel';
import {
  classify,
  COMM_TARGET,
  IRoutingPayload,
  METADATA_KEY,
  MIME,
  metadataSummary,
  notLoaded,
  parsePayload
} from './schema';
import { keyOf, RoutingStore } from './store';

export interface IRoutingSettings {
  /** Show a badge under each cell that ran aten ops. */
  showBadges: boolean;
  /** Keep each cell's summary in its metadata (saved with the notebook). */
  keepInMetadata: boolean;
  /** How many fallback ops a tooltip lists. */
  tooltipFallbacks: number;
}

export const DEFAULT_SETTINGS: IRoutingSettings = {
  showBadges: true,
  keepInMetadata: false,
  tooltipFallbacks: 5
};

type CommHandler = (comm: Kernel.IComm, msg: KernelMessage.ICommOpenMsg) => void;

/**
 * One comm target registration per kernel connection, fanned out to every
 * notebook view using it (two views of one notebook share a connection, and a
 * connection holds one callback per target name).
 */
namespace CommHub {
  interface IRegistration {
    listeners: Set<CommHandler>;
    callback: CommHandler;
  }
  const registrations = new WeakMap<Kernel.IKernelConnection, IRegistration>();

  export function add(kernel: Kernel.IKernelConnection, handler: CommHandler): void {
    let registration = registrations.get(kernel);
    if (!registration) {
      const listeners = new Set<CommHandler>();
      const callback: CommHandler = (comm, msg) => {
        for (const listener of [...listeners]) {
          listener(comm, msg);
        }
      };
      registration = { listeners, callback };
      registrations.set(kernel, registration);
      kernel.registerCommTarget(COMM_TARGET, callback);
    }
    registration.listeners.add(handler);
  }

  export function remove(kernel: Kernel.IKernelConnection, handler: CommHandler): void {
    const registration = registrations.get(kernel);
    if (!registration) {
      return;
    }
    registration.listeners.delete(handler);
    if (registration.listeners.size === 0) {
      registrations.delete(kernel);
      if (!kernel.isDisposed) {
        kernel.removeCommTarget(COMM_TARGET, registration.callback);
      }
    }
  }
}

export class NotebookRouting implements IDisposable {
  constructor(panel: NotebookPanel, settings: IRoutingSettings) {
    this.panel = panel;
    this._settings = settings;
    const session = panel.sessionContext;
    session.kernelChanged.connect(this._onKernelChanged, this);
    session.statusChanged.connect(this._onStatusChanged, this);
    this._setKernel(session.session?.kernel ?? null);
    this.store.changed.connect(this._onStoreChanged, this);
    NotebookActions.executionScheduled.connect(this._onExecutionScheduled, this);
    panel.content.modelChanged.connect(this._onModelChanged, this);
    this._onModelChanged();
    void panel.context.ready.then(() => {
      this._restoreAll();
      this._readAllOutputs();
      void this.syncFromKernel();
    });
  }

  readonly panel: NotebookPanel;
  readonly store = new RoutingStore();

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Emits when cells were added, removed or moved (the panel's list follows). */
  get cellsChanged(): ISignal<this, void> {
    return this._cellsChanged;
  }

  get settings(): IRoutingSettings {
    return this._settings;
  }

  set settings(value: IRoutingSettings) {
    this._settings = value;
    this._refreshAll();
  }

  /** The kernel connection, if any. */
  get kernel(): Kernel.IKernelConnection | null {
    return this._kernel;
  }

  /** The code cell whose entry has this store key (model id or `#<count>`). */
  findCell(key: string): { cell: Cell; index: number } | null {
    const widgets = this.panel.content.widgets;
    for (let index = 0; index < widgets.length; index++) {
      const cell = widgets[index];
      if (cell.model.id === key || (key.startsWith('#') && this._executionCount(cell) === Number(key.slice(1)))) {
        return { cell, index };
      }
    }
    return null;
  }

  /** Select the cell with this key and scroll it into view. */
  async scrollTo(key: string): Promise<void> {
    const found = this.findCell(key);
    if (!found) {
      return;
    }
    const notebook = this.panel.content;
    notebook.activeCellIndex = found.index;
    notebook.deselectAll();
    await notebook.scrollToCell(found.cell, 'center');
  }

  /**
   * Ask the kernel (silently) for its status and every payload it published,
   * and take the payloads of this notebook's cells: what a reloaded page, or
   * "Refresh", rebuilds the panel from. Returns false when the kernel could
   * not answer (no kernel; or torch_adapter cannot be imported there, which
   * the panel then shows as "not loaded").
   */
  async syncFromKernel(): Promise<boolean> {
    const kernel = this._kernel;
    if (!kernel || this._isDisposed || !this.panel.context.isReady) {
      return false;
    }
    let state;
    try {
      state = await runSilently(kernel, '');
    } catch (error) {
      if (error instanceof KernelRequestError && !this._isDisposed && kernel === this._kernel) {
        this.store.setStatus(notLoaded());
      }
      return false;
    }
    if (this._isDisposed || kernel !== this._kernel) {
      return false;
    }
    this.applyState(state);
    return true;
  }

  /** Take the kernel's status, and the payloads of this notebook's cells. */
  applyState(state: IKernelState): void {
    for (const payload of state.payloads) {
      if (this._belongsHere(payload)) {
        this.store.add(payload);
      }
    }
    this.store.setStatus(state.status);
  }

  /** A kernel payload is this notebook's if its cell is here and has not run since. */
  private _belongsHere(payload: IRoutingPayload): boolean {
    const key = keyOf(payload);
    const found = key === null ? null : this.findCell(key);
    if (!found) {
      return false;
    }
    const count = this._executionCount(found.cell);
    return count === null || payload.execution_count === null || payload.execution_count >= count;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._setKernel(null);
    const session = this.panel.sessionContext;
    session.kernelChanged.disconnect(this._onKernelChanged, this);
    session.statusChanged.disconnect(this._onStatusChanged, this);
    this.store.changed.disconnect(this._onStoreChanged, this);
    NotebookActions.executionScheduled.disconnect(this._onExecutionScheduled, this);
    this.panel.content.modelChanged.disconnect(this._onModelChanged, this);
    this._watchCells(null);
    for (const cell of this.panel.content.widgets) {
      this._badges.get(cell)?.dispose();
    }
    Signal.clearData(this);
  }

  // -- kernel ------------------------------------------------------------------------
  private _onKernelChanged(): void {
    this.store.clearLive();
    this._setKernel(this.panel.sessionContext.session?.kernel ?? null);
    this._readAllOutputs();
    void this.syncFromKernel();
  }

  private _setKernel(kernel: Kernel.IKernelConnection | null): void {
    if (this._kernel) {
      CommHub.remove(this._kernel, this._onComm);
    }
    this._kernel = kernel;
    if (kernel) {
      CommHub.add(kernel, this._onComm);
    }
  }

  private _onStatusChanged(_: unknown, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting') {
      // A restarted kernel has nothing loaded; it says so again once it is up.
      this.store.clearLive();
      this.store.setStatus(notLoaded());
      this._restarted = true;
    } else if (status === 'idle' && this._restarted) {
      this._restarted = false;
      void this.syncFromKernel();
    }
  }

  private _onComm = (_comm: Kernel.IComm, msg: KernelMessage.ICommOpenMsg): void => {
    const message = classify(msg.content.data);
    if (message.kind === 'status') {
      this.store.setStatus(message.status); // `%adapter target …`, `policy …`, `observe …`
      return;
    }
    const result = message.result;
    if (!result.ok) {
      console.warn(`torch_adapter: ignored a routing message from the kernel: ${result.error}`);
      return;
    }
    if (result.warning && !this._warned) {
      this._warned = true;
      console.warn(`torch_adapter: ${result.warning}`);
    }
    const key = this.store.add(result.payload);
    if (key !== null && this._settings.keepInMetadata) {
      this.findCell(key)?.cell.model.setMetadata(METADATA_KEY, metadataSummary(result.payload));
    }
  };

  private _onExecutionScheduled(_: unknown, args: { notebook: unknown; cell: Cell }): void {
    if (args.notebook !== this.panel.content || args.cell.model.type !== 'code') {
      return;
    }
    // A cell that runs again and then runs no op must not keep its old badge.
    const model = args.cell.model;
    this.store.forget(model.id, this._executionCount(args.cell));
    if (this._settings.keepInMetadata && model.getMetadata(METADATA_KEY) !== undefined) {
      model.deleteMetadata(METADATA_KEY);
    }
  }

  // -- cells -------------------------------------------------------------------------
  private _onModelChanged(): void {
    this._watchCells(this.panel.content.model);
    this._refreshAll();
  }

  private _watchCells(model: NotebookPanel['content']['model']): void {
    if (this._cellList) {
      this._cellList.changed.disconnect(this._onCellsChanged, this);
    }
    this._cellList = model ? model.cells : null;
    if (this._cellList) {
      this._cellList.changed.connect(this._onCellsChanged, this);
    }
  }

  private _onCellsChanged(): void {
    // The notebook creates the new cells' widgets in its own handler of the
    // same signal; look at them once it has run.
    void Promise.resolve().then(() => {
      if (this._isDisposed) {
        return;
      }
      this._restoreAll();
      this._readAllOutputs();
      this._refreshAll();
      this._cellsChanged.emit();
    });
  }

  /** Read summaries kept in cell metadata (a notebook saved with the setting on). */
  private _restoreAll(): void {
    const model = this.panel.content.model;
    if (this._isDisposed || !model) {
      return;
    }
    for (const cell of model.cells) {
      if (cell.type !== 'code' || this.store.lookup(cell.id, null)) {
        continue;
      }
      const kept = cell.getMetadata(METADATA_KEY);
      if (kept === undefined) {
        continue;
      }
      const result = parsePayload(kept);
      if (result.ok) {
        this.store.restore(cell.id, result.payload);
      }
    }
  }

  /** The routing payload a cell's stored outputs hold (the last one), if any. */
  private _outputPayload(model: ICodeCellModel): IRoutingPayload | null {
    const outputs = model.outputs;
    let found: IRoutingPayload | null = null;
    for (let i = 0; i < outputs.length; i++) {
      const data = outputs.get(i).data[MIME];
      if (data !== undefined) {
        const result = parsePayload(data);
        if (result.ok) {
          found = result.payload;
        }
      }
    }
    return found;
  }

  /** Read every code cell's stored routing output, and follow each cell's outputs. */
  private _readAllOutputs(): void {
    const model = this.panel.content.model;
    if (this._isDisposed || !model) {
      return;
    }
    for (const cell of model.cells) {
      if (cell.type !== 'code') {
        continue;
      }
      const code = cell as ICodeCellModel;
      if (!this._followed.has(code)) {
        this._followed.add(code);
        code.outputs.changed.connect(() => this._onOutputsChanged(code));
      }
      const payload = this._outputPayload(code);
      if (payload) {
        this.store.fromOutput(code.id, payload);
      }
    }
  }

  private _onOutputsChanged(model: ICodeCellModel): void {
    if (this._isDisposed) {
      return;
    }
    const payload = this._outputPayload(model);
    if (payload) {
      this.store.fromOutput(model.id, payload);
    }
    const widget = this.panel.content.widgets.find(cell => cell.model === model);
    if (widget) {
      this._refresh(widget);
    }
  }

  private _onStoreChanged(): void {
    this._refreshAll();
  }

  private _refreshAll(): void {
    if (this._isDisposed) {
      return;
    }
    for (const cell of this.panel.content.widgets) {
      this._refresh(cell);
    }
  }

  private _executionCount(cell: Cell): number | null {
    return cell.model.type === 'code' ? (cell.model as ICodeCellModel).executionCount : null;
  }

  private _refresh(cell: Cell): void {
    if (!(cell instanceof CodeCell)) {
      return;
    }
    const entry = this._settings.showBadges
      ? this.store.lookup(cell.model.id, this._executionCount(cell))
      : null;
    let badge = this._badges.get(cell);
    // One rendering per cell: the kernel's output is the report where the cell
    // has it; the badge under the input is for reports it does not hold.
    if (!entry || this._outputPayload(cell.model as ICodeCellModel) !== null) {
      badge?.setPayload(null, 0, false);
      return;
    }
    if (!badge || badge.isDisposed) {
      badge = new CellBadge();
      this._badges.set(cell, badge);
      const created = badge;
      // A windowed notebook builds a cell's DOM only when it first comes into view.
      void cell.ready.then(() => this._insert(cell, created));
    }
    badge.setPayload(entry.payload, this._settings.tooltipFallbacks, entry.saved);
  }

  /** Put the badge into the cell's layout, right under the input. */
  private _insert(cell: Cell, badge: Widget): void {
    if (cell.isDisposed || badge.isDisposed || badge.parent === cell) {
      return;
    }
    const layout = cell.layout as PanelLayout;
    const input = layout.widgets.findIndex(w => w.hasClass('jp-Cell-inputWrapper'));
    layout.insertWidget(input < 0 ? layout.widgets.length : input + 1, badge);
  }

  private _settings: IRoutingSettings;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _cellList: { changed: ISignal<unknown, unknown> } | null = null;
  private _badges = new WeakMap<Cell, CellBadge>();
  private _followed = new WeakSet<ICodeCellModel>();
  private _cellsChanged = new Signal<this, void>(this);
  private _isDisposed = false;
  private _warned = false;
  private _restarted = false;
}

/** One NotebookRouting per open notebook panel, and the settings they share. */
export class RoutingManager implements IDisposable {
  get settings(): IRoutingSettings {
    return this._settings;
  }

  set settings(value: IRoutingSettings) {
    this._settings = value;
    for (const routing of this._routings.values()) {
      routing.settings = value;
    }
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** The routing of a panel, created on first use and disposed with the panel. */
  routingFor(panel: NotebookPanel): NotebookRouting {
    let routing = this._routings.get(panel);
    if (!routing) {
      routing = new NotebookRouting(panel, this._settings);
      this._routings.set(panel, routing);
      panel.disposed.connect(this._onPanelDisposed, this);
    }
    return routing;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    for (const [panel, routing] of this._routings) {
      panel.disposed.disconnect(this._onPanelDisposed, this);
      routing.dispose();
    }
    this._routings.clear();
  }

  private _onPanelDisposed(panel: NotebookPanel): void {
    panel.disposed.disconnect(this._onPanelDisposed, this);
    this._routings.get(panel)?.dispose();
    this._routings.delete(panel);
  }

  private _settings: IRoutingSettings = { ...DEFAULT_SETTINGS };
  private _routings = new Map<NotebookPanel, NotebookRouting>();
  private _isDisposed = false;
}
