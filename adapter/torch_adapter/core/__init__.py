"""The bottom layer: what every other part stands on, needing only torch.

The current-session slot (:mod:`.state`), the :class:`~.patching.Patcher` that owns every
patch and its undo, the one import hook (:mod:`.after_import`), the configuration
(:mod:`.config`), the single module that touches torch's private APIs
(:mod:`.torch_private`), the one safe writer (:mod:`.safe_io`) and call-site naming
(:mod:`.callsite`). Nothing here imports another part of the package except
:mod:`torch_adapter.errors`.
"""
