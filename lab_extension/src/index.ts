/**
 * Wiring only: the plugin connects the notebook tracker, settings, commands
 * and the side panel. Behaviour lives in routing.ts (NotebookRouting), views in
 * badge.ts and panel.ts, pure helpers in schema.ts and format.ts.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { policyCode, POLICIES, runSilently } from './kernel';
import { CommandIDs, RoutingPanel } from './panel';
import { DEFAULT_SETTINGS, IRoutingSettings, NotebookRouting, RoutingManager } from './routing';

const PLUGIN_ID = 'torch-adapter-labextension:plugin';
const CATEGORY = 'torch_adapter';

const routingIcon = new LabIcon({
  name: 'torch-adapter:routing',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<circle cx="4" cy="12" r="2.5"/><circle cx="20" cy="4.5" r="2.5"/>' +
    '<circle cx="20" cy="12" r="2.5"/><circle cx="20" cy="19.5" r="2.5"/>' +
    '<path d="M6 11h5.2l5.6-6.1 1.1 1L12.1 12.8H6zM6 12.2h11.3v1.6H6zM11.6 13.6l6.3 4.9-.9 1.3-6.5-5z"/>' +
    '</g></svg>'
});

function readSettings(settings: ISettingRegistry.ISettings): IRoutingSettings {
  const get = <K extends keyof IRoutingSettings>(key: K): IRoutingSettings[K] => {
    const value = settings.get(key).composite;
    return (value ?? DEFAULT_SETTINGS[key]) as IRoutingSettings[K];
  };
  return {
    showBadges: get('showBadges'),
    keepInMetadata: get('keepInMetadata'),
    tooltipFallbacks: get('tooltipFallbacks')
  };
}

function report(error: unknown): void {
  const message = error instanceof Error ? error.message : String(error);
  Notification.error(message, { autoClose: 8000 });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: "Per-cell op-routing badges and an 'Op routing' side panel for torch_adapter.",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry, ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    settingRegistry: ISettingRegistry | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const manager = new RoutingManager();
    const panel = new RoutingPanel(app.commands);
    panel.title.icon = routingIcon;
    app.shell.add(panel, 'right', { rank: 900 });
    restorer?.add(panel, panel.id);

    const current = (): NotebookRouting | null =>
      tracker.currentWidget ? manager.routingFor(tracker.currentWidget) : null;
    tracker.widgetAdded.connect((_, notebook: NotebookPanel) => manager.routingFor(notebook));
    tracker.forEach(notebook => manager.routingFor(notebook));
    tracker.currentChanged.connect(() => panel.setRouting(current()));
    panel.setRouting(current());

    const refreshCommands = () => {
      app.commands.notifyCommandChanged(CommandIDs.setPolicy);
      app.commands.notifyCommandChanged(CommandIDs.refresh);
      app.commands.notifyCommandChanged(CommandIDs.openInspector);
    };
    tracker.currentChanged.connect(refreshCommands);

    const ask = async (routing: NotebookRouting, code: string) => {
      const kernel = routing.kernel;
      if (!kernel) {
        throw new Error('torch_adapter: this notebook has no kernel; start one first.');
      }
      routing.applyState(await runSilently(kernel, code));
      refreshCommands();
    };

    app.commands.addCommand(CommandIDs.setPolicy, {
      label: args => (args.policy ? `Routing: Fallback Policy ${args.policy}` : 'Routing: Set Fallback Policy'),
      caption: 'Set what happens when the target lacks an op: allow, warn or error (%adapter policy …)',
      isEnabled: () => current()?.kernel != null && current()?.store.targetAndPolicy().loaded === true,
      isToggled: args => current()?.store.targetAndPolicy().policy === args.policy,
      describedBy: {
        args: {
          type: 'object',
          properties: { policy: { type: 'string', enum: [...POLICIES] } },
          required: ['policy']
        }
      },
      execute: async args => {
        const routing = current();
        if (routing) {
          // On failure the panel shows the policy it knew again.
          await Promise.resolve()
            .then(() => ask(routing, policyCode(String(args.policy))))
            .catch(report)
            .finally(() => panel.update());
        }
      }
    });

    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Routing: Refresh from Kernel',
      caption: "Read the kernel's target, policy and session totals (%adapter), silently",
      isEnabled: () => current()?.kernel != null,
      execute: async () => {
        const routing = current();
        if (routing) {
          await ask(routing, '').catch(report);
        }
      }
    });

    app.commands.addCommand(CommandIDs.openInspector, {
      label: 'Routing: Open Inspector',
      caption: 'Insert a cell with %adapter_inspector below the active cell and run it',
      isEnabled: () => tracker.currentWidget !== null,
      execute: async () => {
        const notebookPanel = tracker.currentWidget;
        if (!notebookPanel) {
          return;
        }
        const notebook = notebookPanel.content;
        NotebookActions.insertBelow(notebook);
        notebook.activeCell?.model.sharedModel.setSource('%adapter_inspector');
        await NotebookActions.run(notebook, notebookPanel.sessionContext);
      }
    });

    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Routing: Show Op Routing Panel',
      caption: "Show the current notebook's op routing: target, policy, totals, cells",
      execute: () => app.shell.activateById(panel.id)
    });

    if (palette) {
      for (const policy of POLICIES) {
        palette.addItem({ command: CommandIDs.setPolicy, category: CATEGORY, args: { policy } });
      }
      for (const command of [CommandIDs.refresh, CommandIDs.openInspector, CommandIDs.openPanel]) {
        palette.addItem({ command, category: CATEGORY });
      }
    }

    if (settingRegistry) {
      void settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            manager.settings = readSettings(settings);
            panel.update();
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.error(`torch_adapter: could not load settings for ${PLUGIN_ID}`, reason));
    }
  }
};

export default plugin;
