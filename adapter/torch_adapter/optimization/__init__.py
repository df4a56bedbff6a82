"""The optimization layer: what ``optimization_level`` does to a session's models
(:mod:`.layer`), ``torch_adapter.prepare`` (:mod:`.prepare`) and the fused kernels it may
swap in (:mod:`.fusion`). Above routing and redirect; below the session.
"""
