/**
 * The badge: one DOM rendering shared by the cell badge and the MIME renderer.
 */

import { Widget } from '@lumino/widgets';

import { badgeLevel, badgeText, targetLabel, tooltipText } from './format';
import { IRoutingPayload, ROUTES } from './schema';

export const BADGE_CLASS = 'jp-TorchAdapter-badge';

/** Fill `node` with the badge of `payload` (text, level class, tooltip, data-*). */
export function renderBadge(
  node: HTMLElement,
  payload: IRoutingPayload,
  topFallbacks: number,
  showTarget = true
): void {
  const level = badgeLevel(payload.counts);
  node.classList.add(BADGE_CLASS);
  for (const route of ROUTES) {
    node.classList.toggle(`jp-mod-${route}`, route === level);
    node.dataset[route] = String(payload.counts[route]);
  }
  node.dataset.level = level;
  node.title = tooltipText(payload, topFallbacks);
  node.setAttribute('aria-label', `torch_adapter routing: ${badgeText(payload.counts, true)}`);
  node.replaceChildren();
  const dot = document.createElement('span');
  dot.className = 'jp-TorchAdapter-dot';
  const text = document.createElement('span');
  text.className = 'jp-TorchAdapter-badgeText';
  text.textContent = badgeText(payload.counts);
  node.append(dot, text);
  if (showTarget) {
    const target = document.createElement('span');
    target.className = 'jp-TorchAdapter-badgeTarget';
    target.textContent = targetLabel(payload);
    node.append(target);
  }
}

/**
 * The badge under a cell's input. It lives in the cell's layout, so the cell
 * carries it along when a windowed notebook detaches and re-attaches it.
 */
export class CellBadge extends Widget {
  constructor() {
    super();
    this.addClass('jp-TorchAdapter-cellBadge');
    this._chip = document.createElement('span');
    this.node.appendChild(this._chip);
    this.hide();
  }

  setPayload(payload: IRoutingPayload | null, topFallbacks: number, saved: boolean): void {
    if (payload === null) {
      this.hide();
      return;
    }
    renderBadge(this._chip, payload, topFallbacks);
    this._chip.classList.toggle('jp-mod-saved', saved);
    if (saved) {
      this._chip.title += '\n(saved in the notebook metadata from an earlier run)';
    }
    this.show();
  }

  private _chip: HTMLElement;
}
