/**
 * The MIME renderer: the kernel's per-cell display output
 * (application/vnd.torch-adapter.routing+json) shows as a compact badge.
 * It reads no settings: MIME extensions load apart from the main plugin.
 */

import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { renderReport } from './badge';
import { MIME, parsePayload } from './schema';

export class RoutingOutput extends Widget implements IRenderMime.IRenderer {
  constructor() {
    super();
    this.addClass('jp-TorchAdapter-output');
  }

  renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const result = parsePayload(model.data[MIME]);
    this.node.replaceChildren();
    if (!result.ok) {
      const error = document.createElement('span');
      error.className = 'jp-TorchAdapter-outputError';
      error.textContent = `torch_adapter: this routing output cannot be read (${result.error})`;
      this.node.append(error);
      return Promise.resolve();
    }
    // The one rendering of a cell's routing in Lab: this output (it is stored
    // with the notebook, so it comes back after a reload), the fallbacks and
    // their call sites spelled out under the badge.
    const label = document.createElement('span');
    label.className = 'jp-TorchAdapter-outputLabel';
    label.textContent = 'torch_adapter';
    const report = document.createElement('div');
    report.className = 'jp-TorchAdapter-report';
    renderReport(report, result.payload, 5);
    this.node.append(label, report);
    return Promise.resolve();
  }
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [MIME],
  defaultRank: 0,
  createRenderer: () => new RoutingOutput()
};

const extension: IRenderMime.IExtension = {
  id: 'torch-adapter-labextension:mime',
  rendererFactory,
  rank: 0,
  dataType: 'json'
};

export default extension;
