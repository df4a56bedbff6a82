/**
 * The badge: one DOM rendering shared by the cell badge and the MIME renderer.
 */

import { Widget } from '@lumino/widgets';

import { badgeLevel, badgeText, codedReason, compiledText, dtypeText, fallbackLine, formatExact, targetLabel, tooltipText } from './format';
import { IRoutingPayload, ROUTES } from './schema';

export const BADGE_CLASS = 'jp-TorchAdapter-badge';

/** Fill `node` with the badge of `payload` (text, level class, tooltip, data-*). */
export function renderBadge(
  node: HTMLElement,
  payload: IRoutingPayload,
  topFallbacks: number,
  showTarget = true
): void {
  const level = payload.dtypes && payload.dtypes.calls > 0 ? 'fallback' : badgeLevel(payload.counts);
  node.classList.add(BADGE_CLASS);
  for (const route of ROUTES) {
    node.classList.toggle(`jp-mod-${route}`, route === level);
    node.dataset[route] = String(payload.counts[route]);
  }
  node.dataset.level = level;
  node.title = tooltipText(payload, topFallbacks);
  node.setAttribute('aria-label', `torch_adapter routing: ${badgeText(payload.counts, true)}`);
  node.replaceChildren();
  // Each "N route" part never breaks inside, and the dot sits in the first
  // part: where a narrow panel wraps the pill, it wraps between parts only.
  const text = document.createElement('span');
  text.className = 'jp-TorchAdapter-badgeText';
  badgeText(payload.counts)
    .split(' · ')
    .forEach((part, i) => {
      const span = document.createElement('span');
      span.className = 'jp-TorchAdapter-badgePart';
      if (i === 0) {
        const dot = document.createElement('span');
        dot.className = 'jp-TorchAdapter-dot';
        span.append(dot);
      } else {
        text.append(' · ');
      }
      span.append(part);
      text.append(span);
    });
  const dtypes = dtypeText(payload);
  if (dtypes) {
    text.append(dtypes);
  }
  const compiled = compiledText(payload);
  if (compiled) {
    text.append(compiled);
  }
  node.append(text);
  if (showTarget) {
    const target = document.createElement('span');
    target.className = 'jp-TorchAdapter-badgeTarget';
    target.textContent = targetLabel(payload);
    node.append(target);
  }
}

export const FALLBACKS_CLASS = 'jp-TorchAdapter-fallbacks';

/**
 * The ops the policy refused and those that fell back, and the lines that
 * called them, readable without hovering: one line each under the badge
 * (refused first: "refused: op ×calls at cell [n], line l — reason"). A click
 * on a line shows its whole reason. Null when nothing was refused or fell back.
 */
export function renderFallbacks(payload: IRoutingPayload, topFallbacks: number): HTMLElement | null {
  const top = Math.max(0, topFallbacks);
  const refused = payload.top_refused.slice(0, top);
  const shown = payload.top_fallbacks.slice(0, top);
  if (!shown.length && !refused.length) {
    return null;
  }
  const list = document.createElement('ul');
  list.className = FALLBACKS_CLASS;
  const items = [
    ...refused.map(fb => ({ fb, route: 'refused' as const })),
    ...shown.map(fb => ({ fb, route: 'fallback' as const }))
  ];
  for (const { fb, route } of items) {
    const item = document.createElement('li');
    item.className = route === 'refused' ? 'jp-TorchAdapter-refused' : 'jp-TorchAdapter-fallback';
    item.dataset.route = route;
    item.dataset.op = fb.op;
    if (fb.site) {
      item.dataset.site = fb.site;
    }
    const what = document.createElement('span');
    what.className = 'jp-TorchAdapter-fallbackOp';
    what.textContent = (route === 'refused' ? 'refused: ' : '') + fallbackLine(fb);
    item.append(what);
    if (fb.reason) {
      const why = document.createElement('span');
      why.className = 'jp-TorchAdapter-fallbackReason';
      why.textContent = ` — ${codedReason(fb)}`;
      if (fb.code) {
        item.dataset.code = fb.code;
      }
      item.append(why);
      item.title = 'Click to show the whole reason';
      item.addEventListener('click', event => {
        event.stopPropagation();
        item.classList.toggle('jp-mod-expanded');
      });
    }
    list.append(item);
  }
  const hidden =
    Math.max(payload.ops.fallback, payload.top_fallbacks.length) -
    shown.length +
    Math.max(payload.ops.refused, payload.top_refused.length) -
    refused.length;
  if (hidden > 0) {
    const more = document.createElement('li');
    more.className = 'jp-TorchAdapter-fallbackMore';
    more.textContent = `… and ${formatExact(hidden)} more (%%adapter_trace lists every op)`;
    list.append(more);
  }
  return list;
}

/** The whole report of one cell: the badge, then its fallbacks (if any). */
export function renderReport(node: HTMLElement, payload: IRoutingPayload, topFallbacks: number, saved = false): HTMLElement {
  const chip = document.createElement('span');
  renderBadge(chip, payload, topFallbacks);
  chip.classList.toggle('jp-mod-saved', saved);
  if (saved) {
    chip.title += '\n(saved in the notebook metadata from an earlier run)';
  }
  const list = renderFallbacks(payload, topFallbacks);
  node.replaceChildren(...(list ? [chip, list] : [chip]));
  return chip;
}

/**
 * The badge under a cell's input, for a cell whose report is not in its
 * outputs (a summary saved in the metadata, or a kernel that sends comm
 * messages only). It lives in the cell's layout, so the cell carries it along
 * when a windowed notebook detaches and re-attaches it.
 */
export class CellBadge extends Widget {
  constructor() {
    super();
    this.addClass('jp-TorchAdapter-cellBadge');
    this.hide();
  }

  setPayload(payload: IRoutingPayload | null, topFallbacks: number, saved: boolean): void {
    if (payload === null) {
      this.hide();
      return;
    }
    renderReport(this.node, payload, topFallbacks, saved);
    this.show();
  }
}
