"""A real kernel (nbclient): bundles on the cells that ran ops, comm messages, trace tables."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

MIME = "application/vnd.torch-adapter.routing+json"


class RecordingClient(NotebookClient):
    """nbclient that also keeps the comm_open messages the kernel sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.comm_opens = []

    def process_message(self, msg, cell, cell_index):
        if msg["msg_type"] == "comm_open" and msg["content"].get("target_name") == "torch_adapter":
            self.comm_opens.append((cell_index, msg["content"]["data"]))
        return super().process_message(msg, cell, cell_index)


CELLS = [
    "%load_ext torch_adapter",
    "import torch\nmodel = torch.nn.Linear(16, 4).cuda()\nx = torch.randn(8, 16).cuda()\nloss = model(x).sum()\nloss.backward()",
    "note = 'no tensor work here'\nprint(note)",
    "%%adapter_trace\ny = torch.einsum('bi,bi->b', x, x)\nz = torch.cuda.FloatTensor(4).zero_() + 1",
    "%adapter target mps --simulate",
    "w = torch.special.zeta(x.abs() + 2, x.abs() + 1).sum()",
    "import torch_adapter\ntorch_adapter.configure(fallback='error')  # Python, not the magic",
    "print('no tensor work')",
    "%unload_ext torch_adapter",
    "from torch_adapter.jupyter.extension import front_end_state\nprint(front_end_state())",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    client = RecordingClient(nb, timeout=300, kernel_name="python3", store_widget_state=False,
                             resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}})
    client.execute()
    return nb, client


def bundles(cell):
    return [o["data"][MIME] for o in cell.outputs if o.get("output_type") == "display_data" and MIME in o.get("data", {})]


def test_each_cell_that_ran_ops_has_one_routing_bundle(executed):
    nb, _ = executed
    ran_ops = bundles(nb.cells[1])
    assert len(ran_ops) == 1 and ran_ops[0]["counts"]["native"] > 0
    assert ran_ops[0]["execution_count"] == 2 and ran_ops[0]["cell_id"] is None
    assert bundles(nb.cells[2]) == []  # no aten op: nothing published
    assert bundles(nb.cells[0]) == []
    sim = bundles(nb.cells[5])
    assert len(sim) == 1 and sim[0]["simulated"] and sim[0]["target"] == "mps"


def test_comm_messages_carry_the_same_payloads(executed):
    nb, client = executed
    by_cell = {}
    for index, data in client.comm_opens:
        if data["schema"] == "torch-adapter.cell-routing":
            by_cell.setdefault(index, []).append(data)
    assert set(by_cell) == {1, 3, 5}
    assert by_cell[1][0] == bundles(nb.cells[1])[0]


def test_a_target_switch_sends_the_status(executed):
    # `%adapter target` runs no op, so no routing payload: a status message tells the
    # front end (its panel follows the session's current target). So do loading, a policy
    # set from Python, and unloading; a cell that changes nothing sends none.
    nb, client = executed
    statuses = [(index, data) for index, data in client.comm_opens if data["schema"] == "torch-adapter.status"]
    assert [(i, d["target"], d["simulated"], d["policy"], d["loaded"]) for i, d in statuses] == [
        (0, "cpu", False, "allow", True), (4, "mps", True, "allow", True), (6, "mps", True, "error", True),
        (8, None, False, None, False)]
    assert "'loaded': False" in nb.cells[9].outputs[0]["text"] and "'payloads': []" in nb.cells[9].outputs[0]["text"]
    text = "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert text == "torch_adapter: target mps (simulated on cpu)\n"  # a line, not a quoted string
    assert not any(o.output_type == "execute_result" for o in nb.cells[4].outputs)


def test_adapter_trace_lists_the_traced_ops_with_cell_sites(executed):
    nb, _ = executed
    (table,) = [o for o in nb.cells[3].outputs if "torch-adapter-trace" in o.get("data", {}).get("text/html", "")]
    assert set(table["data"]) == {"text/plain", "text/html"}  # no application/json: Lab would show a JSON tree
    text = table["data"]["text/plain"]
    assert "aten::mul" in text or "aten::bmm" in text
    assert "native" in text
    # The einsum is on the cell's line 2 (line 1 is %%adapter_trace), never the kernel's temp file.
    assert "cell [4], line 2" in table["data"]["text/html"] and "/tmp/" not in table["data"]["text/html"]
    assert "ipykernel" not in text


def test_text_fallbacks_for_other_front_ends(executed):
    nb, _ = executed
    data = next(o["data"] for o in nb.cells[1].outputs if MIME in o.get("data", {}))
    assert data["text/plain"].startswith("torch_adapter [cpu]:")
    assert "torch-adapter-routing" in data["text/html"]
