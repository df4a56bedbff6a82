"""The tools around a session: NaN checks and CPU comparison (:mod:`.debug`), memory
diagnostics and the memory server, the profiler with its Chrome trace, export to a
target-ready artifact. They stand on the routing and redirect layers and are reached by
users through ``torch_adapter.debug`` / ``.memory`` / ``.profiler`` / ``.export``.
"""
