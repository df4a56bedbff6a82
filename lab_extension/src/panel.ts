/**
 * The "Op routing" side panel: the current notebook's target and policy, the
 * kernel's session totals, and one row per cell that ran ops (click: scroll
 * to the cell).
 */

import { ICodeCellModel } from '@jupyterlab/cells';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { renderBadge, renderFallbacks } from './badge';
import { shares, targetLabel, totalsText } from './format';
import { POLICIES } from './kernel';
import { NotebookRouting } from './routing';
import { ROUTES } from './schema';

export const CommandIDs = {
  setPolicy: 'torch-adapter:set-policy',
  openInspector: 'torch-adapter:open-inspector',
  refresh: 'torch-adapter:refresh-status',
  openPanel: 'torch-adapter:open-panel'
};

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

export class RoutingPanel extends Widget {
  constructor(commands: CommandRegistry) {
    super();
    this._commands = commands;
    this.id = 'torch-adapter-routing-panel';
    this.addClass('jp-TorchAdapter-panel');
    this.title.caption = 'Op routing (torch_adapter)';
  }

  /** Show this notebook's routing (null: no notebook is current). */
  setRouting(routing: NotebookRouting | null): void {
    if (routing === this._routing) {
      return;
    }
    if (this._routing && !this._routing.isDisposed) {
      this._routing.store.changed.disconnect(this._onChange, this);
      this._routing.cellsChanged.disconnect(this._onChange, this);
      this._routing.panel.sessionContext.kernelChanged.disconnect(this._onChange, this);
    }
    this._routing = routing;
    if (routing) {
      routing.store.changed.connect(this._onChange, this);
      routing.cellsChanged.connect(this._onChange, this);
      routing.panel.sessionContext.kernelChanged.connect(this._onChange, this);
    }
    this.update();
  }

  dispose(): void {
    this.setRouting(null);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    this.update();
  }

  protected onUpdateRequest(msg: Message): void {
    if (!this.isVisible) {
      return; // rendered when shown
    }
    this.node.replaceChildren(...this._render());
  }

  private _onChange(): void {
    this.update();
  }

  private _render(): HTMLElement[] {
    const header = el('div', 'jp-TorchAdapter-panelHeader');
    header.append(el('h2', 'jp-TorchAdapter-panelTitle', 'Op routing'));
    const routing = this._routing;
    if (!routing || routing.isDisposed) {
      header.append(el('div', 'jp-TorchAdapter-notebook', 'Open a notebook to see how its ops are routed.'));
      return [header];
    }
    header.append(el('div', 'jp-TorchAdapter-notebook', routing.panel.context.localPath));
    return [header, this._renderSummary(routing), this._renderTotals(routing), this._renderCells(routing)];
  }

  private _renderSummary(routing: NotebookRouting): HTMLElement {
    const { target, policy, loaded } = routing.store.targetAndPolicy();
    const section = el('div', 'jp-TorchAdapter-summary');
    const targetRow = el('div', 'jp-TorchAdapter-row');
    targetRow.append(el('span', 'jp-TorchAdapter-label', 'Target'));
    // What the kernel is in now: its target, or that it has none.
    const state = routing.kernel === null ? 'no-kernel' : loaded === false ? 'not-loaded' : loaded ? 'loaded' : 'unknown';
    const words = { 'no-kernel': 'no kernel', 'not-loaded': 'not loaded', loaded: target ?? '—', unknown: '—' }[state];
    const targetNode = el('span', 'jp-TorchAdapter-target', words);
    targetNode.dataset.state = state;
    if (state === 'not-loaded') {
      targetNode.title = 'torch_adapter is not loaded in this kernel: run %load_ext torch_adapter';
    }
    targetRow.append(targetNode);
    const policyRow = el('div', 'jp-TorchAdapter-row');
    policyRow.append(el('span', 'jp-TorchAdapter-label', 'Fallback policy'));
    const select = el('select', 'jp-TorchAdapter-policy');
    select.title = 'Switch the fallback policy (runs %adapter policy … in the kernel, silently)';
    for (const p of POLICIES) {
      const option = el('option', '', p);
      option.value = p;
      select.append(option);
    }
    if (policy === null) {
      const unknown = el('option', '', '—');
      unknown.value = '';
      select.prepend(unknown);
    }
    select.value = policy ?? '';
    select.disabled = routing.kernel === null || loaded !== true;
    select.addEventListener('change', () => {
      if (select.value) {
        void this._commands.execute(CommandIDs.setPolicy, { policy: select.value });
      }
    });
    policyRow.append(select);
    const buttons = el('div', 'jp-TorchAdapter-buttons');
    for (const [id, text] of [
      [CommandIDs.openInspector, 'Open inspector'],
      [CommandIDs.refresh, 'Refresh from kernel']
    ]) {
      const button = el('button', 'jp-TorchAdapter-button', text);
      button.title = this._commands.caption(id);
      button.disabled = !this._commands.isEnabled(id);
      button.addEventListener('click', () => void this._commands.execute(id));
      buttons.append(button);
    }
    section.append(targetRow, policyRow, buttons);
    return section;
  }

  private _renderTotals(routing: NotebookRouting): HTMLElement {
    const section = el('div', 'jp-TorchAdapter-section');
    section.append(el('h3', 'jp-TorchAdapter-sectionTitle', 'Session totals (kernel)'));
    const totals = routing.store.totals();
    if (!totals) {
      const notLoaded = routing.store.targetAndPolicy().loaded === false;
      section.append(
        el(
          'div',
          'jp-TorchAdapter-empty',
          notLoaded
            ? 'torch_adapter is not loaded in this kernel: run `%load_ext torch_adapter`.'
            : 'No routing yet: run `%load_ext torch_adapter`, then run cells.'
        )
      );
      return section;
    }
    const line = el('div', 'jp-TorchAdapter-totals', totalsText(totals));
    line.dataset.cells = String(totals.cells);
    for (const route of ROUTES) {
      line.dataset[route] = String(totals[route]);
    }
    const bar = el('div', 'jp-TorchAdapter-bar');
    const share = shares(totals);
    for (const route of ROUTES) {
      if (totals[route] > 0) {
        const part = el('span', `jp-TorchAdapter-barPart jp-mod-${route}`);
        part.style.width = `${Math.max(share[route], 0.5)}%`;
        part.title = `${route}: ${share[route].toFixed(1)} % of op calls`;
        bar.append(part);
      }
    }
    section.append(line, bar);
    return section;
  }

  private _renderCells(routing: NotebookRouting): HTMLElement {
    const section = el('div', 'jp-TorchAdapter-section');
    section.append(el('h3', 'jp-TorchAdapter-sectionTitle', 'Cells'));
    const list = el('ul', 'jp-TorchAdapter-cellList');
    const top = routing.settings.tooltipFallbacks;
    routing.panel.content.widgets.forEach((cell, index) => {
      if (cell.model.type !== 'code') {
        return;
      }
      const count = (cell.model as ICodeCellModel).executionCount;
      const entry = routing.store.lookup(cell.model.id, count);
      if (!entry) {
        return;
      }
      const row = el('li', 'jp-TorchAdapter-cellRow');
      row.dataset.cellId = cell.model.id;
      row.tabIndex = 0;
      const head = el('div', 'jp-TorchAdapter-rowHead');
      // The payload knows its execution count before the cell model does.
      const shownCount = count ?? entry.payload.execution_count;
      head.append(el('span', 'jp-TorchAdapter-prompt', `[${shownCount ?? ' '}]`));
      const source = cell.model.sharedModel.getSource().split('\n')[0] ?? '';
      head.append(el('span', 'jp-TorchAdapter-source', source || `cell ${index + 1}`));
      head.append(el('span', 'jp-TorchAdapter-rowTarget', targetLabel(entry.payload)));
      const chip = el('span', '');
      renderBadge(chip, entry.payload, top, false);
      chip.classList.toggle('jp-mod-saved', entry.saved);
      row.append(head, chip);
      const fallbacks = renderFallbacks(entry.payload, top);
      if (fallbacks) {
        row.append(fallbacks);
      }
      row.title = `Cell ${index + 1}: click to scroll to it\n\n${chip.title}`;
      const go = () => void routing.scrollTo(cell.model.id);
      row.addEventListener('click', go);
      row.addEventListener('keydown', event => {
        if (event.key === 'Enter') {
          go();
        }
      });
      list.append(row);
    });
    if (!list.childElementCount) {
      section.append(el('div', 'jp-TorchAdapter-empty', 'No cell of this notebook has reported ops yet.'));
    } else {
      section.append(list);
    }
    return section;
  }

  private _commands: CommandRegistry;
  private _routing: NotebookRouting | null = null;
}
